"""Direct 2-d convolution in the channel-blocked layout, with a register-tiled output.

Input [N, C/cb, H+2h, W+2h, cb] (its zero halo is the padding), weights packed once at compile
time as [K/KT, C/cb, KH, KW, cb, KT], output [N, K/KB, OH+2h', OW+2h', KB]. One parallel loop runs
over (image, output-channel tile, output row, output-column tile), or rows outside channel tiles
(`splits_by_rows`); the register tile is OWT output
pixels x KT output channels (KT = m x KB, m consecutive output blocks). For each input channel the
kernel loads OWT input scalars and runs one KT-wide loop of multiply-adds: the rows of the tile are
written out in the source and every index is unsigned, which is what let LLVM vectorise this
kernel (shared/PERFORMANCE.md); where hoisting every broadcast would spill, each pixel's broadcast
is loaded right before its FMAs (`Target.broadcasts_by_pixel`). The fused epilogue (bias,
activation, residual add ...) is applied to the tile before it is stored. A last tile that would
run past the row is shifted left to end at the row's end (it recomputes a few pixels rather than
branching in the inner loop).
With `c_chunk`, an item is one output-channel tile whose tiles run over a share of the input
channels at a time (the share's weights stay in the L1), their sums kept on the stack between passes.
"""
from __future__ import annotations

import itertools

import numpy as np

from .. import target
from .codegen import ParallelItem, packed_kernel, row_waste, shifted_start
from .conv_geometry import computed_taps, conv_geometry, flattened, padding_share
from .expr import SUPPORTED
from .intrinsics import calls_polynomial
from .layout import offset
from .space import ConfigSpace
from .template import Kernel, Template, epilogue, register
from .workload import Workload

OWT_CANDIDATES = [1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16, 20, 28]
BOUNDED_TAPS = 0.25       # a share of (output pixel, tap) reads in the padding from which tiles skip them
PASS_FLOATS = 32 << 10    # the sums an output-channel tile keeps on the stack between passes (128 KiB)
PASS_AT_FLOPS = 64        # one-pass kernels split by rows on cores of this many FLOPs a cycle
PREFETCH_PIXELS = 14 * 14  # ... and prefetch weights in one pass where one serves at most this many pixels
LINE_FLOATS = 16          # float32 in a 64-byte cache line


def splits_by_rows(g, tg, blocks_per_tile: int) -> bool:
    """Whether a one-pass kernel's items split among the threads by output rows, each thread walking every
    output-channel tile of its rows, rather than by channel tiles (where every thread reads the
    whole input, half of it where the previous kernel's other thread wrote it): on cores of 64 FLOPs
    a cycle, where the weights, which every row reads, take at most a quarter of the L2. In ResNet-50's
    module (Xeon, Sapphire Rapids class) its 1x1 convs on 56x56 ran 0.60-0.91 of their time; on maps
    the L2 holds easily too (MobileNetV2's 1x1 convs 384 -> 64 on 14x14 0.54-0.64, SqueezeNet's 512 ->
    64 on 13x13 0.67-0.69; those models 0.97 of their time, ResNet-50 0.99-1.0), where they had run
    in passes over the input channels, one item per channel tile. Not a knob: in isolation, where the
    Measurer leaves the input where the kernel's own last run read it, the two splits time the same
    (0.97-1.02), so tuning could not choose; with 2.4 MB of weights (a 3x3 256 -> 256) rows ran 1.20x
    slower there."""
    weights = g.K * g.C * g.KH * g.KW * 4
    return g.K // g.KB > blocks_per_tile and tg.flops_per_cycle >= PASS_AT_FLOPS and weights <= tg.l2_bytes // 4


def whole(g, ow: int, oh: int, m: int) -> bool:
    """Whether tiles of ow columns x oh rows x m channel blocks divide the output (none is shifted)."""
    return not (g.OW % ow or g.OH % oh or (g.K // g.KB) % m)


def tile_stores(wl: Workload, g, TOH: int, OWT: int, m: int, value, ind: str, row: int = 0) -> list:
    """The epilogue and store of a register tile of TOH x OWT pixels (from oh0, ow0) by m output
    blocks (from block ko0), for the item (rt, t, ko) of tiles shifted back at the ends: `value(rr,
    r, blk, cblk)` is the sum at a pixel and block (lane `jj`) before the epilogue; lines at `ind`.
    `row`: `g` is a `flattened` map of rows this long, and column ow0 + r is that pixel of the map.

    A shifted tile stores only what the tile before it did not: two items writing one output raced,
    and as LLVM may round the same sum differently in two places of the unrolled tile (fast-math
    reassociates the bias and residual adds), a module's results changed from run to run in the last
    bit (MobileNetV2's 1x1 conv 144 -> 24, blocks of 8 in tiles of 2). The pixels every item owns
    share one loop over a block's lanes (a loop each compiled 1.2-1.6x slower to the same speed); a
    guarded pixel keeps a loop of its own (under their guards in one shared loop, a 5-pixel x 4-block
    tile ran 2x slower). A flattened map's pixel, found in its row first, has a loop of its own too:
    stores from bases LLVM cannot tell apart kept the shared loop's lanes scalar."""
    out, KB, KBLK = wl.outputs[0], g.KB, g.K // g.KB
    mine, guarded, flat = [], [], []
    for rr in range(TOH):
        for r in range(OWT):
            own = []
            for blk in range(m):
                owner = ([f"oh0 + {rr} >= rt * {TOH}"] if g.OH % TOH else []) + \
                    ([f"ow0 + {r} >= t * {OWT}"] if g.OW % OWT else []) + \
                    ([f"ko0 + {blk} >= ko * {m}"] if KBLK % m else [])
                cblk = f"ko0 + {blk}" if blk else "ko0"
                idx = ["n", (cblk, "jj", KB), *([f"fr{r}", f"fc{r}"] if row else [f"oh0 + {rr}", f"ow0 + {r}"])]
                lines, final = epilogue(wl, wl.epilogue, value(rr, r, blk, cblk), idx, out.shape, out.dtype,
                                        f"v{wl.anchor.index}", var=f"e{rr}_{r}_", unsigned=True)
                lines.append(f"out0[np.uintp({offset(out.shape, out.layout, idx)})] = {final}")
                if owner:
                    guarded += [f"{ind}if {' and '.join(owner)}:", f"{ind}    for jj in range({KB}):"]
                    guarded += [f"{ind}        {ln}" for ln in lines]
                else:
                    own += [f"{ind}    {ln}" for ln in lines]
            if row:
                flat += [f"{ind}fr{r} = (ow0 + {r}) // {row}", f"{ind}fc{r} = ow0 + {r} - fr{r} * {row}",
                         *([f"{ind}for jj in range({KB}):"] + own if own else []), *guarded]
                guarded = []
            else:
                mine += own
    return flat if row else ([f"{ind}for jj in range({KB}):"] + mine if mine else []) + guarded


def _scale_ok(wl: Workload) -> bool:
    """A ScaledConv's gate: a run-time float32 [N, C, 1, 1] input (read through its layout)."""
    a = wl.anchor
    if len(a.args) != 4 or not a.args[3].startswith("i"):
        return False
    s, x = wl.spec(a.args[3]), wl.spec(a.args[0])
    return not s.const and s.dtype == np.float32 and s.shape == (x.shape[0], x.shape[1], 1, 1)


def blocked_conv(wl: Workload) -> bool:
    """A 2-d conv (not grouped) of constant weights and bias from and to the blocked layout, with
    an elementwise epilogue of its shape: what conv2d and conv2d_int8 tile."""
    a = wl.anchor
    if a.op not in ("Conv", "ScaledConv") or len(wl.outputs) != 1 or wl.outputs[0].layout is None:
        return False
    if a.op == "ScaledConv" and not _scale_ok(wl):
        return False
    x = wl.spec(a.args[0])
    if len(x.shape) != 4 or x.layout is None or int(a.attrs.get("group", 1)) != 1:
        return False
    if not a.args[1].startswith("i") or not wl.spec(a.args[1]).const:
        return False
    if len(a.args) > 2 and a.args[2] and not (a.args[2].startswith("i") and wl.spec(a.args[2]).const):
        return False
    if wl.outputs[0].shape != wl.spec(f"v{wl.ops[-1].index}").shape or wl.outputs[0].shape[1] % wl.outputs[0].layout[0]:
        return False
    return all(op.op in SUPPORTED for op in wl.epilogue)


@register
class Conv2d(Template):
    name = "conv2d"
    stores_in_place = True     # (tile_stores / gemm: every element stored once, after its read)

    def matches(self, wl: Workload) -> bool:
        if not blocked_conv(wl) or "x_zero" in wl.anchor.attrs:
            return False
        x = wl.spec(wl.anchor.args[0])
        return x.dtype == np.float32 and max(wl.anchor.attrs["pads"]) <= x.layout[1]

    def space(self, wl: Workload) -> ConfigSpace:
        g = conv_geometry(wl)
        tg = target.current()
        lanes = tg.lanes(4)
        sp = ConfigSpace()
        flat = flattened(g)
        sp.define_knob("tile_ow", [t for t in OWT_CANDIDATES if t <= (flat or g).OW] or [g.OW])
        # m output blocks per tile (up to 4 vectors); when m does not divide the blocks the last
        # tile is shifted back to end at the last block (as columns are), so narrow blocks
        # (K = 1000, 116, 40 give blocks of 8, 4, 8) still fill a vector
        blocks = g.K // g.KB
        sp.define_knob("tile_oc_blocks", [m for m in (1, 2, 3, 4, 6, 8) if m <= blocks and m * g.KB <= 4 * lanes
                                          and (m & (m - 1) == 0 or blocks % m == 0)])
        sp.define_knob("tile_oh", [r for r in (1, 2, 4) if r <= g.OH])
        sp.define_reorder("reduction_order", ["c", "kh", "kw"],
                          candidates=[["c", "kh", "kw"], ["kh", "c", "kw"]])
        sp.define_annotate("unroll_kw", [False, True])
        # input-channel blocks per pass (0: all in one): each pass runs every tile of an output-channel
        # tile over its share of the input channels, so that share's weights are read from the L1
        # by every pixel, and the tiles' sums wait on the stack between passes (oneDNN's blocking
        # of the reduction). Only over outputs small enough for the stack, tiled whole.
        cblk = g.C // g.cb
        sp.define_knob("c_chunk", [0] + [c for c in (1, 2, 4, 8, 16) if c < cblk and cblk % c == 0]
                       if g.N == 1 and g.OH * g.OW * g.KB <= PASS_FLOATS and padding_share(g) <= BOUNDED_TAPS
                       else [0], absent=0)
        # prefetch the weights the tile reads next (the next pass's, or a filter row ahead)
        sp.define_knob("prefetch", [0, 1], absent=0)
        # a pointwise conv's map as one row (`flattened`): tiles run on across the rows' ends
        sp.define_knob("flat", [False, True] if flat else [False], absent=False)
        kb = g.KB
        # a knob that changes nothing for this workload keeps only its first value: over a 1x1
        # filter both reduction orders and both unroll_kw are one kernel, and half of MobileNetV2's
        # 1x1 trials (333 of 701 in a 1,000-trial log) had measured a kernel again under another name
        # (tiles that skip the taps reading padding loop over the kernel columns they need)
        order_moot = g.KH == 1 or g.C // g.cb == 1
        unroll_moot = g.KW == 1 or padding_share(g) > BOUNDED_TAPS

        def valid(cfg):
            if order_moot and cfg["reduction_order"][0] != "c" or unroll_moot and cfg["unroll_kw"]:
                return False
            gg = flat if cfg["flat"] else g
            # (as one row, a tile that divides the row runs the tiles its rows do: the same kernel)
            if cfg["tile_ow"] > gg.OW or cfg["tile_oh"] > gg.OH or cfg["flat"] and g.OW % cfg["tile_ow"] == 0:
                return False
            if cfg["c_chunk"] and (not whole(gg, *(cfg[k] for k in ("tile_ow", "tile_oh", "tile_oc_blocks")))
                                   or g.OH * g.OW * cfg["tile_oc_blocks"] * kb > PASS_FLOATS):
                return False
            # (tile_fits: registers for the tile's accumulators, weight vectors and broadcast)
            return tg.tile_fits(cfg["tile_ow"] * cfg["tile_oh"], -(-cfg["tile_oc_blocks"] * kb // lanes))
        sp.constraint = valid
        return sp

    def default_config(self, wl: Workload, space: ConfigSpace):
        """A register tile of about half the accumulator registers (14 vectors on AVX-512), and
        never fewer than keep the FMA pipes busy (AVX2's 16 registers: 8, not 6 - a 1x1 conv
        16 -> 96 on 112x112 ran 0.53 ms with 6, 0.29 with 8), preferring tiles that divide the row;
        two rows of it where its broadcasts load pixel by pixel (`Target.broadcasts_by_pixel`)."""
        g = conv_geometry(wl)
        tg = target.current()
        # as many output channels per pixel as one vector holds (at least one block), two vectors
        # where every broadcast input costs a load of its own (AVX2: a 1x1 conv 192 -> 32 on 28x28
        # ran 0.056 ms with 7 pixels x 1 vector, 0.049 with 4 x 2; onnxruntime 0.052) or where two
        # full-width FMAs issue a cycle, each with its broadcast (Xeon, Sapphire Rapids class: 24
        # conv tasks of ResNet-50 ran 0.71-1.03 of 14 x 1's time with 7 x 2, 0.93 weighted), among the
        # block counts whose last tile recomputes little: 24 channels in blocks of 8 are 3 blocks, and
        # tiles of 2 computed a fourth (1x1 convs 144 -> 24 on 56x56 ran 0.78-0.86 of their time with
        # 3 blocks per tile, AVX2 and AVX-512 alike)
        per_pixel = tg.lanes(4) * tg.vectors_per_broadcast
        if per_pixel > tg.lanes(4) and g.C * g.KH * g.KW * per_pixel * 4 > tg.l2_bytes // 2:
            # ... unless a tile's weights then outgrow half the L2 (the next tile's stream in behind
            # them) and come from the L3 for every tile: one vector over more pixels loads them half
            # as often (AVX2, a 3x3 2048 -> 256 on 28x28, 1.2 MB a tile: 0.55-0.85 of two vectors' time;
            # Zen 3's 512 KiB L2, ResNet's 3x3 512 -> 512 on 7x7, 295 KB: 7 x 1 vector 0.88 of 4 x 2)
            per_pixel = tg.lanes(4)
        blocks = g.K // g.KB
        if not (tg.fma_bits >= tg.vector_bits and g.KB < tg.lanes(4)):
            ms = [m for m in space.knobs[1].values if -(-blocks // m) * m <= 1.25 * blocks] or space.knobs[1].values[:1]
        else:
            # blocks narrower than a vector on pipes as wide as the vectors: a tile of 24 channels is
            # three half-width FMAs, as many slots as 48 would take, so the block counts of fewest FMA
            # slots over all tiles come first, a shifted last tile's included (Xeon, Sapphire Rapids
            # class: MobileNetV2's 1x1 convs 144 -> 24 on 56x56 ran 0.095 ms in tiles of 2 blocks of 8,
            # 0.18 in tiles of 3; tuned)
            slots = {m: -(-blocks // m) * tg.fma_slots(m * g.KB) for m in space.knobs[1].values}
            ms = [m for m in slots if slots[m] <= 1.1 * min(slots.values())]
        m = min(ms, key=lambda m: (abs(m * g.KB - per_pixel), -m))
        if padding_share(g) > BOUNDED_TAPS:
            return self._skipping_default(g, space, m, tg)
        vectors = -(-m * g.KB // tg.lanes(4))               # accumulator vectors per pixel
        want = -(-max(tg.max_tile_vectors // 2, tg.accumulators_in_flight) // vectors)
        rest = {"tile_oc_blocks": m, "tile_oh": 1, "reduction_order": ["c", "kh", "kw"], "unroll_kw": False,
                "c_chunk": 0, "prefetch": 0}
        owts = [t for t in space.knobs[0].values if t * vectors <= tg.max_tile_vectors
                and space.is_valid(space.from_values({"tile_ow": t, **rest}))] or space.knobs[0].values[:1]
        waste = row_waste(g.OW)
        best = min(owts, key=lambda t: (waste(t) > 0.15, abs(t - want), -t))
        if g.OW % best and (flat := flattened(g)):
            # where that tile does not divide the row (AVX2's 4 x 2 on 7x7, 14x14), a pointwise map as one row, in
            # the widest tile the registers hold where each broadcast takes one (AVX2: 5 x 2 ran 0.83-0.92 of 4 x 2
            # shifted on MobileNetV2's 1x1s on 7x7 and 14x14, 4 x 2 as one row 0.89-0.95; Zen 3), else as wanted
            g, rest = flat, dict(rest, flat=True)
            fits = [t for t in space.knobs[0].values if space.is_valid(space.from_values({"tile_ow": t, **rest}))]
            scale = int(wl.anchor.op == "ScaledConv")    # (a register more: its 5 x 2 spilled, 1.4x slower)
            wide = [t for t in fits if tg.hoisted_registers(t, vectors) + scale <= tg.vector_registers]
            want = max(wide) if wide and not tg.broadcast_in_fma else want
            waste = row_waste(g.OW)
            best = min(fits, key=lambda t: (waste(t) > 0.15, abs(t - want), -t))
        cfg = space.from_values({"tile_ow": best, **rest})
        items = g.N * -(-blocks // m)                   # with passes, one per output-channel tile
        per_block = g.cb * g.KH * g.KW * m * g.KB * 4   # a tile's weights for one input-channel block
        # a tile's weights outgrow half the L1 on cores whose FMAs outrun the L2's supply of them: two
        # vector FMAs a cycle, each with a weight vector (Intel's AVX-512 cores, AVX2; not Zen 4)
        streams = tg.vector_fmas_per_cycle >= 2 and per_block * (g.C // g.cb) > tg.l1d_bytes // 2
        # (not where one pass splits by rows: every thread of a pass kernel reads the whole input once
        # per channel tile; in ResNet-50's module its 1x1 convs 512 -> 128 and 512 -> 256 on 28x28
        # and 256 -> 512 stride 2 on 56x56 ran 0.75-0.93 of their passes' time in one pass by rows)
        if streams and -(-items // tg.threads) * tg.threads <= 1.125 * items and not splits_by_rows(g, tg, m):
            # where the FMAs would outrun the L2's supply of a tile's weights, passes whose weights
            # take at most half the L1, if the tiles still share evenly among the threads: on a Xeon
            # (Sapphire Rapids class) ResNet-18's 3x3 convs on 14x14 and 7x7 ran 0.85-0.95 of one
            # pass's time with passes of 16 channels, ResNet-50's and MobileNetV2's 1x1 convs on 14x14
            # and 7x7 0.81-0.95 with 64-128; 5 tiles on 2 threads ran 1.07 (docs/performance.md)
            # (in whole tiles: 2 x 2 pixels for 4 x 1 on 14x14 - Zen 3, MobileNetV2's 1x1 576 -> 96 0.81 of
            # one pass's time, ResNet-50's 3x3 256 -> 256 s2 and 1x1s 1024 -> 256 0.91-0.92 in its module)
            tile = self._whole_tile(g, space, cfg, tg)
            per_block = g.cb * g.KH * g.KW * tile["tile_oc_blocks"] * g.KB * 4
            fits = [c for c in space.values("c_chunk") if c and c * per_block <= tg.l1d_bytes // 2
                    and space.is_valid(space.from_values(dict(tile.values, c_chunk=c)))]
            if fits:
                cfg = space.from_values(dict(tile.values, c_chunk=max(fits)))
        if streams and (cfg["c_chunk"] or g.OH * g.OW <= PREFETCH_PIXELS):
            # a tile's weights stream from beyond the L1: the loads wait on them unless asked for
            # ahead, the next pass's (Xeon, Sapphire Rapids class: ResNet-50's pass kernels on 7x7
            # outputs ran 0.85-0.91 of their time, on 14x14 0.95-0.96, on 28x28 0.95-1.01) or, in one
            # pass, where each weight serves few pixels (MobileNetV2's 1x1 convs on 14x14 and 7x7
            # 0.81-0.88; on 28x28 and larger 1.0-1.05, where the tiles of the map reuse them)
            cfg = space.from_values(dict(cfg.values, prefetch=1))
        two = dict(cfg.values, tile_oh=2)
        if vectors > 1 and whole(g, best, 2, m) and tg.broadcasts_by_pixel(2 * best, vectors) \
                and tg.tile_fits(2 * best, vectors, int(wl.anchor.op == "ScaledConv")) \
                and space.is_valid(space.from_values(two)):
            # two rows of that tile where their broadcasts load pixel by pixel (so its accumulators do
            # not spill), each weight vector serving twice the pixels, where the tiles are whole (a
            # shifted last tile guards its stores, and two rows doubled those loops: SqueezeNet's 1x1
            # convs on 55x55 to 13x13 ran 1.6-2.3x slower, RegNetY-400MF's 104 -> 208 and 208 -> 440 in
            # tiles of 4 blocks of 8 1.6-2.4x) and the passes above keep whole tiles (7x7):
            # Xeon (Sapphire Rapids class), ResNet-50's module. A ScaledConv's scale takes a register
            # more (EfficientNet-B0's projections on 14x14 spilled and ran 2.2x slower)
            cfg = space.from_values(two)
        return cfg

    @staticmethod
    def _whole_tile(g, space, cfg, tg):
        """`cfg` if its tile is whole, else the whole tile of its vectors, +-1 accumulator, nearest in blocks, rows."""
        ow0, m0, oh0 = cfg["tile_ow"], cfg["tile_oc_blocks"], cfg["tile_oh"]
        if whole(g, ow0, oh0, m0):
            return cfg
        vecs = lambda m: -(-m * g.KB // tg.lanes(4))            # noqa: E731
        cands = [((abs(ow * oh - ow0 * oh0) * vecs(m), abs(m - m0), oh), c)
                 for ow, m, oh in itertools.product(*(k.values for k in space.knobs[:3]))
                 if whole(g, ow, oh, m) and vecs(m) == vecs(m0) and abs(ow * oh - ow0 * oh0) * vecs(m) <= 1
                 and space.is_valid(c := space.from_values(dict(cfg.values, tile_ow=ow, tile_oc_blocks=m, tile_oh=oh)))]
        return min(cands, key=lambda c: c[0])[1] if cands else cfg

    @staticmethod
    def _skipping_default(g, space, m0, tg):
        """Where tiles skip the taps that read padding, the smaller the tile the more it skips:
        the tile computing the fewest products among those with enough accumulators to keep the
        FMA pipes busy, and of those the one nearest the usual accumulator count (about half the
        registers), of about the usual channels per pixel. DeepLabV3's ASPP conv 960 -> 256, 3x3 taps
        12 apart on 14x14 (AMD EPYC Zen 4): 2 x 2 pixels x 2 blocks 1.46 ms, 4 x 2 x 1 1.58, 14 x 1 x 1
        (the usual default) 2.15; onnxruntime 1.47. Among tiles of as few products, the fewest
        accumulators had been taken: 2 x 2 x 4 blocks (16) ran 0.82-0.83 of 2 x 2 x 2 there, and
        DeepLabV3-ResNet50's 2048 -> 256 taps 12 and 24 apart on 28x28 4 x 4 x 1 0.78 and 0.89-0.97 of
        2 x 4 x 1 (AVX2's count, 8, is both pipes' minimum: its tiles are as before)."""
        lanes = tg.lanes(4)
        want = max(tg.max_tile_vectors // 2, tg.accumulators_in_flight)
        rest = {"reduction_order": ["c", "kh", "kw"], "unroll_kw": False, "c_chunk": 0, "prefetch": 0}
        cands = []
        for ow, m, oh in itertools.product(*(k.values for k in space.knobs[:3])):
            cfg = space.from_values({"tile_ow": ow, "tile_oc_blocks": m, "tile_oh": oh, **rest})
            acc = ow * oh * -(-m * g.KB // lanes)
            if acc >= tg.accumulators_in_flight and space.is_valid(cfg):
                cands.append(((computed_taps(g, oh, ow), abs(acc - want), abs(m - m0), -oh), cfg))
        if not cands:
            return space.from_values({"tile_ow": space.knobs[0].values[-1], "tile_oc_blocks": m0, "tile_oh": 1,
                                      **rest})
        return min(cands, key=lambda c: c[0])[1]

    def build(self, wl: Workload, cfg) -> Kernel:
        g = conv_geometry(wl)
        rows_of = g.OW if cfg["flat"] else 0        # (stores find a flattened map's pixels in its rows)
        g = flattened(g) if rows_of else g
        conv = wl.anchor
        OWT, m, TOH = cfg["tile_ow"], cfg["tile_oc_blocks"], cfg["tile_oh"]
        KB, cb = g.KB, g.cb
        KT = KB * m
        KBLK = g.K // KB
        KO = -(-KBLK // m)              # tiles; the last starts at block KBLK - m
        CBLK = g.C // cb
        OH, OW, KH, KW, H, W = g.OH, g.OW, g.KH, g.KW, g.H, g.W
        sh, sw = g.strides
        dh, dw = g.dilations
        ph, pw = g.pads
        hin = g.hin
        NT = -(-OW // OWT)
        NR = -(-OH // TOH)
        ACC = TOH * OWT * KT
        xs = (g.N, CBLK, g.H + 2 * hin, g.W + 2 * hin, cb)
        x_n, x_c, x_h = xs[1] * xs[2] * xs[3] * cb, xs[2] * xs[3] * cb, xs[3] * cb
        x_arg = int(conv.args[0][1:])
        X = f"in{x_arg}"
        has_bias = len(conv.args) > 2 and bool(conv.args[2])
        s_arg = int(conv.args[3][1:]) if conv.op == "ScaledConv" else None
        S, s_spec = (f"in{s_arg}", wl.inputs[s_arg]) if s_arg is not None else (None, None)

        # the tile: TOH output rows x OWT output columns x KT output channels; a last tile that
        # would pass the end of a row or column is shifted back (recomputing, never branching in
        # the reduction)
        item = ParallelItem()
        CC = cfg["c_chunk"]
        # prefetches: with passes, each tile of a pass asks for its share of the cache lines of the
        # next pass's weights (PF a channel) into the L2, where they do not evict this pass's from
        # the L1 (Xeon, SPR class: 0.85-0.91 of the time of the same lines fetched into the L1, and
        # one line a channel per tile against all: 2 x 2 pixels x 4 blocks ran 1.25x slower than
        # no prefetch); without passes every line of the weights a filter row or block ahead, into
        # the L1 (there 0.78-0.93 of the time with them fetched into the L2)
        LINES = -(-KT // LINE_FLOATS)
        PF = -(-LINES // (NR * NT)) if CC else LINES
        if CC:
            # passes over CC input-channel blocks each: an item is an output-channel tile, and its
            # tiles' sums wait in `part` from one pass to the next (the tiles are whole: no overlap)
            P = OH * OW * KT
            body = [item.loop(g.N * KO), *item.last("ko", KO, "n"), f"    ko0 = ko * {m}",
                    f"    acc = carray(stack_empty({ACC}, np.float32), {ACC})",
                    f"    part = carray(stack_empty({P}, np.float32), {P})",
                    f"    for ch in range({CBLK // CC}):", f"     for rt in range({NR}):",
                    f"      oh0 = rt * {TOH}", f"      for t in range({NT}):", f"       ow0 = t * {OWT}",
                    *[f"       pq{p} = np.uintp(((rt * {NT} + t) * {PF} + {p}) % {LINES} * {LINE_FLOATS})"
                      for p in range(PF)],
                    "       if ch == 0:", f"        for q in range({ACC}):", "            acc[q] = np.float32(0.0)",
                    "       else:"]
            for rr in range(TOH):
                for r in range(OWT):
                    body += [f"        for j in range({KT}):",
                             f"            acc[{(rr * OWT + r) * KT} + j] = "
                             f"part[np.uintp(((oh0 + {rr}) * {OW} + ow0 + {r}) * {KT} + j)]"]
        else:
            rows_out = splits_by_rows(g, target.current(), m)
            body = [item.loop(g.N * KO * NR * NT),
                    *item.take("t", NT),
                    *(item.take("ko", KO) + item.last("rt", NR, "n") if rows_out else
                      item.take("rt", NR) + item.last("ko", KO, "n")),
                    f"    oh0 = {shifted_start(f'rt * {TOH}', OH, TOH)}",
                    f"    ko0 = {shifted_start(f'ko * {m}', KBLK, m)}",
                    f"    ow0 = {shifted_start(f't * {OWT}', OW, OWT)}",
                    f"    acc = carray(stack_empty({ACC}, np.float32), {ACC})",
                    f"    for q in range({ACC}):",
                    "        acc[q] = np.float32(0.0)"]

        tg = target.current()
        by_pixel = tg.broadcasts_by_pixel(TOH * OWT, -(-KT // tg.lanes(4)))

        def inner(ind, kw_expr):
            pre = " " * ind
            lines = [f"{pre}xb{rr} = np.uintp(xrow{rr} + (ow0 * {sw} + {kw_expr} * {dw} + {hin - pw}) * {cb})"
                     for rr in range(TOH)]
            lines += [f"{pre}wb = np.uintp(((((ko * {CBLK} + cb) * {KH} + kh) * {KW} + {kw_expr}) * {cb}) * {KT})",
                      f"{pre}for c in range({cb}):"]
            if not by_pixel:
                lines += [f"{pre}    x{rr}_{r} = {X}[xb{rr} + np.uintp({r * sw * cb} + c)]"
                          for rr in range(TOH) for r in range(OWT)]
            lines += [f"{pre}    wo = wb + np.uintp(c * {KT})"]
            if cfg["prefetch"]:
                # the same place in the next pass, or (one pass) the next filter row or channel block
                step = KW if cfg["reduction_order"][0] == "c" else KH * KW
                ahead = (CC * KH * KW if CC else step) * cb * KT
                lines += [f"{pre}    prefetch(w, wo + np.uintp({ahead}) + pq{p}, 2)" if CC else
                          f"{pre}    prefetch(w, wo + np.uintp({ahead + p * LINE_FLOATS}), 1)" for p in range(PF)]
            if S is not None:
                # conv(x * s) = conv(x, w * s): one multiply per weight vector, not per pixel
                s_at = offset(s_spec.shape, s_spec.layout, ["n", ("cb", "c", cb), "0", "0"])
                lines.append(f"{pre}    sc = {S}[np.uintp({s_at})]")
            wv = "(w[wo + np.uintp(j)] * sc)" if S is not None else "w[wo + np.uintp(j)]"
            if by_pixel:        # each pixel's broadcast, then its FMAs (the weight loads are shared)
                for rr in range(TOH):
                    for r in range(OWT):
                        lines += [f"{pre}    xv = {X}[xb{rr} + np.uintp({r * sw * cb} + c)]",
                                  f"{pre}    for j in range({KT}):",
                                  f"{pre}        acc[{(rr * OWT + r) * KT} + j] += xv * {wv}"]
                return lines
            lines += [f"{pre}    for j in range({KT}):", f"{pre}        wv = {wv}"]
            for rr in range(TOH):
                for r in range(OWT):
                    lines.append(f"{pre}        acc[{(rr * OWT + r) * KT} + j] += x{rr}_{r} * wv")
            return lines

        def row(ind):
            pre = " " * ind
            return [f"{pre}xrow{rr} = n * {x_n} + cb * {x_c} + ((oh0 + {rr}) * {sh} + kh * {dh} + {hin - ph}) * {x_h}"
                    for rr in range(TOH)]

        # Where most products would read the zero halo, each tile runs only the filter rows and
        # columns that reach into the input for some pixel of the tile (the halo keeps the rest
        # of a partly covered tile correct): DeepLabV3's ASPP conv, 3x3 taps 12 apart on a 14x14
        # map, in the module 4.86 -> 1.46 ms (onnxruntime 1.48), AMD EPYC Zen 4.
        bounded = padding_share(g) > BOUNDED_TAPS
        kh_range, kw_range = (("khl, khh", "kwl, kwh") if bounded else (str(KH), str(KW)))
        if bounded:
            body += [f"    khl = max(0, -(((oh0 + {TOH - 1}) * {sh} - {ph}) // {dh}))",
                     f"    khh = min({KH}, ({H - 1 + ph} - oh0 * {sh}) // {dh} + 1)",
                     f"    kwl = max(0, -(((ow0 + {OWT - 1}) * {sw} - {pw}) // {dw}))",
                     f"    kwh = min({KW}, ({W - 1 + pw} - ow0 * {sw}) // {dw} + 1)"]

        def kw_loop(ind):
            if cfg["unroll_kw"] and not bounded:
                return [ln for kw in range(KW) for ln in inner(ind, str(kw))]
            return [" " * ind + f"for kw in range({kw_range}):"] + inner(ind + 4, "kw")

        # the loops over input-channel blocks (c) and filter rows (kh) in the knob's order; the
        # filter columns (kw) always inside both, the block's channels innermost
        cb_range = f"ch * {CC}, ch * {CC} + {CC}" if CC else str(CBLK)
        loops = [f"for cb in range({cb_range}):", f"for kh in range({kh_range}):"]
        if cfg["reduction_order"][0] != "c":
            loops.reverse()
        tile = [f"    {loops[0]}", f"        {loops[1]}"] + row(12) + kw_loop(12)

        # epilogue and store: channel k = (ko * m + blk) * KB + jj
        def value(rr, r, blk, cblk):
            v = f"acc[{(rr * OWT + r) * KT + blk * KB} + jj]"
            return f"({v} + bias[np.uintp(({cblk}) * {KB} + jj)])" if has_bias else v
        if CC:
            # the reduction and stores three loops deeper (passes, rows, columns); sums to `part`
            # after every pass but the last, which ends in the epilogue
            tile += [f"    if ch < {CBLK // CC - 1}:", f"        for j in range({KT}):"]
            tile += [f"            part[np.uintp(((oh0 + {rr}) * {OW} + ow0 + {r}) * {KT} + j)] = "
                     f"acc[{(rr * OWT + r) * KT} + j]" for rr in range(TOH) for r in range(OWT)]
            tile += ["    else:"] + tile_stores(wl, g, TOH, OWT, m, value, "        ", rows_of)
            body += ["   " + ln for ln in tile]
        else:
            body += tile + tile_stores(wl, g, TOH, OWT, m, value, "    ", rows_of)

        def pack_weights(w):                                            # [K, C, KH, KW]
            first = [min(t * m, KBLK - m) * KB for t in range(KO)]      # each tile's first channel
            wv = w.astype(np.float32)[np.array([f + j for f in first for j in range(KT)])]
            return wv.reshape(KO, KT, CBLK, cb, KH, KW).transpose(0, 2, 4, 5, 3, 1)

        # The reduction over a block's input channels is a loop of scalar broadcasts; allowed to
        # reassociate, LLVM vectorised it (horizontal sums) instead of the output channels' loop
        # whenever it had fully unrolled that one first: AVX2's 8-lane blocks with a 6-pixel tile,
        # a 1x1 conv 16 -> 96 on 112x112 ran 1.39 ms, 0.53 in order (some tiles 1.58 -> 0.29;
        # onnxruntime 0.28), AMD EPYC Zen 4 compiling for znver3/AVX2. On AVX-512 the tuned and
        # default kernels of 30 tasks ran the same either way, except that epilogues with the
        # sigmoid polynomial (SiLU) ran 4-10% slower in order, so those keep it.
        return packed_kernel(wl, body, pack_weights, [] if s_arg is None else [s_arg],
                             reassoc=calls_polynomial(body))
