"""Rows and columns: how the reduction-family templates (softmax, layer norm, Reduce*, ArgMax,
LogSumExp, LRN, scans, TopK) lay out their work, and their shared knobs and defaults.

When the reduced axes are innermost (a softmax over the last axis, a layer norm, a ReduceMean over
H, W) every output is a contiguous *row* reduction, written as a plain scalar loop: with fast-math
adds and llvm.maxnum/minnum (intrinsics.fmax/fmin; numba's own max() is a select that LLVM will
not vectorise as a reduction) LLVM turns it into a vector reduction with interleaved accumulators.
When kept axes are innermost (a softmax over channels, a ReduceSum over axis 1) each block of
`vector_width` contiguous kept elements is a *column* reduction: a stack array of accumulators and
a lane loop per reduced position. One parallel loop runs over tasks of `rows_per_task` rows (or
column blocks); small workloads run serially by default (`parallel` knob): starting threads costs
a few microseconds.
"""
from __future__ import annotations

import math

import numpy as np

from .. import target
from .layout import strides
from .space import ConfigSpace
from .template import Kernel, anchor_ref, epilogue, epilogue_inputs, parallel_loop, source
from .workload import Workload

RPT_CANDIDATES = [1, 2, 4, 8, 16, 32, 64]
MAX_COLUMNS = 128             # the widest column block (its accumulators live on the stack)
# A column block's lane loop must stay a loop: a fully unrolled 16-lane loop had its accumulators
# promoted to registers and LLVM then vectorised the reduced axis instead, with gathers; loops of
# 64 lanes stay loops. That is LLVM's full-unroll threshold, not the machine's: the default width
# is the candidate nearest this many columns on every target.
LOOP_COLUMNS = 64
TASKS_PER_THREAD = 8          # tasks per thread by default: balance without many tiny tasks
# Starting the threads costs a few microseconds: about what one core spends on this many vector
# operations. Work is counted in element-ops, so the serial/parallel break-even grows with the
# vector width (131072 element-ops with 16 float32 lanes).
PARALLEL_MIN_VECTORS = 8192


def vector_columns() -> int:
    """Contiguous float32 columns in one vector of the target: the narrowest column block."""
    return target.current().lanes(4)


def parallel_min() -> int:
    """Element-ops below which a serial kernel is the default."""
    return PARALLEL_MIN_VECTORS * vector_columns()


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
    lines = [parallel_loop("it", nt)] + ["    " + ln for ln in prologue]
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
    """Column block widths: from one vector up to MAX_COLUMNS, doubling (see LOOP_COLUMNS)."""
    widths, w = [], vector_columns()
    while w <= min(inner, MAX_COLUMNS):
        widths.append(w)
        w *= 2
    return widths or [inner]


def define_row_or_column(sp: ConfigSpace, outer: int, inner: int, columns: bool | None = None):
    """Knobs of a reduction over rows or over blocks of `inner` contiguous columns (`columns`,
    by default when inner > 1)."""
    if (inner > 1 if columns is None else columns):
        sp.define_knob("vector_width", col_widths(inner))
        outer *= -(-inner // vector_columns())
    define_rows(sp, outer)


def define_rows(sp: ConfigSpace, rows: int):
    sp.define_knob("rows_per_task", [r for r in RPT_CANDIDATES if r <= rows] or [1])
    sp.define_annotate("parallel", [True, False])


def default_rows(rows: int, work: int, rpts: list) -> dict:
    """About TASKS_PER_THREAD tasks per thread; threads only for enough work (in element-ops:
    starting them costs a few microseconds, as much as a serial layer norm of 32k elements)."""
    t = target.current()
    want = max(1, rows // (TASKS_PER_THREAD * t.threads))
    rpt = min(rpts, key=lambda r: (abs(math.log2(r) - math.log2(want)), r))
    return {"rows_per_task": rpt, "parallel": t.threads > 1 and work >= parallel_min()}


def default_row_or_column(space: ConfigSpace, outer: int, inner: int, work: int,
                          columns: bool | None = None) -> dict:
    """Default knobs of `define_row_or_column`: columns in blocks of about LOOP_COLUMNS."""
    vals, rows = {}, outer
    if (inner > 1 if columns is None else columns):
        vals["vector_width"] = w = min(knob_values(space, "vector_width"), key=lambda w: abs(w - LOOP_COLUMNS))
        rows = outer * -(-inner // w)
    vals.update(default_rows(rows, work, knob_values(space, "rows_per_task")))
    return vals


def knob_values(space: ConfigSpace, name: str) -> list:
    return next(k.values for k in space.knobs if k.name == name)


def finish(wl: Workload, body: list, x_args: list, parallel: bool, extra=(), packed=(), pack=None):
    """The kernel of a reduction body reading inputs `x_args`, arrays `packed` (made by `pack`)
    and the epilogue's inputs."""
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


def plain_float(wl: Workload, ref: str, half: bool = False) -> bool:
    """`ref` and the output are plain float32 or float64 tensors of one dtype (or float16, with
    `half`, and no epilogue: the epilogues' code is float32/64)."""
    t = wl.spec(ref)
    floats = (np.float32, np.float64, np.float16) if half and not wl.epilogue else (np.float32, np.float64)
    return t.layout is None and t.dtype in floats and \
        wl.outputs[0].layout is None and wl.outputs[0].dtype == t.dtype


def axis_index(a, rank):
    a = int(a)
    return a + rank if a < 0 else a
