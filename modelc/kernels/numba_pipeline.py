"""numba's compiler pipeline, cut to what generated kernels use.

Tuning is compile-bound (issue 14: 120 trials a minute needs compiles under a second), and numba
spends most of a kernel's compile in Python, not in LLVM: on 50 kernels of the cache (AMD EPYC
Zen 4) LLVM was 20-30% of the time, numba's typing, SSA and rewrite passes and its lowering the
rest. Four things cut it to about 0.6 of the time, with the machine code unchanged (the
assembly of 148 sampled kernels was byte-identical; tests/test_numba_pipeline.py checks a few):

- `KernelCompiler` runs numba's passes minus those for constructs generated code never has:
  closures, `with` blocks, `raise`, `literal_unroll`, literal dispatch, branch pruning on
  constants (LLVM folds them), array-expression rewrites, and the SSA reconstruction - a kernel
  gives each variable one type, so numba's plain typing of variables (its behaviour before SSA)
  types it the same. A template that needed one of them would mostly fail to compile; one that
  gave a variable two types would have them unified (int64 and float64 to float64) - which is why
  every candidate is still checked against the reference when it is measured, and tests compare
  assembly with numba's full pipeline.
- numba re-types every arithmetic operator from scratch, trying each overload template in turn
  (and, for each one that does not match, formatting an error message that is thrown away),
  once during typing and again during lowering: a quarter of a compile. While a kernel compiles
  (and only then), `_memo_call_type` remembers the answer for operators and min/max/abs per
  (function type, typing context, argument types): a function type is a new object whenever
  someone registers another overload for it, so nothing registered later is missed.
- numba wraps the typing and the lowering of every IR instruction in `new_error_context`, a
  generator-based context manager (~170,000 entries a dozen kernels): while a kernel compiles,
  `_ErrorContext` does the same in a plain class - 0.955 of the compile time (20 ResNet-18
  candidates, alternating, AMD EPYC Zen 4).
- numba colours those discarded messages with colorama; `target.prefer_wide_vectors` turns the
  highlighting off before numba is imported (NUMBA_DISABLE_ERROR_MESSAGE_HIGHLIGHTING).
"""
from __future__ import annotations

import operator

from numba.core.compiler import CompilerBase
from numba.core.compiler_machinery import PassManager
from numba.core.typed_passes import (AnnotateTypes, InlineOverloads, IRLegalization, NativeLowering,
                                     NoPythonBackend, NoPythonSupportedFeatureValidation,
                                     NopythonTypeInference, PreLowerStripPhis)
from numba.core import errors as _errors, lowering as _lowering, typeinfer as _typeinfer
from numba.core.types import functions as _functions
from numba.core.untyped_passes import FixupArgs, InlineInlinables, IRProcessing, TranslateByteCode


class KernelCompiler(CompilerBase):
    """numba's nopython pipeline for generated kernels: the passes they need, and the kernel's
    pointer arguments marked `noalias`, as numba marks the arrays of the gufuncs it makes from
    parallel loops. Without noalias LLVM had to assume that an output may overlap an input: the
    epilogue loops of the dense kernels stayed scalar and the transformer's dense layers ran 3x
    slower. Modules never give a kernel an output buffer that overlaps another of its arrays
    (`launch.BoundKernel` checks)."""

    def compile_extra(self, func):
        global _active
        _active += 1                # numba compiles under its global lock: a counter will do
        try:
            return super().compile_extra(func)
        finally:
            _active -= 1

    def define_pipelines(self):
        self.state.flags.noalias = True
        pm = PassManager("modelc kernel")
        if self.state.func_ir is None:
            pm.add_pass(TranslateByteCode, "analyzing bytecode")
            pm.add_pass(FixupArgs, "fix up args")
        pm.add_pass(IRProcessing, "processing IR")
        pm.add_pass(InlineInlinables, "inline inlinable functions")     # helpers with inline='always'
        pm.add_pass(NopythonTypeInference, "nopython frontend")
        pm.add_pass(PreLowerStripPhis, "remove phis nodes")
        pm.add_pass(InlineOverloads, "inline overloaded functions")
        pm.add_pass(NoPythonSupportedFeatureValidation, "ensure features that are in use are in a valid form")
        pm.add_pass(IRLegalization, "ensure IR is legal prior to lowering")
        pm.add_pass(AnnotateTypes, "annotate types")
        pm.add_pass(NativeLowering, "native lowering")
        pm.add_pass(NoPythonBackend, "nopython mode backend")
        pm.finalize()
        return [pm]


_MEMO_KEYS = frozenset(getattr(operator, n) for n in (
    "add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "neg", "pos", "not_", "invert",
    "iadd", "isub", "imul", "itruediv", "ifloordiv", "imod", "ipow",
    "lt", "le", "gt", "ge", "eq", "ne", "and_", "or_", "xor", "lshift", "rshift",
    "getitem", "setitem")) | {min, max, abs}
_MEMO_LIMIT = 200_000          # signatures remembered (literal integer arguments make many)
_memo: dict = {}
_active = 0                    # kernel compiles under way


def _memo_call_type(original):
    def get_call_type(self, context, args, kws):
        if not _active or kws or getattr(self, "typing_key", None) not in _MEMO_KEYS:
            return original(self, context, args, kws)
        key = (self, context, tuple(args))
        sig = _memo.get(key)
        if sig is None:
            sig = original(self, context, args, kws)        # raises as numba does on no match
            if sig is not None and len(_memo) < _MEMO_LIMIT:
                _memo[key] = sig
        return sig
    get_call_type.memoised = True
    return get_call_type


if not getattr(_functions.BaseFunction.get_call_type, "memoised", False):
    _functions.BaseFunction.get_call_type = _memo_call_type(_functions.BaseFunction.get_call_type)


class _ErrorContext:
    """numba's `errors.new_error_context` as a class: the same location note on entry and the same
    context added to a NumbaError on its way out, without a generator per IR instruction."""

    __slots__ = ("fmt", "args", "kwargs")

    def __init__(self, fmt_, *args, **kwargs):
        self.fmt, self.args, self.kwargs = fmt_, args, kwargs
        loc = kwargs.get("loc")
        if loc is not None and not loc.filename.startswith(_errors._numba_path):
            _errors.loc_info.update(kwargs)

    def __enter__(self):
        return None

    def __exit__(self, typ, value, tb):
        if typ is not None and issubclass(typ, _errors.NumbaError):
            value.add_context(_errors._format_msg(self.fmt, self.args, self.kwargs))
        return False


def _error_context(original):
    def new_error_context(fmt_, *args, **kwargs):
        return (_ErrorContext if _active else original)(fmt_, *args, **kwargs)
    new_error_context.fast = True
    return new_error_context


for _m in (_lowering, _typeinfer):
    if not getattr(_m.new_error_context, "fast", False):
        _m.new_error_context = _error_context(_m.new_error_context)
