"""Winograd convolution F(m x m, 3 x 3) for 3x3 stride-1 convs, in the channel-blocked layout.

Dilated convs too: on each of its interleaved grids of outputs the conv is an undilated one over
the input read with the dilation's stride (`_grid`; grids one row or column short where the dilation
does not divide the output). DeepLabV3's and FCN's ResNet-50 layers dilated by 2 and 4 on 28 x 28 ran
in 0.44 and 0.54 of the direct conv's time, on 65 x 65 (a 520 x 520 image) 0.45 and 0.58 (AMD EPYC
Zen 4, AVX-512; on 28 x 28 0.68 and 0.63 compiled for AVX2).

Why: a direct 3x3 conv spends 9 m^2 multiplies per (input channel, output channel) on an m x m
output tile; Winograd's minimal filtering (Lavin & Gray, CVPR'16) spends (m+2)^2 - 16 instead
of 36 for F(2x2, 3x3), 36 instead of 144 for F(4x4, 3x3) - and 3x3 stride-1 convs are most of a
ResNet's FLOPs. The price is the transforms (additions, once per tile and channel, amortised
over the output channels) and rounding: F(4x4, 3x3)'s output differs from the exact sum by a few
1e-7 of its scale, against ~1e-7 for the direct conv.

Weights are transformed at compile time (U = G g G^T) and packed as [K/KT, (m+2)^2, C, KT]. One
parallel loop runs over (image, output-channel tile, group of TT output tiles). Per item: the
input tiles are transformed (V = B^T d B) into a buffer on the stack, then for each of the
(m+2)^2 transform points a TT x KT register tile accumulates V x U over the input channels (a
small GEMM per point, written like conv2d's inner loop so LLVM vectorises it), and the output
transform Y = A^T M A, the fused epilogue and the store finish the tile. A last tile or group
that would pass the end is shifted back (it recomputes) and stores only what the one before it did
not, as in conv2d: every output has one writer.

A conv this template matches gets one tuning task per template, and the fastest record wins.
Untuned modules run Winograd where its default has always beaten the direct conv's: outputs of at
least 16 tiles of 4 x 4 per image (13 x 13 and up) over at least 16 input and output channels -
ResNet-18's and SqueezeNet 1.1's 3x3 convs ran 1.6-2.8x faster so on AMD EPYC Zen 4 with AVX-512
and compiled for AVX2 alike (a multiply count 3-4x smaller; the direct conv was already at 220
GFLOP/s). On 7 x 7 outputs (4 tiles, too few for a register tile of tiles) it ran 1.6x slower on
AVX-512 and level on AVX2, so there the direct conv stays, as TVM's x86 strategy and oneDNN keep it.
Those are cores of 32 float32 FLOPs a cycle; where twice that issue (Intel's AVX-512 cores on two
full-width FMA pipes) the direct conv's time halves and Winograd's transforms' does not, so it takes
twice the tiles: on a Xeon (Sapphire Rapids class) 256 -> 256 on 14x14 ran 1.10-1.28 ms by Winograd,
0.85-1.0 direct; on 28x28 Winograd still won (docs/performance.md, "A Xeon again"). Between the
two, F(2x2, 3x3) has the tiles F(4x4) lacks (`small_tiles`: 49 on 14 x 14 and 13 x 13), and in the
module it ran 0.84-1.00 of the direct conv's time (docs/performance.md, "Small tiles").
Nor where the transformed weights (36 floats per channel pair) outgrow the last-level cache by far
over few tiles: streamed from memory again for every group of tiles, they made it lose where the
direct conv reuses its weights across a row. AMD EPYC Zen 4, L3 32 MiB, against the direct conv's
default: 512 x 384 and 512 x 512 channels (20-36 MiB) 0.53-0.55 on 14x14 and 28x28; with input
channels past the stack transformed in chunks (FCN-ResNet50's head had carried its sums through
memory every 8-16 channels), 1024 -> 512 (72 MiB) 0.49 on 28x28 (0.61 compiled for AVX2),
2048 -> 512 (144 MiB, FCN-ResNet50's head) 0.77 on 28x28 (AVX2: 0.46) but 1.03 on 14x14 (0.96),
2048 -> 2048 on 14x14 (576 MiB) 1.31 (0.99). So the bound is 3 L3s, 6 where the output has 32
tiles or more.
"""
from __future__ import annotations

import math

import numpy as np

from .. import target
from .codegen import ParallelItem, packed_kernel, row_waste, shifted_start
from .conv2d import BOUNDED_TAPS, LINE_FLOATS
from .conv_geometry import conv_geometry, padding_share
from .layout import offset
from .space import ConfigSpace
from .template import Kernel, Template, epilogue, get, register
from .winograd_transforms import MATRICES, lin_source, transformed_weights
from .workload import Workload

TT_CANDIDATES = [1, 2, 3, 4, 6, 7, 8, 12, 14, 16]
PREFERRED_TILES = 16            # 4 x 4 output tiles per image from which untuned modules run Winograd,
PREFERRED_AT_FLOPS = 32         # ... on cores of 32 float32 FLOPs a cycle, more in proportion above
PREFERRED_CHANNELS = 16
PREFERRED_WEIGHTS_L3 = 3        # ... and while the transformed weights fit in 3 L3s (the docstring),
PREFERRED_WEIGHTS_L3_WIDE = 6   # 6 from WIDE_TILES tiles up
SMALL_TILES_AT_FLOPS = 64       # from cores of 64 FLOPs a cycle, F(2x2, 3x3) where F(4x4) has too few
SMALL_TILE_VECTORS = 2          # ... with output channels of 2 vectors (`small_tiles`)
WIDE_TILES = 32
MAX_STREAM_SHARE = 0.75         # untuned modules run Winograd while its weights' stream takes less (`stream_share`)
MAX_STACK_FLOATS = 64 << 10          # 256 KB of stack per item: far below any thread's stack


def _chunk(g, a2: int, tt: int, kt: int) -> int:
    """Blocks of input channels the "chunks" transform takes at a time: the most that divide the
    blocks and whose transformed tiles fit the stack beside the sums. FCN-ResNet50's head (2048 ->
    512 on 28x28) cannot hold all channels' tiles on the stack, and per block it carried its sums
    through memory after every 8-16 channels."""
    cblk = g.C // g.cb
    room = MAX_STACK_FLOATS - a2 * tt * kt - tt * kt
    return max([d for d in range(1, cblk + 1) if cblk % d == 0 and a2 * tt * d * g.cb <= room] or [0])


def _grid(g) -> tuple:
    """(dh, dw, SH, SW): a conv dilated by (dh, dw) is, on each of its dh x dw interleaved grids of
    outputs (those of one oy % dh and ox % dw), an undilated 3x3 conv over the input grid read with
    the same stride: Winograd runs on each grid of up to SH x SW outputs (DeepLabV3's and FCN's layers
    dilated by 2 and 4 on 28 x 28: grids of 14 x 14 and 7 x 7; on 65 x 65, from a 520 x 520 image,
    grids of 33 and 32 rows)."""
    dh, dw = g.dilations
    return dh, dw, -(-g.OH // dh), -(-g.OW // dw)


def _smallest(g) -> tuple:
    """The smallest grid's rows and columns (where the dilation does not divide the output, the
    last grids hold one row or column fewer)."""
    return g.OH // g.dilations[0], g.OW // g.dilations[1]


def _tiles(g, m):
    """Tile rows and columns of one grid, and the tiles of all grids."""
    dh, dw, sh, sw = _grid(g)
    nth, ntw = -(-sh // m), -(-sw // m)
    return nth, ntw, nth * ntw * dh * dw


def _least_tiles(tg) -> float:
    """Output tiles per image from which untuned modules run Winograd on target `tg`."""
    return PREFERRED_TILES * max(1.0, tg.flops_per_cycle / PREFERRED_AT_FLOPS)


def small_tiles(g, tg) -> bool:
    """Whether untuned modules run F(2x2, 3x3) rather than F(4x4, 3x3): on cores of 64 FLOPs a
    cycle, where 4 x 4 tiles are too few and 2 x 2 ones are not (14 x 14 and 13 x 13 outputs: 16
    tiles of 4 x 4, 49 of 2 x 2). On a Xeon (Sapphire Rapids class), 256 -> 256 on 14 x 14, in
    ResNet-18's untuned module: 0.64-0.68 ms by F(2x2) over 7 tiles x 2 vectors against the direct
    conv's 0.75-0.80; F(2x2) over 16 tiles (a third of them recomputed) 0.82-0.87, F(4x4) 0.89."""
    return (tg.flops_per_cycle >= SMALL_TILES_AT_FLOPS and _smallest(g)[0] >= 2 and
            _tiles(g, 4)[2] < _least_tiles(tg) <= _tiles(g, 2)[2])


def item_weight_bytes(g, m: int, kt: int) -> int:
    """Bytes of transformed weights one item reads: (m+2)^2 x C x kt floats."""
    return (m + 2) ** 2 * g.C * kt * 4


def streams_weights(g, tg, m: int, kt: int) -> bool:
    """Whether an item's transformed weights ((m+2)^2 x C x kt floats) outgrow the L2 on a core
    of 64 FLOPs a cycle or more: then they stream from beyond it once per group of tiles, and
    fewer output channels a tile (2 vectors, not 4) let each group take more tiles (7, not 4),
    so they stream about half as often. On a Xeon (Sapphire Rapids class, L2 2 MiB), 256 -> 256
    on 28 x 28 (2.4 MB of weights a 4-vector item) ran 0.70-0.72 of the 4-vector tile's time
    (2.10-2.16 against 3.01 ms, the direct conv 2.95); 128 -> 128 (1.2 MB: they stay in the L2)
    1.06, so there 4 vectors stay. Cores of 32 FLOPs a cycle spend twice the cycles on the
    multiplies the stream overlaps, and keep 4 (Zen 4's tuned ResNet-18 ended there)."""
    return tg.flops_per_cycle >= SMALL_TILES_AT_FLOPS and item_weight_bytes(g, m, kt) > tg.l2_bytes


def stream_share(g, tg, cfg) -> float:
    """Cycles a core spends streaming the transformed weights from beyond its L2 (once per group
    of tiles, where an item's share outgrows the L2), over the cycles the direct conv's
    multiplies take: the time Winograd cannot save, at the target's rate beyond the L2. On a Xeon
    (Sapphire Rapids class, about 8 bytes a cycle a core: 256 -> 256 on 28 x 28 with 4-vector
    tiles streamed 122 MB in 2.9 ms on two cores, 1.01x the direct conv's time), FCN-ResNet50's
    512 -> 512 convs dilated by 2 and 4 (share 0.82) ran 1.32x the direct conv's time and its 2048
    -> 512 head (0.57) 0.54x. On AMD EPYC Zen 4 (32 FLOPs and 32 bytes a cycle) the same layers'
    shares are 0.13-0.16, and Winograd ran 0.44-0.55 of the direct conv's time there."""
    m, tt, kt = cfg["tile_size"], cfg["tile_tiles"], cfg["tile_oc_blocks"] * g.KB
    if item_weight_bytes(g, m, kt) <= tg.l2_bytes:
        return 0.0
    streamed = -(-_tiles(g, m)[2] // tt) * item_weight_bytes(g, m, g.K)
    return streamed * tg.flops_per_cycle / (2 * 9 * g.C * g.K * g.OH * g.OW * tg.beyond_l2_bytes_per_cycle)


@register
class Conv2dWinograd(Template):
    name = "conv2d_winograd"
    alternative_to = "conv2d"      # picked by a faster tuning record, or untuned by `preferred`

    def matches(self, wl: Workload) -> bool:
        a = wl.anchor
        # a ScaledConv's gate multiplies the input, which Winograd's transform does not take
        if a.op != "Conv" or not get(self.alternative_to).matches(wl):
            return False
        w = wl.spec(a.args[1])
        g = conv_geometry(wl)
        return tuple(w.shape[2:]) == (3, 3) and tuple(g.strides) == (1, 1) and min(_smallest(g)) >= 2

    def preferred(self, wl: Workload) -> bool:
        """Run untuned where the direct conv always lost (the module docstring's measurements), not
        where most of the direct conv's products would read padding, which it skips and Winograd
        computes (DeepLabV3's ASPP conv, taps 12 apart on 28 x 28: Winograd 2.1x its time), nor
        where streaming its transformed weights takes most of the direct conv's time
        (`stream_share`: dilated 256- and 512-channel convs on a Xeon)."""
        g = conv_geometry(wl)
        if padding_share(g) > BOUNDED_TAPS:
            return False
        tg = target.current()
        weights = 36 * g.C * g.K * 4 / tg.l3_bytes
        tiles = _tiles(g, 2 if small_tiles(g, tg) else 4)[2]
        if not (tiles >= _least_tiles(tg) and min(g.C, g.K) >= PREFERRED_CHANNELS and
                weights <= (PREFERRED_WEIGHTS_L3_WIDE if tiles >= WIDE_TILES else PREFERRED_WEIGHTS_L3)):
            return False
        return stream_share(g, tg, self.default_config(wl, self.space(wl))) < MAX_STREAM_SHARE

    def space(self, wl: Workload) -> ConfigSpace:
        g = conv_geometry(wl)
        tg = target.current()
        lanes, most = tg.lanes(4), tg.max_tile_vectors
        sp = ConfigSpace()
        # an `exact` conv sums integers (a quantized op's): F(2x2, 3x3) transforms them by halves and
        # quarters, which float32 holds exactly; F(4x4, 3x3)'s sixths it would round
        sizes = [2] if wl.anchor.attr("exact", 0) else list(MATRICES)
        sp.define_knob("tile_size", [m for m in sizes if m <= min(_smallest(g))])
        sp.define_knob("tile_tiles", [t for t in TT_CANDIDATES if t <= _tiles(g, 2)[2]])
        blocks = g.K // g.KB
        sp.define_knob("tile_oc_blocks", [b for b in (1, 2, 4) if b <= blocks and b * g.KB <= 4 * lanes])
        sp.define_knob("transform", ["per_block", "all_channels", "chunks"])
        sp.define_reorder("item_order", ["k", "tiles"], candidates=[["k", "tiles"], ["tiles", "k"]])
        sp.define_knob("prefetch", [0, 1], absent=0)      # the next channel block's weights (`build`)
        kb, c = g.KB, g.C

        def ok(cfg):
            m, tt, kt = cfg["tile_size"], cfg["tile_tiles"], cfg["tile_oc_blocks"] * kb
            a2 = (m + 2) ** 2
            if cfg["transform"] == "chunks":
                d = _chunk(g, a2, tt, kt)
                if not 1 < d < c // g.cb:             # (a chunk of one block or of all: the others)
                    return False
                v = a2 * tt * d * g.cb
            else:
                v = a2 * tt * (c if cfg["transform"] == "all_channels" else g.cb)
            return (tt * -(-kt // lanes) <= most and tt <= _tiles(g, m)[2]
                    and a2 * tt * kt + v + tt * kt <= MAX_STACK_FLOATS)
        sp.constraint = ok
        return sp

    def default_config(self, wl: Workload, space: ConfigSpace):
        """F(4x4, 3x3) where the output allows it (F(2x2) where `small_tiles`, over output channels
        of 2 vectors, transformed per block: in ResNet-18's module the tiles of all 256 channels, 112
        KB, ran 1.07-1.15x slower than a block's 7 KB; the next block's weights asked for ahead:
        0.80-0.96 of the time without in ResNet-18's and ResNet-50's modules, but 1.01-1.31 where two
        blocks' weights outgrew half the L2, as F(4x4)'s on 28x28 do); output channels up to 4 vectors
        and tiles for about half the accumulator registers (4 x 4 = 16 of AVX-512's 28), whole groups
        of tiles where possible; input tiles of all channels transformed once per item when the stack holds
        them. Tuned ResNet-18 tasks on EPYC Zen 4 all ended there (4 vectors x 3-6 tiles, all_channels:
        0.34-0.58 ms); the earlier default (2 vectors x 8 tiles, per block) read 1.2-5x slower, 1.68
        and 2.95 ms on 14x14 x 256 channels, so tuning had reached Winograd there only after 600
        trials."""
        g = conv_geometry(wl)
        tg = target.current()
        lanes = tg.lanes(4)
        m = max(space.knobs[0].values)
        most, transforms = 4, ("all_channels", "chunks", "per_block")
        small = small_tiles(g, tg) and 2 in space.knobs[0].values
        if small:
            m, most, transforms = 2, SMALL_TILE_VECTORS, ("per_block", "all_channels")
        elif streams_weights(g, tg, m, most * lanes):
            most = SMALL_TILE_VECTORS
        blocks = max([b for b in space.knobs[2].values if b * g.KB <= most * lanes] or space.knobs[2].values[:1])
        vectors = -(-blocks * g.KB // lanes)
        want = tg.max_tile_vectors / 2 / vectors
        tiles = _tiles(g, m)[2]
        waste = row_waste(tiles)
        tts = [t for t in space.knobs[1].values if t <= tiles and t * vectors <= tg.max_tile_vectors] or \
            space.knobs[1].values[:1]
        tt = min(tts, key=lambda t: (waste(t) > 0.15, abs(t - want), -t))
        # the next channel block's weights asked for ahead where both blocks' fit in half the L2
        kt = blocks * g.KB
        prefetch = int(small and g.K > kt and
                       2 * item_weight_bytes(g, m, kt) <= tg.l2_bytes / 2)
        for transform in transforms:
            c = space.from_values({"tile_size": m, "tile_tiles": tt, "tile_oc_blocks": blocks,
                                   "transform": transform, "item_order": ["k", "tiles"], "prefetch": prefetch})
            if space.is_valid(c):
                return c
        return space.get(space.valid_indices(limit=1)[0])

    def features(self, wl: Workload, cfg) -> dict:
        """What the cost model cannot read from knob names: multiplies saved, wasted tiles, and
        how often the transformed weights (4x the weights for F(4x4, 3x3)) are streamed."""
        g = conv_geometry(wl)
        m, tt, kt = cfg["tile_size"], cfg["tile_tiles"], cfg["tile_oc_blocks"] * g.KB
        nth, ntw, nt = _tiles(g, m)
        groups = -(-nt // tt)
        ko = -(-g.K // kt)
        return {"mults_per_output": (m + 2) ** 2 / m ** 2,
                "tile_waste": groups * tt * m * m / (g.OH * g.OW) - 1.0,
                "log_weight_bytes": math.log2(4.0 * (m + 2) ** 2 * g.C * ko * kt * groups),
                "log_input_transforms": math.log2(groups * tt * g.C * ko),
                "log_items": math.log2(g.N * ko * groups)}

    def build(self, wl: Workload, cfg) -> Kernel:
        g = conv_geometry(wl)
        conv = wl.anchor
        m, TT, mb = cfg["tile_size"], cfg["tile_tiles"], cfg["tile_oc_blocks"]
        BT, AT = (np.array(MATRICES[m][k], np.float64) for k in ("BT", "AT"))
        a = m + 2
        A2 = a * a
        KB, cb, C = g.KB, g.cb, g.C
        KT = KB * mb
        KBLK = g.K // KB
        KO = -(-KBLK // mb)
        CBLK = C // cb
        OH, OW = g.OH, g.OW
        ph, pw = g.pads
        hin = g.hin
        NTH, NTW, NT = _tiles(g, m)
        dh, dw, SH, SW = _grid(g)
        # a grid's rows and columns: the last grids have one fewer where the dilation does not
        # divide the output
        rows = SH if OH % dh == 0 else f"({OH - 1} - grid // {dw}) // {dh} + 1"
        cols = SW if OW % dw == 0 else f"({OW - 1} - grid % {dw}) // {dw} + 1"
        NG = -(-NT // TT)
        xs = (g.N, CBLK, g.H + 2 * hin, g.W + 2 * hin, cb)
        x_n, x_c, x_h = xs[1] * xs[2] * xs[3] * cb, xs[2] * xs[3] * cb, xs[3] * cb
        x_arg = int(conv.args[0][1:])
        X = f"in{x_arg}"
        has_bias = len(conv.args) > 2 and bool(conv.args[2])
        ACC = A2 * TT * KT
        # blocks of input channels transformed at a time: one, all, or as many as the stack holds
        CC = {"per_block": 1, "all_channels": CBLK}.get(cfg["transform"]) or _chunk(g, A2, TT, KT)
        VLEN = A2 * TT * CC * cb

        item = ParallelItem()
        if cfg["item_order"][0] == "k":
            split = item.take("g", NG) + item.last("ko", KO, "n")
        else:
            split = item.take("ko", KO) + item.last("g", NG, "n")
        body = [item.loop(g.N * KO * NG), *split,
                f"    ko0 = {shifted_start(f'ko * {mb}', KBLK, mb)}",
                f"    q0 = {shifted_start(f'g * {TT}', NT, TT)}",
                f"    acc = carray(stack_empty({ACC}, np.float32), {ACC})",
                f"    vt = carray(stack_empty({VLEN}, np.float32), {VLEN})",
                f"    rt = carray(stack_empty({TT * KT}, np.float32), {TT * KT})"]

        def tile_origin(ind):
            """Tile q's first output (oy, ox); a dilated conv's tiles run grid by grid, (ty, tx)
            the tile's start on its grid (tq its index there)."""
            pre = " " * ind
            if dh * dw == 1:
                return [f"{pre}q = q0 + t",
                        f"{pre}oy = {shifted_start(f'(q // {NTW}) * {m}', OH, m)}",
                        f"{pre}ox = {shifted_start(f'(q % {NTW}) * {m}', OW, m)}"]
            return [f"{pre}q = q0 + t",
                    f"{pre}tq = q % {NTH * NTW}",
                    f"{pre}grid = q // {NTH * NTW}",
                    f"{pre}ty = {shifted_start(f'(tq // {NTW}) * {m}', rows, m)}",
                    f"{pre}tx = {shifted_start(f'(tq % {NTW}) * {m}', cols, m)}",
                    f"{pre}oy = grid // {dw} + ty * {dh}",
                    f"{pre}ox = grid % {dw} + tx * {dw}"]

        def input_transform(ind, vstride, voff):
            """V[point][t][...] = B^T d B for the TT tiles and the cb channels of block cbk."""
            pre = " " * ind
            lines = [f"{pre}for t in range({TT}):"] + tile_origin(ind + 4)
            lines += [f"{pre}    xb = np.uintp(n * {x_n} + cbk * {x_c} + (oy + {hin - ph}) * {x_h} "
                      f"+ (ox + {hin - pw}) * {cb})",
                      f"{pre}    for c in range({cb}):"]
            p2 = pre + " " * 8
            for r in range(a):
                for s in range(a):
                    lines.append(f"{p2}d{r}_{s} = {X}[xb + np.uintp({r * dh * x_h + s * dw * cb} + c)]")
            for i in range(a):           # rows: B^T d
                for s in range(a):
                    lines.append(f"{p2}u{i}_{s} = {lin_source(BT[i], [f'd{k}_{s}' for k in range(a)])}")
            for i in range(a):           # columns: (B^T d) B
                for j in range(a):
                    lines.append(f"{p2}vt[np.uintp((({i * a + j} * {TT} + t) * {vstride}) + {voff} + c)] = "
                                 f"{lin_source(BT[j], [f'u{i}_{k}' for k in range(a)])}")
            return lines

        def point_gemm(ind, chans, vstride, voff, wchan, pair="xi", pairs=A2):
            """rt (TT x KT) += V[point] x U[point] over `chans` channels."""
            pre = " " * ind
            lines = []
            if cfg["prefetch"] and KO > 1:
                # the next block of output channels' weights into the L2, in shares: where items
                # take groups of tiles first, each group of a block asks for its part of the next's
                share = -(-A2 * C * KT // LINE_FLOATS)
                first = ""
                if cfg["item_order"][0] == "k":
                    share = -(-share // NG)
                    first = f"g * {share} + "
                pf = -(-share // pairs)
                lines.append(f"{pre}pl = np.uintp((ko + 1) * {A2 * C * KT} + ({first}({pair}) * {pf}) * {LINE_FLOATS})")
                if pf <= 4:
                    lines += [f"{pre}prefetch(w, pl + np.uintp({z * LINE_FLOATS}), 2)" for z in range(pf)]
                else:
                    lines += [f"{pre}for z in range({pf}):",
                              f"{pre}    prefetch(w, pl + np.uintp(z * {LINE_FLOATS}), 2)"]
            lines += [f"{pre}for c in range({chans}):"]
            lines += [f"{pre}    x{t} = vt[np.uintp((xi * {TT} + {t}) * {vstride} + {voff} + c)]"
                      for t in range(TT)]
            lines += [f"{pre}    wo = np.uintp(((ko * {A2} + xi) * {C} + {wchan} + c) * {KT})",
                      f"{pre}    for j in range({KT}):",
                      f"{pre}        wv = w[wo + np.uintp(j)]"]
            lines += [f"{pre}        rt[{t * KT} + j] += x{t} * wv" for t in range(TT)]
            return lines

        if CC < CBLK:
            # a block (per_block) or a chunk of CC blocks at a time: the point GEMMs run over its
            # channels, the sums carried on the stack from one to the next
            body += [f"    for q in range({ACC}):", "        acc[q] = np.float32(0.0)"]
            if CC == 1:
                body += [f"    for cbk in range({CBLK}):", *input_transform(8, cb, "0")]
            else:
                body += [f"    for ch in range({CBLK // CC}):", f"        for cbl in range({CC}):",
                         f"            cbk = ch * {CC} + cbl", *input_transform(12, CC * cb, f"cbl * {cb}")]
            body += [f"        for xi in range({A2}):",
                     f"            for q in range({TT * KT}):",
                     f"                rt[q] = acc[np.uintp(xi * {TT * KT} + q)]"]
            body += point_gemm(12, CC * cb, CC * cb, "0", f"{'cbk' if CC == 1 else 'ch'} * {CC * cb}",
                               f"{'cbk' if CC == 1 else 'ch'} * {A2} + xi", A2 * (CBLK // CC))
            body += [f"            for q in range({TT * KT}):",
                     f"                acc[np.uintp(xi * {TT * KT} + q)] = rt[q]"]
        else:
            body += [f"    for cbk in range({CBLK}):"]
            body += input_transform(8, C, f"cbk * {cb}")
            body += [f"    for xi in range({A2}):",
                     f"        for q in range({TT * KT}):", "            rt[q] = np.float32(0.0)"]
            body += point_gemm(8, C, C, "0", "0")
            body += [f"        for q in range({TT * KT}):",
                     f"            acc[np.uintp(xi * {TT * KT} + q)] = rt[q]"]

        # output transform, epilogue and store: channel k = (ko0 + blk) * KB + jj. A shifted
        # group, tile or channel block stores only what the one before it did not: two items
        # storing one output race, and a tile computes it with other transform weights than the
        # tile before (another rounding), so the module's result would change from run to run.
        out = wl.outputs[0]
        ops = wl.epilogue
        # (constant trip counts with a `continue`: a loop from a variable start ran 12-15% slower)
        if NT % TT:
            body.append(f"    tskip = g * {TT} - q0")
        if KBLK % mb:
            body.append(f"    bskip = ko * {mb} - ko0")
        body += [f"    for t in range({TT}):"]
        if NT % TT:
            body += ["        if t < tskip:", "            continue"]
        body += tile_origin(8)
        most_y, most_x = (NTH * m - _smallest(g)[0], NTW * m - _smallest(g)[1])   # a shifted tile's largest overlap
        tq, ty, tx = ("q", "oy", "ox") if dh * dw == 1 else ("tq", "ty", "tx")
        if most_y:
            body.append(f"        sy = ({tq} // {NTW}) * {m} - {ty}")
        if most_x:
            body.append(f"        sx = ({tq} % {NTW}) * {m} - {tx}")

        def store_section(guarded: bool) -> list:
            """The blk / jj loops of one tile; `guarded`: stores skip what the tile before stored."""
            lines = [f"        for blk in range({mb}):"]
            if KBLK % mb:
                lines += ["            if blk < bskip:", "                continue"]
            lines.append(f"            for jj in range({KB}):")
            p3 = " " * 16
            for i in range(a):
                for j in range(a):
                    lines.append(f"{p3}m{i}_{j} = acc[np.uintp((({i * a + j} * {TT} + t) * {KT}) + blk * {KB} + jj)]")
            for i in range(m):
                for j in range(a):
                    lines.append(f"{p3}s{i}_{j} = {lin_source(AT[i], [f'm{k}_{j}' for k in range(a)])}")
            if has_bias:
                lines.append(f"{p3}bv = bias[np.uintp((ko0 + blk) * {KB} + jj)]")
            for dy in range(m):
                for dx in range(m):
                    v = lin_source(AT[dx], [f's{dy}_{k}' for k in range(a)])
                    v = f"({v}) + bv" if has_bias else v
                    idx = ["n", ("ko0 + blk", "jj", KB), f"oy + {dy * dh}", f"ox + {dx * dw}"]
                    st, final = epilogue(wl, ops, v, idx, out.shape, out.dtype, f"v{conv.index}",
                                         var=f"e{dy}_{dx}_", unsigned=True)
                    st = [*st, f"out0[np.uintp({offset(out.shape, out.layout, idx)})] = {final}"]
                    cond = [c for c, on in ((f"sy <= {dy}", dy < most_y), (f"sx <= {dx}", dx < most_x))
                            if on and guarded]
                    if cond:
                        st = [f"if {' and '.join(cond)}:", *("    " + ln for ln in st)]
                    lines += [p3 + ln for ln in st]
            return lines

        if most_y or most_x:
            # only the last row or column of tiles is shifted: the others store unguarded (a
            # guard inside the lane loop ran 7x7 convs 1.15-1.28x slower)
            interior = " and ".join(c for c, on in (("sy == 0", most_y), ("sx == 0", most_x)) if on)
            body += [f"        if {interior}:", *("    " + ln for ln in store_section(False)),
                     "        else:", *("    " + ln for ln in store_section(True))]
        else:
            body += store_section(False)

        def pack_weights(w):                                                      # [K, C, 3, 3]
            u = transformed_weights(w, m).reshape(A2, g.K, C)
            first = [min(t * mb, KBLK - mb) * KB for t in range(KO)]            # U = G g G^T
            u = u[:, np.array([f + j for f in first for j in range(KT)])]        # [A2, KO*KT, C]
            return u.reshape(A2, KO, KT, C).transpose(1, 0, 3, 2)                # [KO, A2, C, KT]

        return packed_kernel(wl, body, pack_weights)
