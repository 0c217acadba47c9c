"""numba's compiler pipeline, cut to what generated kernels use.

Tuning is compile-bound (issue 14: 120 trials a minute needs compiles under a second), and numba
spends most of a kernel's compile in Python, not in LLVM: on 50 kernels of the cache (AMD EPYC
Zen 4) LLVM was 20-30% of the time, numba's typing, SSA and rewrite passes and its lowering the
rest. Four things cut it to about 0.6 of the time and a fifth (the last below) to 0.93 of that,
with the machine code unchanged (the assembly of 148 sampled kernels was byte-identical;
tests/test_numba_pipeline.py checks a few):

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
- numba works out every variable's lifetime three times (after the bytecode, before lowering, and
  for the `del`s the lowering needs), but only the nopython lowering's run is read: the other two
  fill in what object mode and generators use. Here they canonicalise the CFG (one back edge per
  loop; the lowering relies on it) and rebuild the definitions, and the bytecode's peephole
  rewrites (with-blocks, try, star-calls, dict displays) run only on code that has such bytecode
  (`_Interpreter`, `_IRProcessing`, `_StripPhis`): 0.93 of the compile time, the same machine code
  (55 kernels of three models' logs, each compiled three times both ways, AMD EPYC Zen 4).
"""
from __future__ import annotations

import dis
import operator

from numba.core.compiler import CompilerBase
from numba.core.compiler_machinery import PassManager
from numba.core.typed_passes import (AnnotateTypes, InlineOverloads, IRLegalization, NativeLowering,
                                     NoPythonBackend, NoPythonSupportedFeatureValidation,
                                     NopythonTypeInference, PreLowerStripPhis)
from numba.core import errors as _errors, interpreter as _interpreter, lowering as _lowering
from numba.core import transforms as _transforms, typeinfer as _typeinfer
from numba.core.compiler_machinery import FunctionPass, register_pass
from numba.core.ir_utils import build_definitions
from numba.core.types import functions as _functions
from numba.core.untyped_passes import FixupArgs, InlineInlinables, TranslateByteCode

# bytecode that numba's post-interpretation peepholes rewrite: without any, each is a no-op
_PEEPHOLE_OPS = frozenset(dis.opmap[n] for n in (
    "BEFORE_WITH", "SETUP_WITH", "SETUP_FINALLY", "LIST_TO_TUPLE", "LIST_EXTEND", "CALL_FUNCTION_EX",
    "BUILD_MAP", "BUILD_CONST_KEY_MAP", "DICT_UPDATE", "DICT_MERGE", "MAP_ADD") if n in dis.opmap)


def needs_peepholes(code) -> bool:
    """Whether numba's post-interpretation rewrites could change the IR of `code`: it has a try
    block or one of the opcodes they rewrite (wordcode: an opcode at every even byte)."""
    return bool(getattr(code, "co_exceptiontable", b"")) or not _PEEPHOLE_OPS.isdisjoint(code.co_code[::2])


class _Interpreter(_interpreter.Interpreter):
    def post_process(self, peepholes, func_ir):
        if needs_peepholes(self.func_id.code):
            return super().post_process(peepholes, func_ir)
        return func_ir


@register_pass(mutates_CFG=True, analysis_only=False)
class _TranslateByteCode(TranslateByteCode):
    _name = "modelc_translate_bytecode"

    def run_pass(self, state):
        state["func_ir"] = _Interpreter(state["func_id"]).interpret(state["bc"])
        return True


@register_pass(mutates_CFG=True, analysis_only=False)
class _IRProcessing(FunctionPass):
    """numba's IRProcessing without the lifetimes (object mode's and generators')."""
    _name = "modelc_ir_processing"

    def __init__(self):
        FunctionPass.__init__(self)

    def run_pass(self, state):
        state.func_ir.blocks = _transforms.canonicalize_cfg(state.func_ir.blocks)
        return True


@register_pass(mutates_CFG=True, analysis_only=False)
class _StripPhis(PreLowerStripPhis):
    """numba's PreLowerStripPhis without its PostProcessor run: IRLegalization's comes next."""
    _name = "modelc_strip_phis"

    def run_pass(self, state):
        if state.func_ir.is_generator:
            return super().run_pass(state)
        state.func_ir = self._strip_phi_nodes(state.func_ir)
        state.func_ir._definitions = build_definitions(state.func_ir.blocks)
        return True


class KernelCompiler(CompilerBase):
    """numba's nopython pipeline for generated kernels: the passes they need, and the kernel's
    pointer arguments marked `noalias`, as numba marks the arrays of the gufuncs it makes from
    parallel loops. Without noalias LLVM had to assume that an output may overlap an input: the
    epilogue loops of the dense kernels stayed scalar and the transformer's dense layers ran 3x
    slower. Modules never give a kernel an output buffer that overlaps another of its arrays
    (`launch.BoundKernel` checks), but for a residual that is the output's very array, in templates
    that read each of its elements once, right before storing that element (`stores_in_place`): the
    store depends on that load, so no reordering noalias allows moves one past the other, and the
    other elements are other addresses."""

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
            pm.add_pass(_TranslateByteCode, "analyzing bytecode")
            pm.add_pass(FixupArgs, "fix up args")
        pm.add_pass(_IRProcessing, "processing IR")
        pm.add_pass(InlineInlinables, "inline inlinable functions")     # helpers with inline='always'
        pm.add_pass(NopythonTypeInference, "nopython frontend")
        pm.add_pass(_StripPhis, "remove phis nodes")
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
