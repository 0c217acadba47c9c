"""The register-tiled GEMM code generator shared by Dense (kernels/dense.py) and MatMul
(kernels/matmul.py): out[b, m, n] = sum_k A[b, m, k] * B[b, k, n], then a fused epilogue.

One parallel loop runs over (batch x) M tiles x N tiles; the register tile is MR rows x NR
columns on a stack array. For every k the kernel loads MR scalars of A (broadcast) and runs one
NR-wide loop of multiply-adds whose MR rows are written out in the source (shared/PERFORMANCE.md:
that, a stack accumulator and constant trip counts are what LLVM vectorises; the assembly shows
MR x NR/16 zmm accumulators held in registers, MR broadcasts and NR/16 loads per k). B is either
packed once at compile time as [N/NR, K, NR] (`pack_b`: N padded with zero columns up to a
multiple of NR, so the NR columns of a tile are one contiguous run per k), or a runtime tensor
read in place or copied per work item into a [K, NR] panel on the stack. The epilogue (bias,
activation, residual add ...) is applied to the tile as it is stored; columns past N are never
stored. A last M tile that would run past M is shifted up to end at M and stores only its rows
not stored yet, so no element is written twice (a residual input may share the output buffer).
Operands may be strided views of their tensors (StridedMatMul: attention's heads read in place),
B's columns contiguous; then every offset is written out flat from the views' strides. The result
may be stored through strides too (`out_strides`: attention's heads merged back as they are stored).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .. import target
from ..errors import ModelcError
from ..ops.internal import stored_shape
from .codegen import ParallelItem, shifted_start, unravel_index
from .expr import SUPPORTED
from .intrinsics import calls_polynomial
from .layout import same_as_plain, strides
from .template import epilogue, source
from .workload import Workload


@dataclass
class Gemm:
    """One (batched) GEMM: out[b, m, n] = sum_k A[b, m, k] * B[b, k, n], then the epilogue."""
    M: int
    K: int
    N: int
    a: str                              # kernel argument of A (flat [BA, M, K])
    b: str                              # kernel argument of B (flat packed or [BB, K, N])
    b_packed: bool                      # B prepacked as [N/NR, K, NR] (no batch)
    out_shape: tuple                    # logical output shape (for the epilogue)
    batch: tuple = ()                   # output batch dims
    a_batch: tuple = ()                 # A's batch dims (right-aligned against `batch`)
    b_batch: tuple = ()
    row_dims: tuple = None              # output dims flattened into M (default (M,))
    col_dims: tuple = None              # output dims of N: (N,) or () for a 1-d B
    bias: str | None = None             # kernel argument of a bias [N]
    a_strides: tuple | None = None      # a strided view: element strides of (*a_batch, M, K)
    b_strides: tuple | None = None      # ... and of (*b_batch, K, N)
    out_strides: tuple | None = None    # stored transposed: element strides of (*batch, *row_dims, N)
    a_offset: int = 0                   # the views' first elements
    b_offset: int = 0

    def __post_init__(self):
        if self.row_dims is None:
            self.row_dims = (self.M,)
        if self.col_dims is None:
            self.col_dims = (self.N,)


def batch_offset(bidx: list, out_batch: tuple, own: tuple) -> str:
    """Flat batch index of an operand with batch dims `own` broadcast against `out_batch`."""
    lead = len(out_batch) - len(own)
    terms, stride = [], 1
    for k in reversed(range(len(own))):
        if own[k] != 1 and bidx[lead + k] != "0":
            terms.append(bidx[lead + k] if stride == 1 else f"{bidx[lead + k]} * {stride}")
        stride *= own[k]
    return " + ".join(reversed(terms)) or "0"


def batch_strided(bidx: list, out_batch: tuple, own: tuple, strides: tuple) -> str:
    """Element offset of a strided view's batch, its batch dims `own` broadcast against `out_batch`."""
    lead = len(out_batch) - len(own)
    terms = [f"{bidx[lead + k]} * {strides[k]}" for k in range(len(own))
             if own[k] != 1 and bidx[lead + k] != "0" and strides[k]]
    return " + ".join(terms) or "0"


def gemm_source(wl: Workload, g: Gemm, cfg: dict, args: list, dtypes: list) -> str:
    """The kernel source of GEMM `g` under config `cfg` (knob values) with epilogue `wl.epilogue`.

    cfg: tile_m, tile_n, order ("mn" | "nm"), m_group, k_block, k_unroll, k_split, index
    ("2d" | "flat"), store ("rolled" | "unrolled"), pack_b (runtime B only).
    """
    M, K, N = g.M, g.K, g.N
    MR, NR = cfg["tile_m"], cfg["tile_n"]
    G = cfg.get("m_group", 1)
    KC = cfg.get("k_block", K)
    U = cfg.get("k_unroll", 1)
    S = cfg.get("k_split", 1)
    if S > 1 and (G > 1 or U % S):
        raise ModelcError(f"k_split {S} needs m_group 1 and k_unroll a multiple of it")
    viewed = g.a_strides is not None or g.b_strides is not None
    sam, sak = g.a_strides[-2:] if g.a_strides is not None else (K, 1)
    sbk, sbn = g.b_strides[-2:] if g.b_strides is not None else (N, 1)
    flat = cfg.get("index", "2d") == "flat" or viewed
    if sbn not in (0, 1):
        raise ModelcError(f"B's columns {sbn} elements apart: the GEMM reads them contiguous")
    pack = (not g.b_packed) and cfg.get("pack_b", False)
    MT = -(-M // MR)
    NT = -(-N // NR)
    MG = -(-MT // G)         # groups of G M tiles, the last one short where G does not divide MT
    BATCH = math.prod(g.batch)
    BA, BB = math.prod(g.a_batch), math.prod(g.b_batch)
    shift = M % MR != 0
    ragged_n = N % NR != 0

    body, views = [], {}
    if not flat:
        views["A"] = (g.a, (BA, M, K))
        if g.b_packed:
            views["B"] = (g.b, (NT, K, NR))
        elif not pack:
            views["B"] = (g.b, (BB, K, N))
    total = BATCH * MG * NT
    ind = "    "
    item = ParallelItem(ind=ind)
    body.append(item.loop(total))
    if cfg.get("order", "mn") == "mn":
        body += item.take("nt", NT) + item.last("mg", MG, "bi")
    else:
        body += item.take("mg", MG) + item.last("nt", NT, "bi")
    blines, bidx = unravel_index("bi", g.batch, "b")
    body += [ind + ln for ln in blines]
    if viewed:      # ba, bb: element offsets of the operands' batch
        a_st = g.a_strides or strides(tuple(g.a_batch) + (M, K))
        b_st = g.b_strides or strides(tuple(g.b_batch) + (K, N))
        ba = " + ".join(t for t in (batch_strided(bidx, g.batch, g.a_batch, a_st[:-2]), str(g.a_offset))
                        if t != "0") or "0"
        bb = " + ".join(t for t in (batch_strided(bidx, g.batch, g.b_batch, b_st[:-2]), str(g.b_offset))
                        if t != "0") or "0"
    else:
        ba = batch_offset(bidx, g.batch, g.a_batch)
        bb = batch_offset(bidx, g.batch, g.b_batch)
    body += [f"{ind}ba = {ba}", f"{ind}bb = {bb}", f"{ind}n0 = nt * {NR}"]
    if ragged_n:
        body.append(f"{ind}nv = min({NR}, {N} - n0)")
    nkb = K // KC if G > 1 else 1
    # with k blocks, the G tiles' sums wait on the stack for the next block; without, each tile is
    # summed and stored before the next, in the one set of accumulators (constant offsets: registers)
    nacc = (G if nkb > 1 else S) * MR * NR
    body.append(f"{ind}acc = carray(stack_empty({nacc}, np.float32), {nacc})")
    if pack:
        # copy B[bb, :, n0:n0 + NR] into a zero-padded [K, NR] panel (flat, unsigned offsets:
        # 2-d indexing of the panel kept this copy from vectorising)
        def copy(ind, ragged):
            lines = [f"{ind}for k in range({K}):",
                     f"{ind}    so = np.uintp(bb + k * {sbk} + n0)" if viewed else
                     f"{ind}    so = np.uintp((bb * {K} + k) * {N} + n0)",
                     f"{ind}    do = np.uintp(k * {NR})",
                     f"{ind}    for j in range({'nv' if ragged else NR}):",
                     f"{ind}        bp[do + np.uintp(j)] = {g.b}[so + np.uintp(j)]"]
            return lines + ([f"{ind}    for j in range(nv, {NR}):",
                             f"{ind}        bp[do + np.uintp(j)] = np.float32(0.0)"] if ragged else [])
        body.append(f"{ind}bp = carray(stack_empty({K * NR}, np.float32), {K * NR})")
        if ragged_n:        # whole tiles copy rows of constant length (vectors); the last, its part
            body += [f"{ind}if nv == {NR}:"] + copy(ind + "    ", False) + [f"{ind}else:"] + copy(ind + "    ", True)
        else:
            body += copy(ind, False)

    # the M tiles of this work item's group
    tiles = f"min({G}, {MT} - mg * {G})" if MT % G else str(G)

    def tile_start(gexpr, ind):
        mt = f"mg * {G} + {gexpr}" if G > 1 else "mg"
        lines = [f"{ind}mt = {mt}"]
        if shift:
            lines += [f"{ind}m0 = {shifted_start(f'mt * {MR}', M, MR)}", f"{ind}skip = mt * {MR} - m0"]
        else:
            lines += [f"{ind}m0 = mt * {MR}"]
        return lines

    tg = target.current()
    by_row = tg.broadcasts_by_pixel(MR, -(-NR // tg.lanes(4)))

    def micro(ind, k, gbase, q=0):
        """One k step of the MR x NR tile at acc[gbase ...], into accumulator set q."""
        lines = []
        if flat:
            lines.append(f"{ind}xo = np.uintp(ba + m0 * {sam} + ({k}) * {sak})" if viewed else
                         f"{ind}xo = np.uintp((ba * {M} + m0) * {K} + {k})")
            xs = [f"{g.a}[xo + np.uintp({r * sam})]" if r else f"{g.a}[xo]" for r in range(MR)]
            if g.b_packed:
                lines.append(f"{ind}wo = np.uintp((nt * {K} + {k}) * {NR})")
                wv = f"{g.b}[wo + np.uintp(j)]"
            elif pack:
                lines.append(f"{ind}wo = np.uintp(({k}) * {NR})")
                wv = "bp[wo + np.uintp(j)]"
            elif viewed:
                lines.append(f"{ind}wo = np.uintp(bb + ({k}) * {sbk} + n0)")
                wv = f"{g.b}[wo + np.uintp(j)]"
            else:
                lines.append(f"{ind}wo = np.uintp((bb * {K} + {k}) * {N} + n0)")
                wv = f"{g.b}[wo + np.uintp(j)]"
        else:
            xs = [f"A[ba, m0 + {r}, {k}]" if r else f"A[ba, m0, {k}]" for r in range(MR)]
            if pack:
                lines.append(f"{ind}wo = np.uintp(({k}) * {NR})")
            wv = (f"B[nt, {k}, j]" if g.b_packed else "bp[wo + np.uintp(j)]" if pack
                  else f"B[bb, {k}, n0 + j]")
        if by_row:          # each row's broadcast, then its FMAs (the loads of B's row are shared)
            for r in range(MR):
                lines += [f"{ind}xv = {xs[r]}", f"{ind}for j in range({NR}):",
                          f"{ind}    acc[{gbase}{q * MR * NR + r * NR} + j] += xv * {wv}"]
            return lines
        lines += [f"{ind}x{r} = {x}" for r, x in enumerate(xs)]
        lines += [f"{ind}for j in range({NR}):", f"{ind}    wv = {wv}"]
        for r in range(MR):
            lines.append(f"{ind}    acc[{gbase}{q * MR * NR + r * NR} + j] += x{r} * wv")
        return lines

    def k_loop(ind, lo, n, gbase):
        """k over [lo, lo + n) with the body unrolled U times (and a remainder)."""
        lines = []
        u = U if n >= U else 1
        main = n - n % u
        base = "" if lo == "0" else f"{lo} + "
        if main and u == 1:
            lines.append(f"{ind}for k in range({main}):" if lo == "0" else
                         f"{ind}for k in range({lo}, {lo} + {main}):")
            lines += micro(ind + "    ", "k", gbase)
        elif main:
            lines += [f"{ind}for kk in range({main // u}):", f"{ind}    k = {base}kk * {u}"]
            for q in range(u):
                lines += micro(ind + "    ", f"k + {q}" if q else "k", gbase, q % S)
        for q in range(main, n):
            lines += micro(ind, f"{base}{q}", gbase)
        return lines

    zero = [f"for q in range({nacc}):", "    acc[q] = np.float32(0.0)"]
    store = _store_unrolled if cfg.get("store") == "unrolled" else _store
    if nkb == 1:
        # one tile, or G tiles sharing this item's columns of B (a packed panel) one after another
        inner = ind
        if G > 1:
            body.append(f"{ind}for gi in range({tiles}):")
            inner = ind + "    "
        body += tile_start("gi" if G > 1 else "0", inner)
        body += [inner + ln for ln in zero]
        body += k_loop(inner, "0", K, "")
        if S > 1:       # independent accumulator sets for alternate k steps: sum them
            body += [f"{inner}for q in range({MR * NR}):",
                     f"{inner}    acc[q] = " + " + ".join(f"acc[q + {t * MR * NR}]" if t else "acc[q]"
                                                     for t in range(S))]
        body += store(wl, g, inner, MR, NR, shift, ragged_n, "")
    else:
        # with k blocking, a block of B rows is reused by all G tiles before the next block
        body += [ind + ln for ln in zero]
        body.append(f"{ind}for kb in range({nkb}):")
        inner = ind + "    "
        body.append(f"{inner}for gi in range({tiles}):")
        body += tile_start("gi", inner + "    ")
        body.append(f"{inner}    ga = gi * {MR * NR}")
        body += k_loop(inner + "    ", f"kb * {KC}", KC, "ga + ")
        body.append(f"{ind}for gi in range({tiles}):")
        body += tile_start("gi", ind + "    ")
        body.append(f"{ind}    ga = gi * {MR * NR}")
        body += store(wl, g, ind + "    ", MR, NR, shift, ragged_n, "ga + ")
    # summed in order unless the epilogue evaluates a polynomial: with reassociation, a tile of one
    # vector of columns (a GEMV such as a squeeze-excitation layer's 672 -> 168, whose N admits no
    # wider tile) had LLVM vectorise the k loop with horizontal sums, 0.042 ms against 0.019 in
    # order (one thread, AMD EPYC Zen 4); wider tiles, the transformer's and ResNet's, ran the same
    return source(args, dtypes, body, views=views, reassoc=calls_polynomial(body))


def _row_offset(g: Gemm, bidx: list, ridx: list) -> tuple:
    """(the flat offset of row m's column n0 as source, the column's offset of lane j)."""
    M, N = g.M, g.N
    if g.out_strides is None:
        return f"np.uintp((bi * {M} + m) * {N} + n0)", "np.uintp(j)"
    st = g.out_strides
    terms = [f"{i} * {s}" for i, s in zip(list(bidx) + list(ridx), st[:-1]) if i != "0" and s]
    sn = st[-1]
    terms.append("n0" if sn == 1 else f"n0 * {sn}")
    return f"np.uintp({' + '.join(terms)})", "np.uintp(j)" if sn == 1 else f"np.uintp(j * {sn})"


def _store(wl: Workload, g: Gemm, ind: str, MR: int, NR: int, shift: bool, ragged_n: bool,
           gbase: str) -> list:
    """Bias + epilogue + store of the MR x NR tile (a loop over its rows); only rows >= skip and
    columns < N are stored."""
    _, bidx = unravel_index("bi", g.batch, "b")     # computed at the item's start
    lines = [f"{ind}for r in range({'skip, ' if shift else ''}{MR}):",
             f"{ind}    m = m0 + r"]
    rl, ridx = unravel_index("m", g.row_dims, "r")
    lines += [f"{ind}    {ln}" for ln in rl]
    ob, col = _row_offset(g, bidx, ridx)
    lines += [f"{ind}    ob = {ob}",
              f"{ind}    ra = {gbase}r * {NR}",
              f"{ind}    for j in range({'nv' if ragged_n else NR}):"]
    pre = ind + "        "
    v = "acc[ra + j]"
    if g.bias:
        lines.append(f"{pre}a = {v} + {g.bias}[n0 + j]")
        v = "a"
    idx = list(bidx) + list(ridx) + (["n0 + j"] if g.col_dims else [])
    el, final = epilogue(wl, wl.epilogue, v, idx, g.out_shape, wl.outputs[0].dtype,
                         f"v{wl.anchor.index}", fast_erf=True)
    lines += [pre + ln for ln in el]
    lines.append(f"{pre}out0[ob + {col}] = {final}")
    return lines


def _store_unrolled(wl: Workload, g: Gemm, ind: str, MR: int, NR: int, shift: bool, ragged_n: bool,
                    gbase: str) -> list:
    """`_store` with the tile's MR rows written out in the source (constant accumulator offsets)."""
    lines = []
    _, bidx = unravel_index("bi", g.batch, "b")
    for r in range(MR):
        pre = ind
        if shift:
            lines.append(f"{ind}if {r} >= skip:")
            pre = ind + "    "
        lines.append(f"{pre}m = m0 + {r}")
        rl, ridx = unravel_index("m", g.row_dims, f"r{r}_")
        lines += [pre + ln for ln in rl]
        ob, col = _row_offset(g, bidx, ridx)
        lines.append(f"{pre}ob = {ob}")
        lines.append(f"{pre}for j in range({'nv' if ragged_n else NR}):")
        v = f"acc[{gbase}{r * NR} + j]"
        if g.bias:
            lines.append(f"{pre}    a = {v} + {g.bias}[n0 + j]")
            v = "a"
        idx = list(bidx) + list(ridx) + (["n0 + j"] if g.col_dims else [])
        el, final = epilogue(wl, wl.epilogue, v, idx, g.out_shape, wl.outputs[0].dtype,
                             f"v{wl.anchor.index}", var=f"e{r}_", fast_erf=True)
        lines += [pre + "    " + ln for ln in el]
        lines.append(f"{pre}    out0[ob + {col}] = {final}")
    return lines


def plain(t) -> bool:
    """A tensor laid out as plain row-major memory (the GEMM reads its operands so)."""
    return same_as_plain(t.shape, t.layout)


def epilogue_ok(wl: Workload, anchor_shape: tuple) -> bool:
    """The GEMM stores one plain float32 output: the end of an elementwise chain of the
    anchor's shape, whose inputs broadcast against it and whose constants are scalars; or, for a
    product stored through strides (`y_strides`), the product alone."""
    if len(wl.outputs) != 1 or not plain(wl.outputs[0]):
        return False
    out = wl.outputs[0]
    a = wl.anchor
    if "y_strides" in a.attrs or "y_shape" in a.attrs:
        try:
            shape = stored_shape(tuple(anchor_shape), a.attrs.get("y_shape"), a.attrs.get("y_strides"))
        except ValueError:
            return False
        return not wl.epilogue and out.shape == shape and out.dtype == np.float32 and \
            wl.output_values[0] == f"v{a.index}"
    if out.shape != tuple(anchor_shape) or out.dtype != np.float32:
        return False
    if wl.output_values[0] != f"v{wl.ops[-1].index}":
        return False
    for op in wl.epilogue:
        if op.op not in SUPPORTED:
            return False
        for a in op.args:
            if a.startswith("v") and "." in a:
                return False
            if a.startswith("p") and wl.params[a].size != 1:
                return False
            if a.startswith("i"):
                s = wl.spec(a).shape
                if len(s) > len(out.shape) or any(
                        d not in (1, o) for d, o in zip(s[::-1], out.shape[::-1])):
                    return False
        if wl.spec(f"v{op.index}").shape != out.shape:
            return False
    return True


def pack_b(w: np.ndarray, NR: int) -> np.ndarray:
    """A constant [K, N] right operand packed as [N/NR, K, NR] (zero columns past N)."""
    K, N = w.shape
    NT = -(-N // NR)
    wp = np.zeros((K, NT * NR), np.float32)
    wp[:, :N] = np.asarray(w, np.float32)
    return wp.reshape(K, NT, NR).transpose(1, 0, 2)
