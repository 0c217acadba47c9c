"""The GEMM's config space and its default: the knobs of kernels/gemm.py and a small model of the
target's FMA pipes and registers that picks the register tile an untuned module runs.
"""
from __future__ import annotations

from .. import target
from .space import ConfigSpace
from .workload import Workload

MR_CANDIDATES = [1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16]
NR_VECTORS = [1, 2, 3, 4]      # tile_n candidates, in vectors of the target
GROUPS = [1, 2, 4, 8, 16, 32]  # m_group candidates: M tiles a work item runs (the last group may be short)
MAX_PANEL_BYTES = 96 * 1024    # a packed B panel on the stack (matmul) stays well inside L2
STREAM_AT_FLOPS = 64           # cores of this many FLOPs a cycle outrun the L2's supply of a B panel ...
L2_LINE_CYCLES = 3.0           # ... which arrives at about a 64-byte line (a vector) every 3 cycles


def nr_candidates(lanes: int) -> list:
    """tile_n candidates: whole vectors (16, 32, 48, 64 float32 on AVX-512)."""
    return [v * lanes for v in NR_VECTORS]


def gemm_space(M: int, K: int, N: int, runtime_b: bool, viewed: bool = False) -> ConfigSpace:
    """Register tile (tile_m x tile_n), loop order over tiles, M tiles per work item (m_group),
    k blocking across grouped tiles, k unrolling, independent accumulator sets for alternate k
    steps (k_split: hides the FMA latency of tiles of few accumulators), indexing style (2-d
    views or flat unsigned offsets), store rows rolled or written out, and for a runtime B
    whether each item first packs its columns of B into a stack panel (required when
    N % tile_n != 0). Strided views of the operands (`viewed`) are indexed flat."""
    tg = target.current()
    lanes, most = tg.lanes(4), tg.max_tile_vectors
    sp = ConfigSpace()
    mrs = [m for m in MR_CANDIDATES if m <= M] or [M]
    # one vector, or more when N is wide enough and the padding past N is under a vector (or a
    # sixteenth of N); N narrower than a vector is one tile
    nrs = [n for n in nr_candidates(lanes)
           if n == lanes or n <= N and (-N % n < lanes or -N % n <= N // 16)] if N >= lanes else [N]
    if runtime_b and N >= lanes:
        nrs = [n for n in nrs if N % n == 0] or nrs
    sp.define_knob("tile_m", mrs)
    sp.define_knob("tile_n", nrs)
    sp.define_reorder("order", ["m", "n"], candidates=[["m", "n"], ["n", "m"]])
    mt_max = -(-M // min(mrs))
    sp.define_knob("m_group", [x for x in GROUPS if x <= mt_max])
    kbs = [K] + [c for c in (512, 256, 128) if c < K and K % c == 0]
    sp.define_knob("k_block", kbs)
    sp.define_annotate("k_unroll", [u for u in (1, 2, 4) if u <= K])
    sp.define_knob("k_split", [s for s in (1, 2, 4) if s <= K])
    sp.define_knob("index", ["flat"] if viewed else ["2d", "flat"])
    sp.define_annotate("store", ["rolled", "unrolled"])
    if runtime_b:
        sp.define_knob("pack_b", [False, True])

    def ok(cfg):
        mr, nr = cfg["tile_m"], cfg["tile_n"]
        if mr * -(-nr // lanes) > most:
            return False
        mt = -(-M // mr)
        if cfg["m_group"] > mt:
            return False                    # (a group past the tiles runs as one of all of them)
        if cfg["order"][0] == "n" and (mt <= cfg["m_group"] or nr >= N):
            return False                    # one group of row tiles or one column tile: the "mn" kernel
        if cfg["k_block"] != K and cfg["m_group"] == 1:
            return False                    # k blocking only reorders work across grouped tiles
        ks = cfg["k_split"]
        if ks > 1 and (cfg["m_group"] > 1 or cfg["k_unroll"] % ks or nr < 2 * lanes
                       or ks * mr * -(-nr // lanes) > most):
            return False    # one set per unrolled k step, in registers (with one vector of
            #                 columns LLVM vectorised along k instead and ran 7-12x slower)
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
               tg: target.Target | None = None) -> float:
    """Estimated cycles of a register tile choice on target `tg` (default: the current one).

    Per k step the tile issues mr * v multiply-adds (v = nr / lanes vectors) on the FMA pipes,
    and each accumulator waits for its previous FMA, so fewer than pipes x latency accumulators
    (8 on AVX-512 machines; times `split` sets) leave the pipes idle; it also issues mr broadcasts
    and v vector loads of B, which stream from L2 at about one vector per cycle (a 1-row tile, as
    in a classifier, is bound by them). A tile whose accumulators, B vectors and broadcasts exceed
    the vector registers (`registers_needed`) spills. Work items are dealt to the target's
    threads (a partial last round costs a full one); tiles past M are recomputed (shifted) and
    columns past N are padding. Calibrated on the transformer's shapes on AVX-512 (Zen 5), one
    thread: 4x64, 6x64 and 8x32 tiles ran at 0.9-1.0 of the best (about 2x numpy's sgemm), 2x32 at
    0.5, 2x64 at 0.6 (0.73 with k_split 2).

    On cores of 64 FLOPs a cycle a B panel (K x NR) larger than half the L1 streams from the L2 for
    every tile, at about a line every L2_LINE_CYCLES: a tile of few rows then waits for B (Xeon,
    Sapphire Rapids class, B in cache: 4x64 tiles ran 1.22-1.28x the time of 8x32 and 6x64 on the
    transformer's dense layers, 5x64 1.0-1.2x; untuned in its module 8x32 ran 0.71-0.80 of 4x64's time).
    """
    tg = tg or target.current()
    vec = -(-nr // tg.lanes(4))
    fmas = mr * vec
    stream = vec * L2_LINE_CYCLES if tg.flops_per_cycle >= STREAM_AT_FLOPS and K * nr * 4 > tg.l1d_bytes // 2 else 0.0
    per_k = max(fmas / float(tg.fma_pipes), float(tg.fma_latency) / split, vec * 1.0, stream) + 0.1 * (mr + vec)
    if registers_needed(mr, vec, tg) > tg.vector_registers:
        per_k += 8.0
    item = K * per_k + fmas * (6 + split) + 40  # k loop, then zero + epilogue + store, overhead
    items = batch * -(-M // mr) * -(-N // nr)
    return -(-items // tg.threads) * item


def registers_needed(mr: int, vec: int, tg: target.Target) -> int:
    """Vector registers the k loop of an mr x vec tile keeps. Without the FMA's broadcast operand
    (AVX2) LLVM hoists a k step's mr broadcasts above its FMAs and streams the B vectors through
    one register: 3 x 32 (12 accumulators + 3 + 1) compiles without a spill and ran 0.81-0.90 of
    2 x 32's time on the transformer's four dense shapes (AMD EPYC Zen 3), where 6 x 16 and 4 x 24
    (+ 6 and + 4 broadcasts) spilled and ran 1.9-2.0x. With AVX-512, calibrated with 32 registers:
    accumulators + B vectors + rows, less 2."""
    if not tg.broadcast_in_fma:
        return tg.hoisted_registers(mr, vec)
    return mr * vec + vec + mr - 2


HEAVY_EPILOGUE = {"Gelu", "Erf", "Tanh", "Exp", "Log", "Sigmoid", "Softplus", "Mish", "Elu", "Selu",
                  "Pow", "Sin", "Cos"}


def default_gemm(wl: Workload, space: ConfigSpace, M: int, K: int, N: int, batch: int,
                 runtime_b: bool, viewed: bool = False):
    """The tile (and k_split) of least `model_cost`; rows of the store written out unless the
    epilogue is heavy (unrolled stores ran 1.15-1.3x faster for 6x64 and 8x32 tiles; with a GELU
    they only cost compile time: a 16-row GELU tile took 9 s to compile instead of 3 s)."""
    store = "rolled" if any(op.op in HEAVY_EPILOGUE for op in wl.epilogue) else "unrolled"
    splits = next(k.values for k in space.knobs if k.name == "k_split")
    tg = target.current()
    best, best_cost = None, None
    for mr in space.knobs[0].values:
        for nr in space.knobs[1].values:
            for split in splits:
                vals = {"tile_m": mr, "tile_n": nr, "order": ["m", "n"], "m_group": 1,
                        "k_block": K, "k_unroll": split, "k_split": split,
                        "index": "flat" if viewed else "2d", "store": store}
                if runtime_b:
                    vals["pack_b"] = N % nr != 0
                cfg = space.from_values(vals)
                if not space.is_valid(cfg):
                    continue
                # ties (common once the FMA pipes are saturated) go to tiles that divide M (no
                # shifted last tile), then to no split, then to larger tiles
                cost = model_cost(M, K, N, batch, mr, nr, split, tg) * (1.02 if M % mr else 1.0)
                c = (round(cost), split, -mr * nr)
                if best_cost is None or c < best_cost:
                    best, best_cost = cfg, c
    return _share_packed_panel(space, _tile_order(space, best, M, K, N, tg), M, N, batch, tg)


def beyond_l2(M: int, K: int, N: int, mr: int, nr: int, order: str, l2_bytes: int) -> int:
    """Bytes of A and B a GEMM reads from beyond the L2 in loop order `order` ("mn": each row tile
    walks every column tile, so B is read once per row tile unless it fits the L2; "nm": A once per
    column tile unless it fits)."""
    a, b = M * K * 4, K * N * 4
    if order == "mn":
        return a + b * (-(-M // mr) if b > l2_bytes else 1)
    return b + a * (-(-N // nr) if a > l2_bytes else 1)


def _tile_order(space: ConfigSpace, cfg, M: int, K: int, N: int, tg):
    """Column tiles outside (each walking every row tile) where that reads less from beyond the L2:
    ViT-B/16's dense layers (197 x 768 -> 2304 and 3072, 7-9 MB of weights) read B again for each of
    their 25 row tiles and ran at 2.3-2.5x onnxruntime's time (Xeon, Sapphire Rapids class). Where B
    fits the L2 (the transformer's, up to 1 MB) the orders tie and rows stay outside."""
    if cfg is None:
        return cfg
    mr, nr = cfg["tile_m"], cfg["tile_n"]
    if beyond_l2(M, K, N, mr, nr, "nm", tg.l2_bytes) >= beyond_l2(M, K, N, mr, nr, "mn", tg.l2_bytes):
        return cfg
    cols = space.from_values(dict(cfg.values, order=["n", "m"]))
    return cols if space.is_valid(cols) else cfg


def _share_packed_panel(space: ConfigSpace, cfg, M: int, N: int, batch: int, tg):
    """A tile that packs its columns of B first shares the panel among as many row tiles of one
    work item as leave the items outnumbering the threads 8 to 1: ViT-B/16's Q x K^T (197 x 64 @
    64 x 197, 12 heads) ran at 0.76-0.83 of its time with 4 (AMD EPYC Zen 4; onnxruntime ~0.6),
    and at 0.93 of that with all its 20 tiles in groups of 16 and 4 (Intel Xeon, Emerald Rapids:
    the panel's copy is paid once per group)."""
    if cfg is None or not cfg.values.get("pack_b") or cfg["k_split"] > 1:
        return cfg
    mt, nt = -(-M // cfg["tile_m"]), -(-N // cfg["tile_n"])
    for g in reversed(GROUPS[1:]):
        if g in space.knobs[3].values and g <= mt and batch * -(-mt // g) * nt >= 8 * tg.threads:
            grouped = space.from_values(dict(cfg.values, m_group=g))
            if space.is_valid(grouped):
                return grouped
    return cfg
