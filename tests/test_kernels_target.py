"""Templates' defaults follow the target: on an AVX2 machine (16 registers of 8 float32) the
default register tiles of conv2d, Winograd, depthwise, the generic conv and dense fit its 12
accumulator vectors, and on an AVX-512 one (32 registers of 16) they are the tiles tuned there."""
import pytest

from modelc import target
from modelc.kernels import template, templates, testing  # noqa: F401  (registers the templates)
from modelc.kernels.gemm_space import beyond_l2, model_cost
from modelc.kernels.layout import choose_block
from modelc.kernels.workload import Workload
from modelc.target import Target

AVX2 = Target.from_features("znver3", "+avx,+avx2,+fma,+sse4.1,+sse4.2", threads=2)
AVX512 = Target.from_features("znver4", "+avx,+avx2,+fma,+avx512f,+avx512bw,+avx512vl", threads=2)
# Intel Sapphire Rapids: AVX-512 on two full-width FMA pipes (twice Zen 4's FLOPs a cycle), L2 2 MiB
SPR = Target.from_features("sapphirerapids", "+avx,+avx2,+fma,+avx512f,+avx512bw,+avx512vl,+avx512vnni,+amx-tile",
                           threads=2, caches=(48 << 10, 2 << 20, 105 << 20))


@pytest.fixture(autouse=True)
def _sixteen_lane_layouts():
    """Workloads built in a test take their channel blocks from the target in effect (16 lanes on
    the AVX-512 machines these expectations were measured on, 8 on an AVX2 host, whose blocks of 8
    changed every AVX-512 default below): pinned to SPR's, so the tests mean the same on every host.
    `default` still derives each config under the target it names."""
    with target.use(SPR):
        yield


def conv(C, H, K, k=3, s=1, p=1, group=1, layout=True, d=1, scaled=False):
    OH = (H + 2 * p - d * (k - 1) - 1) // s + 1
    cb, kb = choose_block(C), choose_block(K)
    wshape = [K, C // group, k, k]
    return Workload({"version": 1, "params": {},
                     "inputs": [{"shape": [1, C, H, H], "dtype": "float32", "const": False,
                                 "layout": [cb, p] if layout else None},
                                {"shape": wshape, "dtype": "float32", "const": True},
                                {"shape": [K], "dtype": "float32", "const": True}]
                     # a ScaledConv: a run-time scale of the input channels
                     + ([{"shape": [1, C, 1, 1], "dtype": "float32", "const": False}] if scaled else []),
                     "ops": [{"op": "ScaledConv" if scaled else "Conv", "args": ["i0", "i1", "i2", "i3"][:3 + scaled],
                              "attrs": {"kernel_shape": [k, k], "strides": [s, s], "pads": [p] * 4,
                                        "dilations": [d, d], "group": group}},
                             {"op": "Relu", "attrs": {}, "args": ["v0"]}],
                     "outputs": [{"shape": [1, K, OH, OH], "dtype": "float32", "value": "v1",
                                  "layout": [kb, 0] if layout else None}]})


def dense(M, K, N):
    return Workload({"version": 1, "params": {},
                     "inputs": [{"shape": [M, K], "dtype": "float32", "const": False},
                                {"shape": [K, N], "dtype": "float32", "const": True},
                                {"shape": [N], "dtype": "float32", "const": True}],
                     "ops": [{"op": "Dense", "attrs": {}, "args": ["i0", "i1", "i2"]}],
                     "outputs": [{"shape": [M, N], "dtype": "float32", "value": "v0"}]})


RESNET = [(64, 56, 64, 3, 1), (64, 56, 128, 3, 2), (128, 28, 128, 3, 1), (256, 14, 256, 3, 1),
          (512, 7, 512, 3, 1), (256, 14, 512, 1, 2), (3, 224, 64, 7, 2), (40, 28, 40, 3, 1)]
MOBILENET_DW = [(32, 112, 1), (96, 112, 2), (144, 56, 1), (192, 28, 2), (576, 14, 1), (960, 7, 1)]
DENSE = [(128, 256, 256), (128, 256, 1024), (128, 1024, 256), (1, 512, 1000), (7, 40, 23), (64, 64, 100)]


def default(wl, name, tg):
    with target.use(tg):
        t = template.get(name)
        assert t.matches(wl)
        sp = t.space(wl)
        cfg = t.default_config(wl, sp)
        assert sp.is_valid(cfg)
        return sp, cfg


def vectors(channels, lanes):
    return -(-channels // lanes)


@pytest.mark.parametrize("C,H,K,k,s", RESNET)
def test_conv2d_default_fits_the_registers(C, H, K, k, s):
    wl = conv(C, H, K, k, s, p=k // 2)
    _, cfg = default(wl, "conv2d", AVX2)
    kb = choose_block(K)
    acc = cfg["tile_ow"] * cfg["tile_oh"] * vectors(cfg["tile_oc_blocks"] * kb, 8)
    assert acc <= 12


@pytest.mark.parametrize("C,H,K,k,s", RESNET)
def test_conv2d_space_never_spills_on_avx2(C, H, K, k, s):
    wl = conv(C, H, K, k, s, p=k // 2)
    sp, _ = default(wl, "conv2d", AVX2)
    kb = choose_block(K)
    for i in sp.valid_indices():
        c = sp.get(i)
        assert c["tile_ow"] * c["tile_oh"] * vectors(c["tile_oc_blocks"] * kb, 8) <= 12


def test_conv2d_default_on_avx512_is_the_tuned_one():
    """14 output columns x one 16-lane vector of channels, as measured on AVX-512 machines."""
    _, cfg = default(conv(64, 56, 64), "conv2d", AVX512)
    assert (cfg["tile_ow"], cfg["tile_oc_blocks"], cfg["tile_oh"]) == (14, 1, 1)
    _, cfg = default(conv(512, 7, 512), "conv2d", AVX512)
    assert (cfg["tile_ow"], cfg["tile_oc_blocks"]) == (7, 1)
    _, cfg = default(conv(40, 28, 40), "conv2d", AVX512)            # blocks of 8: two per vector
    assert (cfg["tile_ow"], cfg["tile_oc_blocks"]) == (14, 2)
    _, cfg = default(conv(64, 56, 64), "conv2d", AVX2)
    assert cfg["tile_ow"] * cfg["tile_oc_blocks"] * 16 // 8 <= 12 and cfg["tile_ow"] < 14


def test_conv2d_default_on_two_full_width_fma_pipes_takes_two_vectors_per_pixel():
    """Where two 512-bit FMAs issue a cycle (Intel's AVX-512 cores), each with a broadcast operand,
    a pixel takes two vectors of output channels: ResNet-50's and MobileNetV2's 1x1 and 3x3 convs
    tuned on a Xeon (Sapphire Rapids class) kept 2-4 blocks per pixel in 20 of 24 tasks, and 7 x 2 ran
    0.67-0.8 of 14 x 1's time (docs/performance.md). Zen 4 keeps one vector."""
    for C, H, K, k in [(256, 56, 64, 1), (1024, 14, 256, 1), (256, 14, 256, 3), (512, 7, 512, 3)]:
        with target.use(SPR):
            sp, cfg = default(conv(C, H, K, k, p=k // 2), "conv2d", SPR)
        assert cfg["tile_oc_blocks"] * choose_block(K) == 32 and sp.is_valid(cfg), (C, H, K, k, cfg)
        assert SPR.accumulators_in_flight <= cfg["tile_ow"] * cfg["tile_oh"] * 2 <= SPR.max_tile_vectors
        with target.use(AVX512):
            _, cfg = default(conv(C, H, K, k, p=k // 2), "conv2d", AVX512)
        assert cfg["tile_oc_blocks"] * choose_block(K) == 16, (C, H, K, k, cfg)


def test_conv2d_passes_over_input_channels_where_the_fmas_outrun_the_l2():
    """On twice Zen 4's FLOPs a cycle, a tile whose weights outgrow half the L1 passes over the
    input channels in shares whose weights fit it (3x3: one block of 16; 1x1: 8 blocks), if its
    output-channel tiles still share evenly among the threads, as on AVX2, whose two FMAs a cycle
    take a vector of weights each too; Zen 4 (one FMA of its vectors a cycle) keeps one pass."""
    def chunk(tg, *shape):
        with target.use(tg):
            wl = conv(*shape, p=shape[3] // 2)
            return default(wl, "conv2d", tg)[1]["c_chunk"]
    assert chunk(SPR, 512, 7, 512, 3) == 1 and chunk(SPR, 1024, 14, 256, 1) == 8
    assert chunk(SPR, 64, 28, 128, 1) == 0            # 8 KiB of weights a tile: one pass
    assert chunk(SPR, 960, 7, 160, 1) == 0            # 5 tiles on 2 threads
    assert chunk(AVX2, 256, 14, 256, 3) == 2 and chunk(AVX2, 64, 28, 128, 1) == 0
    assert chunk(AVX512, 512, 7, 512, 3) == 0 and chunk(AVX512, 1024, 14, 256, 1) == 0


def test_conv2d_prefetches_weights_that_stream_past_the_l1_to_few_pixels():
    """On twice Zen 4's FLOPs a cycle, tiles whose weights outgrow half the L1 ask for them ahead:
    the next pass's where they pass over the input channels, and in one pass where each weight
    serves at most 14 x 14 pixels (over larger maps the map's tiles reuse them), as on AVX2; Zen 4
    does not."""
    def fetches(tg, *shape, s=1):
        with target.use(tg):
            _, cfg = default(conv(*shape, s=s, p=shape[3] // 2), "conv2d", tg)
            return cfg["prefetch"], cfg["c_chunk"]
    assert fetches(SPR, 512, 7, 512, 3)[0] and fetches(SPR, 960, 7, 160, 1) == (1, 0)
    assert fetches(SPR, 576, 14, 96, 1) == (1, 0) and fetches(SPR, 128, 28, 128, 3) == (1, 1)
    assert fetches(SPR, 256, 56, 64, 1) == (0, 0)       # one pass over 56 x 56 pixels
    assert fetches(SPR, 144, 14, 32, 1) == (0, 0)       # 18 KiB of weights a tile: the L1 keeps them
    assert fetches(AVX2, 960, 7, 320, 1) == (1, 0) and fetches(AVX2, 256, 56, 64, 1) == (0, 0)
    assert not fetches(AVX512, 512, 7, 512, 3)[0] and not fetches(AVX512, 576, 14, 96, 1)[0]


# AMD EPYC Zen 3, as `lscpu` and the OS describe it: AVX2, L2 512 KiB a core
ZEN3 = Target.from_features("znver3", "+avx,+avx2,+fma,+sse4.1,+sse4.2", threads=2,
                            caches=(32 << 10, 512 << 10, 32 << 20))


def test_avx2_passes_run_whole_tiles_of_as_many_accumulators():
    """Passes need whole tiles: where the row's tile does not divide it, a whole tile of the same
    weight vectors and about as many accumulators takes the passes (Zen 3: 2 x 2 pixels x 2 vectors
    for 4 x 1 on 14x14; MobileNetV2's 1x1 576 -> 96 ran 0.81 of one pass's time, before pointwise
    maps ran as one row), and where there is none (7x7: 7 pixels x 2 vectors spill) the tile keeps one
    pass; a tile that divides stays."""
    def tile(tg, *shape, s=1):
        with target.use(tg):
            _, cfg = default(conv(*shape, s=s, p=shape[3] // 2), "conv2d", tg)
            return cfg["tile_ow"], cfg["tile_oh"], cfg["tile_oc_blocks"] * choose_block(shape[2], 8), cfg["c_chunk"] > 0
    assert tile(ZEN3, 256, 14, 256, 3) == (2, 2, 16, True)
    assert tile(ZEN3, 256, 28, 256, 3, s=2) == (2, 2, 16, True)     # 14 x 14 outputs
    assert tile(ZEN3, 256, 7, 256, 3) == (4, 1, 16, False)
    assert tile(ZEN3, 256, 56, 128, 3, s=2) == (4, 1, 16, True)     # 28 x 28: 4 divides the row
    assert tile(SPR, 576, 14, 96, 1)[:2] == (7, 2)                    # whole already


def test_pointwise_maps_run_as_one_row_where_the_rows_tile_does_not_divide_them():
    """A pointwise conv's map is one row of contiguous pixels (`flat`): where AVX2's 4 x 2-vector tile
    does not divide a row (7x7, 14x14, SqueezeNet's 13x13), the map runs as one row in the widest
    tile the 16 registers hold with its broadcasts, 5 x 2 (MobileNetV2's 1x1 convs there 0.83-0.92 of
    4 x 2's time, SqueezeNet 1.1's module 0.80-0.83; Zen 3). Where 4 divides the row (28x28) or the conv
    is not pointwise the rows stay, and on AVX-512 (tiles of 7 and 14) 7x7 and 14x14 keep theirs."""
    def flat(tg, C, H, K, k=1):
        with target.use(tg):
            _, cfg = default(conv(C, H, K, k, p=k // 2), "conv2d", tg)
            return cfg["flat"] and (cfg["tile_ow"], cfg["tile_oh"], cfg["tile_oc_blocks"] * choose_block(K, 8))
    for shape in ((960, 7, 320), (576, 14, 96), (320, 7, 1280), (512, 13, 64)):
        assert flat(ZEN3, *shape) == (5, 1, 16), shape
    assert not flat(ZEN3, 192, 28, 32) and not flat(ZEN3, 512, 7, 512, 3)
    for tg in (SPR, AVX512):
        assert not flat(tg, 960, 7, 320) and not flat(tg, 576, 14, 96)


def test_conv2d_splits_by_rows_where_the_weights_are_small():
    """On twice Zen 4's FLOPs a cycle, a one-pass conv whose weights take at most a quarter of the
    L2 splits its items among the threads by output rows (each reads its rows, not the whole input),
    in one pass where it would otherwise pass over the input channels, on large maps and small;
    large weights, one channel tile, and Zen 4 and AVX2 keep the split by output-channel tiles."""
    from modelc.kernels.conv2d import splits_by_rows
    from modelc.kernels.conv_geometry import conv_geometry

    def rows(tg, *shape):
        with target.use(tg):
            wl = conv(*shape, p=shape[3] // 2)
            _, cfg = default(wl, "conv2d", tg)
            return not cfg["c_chunk"] and splits_by_rows(conv_geometry(wl), tg, cfg["tile_oc_blocks"])
    assert rows(SPR, 256, 56, 64, 1) and rows(SPR, 64, 56, 256, 1)
    assert rows(SPR, 512, 28, 128, 1)           # one pass by rows rather than passes by channel tiles
    assert not rows(SPR, 256, 14, 256, 3)       # 2.4 MB of weights (and passes)
    assert rows(SPR, 128, 28, 512, 1) and rows(SPR, 384, 14, 64, 1)     # inputs of 400 and 300 KB
    assert not rows(SPR, 960, 7, 320, 1)        # 1.2 MB of weights (in passes)
    assert not rows(SPR, 256, 56, 16, 1)        # one channel tile
    for tg in (AVX512, AVX2):
        assert not rows(tg, 256, 56, 64, 1)


@pytest.mark.parametrize("tg,want", [("avx512", (7, 3)), ("avx2", (3, 3)), ("spr", (16, 2))])
def test_conv2d_default_tiles_three_blocks_whole(tg, want):
    """24 output channels are three blocks of 8: a tile of two blocks computed a fourth in its last
    tile, and MobileNetV2's and EfficientNet-B0's 1x1 convs 144 -> 24 on 56x56 ran 0.78-0.86 of that
    time with tiles of three (7 pixels on AVX-512, 3 within AVX2's 16 registers). But where the FMA
    pipes are as wide as 512-bit vectors, 24 channels are three 256-bit FMAs, the slots of 48, and
    two tiles of one vector (32 channels) take fewer (Sapphire Rapids: 0.095 against 0.18 ms)."""
    t = {"avx512": AVX512, "avx2": AVX2, "spr": SPR}[tg]
    with target.use(t):
        sp, cfg = default(conv(144, 56, 24, 1), "conv2d", t)
    assert (cfg["tile_ow"], cfg["tile_oc_blocks"]) == want
    assert sp.is_valid(cfg)


@pytest.mark.parametrize("C,H,K,k", [(16, 112, 96, 1), (192, 28, 32, 1), (64, 56, 64, 3), (512, 7, 512, 3)])
def test_conv2d_default_on_avx2_keeps_the_pipes_and_load_ports_busy(C, H, K, k):
    """AVX2 has no broadcast operand in its FMAs: two vectors of output channels per broadcast
    input, and at least pipes x latency accumulators (MobileNetV2's 1x1 convs ran 5-8x onnxruntime's
    time with 6 pixels x 1 vector)."""
    with target.use(AVX2):
        wl = conv(C, H, K, k, p=k // 2)                # blocks of 8, as an AVX2 module lays them out
        _, cfg = default(wl, "conv2d", AVX2)
    acc = cfg["tile_ow"] * cfg["tile_oh"] * vectors(cfg["tile_oc_blocks"] * 8, 8)
    assert AVX2.accumulators_in_flight <= acc <= AVX2.max_tile_vectors
    assert cfg["tile_oc_blocks"] == 2, cfg
    assert not AVX2.broadcast_in_fma and AVX512.broadcast_in_fma


def test_conv2d_space_leaves_out_tiles_that_spill():
    """Accumulators + twice the weight vectors (+ the broadcast on AVX2) must fit the registers:
    on AVX2 (blocks of 8) 6 x 2 and 2 x 4 spilled and ran 2-3x slower than 7 x 1, 4 x 2 or 5 x 2."""
    def tiles(tg, wl):
        with target.use(tg):
            sp, _ = default(wl, "conv2d", tg)
            return {(c["tile_ow"], c["tile_oc_blocks"], c["tile_oh"]) for c in map(sp.get, sp.valid_indices())}
    with target.use(AVX2):
        small = tiles(AVX2, conv(512, 7, 512))
    assert {(7, 1, 1), (4, 2, 1), (5, 2, 1), (1, 2, 4)} <= small
    assert not {(6, 2, 1), (3, 2, 2), (2, 4, 1), (3, 4, 1)} & small
    big = tiles(AVX512, conv(64, 56, 64))
    assert {(14, 1, 1), (7, 1, 1), (14, 2, 1), (28, 1, 1)} <= big and (7, 4, 1) not in big


@pytest.mark.parametrize("C,H,K,k,s", RESNET[:5])
def test_winograd_default_fits_the_registers(C, H, K, k, s):
    if s != 1:
        return
    wl = conv(C, H, K, k, s)
    _, cfg = default(wl, "conv2d_winograd", AVX2)
    assert cfg["tile_tiles"] * vectors(cfg["tile_oc_blocks"] * choose_block(K), 8) <= 12
    _, cfg = default(wl, "conv2d_winograd", AVX512)
    # tuned ResNet-18 tasks on AVX-512 (EPYC Zen 4) ended at 4 vectors of channels x 3-6 tiles,
    # input tiles of all channels transformed once per item
    assert cfg["tile_oc_blocks"] * choose_block(K) == 64 and cfg["tile_tiles"] == min(4, (-(-H // 4)) ** 2)
    # (512: past the stack's 256 KB, so in chunks of as many channels as it holds)
    assert cfg["transform"] == ("all_channels" if C <= 256 else "chunks")


@pytest.mark.parametrize("C,H,s", MOBILENET_DW)
def test_depthwise_default_fits_the_registers(C, H, s):
    wl = conv(C, H, C, 3, s, group=C)
    _, cfg = default(wl, "depthwise_conv2d", AVX2)
    b = choose_block(C)
    assert cfg["tile_ow"] * cfg["tile_oh"] * vectors(b, 8) <= 12
    _, cfg = default(wl, "depthwise_conv2d", AVX512)
    assert cfg["tile_oh"] == 1 and cfg["tile_ow"] == min(8, (H + s - 1) // s) if H >= 8 else True


def test_generic_conv_channel_tile_fits_the_registers():
    wl = conv(64, 28, 64, 3, 1, group=2, layout=False)
    _, cfg = default(wl, "conv_generic", AVX2)
    assert cfg["vector_axis"] == "oc"
    assert cfg["tile_ow"] * vectors(cfg["tile_oc"], 8) <= 12
    _, cfg = default(wl, "conv_generic", AVX512)
    assert cfg["vector_axis"] == "oc" and cfg["tile_ow"] * cfg["tile_oc"] == 14 * 16


@pytest.mark.parametrize("M,K,N", DENSE)
def test_dense_default_fits_the_registers(M, K, N):
    sp, cfg = default(dense(M, K, N), "dense", AVX2)
    assert cfg["k_split"] * cfg["tile_m"] * vectors(cfg["tile_n"], 8) <= 12
    tiles = next(k.values for k in sp.knobs if k.name == "tile_n")
    assert all(n % 8 == 0 for n in tiles) or tiles == [N]


def test_dense_candidates_are_whole_vectors_of_the_target():
    sp, cfg = default(dense(128, 256, 192), "dense", AVX512)
    assert sp.knobs[1].values == [16, 32, 48, 64]
    _, cfg = default(dense(128, 256, 256), "dense", AVX512)
    assert (cfg["tile_m"], cfg["tile_n"]) in {(4, 64), (6, 64), (8, 32)}        # tuned on AVX-512
    sp, _ = default(dense(128, 256, 192), "dense", AVX2)
    assert sp.knobs[1].values == [8, 16, 24, 32]


def test_gemm_model_follows_the_target():
    """Fewer threads, fewer registers, slower pipes: never a cheaper estimate."""
    one = Target.from_features("znver4", "+avx,+avx2,+fma,+avx512f", threads=1)
    assert model_cost(128, 256, 256, 1, 6, 64, tg=one) > model_cost(128, 256, 256, 1, 6, 64, tg=AVX512)
    # 6 x 64 is 24 accumulators: they fit AVX-512's 32 registers, AVX2's 16 spill
    assert model_cost(128, 256, 256, 1, 6, 64, tg=AVX2) > model_cost(128, 256, 256, 1, 6, 64, tg=AVX512)
    assert model_cost(128, 256, 256, 1, 4, 16, tg=AVX2) < model_cost(128, 256, 256, 1, 6, 64, tg=AVX2)


@pytest.mark.parametrize("M,K,N", [(128, 256, 256), (128, 256, 768), (128, 256, 1024), (128, 1024, 256)])
def test_avx2_dense_tile_holds_its_broadcasts_and_one_b_vector(M, K, N):
    """On AVX2 a k step's broadcasts stay in registers beside the accumulators, the B vectors pass
    through one: 3 x 32 (12 + 3 + 1) fits 16 registers and is the untuned tile of the transformer's
    dense layers (0.81-0.90 of 2 x 32's time, Zen 3), 6 x 16 and 4 x 24 (12 + 6 + 1, 12 + 4 + 1) spill."""
    _, cfg = default(dense(M, K, N), "dense", AVX2)
    assert (cfg["tile_m"], cfg["tile_n"]) == (3, 32)
    for mr, nr in [(6, 16), (4, 24)]:
        assert model_cost(M, K, N, 1, mr, nr, tg=AVX2) > model_cost(M, K, N, 1, 3, 32, tg=AVX2)
    # AVX-512 keeps its calibrated count: the tiles tuned there are unchanged
    _, zen = default(dense(M, K, N), "dense", AVX512)
    assert (zen["tile_m"], zen["tile_n"]) == (4, 64)


@pytest.mark.parametrize("M,K,N", [(128, 256, 256), (128, 256, 1024), (128, 1024, 256)])
def test_dense_default_on_two_full_width_fma_pipes_waits_for_no_streaming_panel(M, K, N):
    """Where two full-width FMAs a cycle outrun the L2's supply of a B panel larger than half the
    L1, the untuned tile has rows enough to use each B vector 6-8 times (the transformer's dense
    layers, Xeon: 4 x 64 ran 1.22-1.28x 8 x 32's time); Zen 4 (one such FMA a cycle) keeps its own."""
    _, cfg = default(dense(M, K, N), "dense", SPR)
    assert cfg["tile_m"] >= 6 and K * cfg["tile_n"] * 4 > SPR.l1d_bytes // 2
    _, zen = default(dense(M, K, N), "dense", AVX512)
    assert (zen["tile_m"], zen["tile_n"]) == (4, 64)
    assert model_cost(M, K, N, 1, 4, 64, tg=SPR) > model_cost(M, K, N, 1, 8, 32, tg=SPR)
    # a panel that fits half the L1 streams nothing: no wait for it
    assert model_cost(128, 64, 128, 1, 4, 64, tg=SPR) <= model_cost(128, 64, 128, 1, 8, 32, tg=SPR)


@pytest.mark.parametrize("M,K,N,l2,cols", [
    (197, 768, 3072, 2 << 20, True),     # ViT-B/16's FFN: 9 MB of weights, read again per row tile
    (197, 3072, 768, 2 << 20, True),     # ... even where A (2.4 MB) is read again per column tile
    (128, 256, 1024, 2 << 20, False),    # the transformer's, 1 MB: fits the L2, rows stay outside
    (128, 256, 1024, 1 << 20, False),    # ... and fits Zen 4's 1 MiB
    (128, 256, 1024, 512 << 10, True),   # Zen 3's 512 KiB it does not
    (1, 2048, 1000, 2 << 20, False),     # one row tile: nothing to walk
])
def test_dense_tiles_walk_the_operand_that_stays_in_the_l2(M, K, N, l2, cols):
    """Column tiles outside, each walking every row tile, where B outgrows the L2 and rows outside
    would read it from beyond it once per row tile (ViT-B/16 untuned, Xeon: 114.7 ms against 313)."""
    tg = Target.from_features("sapphirerapids", "+avx,+avx2,+fma,+avx512f,+avx512bw,+avx512vl",
                              threads=2, caches=(48 << 10, l2, 105 << 20))
    _, cfg = default(dense(M, K, N), "dense", tg)
    assert (cfg["order"][0] == "n") == cols
    mr, nr = cfg["tile_m"], cfg["tile_n"]
    assert (beyond_l2(M, K, N, mr, nr, "nm", l2) < beyond_l2(M, K, N, mr, nr, "mn", l2)) == cols or M == 1


@pytest.mark.parametrize("wl,name", [(conv(40, 9, 40), "conv2d"), (conv(32, 10, 32, group=32), "depthwise_conv2d"),
                                     (dense(3, 512, 1000), "dense"), (dense(20, 40, 23), "dense")])
def test_avx2_defaults_compute_the_reference(wl, name):
    """Kernels generated for the smaller machine (8-lane tiles, ragged 24-column tiles, k_split)
    are correct wherever they run."""
    with target.use(AVX2):
        t = template.get(name)
        sp = t.space(wl)
        cfg = t.default_config(wl, sp)
        got, want, _, _ = testing.run(wl, t, cfg)
    assert testing.max_rel_error(got, want) <= 1e-5, str(cfg)


def test_untuned_winograd_stops_where_its_weights_outgrow_the_cache():
    """Winograd's transformed weights (36 floats per channel pair) are streamed again per group of
    tiles: untuned modules take it while they fit in 3 L3s, or 6 over 32 tiles or more, whatever the
    L3 of the target is. 2048 -> 512 channels: 144 MiB transformed."""
    wino = template.get("conv2d_winograd")

    def tg(l3_mib):
        return Target.from_features("znver4", "+avx,+avx2,+fma,+avx512f", threads=2,
                                    caches=(32 << 10, 1 << 20, l3_mib << 20))
    with target.use(tg(16)):
        assert not wino.preferred(conv(2048, 28, 512)) and wino.preferred(conv(512, 28, 512))
    with target.use(tg(32)):         # FCN-ResNet50's head: 4.5 L3s over 49 tiles, but not over 16
        assert wino.preferred(conv(2048, 28, 512)) and not wino.preferred(conv(2048, 14, 512))
    with target.use(tg(64)):
        assert wino.preferred(conv(2048, 14, 512))


def test_untuned_winograd_needs_more_tiles_where_the_direct_conv_has_more_flops():
    """Winograd saves multiplies but not its transforms' loads and stores: on a core of twice Zen
    4's FLOPs a cycle the direct conv over 16 tiles of 4 x 4 (14x14) ran 0.71-0.8 of F(4x4)'s time
    (ResNet-18's and ResNet-50's 256 -> 256, Xeon), while over 49 (28x28) Winograd still won; over
    49 tiles of 2 x 2, 7 at a time on 2 vectors of channels, F(2x2) won on 14x14 and 13x13 too. A
    7x7 output has 16 of either: the direct conv stays."""
    wino = template.get("conv2d_winograd")
    for tg, small in ((AVX512, False), (AVX2, False), (SPR, True)):
        with target.use(tg):
            for C, H, K in ((256, 14, 256), (64, 13, 256)):
                assert wino.preferred(conv(C, H, K)), tg.llvm_cpu
                _, cfg = default(conv(C, H, K), "conv2d_winograd", tg)
                assert (cfg["tile_size"] == 2) == small, (tg.llvm_cpu, cfg.values)
                if small:
                    assert cfg["tile_tiles"] == 7 and cfg["tile_oc_blocks"] * choose_block(K) == 2 * tg.lanes(4)
                    assert cfg["transform"] == "per_block" and cfg["prefetch"] == 1
            assert wino.preferred(conv(128, 28, 128)), tg.llvm_cpu
            on_28 = default(conv(128, 28, 128), "conv2d_winograd", tg)[1].values
            assert on_28["tile_size"] == 4 and on_28["prefetch"] == 0
            assert not wino.preferred(conv(512, 7, 512)), tg.llvm_cpu


def test_winograd_weights_that_outgrow_the_l2_stream_less_often():
    """On a core of 64 FLOPs a cycle, where an item's transformed weights outgrow the L2 they are
    streamed once per group of tiles: 2 vectors of channels a tile let a group take 7 tiles, not 4
    (256 -> 256 on 28 x 28 on the Xeon: 0.70 of the time); where they fit (128 channels), or on
    cores of 32 FLOPs a cycle, 4 vectors stay. Where the stream would still take most of the direct
    conv's time (512 -> 512 dilated on 28 x 28, on Intel's server cores at 8 bytes a cycle beyond
    the L2), untuned modules run the direct conv; on AMD's (32 bytes a cycle) Winograd stays."""
    import dataclasses
    wino = template.get("conv2d_winograd")
    lanes = SPR.lanes(4)
    for C, vectors, tiles in ((256, 2, 7), (128, 4, 4)):
        _, cfg = default(conv(C, 28, C), "conv2d_winograd", SPR)
        assert (cfg["tile_oc_blocks"] * choose_block(C), cfg["tile_tiles"]) == (vectors * lanes, tiles), C
    assert default(conv(256, 28, 256), "conv2d_winograd", AVX512)[1]["tile_oc_blocks"] * 16 == 64
    for tg, dilated in ((SPR, False), (AVX512, True), (AVX2, True)):
        with target.use(tg):
            for d in (2, 4):
                assert wino.preferred(conv(512, 28, 512, p=d, d=d)) == dilated, (tg.llvm_cpu, d)
            assert wino.preferred(conv(256, 28, 256)) and wino.preferred(conv(2048, 28, 512)), tg.llvm_cpu
    with target.use(dataclasses.replace(SPR, l2_bytes=64 << 10)):      # the streaming tile computes the conv
        wl = conv(64, 14, 64)
        sp = wino.space(wl)
        cfg = wino.default_config(wl, sp)
        assert cfg["tile_oc_blocks"] * choose_block(64) == 2 * lanes
        got, want, _, _ = testing.run(wl, wino, cfg)
    assert testing.max_rel_error(got, want) <= 1e-5, str(cfg)


def test_the_rate_beyond_the_l2_follows_the_microarchitecture():
    feats = "+avx,+avx2,+fma,+avx512f"
    assert [Target.from_features(c, feats).beyond_l2_bytes_per_cycle
            for c in ("znver3", "znver4", "sapphirerapids", "emeraldrapids", "alderlake")] == [32, 32, 8, 8, 16]


@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v2", "transformer"])
def test_defaults_are_within_their_spaces(name):
    """Every template's default for the example models' tasks, on both targets, is a config its
    space admits: a default outside it would be measured and saved, then refused when read back."""
    import models
    from modelc.extract import extract_tasks
    model = models.build(name)
    shapes = {i.name: [d.dim_value or 1 for d in i.type.tensor_type.shape.dim] for i in model.graph.input}
    for tg in (AVX2, AVX512, SPR):
        with target.use(tg):
            for t in extract_tasks(model, shape=shapes):
                for tpl in map(template.get, [t.template, *t.alternatives]):
                    space = tpl.space(t.wl)
                    cfg = tpl.default_config(t.wl, space)
                    assert space.is_valid(cfg), (tg.llvm_cpu, tpl.name, t.desc, cfg.values)


def test_avx2_tiles_take_one_vector_where_two_vectors_of_weights_outgrow_the_l2():
    """On AVX2 a pixel takes two vectors of output channels, unless a tile's weights (C x 3 x 3 x 16
    floats: 1.2 MB for 2048 input channels) then outgrow the L2: one vector over more pixels loads
    them from the L3 half as often. Half the L2 decides (the next tile's weights stream in behind a
    tile's), not the channel count: Zen 3's 512 KiB L2 and ResNet's 3x3 512 -> 512 on 7x7 (295 KB
    for two vectors) took 7 pixels x 1 vector, 0.88 of 4 x 2's time."""
    import dataclasses
    tpl = template.get("conv2d")
    for c, l2, vectors in ((2048, 2 << 20, 1), (2048, 4 << 20, 2), (256, 1 << 20, 2)):
        with target.use(dataclasses.replace(AVX2, l2_bytes=l2)):
            wl = conv(c, 28, 256)                      # (blocks of AVX2's 8 channels)
            cfg = tpl.default_config(wl, tpl.space(wl))
        assert cfg["tile_oc_blocks"] * wl.outputs[0].layout[0] // 8 == vectors, (c, l2, cfg.values)
    for tg, want in ((ZEN3, (7, 8)), (AVX2, (4, 16))):      # 512 KiB, 1 MiB
        with target.use(tg):
            wl = conv(512, 7, 512)
            cfg = tpl.default_config(wl, tpl.space(wl))
        assert (cfg["tile_ow"], cfg["tile_oc_blocks"] * 8) == want, tg.l2_bytes


def test_broadcasts_load_pixel_by_pixel_where_hoisting_them_would_spill():
    """With the FMA's broadcast operand, a tile whose accumulators, pixels' broadcasts and weight
    vectors outnumber the registers loads each pixel's broadcast by its FMAs; AVX2 never does."""
    assert SPR.broadcasts_by_pixel(14, 2) and SPR.broadcasts_by_pixel(6, 4) and AVX512.broadcasts_by_pixel(14, 2)
    assert not SPR.broadcasts_by_pixel(7, 2) and not SPR.broadcasts_by_pixel(3, 4)
    assert not AVX2.broadcasts_by_pixel(6, 2) and not AVX2.broadcasts_by_pixel(12, 1)


def test_conv2d_default_takes_two_rows_where_broadcasts_load_pixel_by_pixel():
    """On Intel's AVX-512 cores the 7 x 2-vector tile doubles to two rows (28 accumulators, which
    loading broadcasts pixel by pixel keeps in registers; ResNet-50's module 0.97 of its time), but not
    where a tile is shifted (a shifted last tile guards its stores), where passes need whole tiles
    (7x7), where a ScaledConv's scale takes the register, nor on Zen 4 (one vector a pixel) or AVX2."""
    for C, H, K, k in [(256, 56, 64, 1), (512, 28, 128, 1), (256, 14, 256, 3)]:
        wl = conv(C, H, K, k, p=k // 2)
        _, cfg = default(wl, "conv2d", SPR)
        assert (cfg["tile_ow"], cfg["tile_oc_blocks"], cfg["tile_oh"]) == (7, 2, 2), (C, H, K, k, cfg)
        with target.use(SPR):
            src = template.get("conv2d").build(wl, cfg).source
        assert "xv = " in src and "x0_0 = " not in src
        assert default(wl, "conv2d", AVX512)[1]["tile_oh"] == 1
        _, cfg = default(wl, "conv2d", AVX2)                 # (two rows only as a whole tile for passes)
        assert cfg["tile_oh"] == 1 or cfg["c_chunk"] and cfg["tile_ow"] * cfg["tile_oh"] <= 4
        with target.use(AVX2):
            assert "x0_0 = " in template.get("conv2d").build(wl, cfg).source
        _, cfg = default(conv(C, H, K, k, p=k // 2, scaled=True), "conv2d", SPR)
        assert cfg["tile_oh"] == 1 and cfg["tile_oc_blocks"] == 2
    # odd rows, 26 blocks of 8 in tiles of 4 (shifted last tiles guard their stores), passes on 7x7
    for C, H, K, k in [(64, 55, 64, 1), (384, 13, 64, 1), (104, 28, 208, 1), (2048, 7, 512, 1), (512, 7, 512, 3)]:
        _, cfg = default(conv(C, H, K, k, p=k // 2), "conv2d", SPR)
        assert cfg["tile_oh"] == 1 and cfg["tile_oc_blocks"] * choose_block(K) == 32, (C, H, K, k, cfg)
    assert default(conv(2048, 7, 512, 1, p=0), "conv2d", SPR)[1]["c_chunk"]
