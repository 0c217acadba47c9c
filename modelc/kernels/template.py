"""The template interface: workload + config -> kernel source, and the registry of templates.

A template declares its config space (knobs), picks a default config from a simple model of the
machine, and generates a kernel: a body of numba code over flat 1-d arrays, which `source` turns
into a module with one `cfunc` named `kernel` (a range of the body's parallel loop; launch.py runs
it on the threads), plus the list saying what each array is bound to ("out0", "in2", or the name
of an array that `pack` prepares once from constant inputs, such as weights re-laid out for the
kernel).
"""
from __future__ import annotations

import contextlib
import re
import threading
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..errors import ModelcError
from .expr import SUPPORTED, ctor, emit, lit
from .intrinsics import FASTMATH, FASTMATH_IN_ORDER, calls_polynomial, helpers
from .layout import offset, uoffset
from .offsets import share_offsets
from .space import Config, ConfigSpace
from .workload import BYTES, Workload

_NB = {"float32": "float32", "float64": "float64", "int64": "int64", "int32": "int32",
       "bool": "boolean", "uint8": "uint8", "int8": "int8", "int16": "int16", "uint16": "uint16",
       "uint32": "uint32", "uint64": "uint64", "float16": "uint16"}     # float16: its bits (h2f)


@dataclass
class Kernel:
    source: str
    args: list                                   # what each kernel argument is bound to
    pack: Callable | None = None                 # {input index: const value} -> {arg name: array}
    python: Callable | None = None               # set only by the fallback: not generated code


class Template:
    name = "template"
    tunable = True
    priority = 0          # lower is tried first; generic templates set it higher
    alternative_to = None  # another template's name: this one is a second algorithm for its
                           # workloads, chosen by a faster tuning record (or by `preferred`)
    takes_half = False     # also builds float16 workloads (loads h2f, computes float32, stores f2h)
    supersedes = False     # an alternative that, where `preferred`, is the workload's only algorithm
                           # tuning tries (the others cannot win)
    reads_bytes = False    # builds convs that read their input as bytes (`x_zero`: passes/byte_inputs.py)
    stores_in_place = False  # its kernels read each element of an epilogue input of the output's shape only
                             # right before storing that element, once: the output may take its buffer

    def matches(self, wl: Workload) -> bool:
        raise NotImplementedError

    def preferred(self, wl: Workload) -> bool:
        """An alternative's claim that an untuned module should run it instead of the default
        template (where its default is known to beat the default template's, on any CPU)."""
        return False

    def space(self, wl: Workload) -> ConfigSpace:
        return ConfigSpace()

    def default_config(self, wl: Workload, space: ConfigSpace) -> Config:
        return space.get(0) if len(space) else Config(space, 0, {})

    def build(self, wl: Workload, cfg: Config) -> Kernel:
        raise NotImplementedError


TEMPLATES: list[Template] = []


def valid_default(tpl: Template, wl: Workload, space: ConfigSpace) -> Config:
    """`tpl`'s default config, or its space's first config when the default falls outside the
    template's constraint (a record or module of that config would be refused when read back)."""
    cfg = tpl.default_config(wl, space)
    if space.is_valid(cfg):
        return cfg
    first = space.valid_indices(limit=1)
    return space.get(first[0]) if first else cfg


def register(cls):
    TEMPLATES.append(cls())
    return cls


# dtypes the hand-written templates take (numba types); the numpy fallback also runs FALLBACK_DTYPES.
# float16 groups are kernels that load and store its bits and compute in float32 (intrinsics.h2f),
# where the CPU converts half: a template that says it `takes_half`, else their te declaration
# (te_group); elsewhere, and with any other dtype, the fallback.
KERNEL_DTYPES = frozenset(_NB) - {"float16"}
FALLBACK_DTYPES = frozenset({"float16"})


def _dtypes(wl: Workload) -> list:
    dtypes = [t.dtype for t in (*wl.inputs, *wl.outputs)] + [v.dtype for v in wl.params.values()]
    try:
        dtypes += [t.dtype for t in wl.value_specs().values()]
    except Exception:           # values the shape rules cannot describe: the templates will say
        pass
    return [np.dtype(dt).name for dt in dtypes]


def unsupported_dtype(wl: Workload) -> str | None:
    """The first dtype of `wl` (inputs, constants, intermediate values, outputs) that the
    hand-written templates do not take, or None."""
    return next((dt for dt in _dtypes(wl) if dt not in KERNEL_DTYPES), None)


def select(wl: Workload) -> Template:
    """The first registered template that handles `wl` (the fallback matches everything). A
    workload with float16 goes to a template that takes half, or its te declaration, when the CPU
    converts half, and with another dtype no kernel takes, to the fallback."""
    if "x_zero" in wl.anchor.attrs:       # only the templates that say so read bytes as x - x_zero
        return next((t for t in sorted(TEMPLATES, key=lambda t: t.priority) if t.reads_bytes and t.matches(wl)),
                    get("reference"))
    odd = set(_dtypes(wl)) - KERNEL_DTYPES
    if odd:
        from .. import target
        if odd == {"float16"} and target.current().converts_half:
            for t in sorted(TEMPLATES, key=lambda t: t.priority):
                if t.takes_half and t.alternative_to is None and t.matches(wl):
                    return t
            if get("te_group").matches(wl):
                return get("te_group")
        return get("reference")
    for t in sorted(TEMPLATES, key=lambda t: t.priority):
        if t.alternative_to is None and t.matches(wl):
            return t
    raise ModelcError(f"no kernel template for pattern {[o.op for o in wl.ops]}")


def untuned(wl: Workload, default: Template) -> Template:
    """The template a module without tuning records runs: `default` (`select`'s), or an
    alternative to it that claims the workload (`preferred`)."""
    return next((t for t in alternatives(wl, default) if t.preferred(wl)), default)


def alternatives(wl: Workload, default: Template) -> list:
    """The other algorithms for `wl` whose records may replace `default`'s (tuning decides)."""
    return [t for t in sorted(TEMPLATES, key=lambda t: t.priority)
            if t.alternative_to == default.name and t.matches(wl)
            and (t.reads_bytes or "x_zero" not in wl.anchor.attrs)]


def get(name: str) -> Template:
    for t in TEMPLATES:
        if t.name == name:
            return t
    raise ModelcError(f"unknown kernel template {name!r}")


# ---- source helpers shared by the templates ---------------------------------------------------

_sourceless = threading.local()


@contextlib.contextmanager
def without_source():
    """Kernels built inside have an empty source: for a process that loads the compiled kernel by
    its file name (a tuning runner, told it by the builder) and needs only the kernel's arguments
    and weight packing - writing the source again was half of the runner's time per candidate."""
    before = getattr(_sourceless, "on", False)
    _sourceless.on = True
    try:
        yield
    finally:
        _sourceless.on = before


def source(args: list, dtypes: list, body: list, parallel: bool = True, fastmath: bool = True,
           extra: list = (), views: dict | None = None, reassoc: bool = True) -> str:
    """A complete kernel module: a serial `kernel` over items [lo, hi) of the body's parallel loops.

    Templates write the body as numba code over 1-d arrays named by `args`, with their parallel
    work as top-level loops whose headers are `parallel_loop(var, N)` lines. The loops become one
    range of items, N1 + N2 + ...; a `cfunc` computes a contiguous part of it and the launcher's
    driver spreads the parts over the threads (launch.py says why). A body with no such loop is
    one item.
    `views` ({name: (arg, shape)}) are n-d arrays over an argument's memory. They are made from the
    argument's pointer, not by `arg.reshape`: numba's reshape leaves shape, strides and data in
    memory LLVM cannot see through, so a GEMM's accumulators were spilled and the kernel ran 4x
    slower. `reassoc=False` compiles without reassociation (intrinsics.FASTMATH_IN_ORDER).
    """
    if getattr(_sourceless, "on", False):
        return ""
    flags = (FASTMATH if reassoc else FASTMATH_IN_ORDER) if fastmath else False
    lines, total = _chunked(body)
    lines = hoist_literals(share_offsets(lines))
    params = ", ".join(f"ptr__{k}, len__{k}" for k in range(len(args)))
    bad = [np.dtype(d).name for d in dtypes if np.dtype(d).name not in _NB]
    if bad:
        raise ModelcError(f"no generated kernel takes arrays of dtype {bad[0]} (kernels take "
                          f"{', '.join(sorted(_NB))})")
    sig = ", ".join(f"types.CPointer(types.{_NB[np.dtype(d).name]}), types.intp" for d in dtypes)
    extra = [*extra, *helpers(body, extra)]
    out = ["import math", "import numpy as np", "import numba", "from numba import carray, prange, types",
           "from modelc.kernels.numba_pipeline import KernelCompiler",
           "from modelc.kernels.stack import stack_empty", *extra, "",
           f"N_ITEMS = {total}",
           f"PARALLEL = {bool(parallel)}",
           f"DTYPES = {tuple(np.dtype(d).name for d in dtypes)!r}",
           f"OUTPUTS = {tuple(k for k, a in enumerate(args) if a.startswith('out'))!r}",
           "",
           # error_model='numpy': x / 0 gives inf as ONNX says, instead of raising (and the
           # zero check numba's default inserts would also stop the loop from vectorising)
           f"@numba.cfunc(types.void({sig}, types.intp, types.intp), fastmath={flags}, "
           "cache=True, boundscheck=False, error_model='numpy', pipeline_class=KernelCompiler)",
           f"def kernel({params}, lo, hi):"]
    lines, direct = pointers(lines, args, dtypes)
    out += [f"    {a} = ptr__{k}" if a in direct else f"    {a} = carray(ptr__{k}, len__{k})"
            for k, a in enumerate(args)]
    out += [f"    {name} = carray(ptr__{args.index(a)}, {tuple(shape)!r})"
            for name, (a, shape) in (views or {}).items()]
    out += ["    " + ln for ln in lines]
    return "\n".join(out) + "\n"


_STACK_ARRAY = re.compile(r"^(\s*)(\w+) = carray\((stack_empty\((\d+), [\w.]+\)), \4\)$")


def pointers(lines: list, args: list, dtypes: list) -> tuple[list, set]:
    """The body with its stack arrays as raw pointers, and the arguments to pass as pointers: every
    array the body only indexes (`a[i]`, never `a.shape` or `f(a)`).

    numba lowers an array's element access through its struct (data, shape and strides unpacked,
    a negative index wrapped around, the address computed) at every access, and LLVM then folds
    most of it away again; a pointer's access is one address and one load or store. Kernels index
    hundreds of times: their compiles took 0.54-0.87 of the time per template with the same
    speed (docs/performance.md). Indices are offsets from the start: no template relies on a
    negative index counting from the end. Booleans stay arrays: numba stores a pointer's element
    in its register form (i1), not in memory's (a byte)."""
    text = "\n".join(lines)
    hinted = re.sub(r"\bprefetch\((\w+),", r"prefetch(\1[", text)      # takes a pointer too

    def indexed_only(name: str, defined: int = 0) -> bool:
        uses = re.findall(rf"(?<![\w.]){re.escape(name)}\b(.?)", hinted)
        return len(uses) > defined and all(c == "[" for c in uses[defined:])
    out = []
    for ln in lines:
        m = _STACK_ARRAY.match(ln)
        if m and "bool" not in m.group(3) and text.count(f"{m.group(2)} = ") == 1 and indexed_only(m.group(2), 1):
            ln = f"{m.group(1)}{m.group(2)} = {m.group(3)}"
        out.append(ln)
    return out, {a for a, d in zip(args, dtypes) if np.dtype(d) != np.bool_ and indexed_only(a)}


_LITERAL_CALL = re.compile(r"\bnp\.(float32|float64|uintp|intp|int64|int32)"
                           r"\((-?[0-9]+(?:\.[0-9]*)?(?:[eE][-+]?[0-9]+)?)\)")


def hoist_literals(lines: list) -> list:
    """The body with each typed literal (`np.float32(4.0)`) made once, before the loops, and named.

    numba types and lowers every such call where it stands (a Winograd kernel writes about 300),
    and LLVM folds the named constant back into each use: the same machine code, compiled about
    a sixth faster."""
    names: dict = {}

    def name(m) -> str:
        return names.setdefault(m.group(0), f"lit__{len(names)}")
    body = [_LITERAL_CALL.sub(name, ln) for ln in lines]
    return [f"{n} = {call}" for call, n in names.items()] + body


class ParallelLoop(str):
    """A body line that heads a parallel loop, `for var in prange(n):`: `source` runs the items
    of a body's parallel loops on the threads. A line of this type says so by itself, so nothing
    has to recognise loops in text (an indented or rewritten copy is a plain line again)."""

    var: str
    n: int

    def __new__(cls, var: str, n: int):
        line = super().__new__(cls, f"for {var} in prange({int(n)}):")
        line.var, line.n = var, int(n)
        return line


def parallel_loop(var: str, n: int) -> ParallelLoop:
    """The header of a top-level loop of `n` independent items over `var` (see `source`)."""
    return ParallelLoop(var, n)


def _chunked(body: list) -> tuple[list, int]:
    """`body` with its parallel loops restricted to items [lo, hi)."""
    loops = [(k, ln) for k, ln in enumerate(body) if isinstance(ln, ParallelLoop)]
    if not loops:
        return ["if lo < hi:"] + ["    " + ln for ln in body], 1
    out, start = list(body), 0
    for k, loop in loops:
        var, n = loop.var, loop.n
        if len(loops) == 1:
            out[k] = f"for {var} in range(lo, hi):"
        else:
            out[k] = f"for {var} in range(max(lo, {start}) - {start}, min(hi, {start + n}) - {start}):"
        start += n
    return out, start



def broadcast_index(shape, out_shape, out_idx: list) -> list:
    """Index into a tensor of `shape` broadcast (right-aligned) against `out_idx`."""
    lead = len(out_shape) - len(shape)
    return [("0" if d == 1 and out_shape[lead + k] != 1 else out_idx[lead + k])
            for k, d in enumerate(shape)]   # a split channel index (tuple) passes through


def epilogue(wl: Workload, ops: list, value: str, out_idx: list, out_shape, dtype,
             start_ref: str, var: str = "e", unsigned: bool = False,
             fast_erf: bool = True) -> tuple[list, str]:
    """Lines applying elementwise `ops` to `value` (the result `start_ref`) at `out_idx`.

    Operands are the running value, workload inputs (read from their own layout, broadcast
    against the output index) and scalar constants (inlined as literals). `unsigned` reads the
    inputs at `np.uintp` offsets (numba then skips its negative-index check, which can keep an
    unrolled tile from vectorising); `fast_erf` is `emit`'s option.
    """
    index = uoffset if unsigned else offset
    lines = []
    if ops and not value.isidentifier():
        # an op may read its operand twice (Swish: x * sigmoid(x)): the value is computed once
        lines.append(f"{var}a = {value}")
        value = f"{var}a"
    names = {start_ref: value}
    kinds = {start_ref: _value_dtype(wl, start_ref, dtype)}   # the anchor's type (ArgMax: int64)
    for j, op in enumerate(ops):
        exprs, consts, dts = [], {}, []
        # each op computes in its own result type (a chain may end in a compare or a Cast)
        op_dt = _value_dtype(wl, f"v{op.index}", dtype)
        for pos, a in enumerate(op.args):
            dts.append(wl.inputs[int(a[1:])].dtype if a.startswith("i") and a not in names else
                       wl.params[a].dtype if a.startswith("p") else kinds.get(a, np.dtype(dtype)))
            if not a:
                exprs.append("")
            elif a in names:
                exprs.append(names[a])
            elif a.startswith("p"):
                v = wl.params[a]
                if v.size != 1:
                    raise ModelcError(f"epilogue constant {a} of shape {v.shape} is not a scalar")
                consts[pos] = v.reshape(())
                exprs.append(lit(v, v.dtype))
            elif a.startswith("i"):
                k = int(a[1:])
                t = wl.inputs[k]
                idx = broadcast_index(t.shape, out_shape, out_idx)
                exprs.append(f"in{k}[{index(t.shape, t.layout, idx)}]")
            else:
                raise ModelcError(f"epilogue operand {a} is not available")
        name = f"{var}{j}"
        lines.append(f"{name} = {emit(op.op, exprs, op.attrs, op_dt, consts, dts, fast_erf=fast_erf)}")
        names[f"v{op.index}"] = name
        kinds[f"v{op.index}"] = op_dt
    return lines, names.get(f"v{ops[-1].index}", value) if ops else value


def polynomial_epilogue(wl: Workload, ops: list, shape, start_ref: str) -> bool:
    """Whether the epilogue `ops` evaluates a polynomial approximation per element (SiLU's sigmoid,
    GELU's erf): in a register tile's stores those run as many interleaved chains, spilling
    (expand_depthwise then runs them as loops over rows)."""
    lines, _ = epilogue(wl, ops, "a", ["n", ("kb", "j", 16), "oh", "ow"], shape, np.float32, start_ref, unsigned=True)
    return calls_polynomial(lines)


def anchor_ref(wl: Workload) -> str | None:
    """The name of the anchor's (single) used result, or None when another output is used."""
    used = {a for op in wl.ops for a in op.args} | set(wl.output_values)
    mine = {v for v in used if v == "v0" or v.startswith("v0.")}
    if mine - {"v0", "v0.0"} or len(mine) > 1:
        return None
    return mine.pop() if mine else "v0"


def chain_ok(wl: Workload) -> bool:
    """A single output: the end of an elementwise chain of the anchor's shape."""
    ref = anchor_ref(wl)
    if ref is None or len(wl.outputs) != 1:
        return False
    last = f"v{wl.ops[-1].index}" if wl.epilogue else ref
    if wl.output_values[0] != last or any(op.op not in SUPPORTED for op in wl.epilogue):
        return False
    anchor_shape = wl.spec(ref).shape
    return all(wl.spec(f"v{op.index}").shape == anchor_shape for op in wl.epilogue) and \
        wl.outputs[0].shape == anchor_shape


def float_or_bytes_out(wl: Workload) -> bool:
    """A float32 output, or bytes cast by the epilogue's last op (the next quantized conv's input,
    passes/byte_inputs.py): stored through the output's dtype."""
    out, last = wl.outputs[0], wl.ops[-1]
    return out.dtype == np.float32 or out.dtype in BYTES and \
        len(wl.ops) > 1 and last.op == "Cast" and wl.spec(last.args[0]).dtype == np.float32


def _value_dtype(wl: Workload, ref: str, default) -> np.dtype:
    try:
        return wl.spec(ref).dtype
    except (KeyError, ModelcError):
        return np.dtype(default)


def plain_anchor_input(wl: Workload, ops, dtypes=("float32", "float64")):
    """The anchor's data input, when the anchor is one of `ops` reading a workload input of one of
    `dtypes`, and it and every output are plain (not channel-blocked); else None."""
    a = wl.anchor
    if a.op not in ops or not a.args or not a.args[0].startswith("i"):
        return None
    x = wl.spec(a.args[0])
    if x.layout is not None or x.dtype.name not in dtypes or any(o.layout for o in wl.outputs):
        return None
    return x


INT_OR_FLOAT = ("float32", "float64", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")


def output_positions(wl: Workload, n: int) -> list | None:
    """Which of the anchor's `n` outputs each workload output is ("v0" is the first, "v0.k" the
    k-th: a multi-output op's workload holds only those read), or None when an output is
    something else or repeats."""
    names = {"v0": 0, **{f"v0.{k}": k for k in range(n)}}
    pos = [names.get(v) for v in wl.output_values]
    return pos if None not in pos and len(set(pos)) == len(pos) else None


def epilogue_inputs(ops: list) -> list:
    """Workload input indices read by an epilogue."""
    return sorted({int(a[1:]) for op in ops for a in op.args if a.startswith("i")})


__all__ = ["KERNEL_DTYPES", "FALLBACK_DTYPES", "unsupported_dtype", "Kernel", "Template", "TEMPLATES",
           "register", "select", "alternatives", "get", "source", "parallel_loop", "ParallelLoop", "epilogue",
           "epilogue_inputs", "polynomial_epilogue", "output_positions", "anchor_ref", "chain_ok", "broadcast_index",
           "ctor", "lit"]
