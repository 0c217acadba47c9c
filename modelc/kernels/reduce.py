"""Reduction-family templates on plain layouts: Softmax/LogSoftmax, LayerNormalization, Reduce*,
ArgMax/ArgMin.

Each splits its input into groups of adjacent axes that are reduced or kept. When the reduced
axes are innermost (a softmax over the last axis, a layer norm, a ReduceMean over H, W) every
output is a contiguous *row* reduction, written as a plain scalar loop: with fast-math adds and
llvm.maxnum/minnum (`fmax`/`fmin` below; numba's own max() is a select that LLVM will not
vectorise as a reduction) LLVM turns it into a vector reduction with interleaved accumulators.
When kept axes are innermost (a softmax over channels, a ReduceSum over axis 1) each block of
`vector_width` contiguous kept elements is a *column* reduction: a stack array of accumulators and
a lane loop per reduced position. The lane loop must stay a loop (64+ lanes): a fully unrolled
16-lane loop had its accumulators promoted to registers and LLVM then vectorised the reduced axis
instead, with gathers. One parallel loop runs over tasks of `rows_per_task` rows (or column
blocks); small workloads run serially by default (`parallel` knob): starting threads costs a few
microseconds.

numba has no vector exp here (no SVML), so float32 softmax uses an inlined Cephes-style exp
(range reduction by ln 2, degree-6 polynomial, 2^k built from its bits by `f32_from_bits`) that
vectorises; it is accurate to a few ulp on the softmax range (x - max <= 0, clamped at -87).
Layer norm accumulates in float32 for rows up to 4096 elements (as the reference does); above, float32
input sums float32 chunks of 4096 into float64 (float64 throughout for float64 input), in two passes
or (knob) one pass of sum and sum of squares in float64; Reduce sums accumulate in float64 beyond
1024 reduced elements per output.
"""
from __future__ import annotations

import math

import numpy as np
from llvmlite import ir as llir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from .expr import ctor, lit
from .layout import strides
from .pool import anchor_ref, chain_ok
from .space import ConfigSpace
from .template import Kernel, Template, epilogue, epilogue_inputs, register, source
from .workload import Workload

EXTRA = ["from modelc.kernels.reduce import f32_from_bits, fmax, fmin"]
COL_WIDTHS = [16, 32, 64, 128]
RPT_CANDIDATES = [1, 2, 4, 8, 16, 32, 64]
PARALLEL_MIN = 131072         # element-ops below which a serial kernel is the default
REDUCES = {"ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceSumSquare", "ReduceL2", "ReduceL1",
           "ReduceProd", "ReduceLogSum"}


@intrinsic
def f32_from_bits(typingctx, bits):
    """The float32 whose IEEE bits are the int32 `bits` (vectorisable: a bitcast)."""
    if bits != types.int32:
        return None

    def codegen(context, builder, sig, args):
        return builder.bitcast(args[0], llir.FloatType())

    return types.float32(types.int32), codegen


@intrinsic
def float_bits(typingctx, x):
    """The IEEE bits of a float32 (as int32) or float64 (as int64): a bitcast, which no fast-math
    assumption about NaN or infinity can fold (IsNaN / IsInf test these bits)."""
    if x == types.float32:
        sig, lt = types.int32(types.float32), llir.IntType(32)
    elif x == types.float64:
        sig, lt = types.int64(types.float64), llir.IntType(64)
    else:
        return None

    def codegen(context, builder, sig, args):
        return builder.bitcast(args[0], lt)

    return sig, codegen


# ---- shared source helpers -------------------------------------------------------------------

def _minmax(name: str):
    @intrinsic
    def fn(typingctx, a, b):
        """llvm.maxnum/minnum with fast-math flags: unlike numba's max(), LLVM vectorises it as a
        reduction (numba's select-based max() stays scalar in reduction loops)."""
        if not (isinstance(a, types.Float) and a == b):
            return None

        def codegen(context, builder, sig, args):
            lt = args[0].type
            suffix = "f32" if lt == llir.FloatType() else "f64"
            f = cgutils.get_or_insert_function(builder.module, llir.FunctionType(lt, [lt, lt]),
                                               f"llvm.{name}.{suffix}")
            # `nnan` lets LLVM vectorise the reduction; never `ninf`: masked rows hold -inf
            return builder.call(f, args, fastmath=("nnan", "nsz", "arcp", "contract", "afn", "reassoc"))

        return a(a, b), codegen
    return fn


fmax = _minmax("maxnum")
fmin = _minmax("minnum")


def exp_lines(dst: str, src: str, dtype, var: str) -> list:
    """Lines setting `dst` = exp(`src`) for `src` <= 0 (float32: a polynomial that vectorises)."""
    if np.dtype(dtype) != np.float32:
        return [f"{dst} = math.exp({src})"]
    F = lambda v: lit(v, np.float32)  # noqa: E731
    d, t, r, p = (f"{var}{s}" for s in "dtrp")
    return [f"{d} = fmax({src}, {F(-87.0)})",
            f"{t} = np.floor({d} * {F(1.4426950408889634)} + {F(0.5)})",
            f"{r} = {d} - {t} * {F(0.693359375)} + {t} * {F(2.12194440e-4)}",
            f"{p} = {F(1.9875691500e-4)} * {r} + {F(1.3981999507e-3)}",
            f"{p} = {p} * {r} + {F(8.3334519073e-3)}",
            f"{p} = {p} * {r} + {F(4.1665795894e-2)}",
            f"{p} = {p} * {r} + {F(1.6666665459e-1)}",
            f"{p} = {p} * {r} + {F(5.0000001201e-1)}",
            f"{dst} = ({p} * {r} * {r} + {r} + {F(1.0)}) * "
            f"f32_from_bits(np.int32({t} * {F(8388608.0)} + {F(1065353216.0)}))"]


def unflatten(flat: str, shape) -> list:
    """Index expressions of row-major `shape` for the flat index `flat`."""
    st = strides(shape)
    outer = next((k for k, d in enumerate(shape) if d != 1), len(shape))
    out = []
    for k, (d, s) in enumerate(zip(shape, st)):
        if d == 1:
            out.append("0")
            continue
        e = f"({flat})" if s == 1 else f"(({flat}) // {s})"
        out.append(e if k == outer else f"({e} % {d})")
    return out


def row_fold(L: int, base: str, load, comb, init: str, scalar: str, ind: str = "") -> list:
    """Lines folding `load(index)` over the contiguous run [base, base + L) into `scalar`.

    A plain scalar loop: LLVM's loop vectoriser turns it into a vector reduction (several
    interleaved accumulators) because the ops are fast-math adds or maxnum/minnum calls.
    """
    return [f"{ind}{scalar} = {init}",
            f"{ind}for i in range({L}):",
            f"{ind}    {scalar} = {comb(scalar, load(f'np.uintp({base} + i)'))}"]


def tasks_loop(rows: int, rpt: int, prologue: list) -> tuple[list, str]:
    """The parallel loop over tasks of `rpt` rows; returns (lines, indentation of a row body)."""
    nt = -(-rows // rpt)
    lines = [f"for it in prange({nt}):"] + ["    " + ln for ln in prologue]
    if rpt == 1:
        return lines + ["    o = it"], "    "
    return lines + [f"    for o in range(it * {rpt}, min(it * {rpt} + {rpt}, {rows})):"], "        "


def column_tasks(outer: int, inner: int, L: int, W: int, rpt: int, prologue: list):
    """The parallel loop over blocks of W contiguous kept elements of an [outer, L, inner] tensor
    reduced over L: (lines, indentation, full blocks, width of the last partial block). A row body
    has `ob` (outer index), `blk` (block) and `base` (offset of the block's first element)."""
    nfull, tail = inner // W, inner % W
    nblk = nfull + (tail > 0)
    body, ind = tasks_loop(outer * nblk, rpt, prologue)
    body += [f"{ind}ob = o // {nblk}", f"{ind}blk = o % {nblk}", f"{ind}base = ob * {L * inner} + blk * {W}"]
    return body, ind, nfull, tail


def column_blocks(ind: str, nfull: int, tail: int, W: int, column) -> list:
    """A column task's body: `column(ind, width)` for a full block of W columns, and for the last
    block of `tail` columns when W does not divide the kept extent."""
    if not tail:
        return column(ind, W)
    return [f"{ind}if blk < {nfull}:", *column(ind + "    ", W), f"{ind}else:", *column(ind + "    ", tail)]


def col_widths(inner: int) -> list:
    """Column block widths: loops of 64+ lanes stay loops that LLVM vectorises; a fully unrolled
    16-lane loop inside a reduction was turned into gathers across the reduced axis."""
    return [w for w in COL_WIDTHS if w <= inner] or [inner]


def define_row_or_column(sp: ConfigSpace, outer: int, inner: int):
    """Knobs of a reduction over rows (inner == 1) or over blocks of `inner` contiguous columns."""
    if inner > 1:
        sp.define_knob("vector_width", col_widths(inner))
    define_rows(sp, outer if inner == 1 else outer * -(-inner // 16))


def define_rows(sp: ConfigSpace, rows: int):
    sp.define_knob("rows_per_task", [r for r in RPT_CANDIDATES if r <= rows] or [1])
    sp.define_annotate("parallel", [True, False])


def default_rows(rows: int, work: int, rpts: list) -> dict:
    """About 16 tasks (balance across 2 threads); threads only for enough work (in element-ops:
    starting them costs a few microseconds, as much as a serial layer norm of 32k elements)."""
    want = max(1, rows // 16)
    rpt = min(rpts, key=lambda r: (abs(math.log2(r) - math.log2(want)), r))
    return {"rows_per_task": rpt, "parallel": work >= PARALLEL_MIN}


def finish(wl: Workload, body: list, x_args: list, parallel: bool, extra=(), packed=(), pack=None):
    ops = wl.epilogue
    args = ["out0"] + [f"in{k}" for k in x_args] + list(packed)
    args += [f"in{k}" for k in epilogue_inputs(ops) if k not in x_args]
    dt = wl.outputs[0].dtype
    dtypes = [dt] + [wl.inputs[k].dtype for k in x_args] + [dt] * len(packed) + \
        [wl.inputs[int(a[2:])].dtype for a in args[1 + len(x_args) + len(packed):]]
    return Kernel(source(args, dtypes, body, parallel=parallel, extra=list(extra)), args, pack)


def store(wl: Workload, ind: str, value: str, flat: str, idx: list | None = None, var: str = "e") -> list:
    """Epilogue + store of one plain output element at flat offset `flat`."""
    out = wl.outputs[0]
    idx = idx if idx is not None else unflatten(flat, out.shape)
    lines, final = epilogue(wl, wl.epilogue, value, idx, out.shape, out.dtype, anchor_ref(wl), var=var)
    return [ind + ln for ln in lines + [f"out0[np.uintp({flat})] = {final}"]]


def _plain_float(wl: Workload, ref: str) -> bool:
    t = wl.spec(ref)
    return t.layout is None and t.dtype in (np.float32, np.float64) and \
        wl.outputs[0].layout is None and wl.outputs[0].dtype == t.dtype


def axis_index(a, rank):
    a = int(a)
    return a + rank if a < 0 else a


# ---- Softmax / LogSoftmax --------------------------------------------------------------------

def _softmax_geometry(wl: Workload):
    a = wl.anchor
    shape = wl.spec(a.args[0]).shape
    ax = axis_index(a.attrs.get("axis", -1), len(shape))
    outer = math.prod(shape[:ax])
    inner = math.prod(shape[ax + 1:])
    return shape, ax, outer, shape[ax], inner


@register
class Softmax(Template):
    name = "softmax"

    def matches(self, wl: Workload) -> bool:
        a = wl.anchor
        return a.op in ("Softmax", "LogSoftmax") and a.args[0].startswith("i") and \
            _plain_float(wl, a.args[0]) and chain_ok(wl)

    def space(self, wl: Workload) -> ConfigSpace:
        shape, ax, outer, L, inner = _softmax_geometry(wl)
        sp = ConfigSpace()
        if inner == 1 and wl.anchor.op == "Softmax":
            sp.define_knob("store_exp", [True, False])
        define_row_or_column(sp, outer, inner)
        return sp

    def default_config(self, wl: Workload, space: ConfigSpace):
        shape, ax, outer, L, inner = _softmax_geometry(wl)
        vals = {}
        if inner == 1:
            if wl.anchor.op == "Softmax":
                vals["store_exp"] = True
            rows = outer
        else:
            vals["vector_width"] = w = min(space.knobs[0].values, key=lambda w: abs(w - 64))
            rows = outer * -(-inner // w)
        vals.update(default_rows(rows, 4 * outer * L * inner, knob_values(space, "rows_per_task")))
        return space.from_values(vals)

    def build(self, wl: Workload, cfg) -> Kernel:
        shape, ax, outer, L, inner = _softmax_geometry(wl)
        log = wl.anchor.op == "LogSoftmax"
        dt = wl.outputs[0].dtype
        T = ctor(dt)
        x_arg = int(wl.anchor.args[0][1:])
        X = f"in{x_arg}"
        RPT = cfg["rows_per_task"]
        ninf, zero, one = lit(-np.inf, dt), lit(0, dt), lit(1, dt)

        if inner == 1:
            # ---- row softmax: each row of L contiguous elements ---------------------------
            store_exp = not log and cfg["store_exp"]
            body, ind = tasks_loop(outer, RPT, [])
            body += [f"{ind}base = o * {L}"]
            body += row_fold(L, "base", lambda i: f"{X}[{i}]", lambda a, b: f"fmax({a}, {b})", ninf, "m", ind)
            body += [f"{ind}s = {zero}", f"{ind}for i in range({L}):", f"{ind}    xi = np.uintp(base + i)"]
            body += [f"{ind}    {ln}" for ln in exp_lines("ev", f"{X}[xi] - m", dt, "x")]
            if store_exp:
                body += [f"{ind}    out0[xi] = ev"]
            body += [f"{ind}    s += ev"]
            body += [f"{ind}lse = m + math.log(s)" if log else f"{ind}inv = {one} / s"]
            body += [f"{ind}for i in range({L}):", f"{ind}    xi = np.uintp(base + i)"]
            if log:
                v = f"({X}[xi] - lse)"
            elif store_exp:
                v = "(out0[xi] * inv)"
            else:
                body += [f"{ind}    {ln}" for ln in exp_lines("ev", f"{X}[xi] - m", dt, "y")]
                v = "(ev * inv)"
            idx = None
            if epilogue_inputs(wl.epilogue):
                idx = unflatten("o", shape[:ax]) + unflatten("i", shape[ax:])
            body += store(wl, ind + "    ", v, "xi", idx)
            return finish(wl, body, [x_arg], cfg["parallel"], EXTRA)

        # ---- column softmax: blocks of W contiguous inner elements, reduced over L ---------
        W = min(cfg["vector_width"], inner)
        body, ind, nfull, tail = column_tasks(outer, inner, L, W, RPT, [f"acc = carray(stack_empty({W}, {T}), {W})",
                                                                          f"acs = carray(stack_empty({W}, {T}), {W})"])

        def column(ind, width):
            lines = [f"{ind}for q in range({width}):", f"{ind}    acc[q] = {ninf}", f"{ind}    acs[q] = {zero}",
                     f"{ind}for l in range({L}):", f"{ind}    xb = np.uintp(base + l * {inner})",
                     f"{ind}    for q in range({width}):",
                     f"{ind}        acc[q] = fmax(acc[q], {X}[xb + np.uintp(q)])",
                     f"{ind}for l in range({L}):", f"{ind}    xb = np.uintp(base + l * {inner})",
                     f"{ind}    for q in range({width}):"]
            lines += [f"{ind}        {ln}" for ln in exp_lines("ev", f"{X}[xb + np.uintp(q)] - acc[q]", dt, "x")]
            if not log:
                lines += [f"{ind}        out0[xb + np.uintp(q)] = ev"]
            lines += [f"{ind}        acs[q] += ev",
                      f"{ind}for q in range({width}):"]
            lines += [f"{ind}    acs[q] = acc[q] + math.log(acs[q])" if log else f"{ind}    acs[q] = {one} / acs[q]"]
            lines += [f"{ind}for l in range({L}):", f"{ind}    xb = np.uintp(base + l * {inner})",
                      f"{ind}    for q in range({width}):", f"{ind}        xi = xb + np.uintp(q)"]
            v = f"({X}[xi] - acs[q])" if log else "(out0[xi] * acs[q])"
            idx = None
            if epilogue_inputs(wl.epilogue):
                idx = unflatten("ob", shape[:ax]) + ["l"] + unflatten(f"blk * {W} + q", shape[ax + 1:])
            lines += store(wl, ind + "        ", v, "xi", idx)
            return lines

        body += column_blocks(ind, nfull, tail, W, column)
        return finish(wl, body, [x_arg], cfg["parallel"], EXTRA)


def knob_values(space: ConfigSpace, name: str) -> list:
    return next(k.values for k in space.knobs if k.name == name)


# ---- LayerNormalization ----------------------------------------------------------------------

def _layernorm_geometry(wl: Workload):
    a = wl.anchor
    shape = wl.spec(a.args[0]).shape
    ax = axis_index(a.attrs.get("axis", -1), len(shape))
    return shape, ax, math.prod(shape[:ax]), math.prod(shape[ax:])


def _const_arg(wl: Workload, ref: str) -> bool:
    return ref.startswith("p") or (ref.startswith("i") and wl.spec(ref).const)


CHUNK = 4096


def _chunked_sum(L: int, acc: str, term, ind: str) -> list:
    """Lines setting the float64 `acc` to the sum of `term(index)` over the row [base, base + L):
    float32 partial sums over chunks of CHUNK elements (loops LLVM vectorises), added in float64."""
    n, tail = divmod(L, CHUNK)
    lines = [f"{ind}{acc} = np.float64(0.0)"]
    if n:
        lines += [f"{ind}for c in range({n}):",
                  f"{ind}    cb = base + c * {CHUNK}",
                  f"{ind}    pc = np.float32(0.0)",
                  f"{ind}    for i in range({CHUNK}):",
                  f"{ind}        pc += {term('np.uintp(cb + i)')}",
                  f"{ind}    {acc} += np.float64(pc)"]
    if tail:
        lines += [f"{ind}pc = np.float32(0.0)",
                  f"{ind}for i in range({tail}):",
                  f"{ind}    pc += {term(f'np.uintp(base + {n * CHUNK} + i)')}",
                  f"{ind}{acc} += np.float64(pc)"]
    return lines


@register
class LayerNorm(Template):
    name = "layernorm"

    def matches(self, wl: Workload) -> bool:
        a = wl.anchor
        if a.op != "LayerNormalization" or not a.args[0].startswith("i") or len(a.args) < 2:
            return False
        if not _plain_float(wl, a.args[0]) or not chain_ok(wl):
            return False
        return all(_const_arg(wl, r) for r in a.args[1:3] if r)

    def space(self, wl: Workload) -> ConfigSpace:
        shape, ax, rows, L = _layernorm_geometry(wl)
        sp = ConfigSpace()
        # two passes (mean, then squared deviations) or one (sum and sum of squares in float64)
        sp.define_knob("statistics", ["two_pass", "one_pass_f64"])
        define_rows(sp, rows)
        return sp

    def default_config(self, wl: Workload, space: ConfigSpace):
        shape, ax, rows, L = _layernorm_geometry(wl)
        vals = {"statistics": "two_pass"}
        vals.update(default_rows(rows, 2 * rows * L, knob_values(space, "rows_per_task")))
        return space.from_values(vals)

    def build(self, wl: Workload, cfg) -> Kernel:
        a = wl.anchor
        shape, ax, rows, L = _layernorm_geometry(wl)
        dt = wl.outputs[0].dtype
        T = ctor(dt)
        one_pass = cfg["statistics"] == "one_pass_f64"
        at = np.dtype(np.float64) if (L > 4096 or one_pass) else np.dtype(dt)
        A = ctor(at)
        eps = lit(a.attrs.get("epsilon", 1e-5), at)
        x_arg = int(a.args[0][1:])
        X = f"in{x_arg}"
        has_b = len(a.args) > 2 and bool(a.args[2])
        cast = (lambda e: e) if at == dt else (lambda e: f"{A}({e})")
        zero, rl = lit(0, at), lit(1.0 / L, at)

        body, ind = tasks_loop(rows, cfg["rows_per_task"], [])
        body += [f"{ind}base = o * {L}"]
        if one_pass:
            body += [f"{ind}s = {zero}", f"{ind}ss = {zero}", f"{ind}for i in range({L}):",
                     f"{ind}    xv = {cast(f'{X}[np.uintp(base + i)]')}",
                     f"{ind}    s += xv", f"{ind}    ss += xv * xv",
                     f"{ind}mean = s * {rl}",
                     f"{ind}var = max(ss * {rl} - mean * mean, {zero})"]
        elif at != dt and np.dtype(dt) == np.float32:
            # long float32 rows: float32 vector sums over chunks of CHUNK elements, added up in
            # float64 (as accurate as the float32 path of shorter rows, at float32's vector width)
            body += _chunked_sum(L, "s", lambda i: f"{X}[{i}]", ind)
            body += [f"{ind}mean = s * {rl}", f"{ind}mean32 = np.float32(mean)"]
            body += _chunked_sum(L, "v", lambda i: f"({X}[{i}] - mean32) * ({X}[{i}] - mean32)", ind)
            body += [f"{ind}var = v * {rl}"]
        else:
            body += row_fold(L, "base", lambda i: cast(f"{X}[{i}]"), lambda p, q: f"{p} + {q}", zero, "s", ind)
            body += [f"{ind}mean = s * {rl}"]
            body += [f"{ind}v = {zero}", f"{ind}for i in range({L}):",
                     f"{ind}    d = {cast(f'{X}[np.uintp(base + i)]')} - mean", f"{ind}    v += d * d",
                     f"{ind}var = v * {rl}"]
        body += [f"{ind}inv = {lit(1, at)} / math.sqrt(var + {eps})"]
        if at != dt:
            body += [f"{ind}mean_t = {T}(mean)", f"{ind}inv_t = {T}(inv)"]
        else:
            body += [f"{ind}mean_t = mean", f"{ind}inv_t = inv"]
        body += [f"{ind}for i in range({L}):", f"{ind}    xi = np.uintp(base + i)"]
        v = f"(({X}[xi] - mean_t) * inv_t * scale[i]" + (" + bias[i])" if has_b else ")")
        idx = None
        if epilogue_inputs(wl.epilogue):
            idx = unflatten("o", shape[:ax]) + unflatten("i", shape[ax:])
        body += store(wl, ind + "    ", v, "xi", idx)

        refs = [r for r in a.args[1:3] if r]
        names = ["scale", "bias"][:len(refs)]
        params = {r: wl.params[r] for r in refs if r.startswith("p")}
        tail_shape = shape[ax:]

        def pack(consts):
            out = {}
            for r, name in zip(refs, names):
                v = params[r] if r in params else consts[int(r[1:])]
                out[name] = np.array(np.broadcast_to(np.asarray(v, dt), tail_shape)).reshape(-1)
            return out

        return finish(wl, body, [x_arg], cfg["parallel"], packed=names, pack=pack)


# ---- Reduce* ---------------------------------------------------------------------------------

def _reduce_axes(wl: Workload):
    """Sorted reduced axes (a tuple; empty = no reduction), or None when not inlined."""
    a = wl.anchor
    rank = len(wl.spec(a.args[0]).shape)
    if len(a.args) > 1 and a.args[1]:
        if not a.args[1].startswith("p"):
            return None
        axes = [int(v) for v in np.ravel(wl.params[a.args[1]])]
    elif "axes" in a.attrs:
        axes = [int(v) for v in a.attrs["axes"]]
    else:
        axes = []
    if not axes:
        return () if int(a.attrs.get("noop_with_empty_axes", 0)) else tuple(range(rank))
    return tuple(sorted({axis_index(v, rank) for v in axes}))


def _groups(shape, axes) -> list:
    """Adjacent axes merged into (size, reduced, stride) groups; size-1 axes dropped."""
    st = strides(shape)
    out = []
    for k, d in enumerate(shape):
        if d == 1:
            continue
        red = k in axes
        if out and out[-1][1] == red:
            out[-1] = (out[-1][0] * d, red, st[k])
        else:
            out.append((d, red, st[k]))
    return out


def _reduce_geometry(wl: Workload):
    shape = wl.spec(wl.anchor.args[0]).shape
    axes = _reduce_axes(wl)
    groups = _groups(shape, axes)
    count = math.prod(d for d, r, s in groups if r)
    row = bool(groups) and groups[-1][1]            # reduced axes innermost
    inner = 1 if row or not groups else groups[-1][0]
    kept = [(d, s) for d, r, s in (groups if row else groups[:-1]) if not r]
    red = [(d, s) for d, r, s in groups if r]
    outer = math.prod(d for d, s in kept)
    return dict(shape=shape, axes=axes, count=count, row=row, inner=inner, kept=kept, red=red, outer=outer)


@register
class Reduce(Template):
    name = "reduce"

    def matches(self, wl: Workload) -> bool:
        a = wl.anchor
        if a.op not in REDUCES or not a.args[0].startswith("i"):
            return False
        # the epilogue may end in another type (ReduceMax -> Equal gives bool)
        x = wl.spec(a.args[0])
        if x.layout is not None or x.dtype not in (np.float32, np.float64) or wl.outputs[0].layout is not None:
            return False
        return _reduce_axes(wl) is not None and chain_ok(wl)

    def space(self, wl: Workload) -> ConfigSpace:
        g = _reduce_geometry(wl)
        sp = ConfigSpace()
        if g["row"]:
            define_rows(sp, g["outer"])
        else:
            sp.define_knob("vector_width", col_widths(g["inner"]))
            define_rows(sp, g["outer"] * -(-g["inner"] // 16))
        return sp

    def default_config(self, wl: Workload, space: ConfigSpace):
        g = _reduce_geometry(wl)
        total = g["outer"] * g["inner"] * g["count"]
        vals, rows = {}, g["outer"]
        if not g["row"]:
            vals["vector_width"] = w = min(space.knobs[0].values, key=lambda w: abs(w - 64))
            rows = g["outer"] * -(-g["inner"] // w)
        vals.update(default_rows(rows, total, knob_values(space, "rows_per_task")))
        return space.from_values(vals)

    def build(self, wl: Workload, cfg) -> Kernel:
        g = _reduce_geometry(wl)
        op = wl.anchor.op
        dt = wl.spec(wl.anchor.args[0]).dtype        # the reduction's type; the epilogue may change it
        T = ctor(dt)
        summing = op not in ("ReduceMax", "ReduceMin")
        at = np.dtype(np.float64) if summing and g["count"] > 1024 else np.dtype(dt)
        A = ctor(at)
        x_arg = int(wl.anchor.args[0][1:])
        X = f"in{x_arg}"
        RPT = cfg["rows_per_task"]
        init = {"ReduceMax": lit(-np.inf, at), "ReduceMin": lit(np.inf, at),
                "ReduceProd": lit(1, at)}.get(op, lit(0, at))

        def comb(p, q):
            return {"ReduceMax": f"fmax({p}, {q})", "ReduceMin": f"fmin({p}, {q})",
                    "ReduceProd": f"{p} * {q}"}.get(op, f"{p} + {q}")

        def load(i):
            v = f"{X}[{i}]" if at == dt else f"{A}({X}[{i}])"
            if op in ("ReduceSumSquare", "ReduceL2"):
                return f"({v} * {v})"
            return f"abs({v})" if op == "ReduceL1" else v

        def post(s):
            if op == "ReduceMean":
                s = f"{s} * {lit(1.0 / g['count'], at)}"
            elif op == "ReduceL2":
                s = f"math.sqrt({s})"
            elif op == "ReduceLogSum":
                s = f"math.log({s})"
            return s if at == dt else f"{T}({s})"

        kept, red = g["kept"], g["red"]

        def kept_base(ind, o):
            """Input offset of kept-outer index `o` (its groups split by div/mod)."""
            terms, rest = [], 1
            for d, s in reversed(kept):
                e = o if rest == 1 else f"({o} // {rest})"
                if rest * d != g["outer"]:
                    e = f"({e} % {d})"
                terms.append(f"{e} * {s}")
                rest *= d
            return [f"{ind}base = " + (" + ".join(reversed(terms)) if terms else "0")]

        def red_loops(ind, inner_red):
            """Nested loops over the reduced groups (all but the innermost if `inner_red`)."""
            loops = red[:-1] if inner_red else red
            lines, off = [], "base"
            for k, (d, s) in enumerate(loops):
                lines += [f"{ind}for r{k} in range({d}):"]
                ind += "    "
                lines += [f"{ind}b{k} = {off} + r{k} * {s}"]
                off = f"b{k}"
            return lines, ind, off

        if g["row"]:
            L = red[-1][0]
            body, ind = tasks_loop(g["outer"], RPT, [])
            body += kept_base(ind, "o")
            body += [f"{ind}tot = {init}"]
            loops, ind2, off = red_loops(ind, True)
            body += loops
            body += row_fold(L, off, load, comb, init, "s", ind2)
            body += [f"{ind2}tot = {comb('tot', 's')}"]
            body += store(wl, ind, post("tot"), "o")
            return finish(wl, body, [x_arg], cfg["parallel"], EXTRA)

        I = g["inner"]
        W = min(cfg["vector_width"], I)
        nfull, tail = I // W, I % W
        nblk = nfull + (tail > 0)
        body, ind = tasks_loop(g["outer"] * nblk, RPT, [f"acc = carray(stack_empty({W}, {A}), {W})"])
        body += [f"{ind}ob = o // {nblk}", f"{ind}blk = o % {nblk}"]
        body += kept_base(ind, "ob")
        body += [f"{ind}base = base + blk * {W}"]

        def column(ind, width):
            lines = [f"{ind}for q in range({width}):", f"{ind}    acc[q] = {init}"]
            loops, ind2, off = red_loops(ind, False)
            lines += loops
            lines += [f"{ind2}xb = np.uintp({off})",
                      f"{ind2}for q in range({width}):",
                      f"{ind2}    acc[q] = {comb('acc[q]', load('xb + np.uintp(q)'))}"]
            lines += [f"{ind}for q in range({width}):"]
            lines += store(wl, ind + "    ", post("acc[q]"), f"np.uintp(ob * {I} + blk * {W} + q)")
            return lines

        body += column_blocks(ind, nfull, tail, W, column)
        return finish(wl, body, [x_arg], cfg["parallel"], EXTRA)
