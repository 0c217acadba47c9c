"""The schedule space of a te kernel, derived from its loop structure (Ansor's sketch rules for CPUs).

Rules, applied to the kernel plan (lower.py has already inlined elementwise stages and fused an
output into the reduction it reads at its own indices: Ansor's always-inline and fuse-consumer):

* vectorise the innermost spatial axis: it is split into tiles of whole vectors of the target
  (`tile_n`, in elements), one constant-trip loop of lanes innermost;
* multi-level tiling of a stage with reuse (a reduction over two or more spatial axes, "SSRSRS"):
  a spatial axis other than the last (`row_axis`) is split into register rows (`tile_m`; the tile,
  tile_m x tile_n, is a stack array written out row by row: Ansor's cache_write; `row_axis2` and
  `tile_m2` add rows along a second axis, as a conv's output pixels x channel blocks), row tiles are
  grouped into one work item (`m_group`, the S1 level), the outermost reduce axis is split in
  blocks reused by the grouped tiles (`k_block`: R0 / R1), and the innermost reduce axis is
  unrolled (`k_unroll`);
* every loop outside the tile is fused into one parallel loop of work items, walked rows-first or
  columns-first (`order`);
* rfactor: a reduction whose innermost axis runs along contiguous memory may put the lanes on it
  instead (`vectorize`), with `k_unroll` independent sets of lanes summed at the store;
* an elementwise stage gets rows per item (`tile_m`) and vector tiles (`tile_n`).

Annotation picks a value per knob; the default comes from the target's registers and FMA pipes
(the GEMM's cost model), so an untuned kernel starts near a tuned one on any CPU.
"""
from __future__ import annotations

import math

import numpy as np

from .. import target
from ..kernels.gemm_space import MR_CANDIDATES, model_cost
from ..kernels.space import ConfigSpace
from .expr import Read, Select, walk
from .lower import KernelPlan

VECTORS = (1, 2, 3, 4)            # tile_n candidates, in vectors
SECOND_ROWS = (1, 2, 3, 4)        # tile_m2 candidates
GROUPS = (1, 2, 4, 8)
K_BLOCKS = (512, 256, 128, 64, 32)
UNROLL = (1, 2, 4, 8)
UNROLL_STEPS = (0, 16, 64)        # Ansor's auto_unroll_max_step: taps of a reduction written out
MAX_UNROLLED = 96                 # unrolled statements (taps x register rows): numba typed 63 in 1.5 s, 126 in 3.5 s
MAX_ELEMWISE_TILE = 64            # vectors an elementwise item stores (rows x tile_n)


def rules(p: KernelPlan) -> list:
    """The derivation rules that apply to a plan, in the order they shape its loop nest."""
    n = len(p.tensor.shape)
    out = ["vectorize-inner"]
    if p.reduce is not None and n >= 2:
        out.append("multi-level-tiling")
    elif p.reduce is not None:
        out.append("reduce-per-lane")
    elif n >= 2:
        out.append("row-tiles")
    if p.reduce is not None and reduce_vectorizable(p):
        out.append("rfactor")
    out.append("parallel-fuse")
    return out


def row_axes(p: KernelPlan) -> list:
    """Spatial axes that may give a register tile its rows: any but the last (the lanes'), of
    extent above one (a conv's output channels as well as its output rows)."""
    shape = p.tensor.shape
    return [d for d in range(len(shape) - 1) if shape[d] > 1] or [len(shape) - 2]


def row_axis(p: KernelPlan, v: dict) -> int:
    """The row axis of an annotation (the knob exists only where there is a choice)."""
    return v.get("row_axis", row_axes(p)[0])


def _inner(p: KernelPlan):
    """The expression of the kernel's innermost loop: what is reduced, or what is stored."""
    return p.reduce.source if p.reduce is not None else p.value


def _reads(p: KernelPlan) -> list:
    return [r for r in walk(_inner(p)) if isinstance(r, Read)]


def _uses(r: Read, var, dims=slice(None)) -> bool:
    """Whether the read's indices in `dims` move with `var`."""
    return any(x is var for ix in r.indices[dims] for x in walk(ix))


def shared_loads(p: KernelPlan, d: int) -> int:
    """Reads of the kernel's inner expression that are vectors (they vary along the lanes) and
    the same for every row of axis `d`: loaded once per step for all the tile's rows (B in a
    matmul tiled over rows of A; the input in a conv tiled over output channels)."""
    return sum(_uses(r, p.axis[-1]) and not _uses(r, p.axis[d]) for r in _reads(p))


def _contiguous_along(p: KernelPlan, var) -> bool:
    """Whether some read of the kernel's inner expression moves along its last (contiguous)
    dimension with `var`."""
    return any(_uses(r, var, slice(-1, None)) for r in _reads(p))


def _strided_reads(p: KernelPlan, var) -> int:
    """Reads that would be gathers with the lanes on `var`: they move with it along a dimension
    other than their last."""
    return sum(_uses(r, var, slice(None, -1)) for r in _reads(p))


def reduce_vectorizable(p: KernelPlan) -> bool:
    """Ansor's rfactor rule, for CPUs: a reduction whose innermost axis runs along contiguous memory
    for some read and spans at least a vector may put the lanes on it (a row's sum or max)."""
    a = p.reduce.axes[-1]
    return a.hi - a.lo >= lanes_of(p) and _contiguous_along(p, a)


def unrolled(p: KernelPlan, v: dict) -> int:
    """Taps of the reduction written out whole under annotation `v`, or 0 (no `unroll`, or its
    outermost axis split in k blocks)."""
    a0 = p.reduce.axes[0]
    if not v.get("unroll", 0) or v.get("k_block", a0.hi - a0.lo) != a0.hi - a0.lo:
        return 0
    return math.prod(a.hi - a.lo for a in p.reduce.axes)


def unroll_steps(p: KernelPlan) -> list:
    """`unroll` candidates: 0, and the least step that writes out the whole reduction when it
    has more than one tap and at most the largest step. Writing out part of one (a conv's window
    under its channel loop) gained nothing on ResNet-18's convs and made compiles of guarded
    windows take 5-10 s."""
    taps = math.prod(a.hi - a.lo for a in p.reduce.axes)
    return [0] + [next(u for u in UNROLL_STEPS if u >= taps)] if 1 < taps <= UNROLL_STEPS[-1] else [0]


def lanes_of(p: KernelPlan) -> int:
    """Vector lanes of the output's compute type (float16 is computed in float32)."""
    return target.current().lanes(4 if p.tensor.dtype == "float16" else np.dtype(p.tensor.dtype).itemsize)


def space(p: KernelPlan) -> ConfigSpace:
    shape = list(p.tensor.shape)
    n, inner = len(shape), shape[-1]
    tg = target.current()
    lanes = lanes_of(p)
    sp = ConfigSpace()
    if inner <= lanes:
        nrs = [inner]
    else:
        nrs = [v * lanes for v in VECTORS if (v - 1) * lanes < inner]
    sp.define_knob("tile_n", nrs)
    tiled = "multi-level-tiling" in rules(p)
    if n >= 2:
        axes = row_axes(p)
        if len(axes) > 1:
            sp.define_knob("row_axis", axes)
        rows = max(shape[d] for d in axes)
        mrs = [m for m in MR_CANDIDATES if m <= rows] or [rows]
        sp.define_knob("tile_m", mrs)
        if tiled:
            sp.define_knob("m_group", [g for g in GROUPS if g <= -(-rows // mrs[0])])
            if len(axes) > 1:       # register rows along a second axis too (-1: none)
                sp.define_knob("row_axis2", [-1, *axes])
                sp.define_knob("tile_m2", [t for t in SECOND_ROWS if t <= rows])
        sp.define_reorder("order", ["m", "n"], candidates=[["m", "n"], ["n", "m"]])
    if p.reduce is not None:
        ext0 = p.reduce.axes[0].hi - p.reduce.axes[0].lo
        if reduce_vectorizable(p):
            sp.define_knob("vectorize", ["spatial", "reduce"])
        if tiled:
            sp.define_knob("k_block", [ext0] + [c for c in K_BLOCKS if c < ext0 and ext0 % c == 0])
        last = p.reduce.axes[-1].hi - p.reduce.axes[-1].lo
        sp.define_annotate("k_unroll", [u for u in UNROLL if u <= last])
        steps = unroll_steps(p)
        if len(steps) > 1:
            sp.define_annotate("unroll", steps, absent=0)       # (logs of before it: not written out)

    def ok(cfg):
        v = cfg.values
        vec = -(-v["tile_n"] // lanes)
        mr = v.get("tile_m", 1)
        if n >= 2 and mr > shape[row_axis(p, v)]:
            return False
        row_tiles = -(-shape[row_axis(p, v)] // mr) if n >= 2 else 1
        rows = mr                               # register rows: tile_m x tile_m2
        r2 = v.get("row_axis2", -1)
        if r2 >= 0:
            if r2 == row_axis(p, v) or v["tile_m2"] < 2 or v["tile_m2"] > shape[r2]:
                return False
            rows *= v["tile_m2"]
        elif v.get("tile_m2", 1) != 1:
            return False
        if tiled and row_tiles % v["m_group"]:
            return False                        # grouped tiles never repeat a tile
        if n >= 2 and v["order"][0] == "n":     # the same kernel as rows first, unless both repeat
            nr = 1 if v.get("vectorize") == "reduce" else min(v["tile_n"], inner)
            if -(-inner // nr) == 1 or row_tiles // v.get("m_group", 1) == 1:
                return False
        if v.get("vectorize") == "reduce":       # one output per row: no column tiles, no k blocks
            return (v["tile_n"] == nrs[0] and v.get("k_block", ext0) == ext0 and not v.get("unroll", 0)
                    and rows * v["k_unroll"] <= tg.max_tile_vectors)
        if p.reduce is None:
            return rows * vec <= MAX_ELEMWISE_TILE
        if rows * vec > tg.max_tile_vectors:
            return False                        # the accumulators would not fit the registers
        if tiled and v["k_block"] != ext0 and v["m_group"] == 1:
            return False                        # a k block only pays when grouped tiles reuse it
        if v.get("unroll", 0):
            taps = unrolled(p, v)
            if not taps or v["k_unroll"] != 1 or taps * rows > MAX_UNROLLED:
                return False                    # (the innermost axis written out: k_unroll is moot)
        return True

    sp.constraint = ok
    return sp


def default_values(p: KernelPlan, sp: ConfigSpace | None = None) -> dict:
    """The annotation an untuned kernel runs: the register tile of least modelled cost on this
    target for a tiled reduction; a vector per tile and one row per item otherwise."""
    sp = sp or space(p)
    knobs = {k.name: k.values for k in sp.knobs}
    base = {name: vals[0] for name, vals in knobs.items()}
    if "order" in base:
        base["order"] = ["m", "n"]
    if "k_block" in base:
        base["k_block"] = knobs["k_block"][0]
    if "k_unroll" in base:
        base["k_unroll"] = 1
    if "row_axis2" in base:
        base["row_axis2"], base["tile_m2"] = -1, 1
    if "unroll" in base:                # the whole (small) reduction written out: a depthwise window
        base["unroll"] = knobs["unroll"][-1]           # ran 15% faster
    if "row_axis" in base:              # rows that share the most vector loads
        base["row_axis"] = max(knobs["row_axis"], key=lambda d: (shared_loads(p, d), d))
    if "vectorize" in base:
        strided = _strided_reads(p, p.axis[-1]) > _strided_reads(p, p.reduce.axes[-1])
        base["vectorize"] = "reduce" if strided else "spatial"
        if base["vectorize"] == "reduce":   # independent chains to cover the FMA latency
            if "unroll" in base:
                base["unroll"] = 0
            tg = target.current()
            base["k_unroll"] = max(u for u in knobs["k_unroll"] if u <= max(1, tg.accumulators_in_flight // 2))
            return base
    if "multi-level-tiling" not in rules(p):
        return base
    shape = p.tensor.shape
    M, N = math.prod(shape[:-1]), shape[-1]
    K = math.prod(a.hi - a.lo for a in p.reduce.axes)
    best, best_cost = base, None
    for unroll in ([base["unroll"], 0] if base.get("unroll") else [None]):   # written out if a tile allows
        for mr in knobs["tile_m"]:
            for nr in knobs["tile_n"]:
                vals = {**base, "tile_m": mr, "tile_n": nr}
                if unroll is not None:
                    vals["unroll"] = unroll
                if not sp.is_valid(sp.from_values(vals)):
                    continue
                cost = (model_cost(M, K, N, 1, mr, nr) * (1.02 if shape[row_axis(p, base)] % mr else 1.0), -mr * nr)
                if best_cost is None or cost < best_cost:
                    best, best_cost = vals, cost
        if best_cost is not None:
            break
    return best


def steps(p: KernelPlan, v: dict) -> list:
    """The schedule as TVM-like steps, for `print_best` and messages."""
    shape = list(p.tensor.shape)
    n = len(shape)
    out = [f"rules: {', '.join(rules(p))}"]
    lanes = lanes_of(p)
    out.append(f"split axis {n - 1} ({shape[-1]}) by {v['tile_n']}; vectorize {min(lanes, v['tile_n'])} lanes")
    if n >= 2:
        r = row_axis(p, v)
        out.append(f"split axis {r} ({shape[r]}) by {v['tile_m']} register rows"
                   + (f", {v['m_group']} row tiles per item" if v.get("m_group", 1) > 1 else ""))
        if v.get("row_axis2", -1) >= 0:
            r2 = v["row_axis2"]
            out.append(f"split axis {r2} ({shape[r2]}) by {v['tile_m2']} more register rows "
                       f"(a tile of {v['tile_m'] * v['tile_m2']} rows)")
    if p.reduce is not None:
        if "k_block" in v and v["k_block"] != p.reduce.axes[0].hi - p.reduce.axes[0].lo:
            out.append(f"split reduce axis 0 by {v['k_block']} (reused by the grouped tiles)")
        if v.get("k_unroll", 1) > 1:
            out.append(f"unroll reduce axis {len(p.reduce.axes) - 1} by {v['k_unroll']}")
        if unrolled(p, v):
            out.append(f"unroll the reduction's {unrolled(p, v)} taps inside the lane loop "
                       f"(auto_unroll_max_step {v['unroll']})")
        out.append("cache_write: the register tile accumulates on the stack")
    order = "rows" if v.get("order", ["m", "n"])[0] == "m" else "columns"
    out.append(f"fuse the outer loops into one parallel loop, consecutive items along {order}")
    return out


def loop_features(p: KernelPlan, v: dict) -> dict:
    """What the cost model cannot read from knob names, computed from the loop nest an annotation
    makes: registers held, loads per multiply-add, gathers, padding guards, parallel items and
    their balance over the threads, work past the axes' ends, and the inner trip count."""
    shape = list(p.tensor.shape)
    n = len(shape)
    tg = target.current()
    lanes = lanes_of(p)
    vred = v.get("vectorize") == "reduce"
    rows_of = {}                                    # axis -> register rows along it
    if n >= 2:
        rows_of[row_axis(p, v)] = min(v["tile_m"], shape[row_axis(p, v)])
        if v.get("row_axis2", -1) >= 0:
            rows_of[v["row_axis2"]] = min(v["tile_m2"], shape[v["row_axis2"]])
    rows = math.prod(rows_of.values()) if rows_of else 1
    width = 1 if vred else min(v["tile_n"], shape[-1])
    vectors = (v.get("k_unroll", 1) if vred else -(-width // lanes))
    lane_var = p.reduce.axes[-1] if vred else p.axis[-1]
    loads = sum(math.prod(k for d, k in rows_of.items() if _uses(r, p.axis[d])) * (vectors if _uses(r, lane_var) else 1)
                for r in _reads(p))
    gathers = _strided_reads(p, lane_var)
    guards = sum(isinstance(x, Select) for x in walk(_inner(p)))
    tiles = {d: -(-shape[d] // k) for d, k in rows_of.items()}
    covered = math.prod(tiles[d] * rows_of[d] for d in tiles) * (-(-shape[-1] // width) * width)
    exact = math.prod(shape[d] for d in tiles) * shape[-1]
    items = math.prod(shape[:-1]) // max(1, math.prod(shape[d] for d in rows_of)) \
        * math.prod(tiles.values()) // max(1, v.get("m_group", 1)) * -(-shape[-1] // width)
    inner = p.reduce.axes[-1].hi - p.reduce.axes[-1].lo if p.reduce is not None else 1
    return {"accumulator_vectors": float(rows * vectors), "loads_per_fma": loads / max(1.0, rows * vectors),
            "gathers": float(gathers), "guards": float(guards), "log_items": math.log2(max(items, 1)),
            "thread_imbalance": -(-items // tg.threads) * tg.threads / max(items, 1) - 1.0,
            "waste": covered / exact - 1.0, "log_inner_trip": math.log2(inner)}
