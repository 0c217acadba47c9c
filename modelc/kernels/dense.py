"""Dense (x[..., K] @ w[K, N] + b) with a register-tiled GEMM and a fused elementwise epilogue.

The weights are packed once at compile time as [N/NR, K, NR] (N padded with zero columns up to a
multiple of NR), so the NR columns of one register tile are one contiguous run per k. One parallel
loop runs over (batch x) M tiles x N tiles; the register tile is MR rows x NR columns on a stack
array. For every k the kernel loads MR scalars of x (broadcast) and runs one NR-wide loop of
multiply-adds whose MR rows are written out in the source (shared/PERFORMANCE.md: that, a stack
accumulator and constant trip counts are what LLVM vectorises; the assembly shows MR x NR/16 zmm
accumulators held in registers, MR broadcasts and NR/16 loads per k). The epilogue (bias,
activation, residual add ...) is applied to the tile as it is stored; columns past N are never
stored. A last M tile that would run past M is shifted up to end at M and stores only its rows
not stored yet, so no element is written twice (a residual input may share the output buffer).

`gemm_source` is shared with the batch_matmul template (kernels/matmul.py), whose right operand is
a runtime tensor read in place or packed per tile into a stack buffer.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..errors import ModelcError
from .expr import FASTMATH, SUPPORTED
from .layout import same_as_plain
from .space import ConfigSpace
from .template import Kernel, Template, epilogue, epilogue_inputs, register, source
from .workload import Workload

MR_CANDIDATES = [1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16]
NR_CANDIDATES = [16, 32, 48, 64]
MAX_TILE_VECTORS = 28          # accumulators that fit in AVX-512's 32 vector registers
LANES = 16                     # float32 lanes of one AVX-512 vector
MAX_PANEL_BYTES = 96 * 1024    # a packed B panel on the stack (matmul) stays well inside L2


# math.erf compiles to a scalar library call that keeps the epilogue loop from vectorising (the
# GELU dense of the transformer ran at 0.15x of the same kernel without it); this rational
# approximation (Eigen's / XLA's float32 erf, max abs error 3.3e-7 on [-6, 6]) vectorises.
# np.divide keeps numba from emitting a division-by-zero check (q <= -0.0142 anyway).
FAST_ERF = [
    f"@numba.njit(fastmath={FASTMATH}, inline='always')",
    "def fast_erf(x):",
    "    x = x if x < np.float32(4.0) else np.float32(4.0)",
    "    x = x if x > np.float32(-4.0) else np.float32(-4.0)",
    "    x2 = x * x",
    "    p = x2 * np.float32(-2.72614225801306e-10) + np.float32(2.77068142495902e-08)",
    "    p = x2 * p + np.float32(-2.10102402082508e-06)",
    "    p = x2 * p + np.float32(-5.69250639462346e-05)",
    "    p = x2 * p + np.float32(-7.34990630326855e-04)",
    "    p = x2 * p + np.float32(-2.95459980854025e-03)",
    "    p = x2 * p + np.float32(-1.60960333262415e-02)",
    "    q = x2 * np.float32(-1.45660718464996e-05) + np.float32(-2.13374055278905e-04)",
    "    q = x2 * q + np.float32(-1.68282697438203e-03)",
    "    q = x2 * q + np.float32(-7.37332916720468e-03)",
    "    q = x2 * q + np.float32(-1.42647390514189e-02)",
    "    return np.divide(x * p, q)",
    "",
]


# ---- the shared GEMM code generator -------------------------------------------------------------

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

    def __post_init__(self):
        if self.row_dims is None:
            self.row_dims = (self.M,)
        if self.col_dims is None:
            self.col_dims = (self.N,)


def _unravel(flat: str, dims: tuple, prefix: str) -> tuple[list, list]:
    """Lines computing the indices of `flat` over `dims` (row-major), and their expressions."""
    lines, exprs = [], []
    total = math.prod(dims)
    for k, d in enumerate(dims):
        if d == 1:
            exprs.append("0")
            continue
        s = math.prod(dims[k + 1:])
        e = flat if s == 1 else f"({flat}) // {s}"
        if s * d < total:
            e = f"({e}) % {d}"
        lines.append(f"{prefix}{k} = {e}")
        exprs.append(f"{prefix}{k}")
    return lines, exprs


def _batch_offset(bidx: list, out_batch: tuple, own: tuple) -> str:
    """Flat batch index of an operand with batch dims `own` broadcast against `out_batch`."""
    lead = len(out_batch) - len(own)
    terms, stride = [], 1
    for k in reversed(range(len(own))):
        if own[k] != 1 and bidx[lead + k] != "0":
            terms.append(bidx[lead + k] if stride == 1 else f"{bidx[lead + k]} * {stride}")
        stride *= own[k]
    return " + ".join(reversed(terms)) or "0"


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
    flat = cfg.get("index", "2d") == "flat"
    pack = (not g.b_packed) and cfg.get("pack_b", False)
    MT = -(-M // MR)
    NT = -(-N // NR)
    if MT % G:
        raise ModelcError(f"m_group {G} does not divide the {MT} M tiles")
    MG = MT // G
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
    body.append(f"for it in prange({total}):")
    ind = "    "
    if cfg.get("order", "mn") == "mn":
        body += [f"{ind}nt = it % {NT}", f"{ind}rest = it // {NT}",
                 f"{ind}mg = rest % {MG}", f"{ind}bi = rest // {MG}"]
    else:
        body += [f"{ind}mg = it % {MG}", f"{ind}rest = it // {MG}",
                 f"{ind}nt = rest % {NT}", f"{ind}bi = rest // {NT}"]
    blines, bidx = _unravel("bi", g.batch, "b")
    body += [ind + ln for ln in blines]
    ba = _batch_offset(bidx, g.batch, g.a_batch)
    bb = _batch_offset(bidx, g.batch, g.b_batch)
    body += [f"{ind}ba = {ba}", f"{ind}bb = {bb}", f"{ind}n0 = nt * {NR}"]
    if ragged_n:
        body.append(f"{ind}nv = min({NR}, {N} - n0)")
    nacc = max(G, S) * MR * NR
    body.append(f"{ind}acc = carray(stack_empty({nacc}, np.float32), {nacc})")
    if pack:
        # copy B[bb, :, n0:n0 + NR] into a zero-padded [K, NR] panel (flat, unsigned offsets:
        # 2-d indexing of the panel kept this copy from vectorising)
        body += [f"{ind}bp = carray(stack_empty({K * NR}, np.float32), {K * NR})",
                 f"{ind}for k in range({K}):",
                 f"{ind}    so = np.uintp((bb * {K} + k) * {N} + n0)",
                 f"{ind}    do = np.uintp(k * {NR})"]
        if ragged_n:
            body += [f"{ind}    for j in range(nv):",
                     f"{ind}        bp[do + np.uintp(j)] = {g.b}[so + np.uintp(j)]",
                     f"{ind}    for j in range(nv, {NR}):",
                     f"{ind}        bp[do + np.uintp(j)] = np.float32(0.0)"]
        else:
            body += [f"{ind}    for j in range({NR}):",
                     f"{ind}        bp[do + np.uintp(j)] = {g.b}[so + np.uintp(j)]"]

    # the M tiles of this work item
    def tile_start(gexpr, ind):
        mt = f"mg * {G} + {gexpr}" if G > 1 else "mg"
        lines = [f"{ind}mt = {mt}"]
        if shift:
            lines += [f"{ind}m0 = min(mt * {MR}, {M - MR})", f"{ind}skip = mt * {MR} - m0"]
        else:
            lines += [f"{ind}m0 = mt * {MR}"]
        return lines

    def micro(ind, k, gbase, q=0):
        """One k step of the MR x NR tile at acc[gbase ...], into accumulator set q."""
        lines = []
        if flat:
            lines.append(f"{ind}xo = np.uintp((ba * {M} + m0) * {K} + {k})")
            for r in range(MR):
                lines.append(f"{ind}x{r} = {g.a}[xo + np.uintp({r * K})]" if r else f"{ind}x0 = {g.a}[xo]")
            if g.b_packed:
                lines.append(f"{ind}wo = np.uintp((nt * {K} + {k}) * {NR})")
                wv = f"{g.b}[wo + np.uintp(j)]"
            elif pack:
                lines.append(f"{ind}wo = np.uintp(({k}) * {NR})")
                wv = "bp[wo + np.uintp(j)]"
            else:
                lines.append(f"{ind}wo = np.uintp((bb * {K} + {k}) * {N} + n0)")
                wv = f"{g.b}[wo + np.uintp(j)]"
        else:
            for r in range(MR):
                lines.append(f"{ind}x{r} = A[ba, m0 + {r}, {k}]" if r else f"{ind}x0 = A[ba, m0, {k}]")
            if pack:
                lines.append(f"{ind}wo = np.uintp(({k}) * {NR})")
            wv = (f"B[nt, {k}, j]" if g.b_packed else "bp[wo + np.uintp(j)]" if pack
                  else f"B[bb, {k}, n0 + j]")
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

    body += [f"{ind}for q in range({nacc}):", f"{ind}    acc[q] = np.float32(0.0)"]
    store = _store_unrolled if cfg.get("store") == "unrolled" else _store
    if G == 1:
        body += tile_start("0", ind)
        body += k_loop(ind, "0", K, "")
        if S > 1:       # independent accumulator sets for alternate k steps: sum them
            body += [f"{ind}for q in range({MR * NR}):",
                     f"{ind}    acc[q] = " + " + ".join(f"acc[q + {t * MR * NR}]" if t else "acc[q]"
                                                   for t in range(S))]
        body += store(wl, g, ind, MR, NR, shift, ragged_n, "")
    else:
        # G tiles share this item's B columns; with k blocking, a block of B rows is reused
        # by all G tiles before the next block (their accumulators live on the stack)
        nkb = K // KC
        inner = ind
        if nkb > 1:
            body.append(f"{ind}for kb in range({nkb}):")
            inner = ind + "    "
        body.append(f"{inner}for gi in range({G}):")
        body += tile_start("gi", inner + "    ")
        body.append(f"{inner}    ga = gi * {MR * NR}")
        body += k_loop(inner + "    ", f"kb * {KC}" if nkb > 1 else "0", KC if nkb > 1 else K, "ga + ")
        body.append(f"{ind}for gi in range({G}):")
        body += tile_start("gi", ind + "    ")
        body.append(f"{ind}    ga = gi * {MR * NR}")
        body += store(wl, g, ind + "    ", MR, NR, shift, ragged_n, "ga + ")
    if any("math.erf(" in ln for ln in body):
        body = [ln.replace("math.erf(", "fast_erf(") for ln in body]
        return source(args, dtypes, body, extra=FAST_ERF, views=views)
    return source(args, dtypes, body, views=views)


def _store(wl: Workload, g: Gemm, ind: str, MR: int, NR: int, shift: bool, ragged_n: bool,
           gbase: str) -> list:
    """Bias + epilogue + store of the MR x NR tile (a loop over its rows); only rows >= skip and
    columns < N are stored."""
    M, N = g.M, g.N
    _, bidx = _unravel("bi", g.batch, "b")     # computed at the item's start
    lines = [f"{ind}for r in range({'skip, ' if shift else ''}{MR}):",
             f"{ind}    m = m0 + r"]
    rl, ridx = _unravel("m", g.row_dims, "r")
    lines += [f"{ind}    {ln}" for ln in rl]
    lines += [f"{ind}    ob = np.uintp((bi * {M} + m) * {N} + n0)",
              f"{ind}    ra = {gbase}r * {NR}",
              f"{ind}    for j in range({'nv' if ragged_n else NR}):"]
    pre = ind + "        "
    v = "acc[ra + j]"
    if g.bias:
        lines.append(f"{pre}a = {v} + {g.bias}[n0 + j]")
        v = "a"
    idx = list(bidx) + list(ridx) + (["n0 + j"] if g.col_dims else [])
    el, final = epilogue(wl, wl.epilogue, v, idx, g.out_shape, wl.outputs[0].dtype,
                         f"v{wl.anchor.index}")
    lines += [pre + ln for ln in el]
    lines.append(f"{pre}out0[ob + np.uintp(j)] = {final}")
    return lines


def _store_unrolled(wl: Workload, g: Gemm, ind: str, MR: int, NR: int, shift: bool, ragged_n: bool,
                    gbase: str) -> list:
    """`_store` with the tile's MR rows written out in the source (constant accumulator offsets)."""
    lines = []
    M, N = g.M, g.N
    _, bidx = _unravel("bi", g.batch, "b")
    for r in range(MR):
        pre = ind
        if shift:
            lines.append(f"{ind}if {r} >= skip:")
            pre = ind + "    "
        lines.append(f"{pre}m = m0 + {r}")
        rl, ridx = _unravel("m", g.row_dims, f"r{r}_")
        lines += [pre + ln for ln in rl]
        lines.append(f"{pre}ob = np.uintp((bi * {M} + m) * {N} + n0)")
        lines.append(f"{pre}for j in range({'nv' if ragged_n else NR}):")
        v = f"acc[{gbase}{r * NR} + j]"
        if g.bias:
            lines.append(f"{pre}    a = {v} + {g.bias}[n0 + j]")
            v = "a"
        idx = list(bidx) + list(ridx) + (["n0 + j"] if g.col_dims else [])
        el, final = epilogue(wl, wl.epilogue, v, idx, g.out_shape, wl.outputs[0].dtype,
                             f"v{wl.anchor.index}", var=f"e{r}_")
        lines += [pre + "    " + ln for ln in el]
        lines.append(f"{pre}    out0[ob + np.uintp(j)] = {final}")
    return lines


# ---- knobs and the default config ----------------------------------------------------------------

def gemm_space(M: int, K: int, N: int, runtime_b: bool) -> ConfigSpace:
    """Register tile (tile_m x tile_n), loop order over tiles, M tiles per work item (m_group),
    k blocking across grouped tiles, k unrolling, independent accumulator sets for alternate k
    steps (k_split: hides the FMA latency of tiles of few accumulators), indexing style (2-d
    views or flat unsigned offsets), store rows rolled or written out, and for a runtime B
    whether each item first packs its columns of B into a stack panel (required when
    N % tile_n != 0)."""
    sp = ConfigSpace()
    mrs = [m for m in MR_CANDIDATES if m <= M] or [M]
    nrs = [n for n in NR_CANDIDATES if n == 16 or n <= N and (-N % n < 16 or -N % n <= N // 16)] \
        if N >= 16 else [N]
    if runtime_b and N >= 16:
        nrs = [n for n in nrs if N % n == 0] or nrs
    sp.define_knob("tile_m", mrs)
    sp.define_knob("tile_n", nrs)
    sp.define_reorder("order", ["m", "n"], candidates=[["m", "n"], ["n", "m"]])
    mt_max = -(-M // min(mrs))
    sp.define_knob("m_group", [x for x in (1, 2, 4, 8) if x <= mt_max])
    kbs = [K] + [c for c in (512, 256, 128) if c < K and K % c == 0]
    sp.define_knob("k_block", kbs)
    sp.define_annotate("k_unroll", [u for u in (1, 2, 4) if u <= K])
    sp.define_knob("k_split", [s for s in (1, 2, 4) if s <= K])
    sp.define_knob("index", ["2d", "flat"])
    sp.define_annotate("store", ["rolled", "unrolled"])
    if runtime_b:
        sp.define_knob("pack_b", [False, True])

    def ok(cfg):
        mr, nr = cfg["tile_m"], cfg["tile_n"]
        if mr * -(-nr // LANES) > MAX_TILE_VECTORS:
            return False
        mt = -(-M // mr)
        if mt % cfg["m_group"]:
            return False                    # grouped tiles never repeat a tile
        if cfg["k_block"] != K and cfg["m_group"] == 1:
            return False                    # k blocking only reorders work across grouped tiles
        ks = cfg["k_split"]
        if ks > 1 and (cfg["m_group"] > 1 or cfg["k_unroll"] % ks or nr < 32
                       or ks * mr * -(-nr // LANES) > MAX_TILE_VECTORS):
            return False    # one set per unrolled k step, in registers (with 16 columns LLVM
            #                 vectorised along k instead and ran 7-12x slower)
        if runtime_b:
            if cfg["pack_b"] and K * nr * 4 > MAX_PANEL_BYTES:
                return False
            if not cfg["pack_b"] and N % nr:
                return False                # reading B in place needs whole tiles
        return True

    sp.constraint = ok
    return sp


def knob_values(cfg) -> dict:
    v = dict(cfg.values)
    v["order"] = "mn" if v["order"][0] == "m" else "nm"
    return v


def model_cost(M: int, K: int, N: int, batch: int, mr: int, nr: int, split: int = 1,
               threads: int = 2) -> float:
    """Estimated cycles of a register tile choice (a simple model of Zen 5 / AVX-512).

    Per k step the tile issues mr * v multiply-adds (v = nr / 16 vectors) on 2 FMA pipes of
    latency 4, so fewer than 8 accumulators (times `split` sets) leave the pipes idle; it also
    issues mr broadcasts and v vector loads of B, which stream from L2 at about one vector per
    cycle (a 1-row tile, as in a classifier, is bound by them). A tile whose accumulators, B
    vectors and broadcasts exceed the 32 vector registers spills. Work items are dealt to
    `threads` cores (a partial last round costs a full one); tiles past M are recomputed (shifted)
    and columns past N are padding. Calibrated on the transformer's shapes, one thread: 4x64,
    6x64 and 8x32 tiles ran at 0.9-1.0 of the best (about 2x numpy's sgemm), 2x32 at 0.5, 2x64
    at 0.6 (0.73 with k_split 2).
    """
    vec = -(-nr // LANES)
    fmas = mr * vec
    per_k = max(fmas / 2.0, 4.0 / split, vec * 1.0) + 0.1 * (mr + vec)
    if fmas + vec + mr > 34:
        per_k += 8.0
    item = K * per_k + fmas * (6 + split) + 40  # k loop, then zero + epilogue + store, overhead
    items = batch * -(-M // mr) * -(-N // nr)
    return -(-items // threads) * item


HEAVY_EPILOGUE = {"Gelu", "Erf", "Tanh", "Exp", "Log", "Sigmoid", "Softplus", "Mish", "Elu", "Selu",
                  "Pow", "Sin", "Cos"}


def default_gemm(wl: Workload, space: ConfigSpace, M: int, K: int, N: int, batch: int,
                 runtime_b: bool):
    """The tile (and k_split) of least `model_cost`; rows of the store written out unless the
    epilogue is heavy (unrolled stores ran 1.15-1.3x faster for 6x64 and 8x32 tiles; with a GELU
    they only cost compile time: a 16-row GELU tile took 9 s to compile instead of 3 s)."""
    store = "rolled" if any(op.op in HEAVY_EPILOGUE for op in wl.epilogue) else "unrolled"
    splits = next(k.values for k in space.knobs if k.name == "k_split")
    best, best_cost = None, None
    for mr in space.knobs[0].values:
        for nr in space.knobs[1].values:
            for split in splits:
                vals = {"tile_m": mr, "tile_n": nr, "order": ["m", "n"], "m_group": 1,
                        "k_block": K, "k_unroll": split, "k_split": split, "index": "2d",
                        "store": store}
                if runtime_b:
                    vals["pack_b"] = N % nr != 0
                cfg = space.from_values(vals)
                if not space.is_valid(cfg):
                    continue
                # ties (common: the FMA pipes are saturated from 16 accumulators) go to tiles
                # that divide M (no shifted last tile), then to no split, then to larger tiles
                cost = model_cost(M, K, N, batch, mr, nr, split) * (1.02 if M % mr else 1.0)
                c = (round(cost), split, -mr * nr)
                if best_cost is None or c < best_cost:
                    best, best_cost = cfg, c
    return best


# ---- the Dense template ----------------------------------------------------------------------------

def _plain(t) -> bool:
    return same_as_plain(t.shape, t.layout)


def epilogue_ok(wl: Workload, anchor_shape: tuple) -> bool:
    if len(wl.outputs) != 1 or not _plain(wl.outputs[0]):
        return False
    out = wl.outputs[0]
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


@register
class Dense(Template):
    name = "dense"

    def _dims(self, wl: Workload):
        x = wl.spec(wl.anchor.args[0])
        w = wl.spec(wl.anchor.args[1])
        K, N = w.shape
        M = math.prod(x.shape[:-1])
        return M, K, N, x

    def matches(self, wl: Workload) -> bool:
        a = wl.anchor
        if a.op != "Dense" or len(a.args) < 2:
            return False
        if not all(r.startswith("i") for r in a.args[:2]):
            return False
        x, w = wl.spec(a.args[0]), wl.spec(a.args[1])
        if not w.const or len(w.shape) != 2 or len(x.shape) < 1 or x.shape[-1] != w.shape[0]:
            return False
        if x.dtype != np.float32 or w.dtype != np.float32 or not _plain(x) or w.layout:
            return False
        if len(a.args) > 2 and a.args[2]:
            b = a.args[2]
            if not b.startswith("i") or not wl.spec(b).const or wl.spec(b).shape != (w.shape[1],):
                return False
        if math.prod(x.shape[:-1]) == 0 or w.shape[0] == 0 or w.shape[1] == 0:
            return False
        return epilogue_ok(wl, tuple(x.shape[:-1]) + (w.shape[1],))

    def space(self, wl: Workload) -> ConfigSpace:
        M, K, N, _ = self._dims(wl)
        return gemm_space(M, K, N, runtime_b=False)

    def default_config(self, wl: Workload, space: ConfigSpace):
        M, K, N, _ = self._dims(wl)
        return default_gemm(wl, space, M, K, N, 1, runtime_b=False)

    def build(self, wl: Workload, cfg) -> Kernel:
        M, K, N, x = self._dims(wl)
        a = wl.anchor
        vals = knob_values(cfg)
        NR = vals["tile_n"]
        NT = -(-N // NR)
        x_arg = int(a.args[0][1:])
        w_arg = int(a.args[1][1:])
        has_bias = len(a.args) > 2 and bool(a.args[2])
        b_arg = int(a.args[2][1:]) if has_bias else None
        g = Gemm(M=M, K=K, N=N, a=f"in{x_arg}", b="w", b_packed=True,
                 out_shape=wl.outputs[0].shape, row_dims=tuple(x.shape[:-1]),
                 bias="bias" if has_bias else None)
        args = ["out0", f"in{x_arg}", "w"] + (["bias"] if has_bias else [])
        args += [f"in{k}" for k in epilogue_inputs(wl.epilogue) if k != x_arg]
        dtypes = [np.float32] * (3 + has_bias) + [wl.inputs[int(s[2:])].dtype for s in args[3 + has_bias:]]
        src = gemm_source(wl, g, vals, args, dtypes)

        def pack(consts):
            wv = np.asarray(consts[w_arg], np.float32)
            wp = np.zeros((K, NT * NR), np.float32)
            wp[:, :N] = wv
            res = {"w": np.ascontiguousarray(wp.reshape(K, NT, NR).transpose(1, 0, 2)).reshape(-1)}
            if has_bias:
                res["bias"] = np.ascontiguousarray(np.asarray(consts[b_arg], np.float32).reshape(-1))
            return res

        return Kernel(src, args, pack)
