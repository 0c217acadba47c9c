"""conv2d template: default and random valid configs against the reference, over shapes."""
import itertools
import platform
import uuid

import numpy as np
import pytest

from modelc import target
from modelc.target import Target
from modelc.kernels import templates  # noqa: F401
from modelc.kernels import template, testing
from modelc.kernels.layout import choose_block
from workloads import conv2d_wl

CASES = [
    dict(C=16, H=10, W=9, K=32, k=3, s=1, p=1, hin=1, hout=1, residual=True),
    dict(C=3, H=17, W=17, K=16, k=7, s=2, p=3, hin=3, hout=0, act="Clip"),
    dict(C=32, H=8, W=8, K=64, k=1, s=2, p=0, hin=0, hout=1, bias=False, act=None),
    dict(C=16, H=9, W=11, K=16, k=3, s=1, p=2, hin=2, hout=0, dil=2),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"c{c['C']}k{c['K']}x{c['k']}s{c['s']}")
def test_conv2d_default_and_random_configs(case):
    wl = conv2d_wl(**case)
    tpl = template.select(wl)
    assert tpl.name == "conv2d"
    space = tpl.space(wl)
    valid = space.valid_indices()
    rng = np.random.default_rng(len(valid))
    configs = [tpl.default_config(wl, space)] + [space.get(int(i)) for i in rng.choice(valid, 2, replace=False)]
    for cfg in configs:
        got, want, _, _ = testing.run(wl, tpl, cfg)
        assert testing.max_rel_error(got, want) <= 1e-5, str(cfg)


def test_conv2d_space_is_large_enough_to_tune():
    wl = conv2d_wl(C=64, H=56, W=56, K=64, k=3, s=1, p=1, hin=1, hout=1)
    tpl = template.select(wl)
    space = tpl.space(wl)
    assert len(space.valid_indices()) >= 150
    assert "tile_ow" in space.get(0).describe()


def test_knobs_that_change_nothing_are_not_searched():
    """Over a 1x1 filter both reduction orders and both unroll_kw build one kernel: the space
    offers each kernel once (a 1,000-trial MobileNetV2 log had measured 333 of its 701 1x1 trials
    again under another name), while a 3x3 filter keeps both choices."""
    one = conv2d_wl(C=96, H=14, W=14, K=24, k=1, s=1, p=0, hin=0, hout=1)
    tpl = template.select(one)
    space = tpl.space(one)
    valid = [space.get(i).values for i in space.valid_indices()]
    rest = [tuple((k, str(v)) for k, v in c.items() if k not in ("reduction_order", "unroll_kw")) for c in valid]
    assert valid and len(set(rest)) == len(rest)
    assert space.is_valid(tpl.default_config(one, space))
    # a log written before keeps its records: the other values still name a config
    moot = space.from_values(dict(valid[0], reduction_order=["kh", "c", "kw"], unroll_kw=True))
    assert not space.is_valid(moot)
    three = conv2d_wl(C=32, H=14, W=14, K=32, k=3, s=1, p=1, hin=1, hout=1)
    sp3 = tpl.space(three)
    seen = {(str(sp3.get(i)["reduction_order"]), sp3.get(i)["unroll_kw"]) for i in sp3.valid_indices()}
    assert len(seen) == 4


@pytest.mark.parametrize("C,K", [(24, 40), (116, 116), (16, 24), (58, 58)])
def test_narrow_channel_blocks_fill_a_vector_with_overlapping_tiles(C, K):
    """K = 40, 116, 24 give output blocks of 8, 4, 8: tiles of m blocks (m need not divide the
    blocks; the last tile is shifted back) are correct for every m, and the default fills 16 lanes
    with a last tile that recomputes at most a quarter of the blocks (24 = 3 blocks: tiles of 3) where
    a 512-bit FMA takes both of the core's pipes (AMD Zen 4; on cores of full-width pipes the block
    count of fewest FMA slots: test_kernels_target.py)."""
    wl = conv2d_wl(C=C, H=7, W=9, K=K, k=3, s=1, p=1, hin=1, hout=0, residual=True)
    tpl = template.select(wl)
    kb = choose_block(K)
    with target.use(Target.from_features("znver4", "+avx,+avx2,+fma,+avx512f,+avx512bw,+avx512vl", threads=2)):
        space = tpl.space(wl)
        default = tpl.default_config(wl, space)
    m, blocks = default["tile_oc_blocks"], K // kb
    assert m * kb >= min(16, K) and -(-blocks // m) * m <= 1.25 * blocks, default
    space = tpl.space(wl)
    for m in space.knobs[1].values:
        cfg = space.from_values(dict(default.values, tile_oc_blocks=m, tile_ow=3))
        got, want, _, _ = testing.run(wl, tpl, cfg)
        assert testing.max_rel_error(got, want) <= 1e-5, str(cfg)


@pytest.mark.parametrize("unroll", [False, True])
def test_reduction_order_says_which_loops_run_outside(unroll):
    """The knob's order is the order of the loops over input-channel blocks (c) and filter rows
    (kh) in the source; filter columns (kw) run inside both, and the result does not change."""
    wl = conv2d_wl(C=32, H=6, W=7, K=16, k=3, s=1, p=1, hin=1, hout=0)
    tpl = template.select(wl)
    space = tpl.space(wl)
    for order in space.knobs[3].values:
        cfg = space.from_values(dict(tpl.default_config(wl, space).values, reduction_order=order,
                                     unroll_kw=unroll))
        src = tpl.build(wl, cfg).source
        loops = {"c": src.index("for cb in range("), "kh": src.index("for kh in range(")}
        loops["kw"] = src.index("for kw in range(") if not unroll else src.index("np.uintp(xrow0 + (ow0")
        assert sorted(loops, key=loops.get) == order, (order, loops)
        got, want, _, _ = testing.run(wl, tpl, cfg)
        assert testing.max_rel_error(got, want) <= 1e-5, str(cfg)


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="reads x86 assembly")
def test_epilogue_of_the_register_tile_is_vectorised():
    """Bias, ReLU6 and store of the tile as vector instructions: without LLVM's SLP vectoriser (numba
    leaves it off) or with Clip as numba's min(max()), they ran one float at a time (vaddss/vmaxss),
    and a 1x1 conv 16 -> 96 on 112x112 took 2.7x as long."""
    import numba
    from modelc.kernels import cache
    assert numba.config.SLP_VECTORIZE
    wl = conv2d_wl(C=16, H=8, W=15, K=32, k=1, s=1, p=0, hin=0, hout=1, act="Clip")
    tpl = template.select(wl)
    space = tpl.space(wl)
    # whole tiles (every pixel's store in one lane loop), tiles shifted back over the row's end
    # (15 % 4: a guarded loop per pixel), and the map as one row (each pixel found in its row)
    for owt, flat in ((5, False), (4, False), (4, True)):
        cfg = space.from_values(dict(tpl.default_config(wl, space).values, tile_ow=owt, flat=flat, tile_oh=1))
        assert space.is_valid(cfg)
        kernel = tpl.build(wl, cfg)
        assert (" if ow0 + " in kernel.source) == (owt == 4 and not flat)
        # a source of its own, so numba compiles it here and keeps the assembly
        fn = cache.load(kernel.source + f"# {uuid.uuid4().hex}\n")
        asm = fn.cfunc._library.get_asm_str()
        assert asm.count("vfmadd") > 0
        scalar = [op for op in ("vaddss", "vmaxss", "vminss", "vmovss") if op in asm]
        assert not scalar, f"scalar instructions in the epilogue of tile_ow {owt}: {scalar}"
        got, want, _, _ = testing.run(wl, tpl, cfg)
        assert testing.max_rel_error(got, want) <= 1e-5


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="reads x86 assembly")
def test_epilogue_reading_its_value_twice_loads_the_bias_once():
    """Swish reads its operand twice (x * sigmoid(x)); with the bias read at a signed index, LLVM
    loaded it with gathers (vgatherqps), and EfficientNet's 1x1 conv 16 -> 96 on 112x112 took 1.7x
    as long (AMD EPYC Zen 4). The bias is read at an unsigned offset, and the value bound once."""
    from modelc.kernels import cache
    wl = conv2d_wl(C=16, H=2, W=28, K=96, k=1, s=1, p=0, hin=0, hout=1, act="Swish")   # gathered at K >= 48
    tpl = template.select(wl)
    cfg = tpl.default_config(wl, tpl.space(wl))
    fn = cache.load(tpl.build(wl, cfg).source + f"# {uuid.uuid4().hex}\n")
    asm = fn.cfunc._library.get_asm_str()
    assert "vdivps" in asm or "vrcp" in asm                    # the sigmoid, vectorised
    assert "vgather" not in asm and "vscatter" not in asm
    got, want, _, _ = testing.run(wl, tpl, cfg)
    assert testing.max_rel_error(got, want) <= 1e-5



def test_every_output_is_stored_by_exactly_one_item():
    """Tiles that would pass the end of rows (9 rows in tiles of 2), columns (9 in tiles of 4) and
    channels (3 blocks of 8 in tiles of 2) are shifted back and recompute; only the tile that owns an
    output may store it. Two items storing one output raced, and LLVM rounds the same sum differently
    in two places of the unrolled tile (fast-math reassociates the bias and residual adds): a
    MobileNetV2 module's results changed from run to run in the last bit. Each item is run alone here
    on an output full of NaN, to count who stores what."""
    wl = conv2d_wl(C=32, H=9, W=9, K=24, k=1, s=1, p=0, hin=0, hout=0, residual=True, act=None)
    tpl = template.select(wl)
    space = tpl.space(wl)
    cfg = space.from_values(dict(tpl.default_config(wl, space).values, tile_oc_blocks=2, tile_oh=2, tile_ow=4))
    got, want, fn, args = testing.run(wl, tpl, cfg)
    assert testing.max_rel_error(got, want) <= 1e-5
    writers = testing.stores_per_output(fn, args)
    assert writers.min() == 1 and writers.max() == 1, np.bincount(writers)


@pytest.mark.parametrize("H,tile,chunk", [(9, 5, 0), (6, 4, 1)])
def test_a_pointwise_map_as_one_row_matches_and_stores_each_output_once(H, tile, chunk):
    """A 1x1 conv's map as one row (`flat`): tiles of 5 pixels run on across the ends of 9-pixel rows
    (the last shifted back), tiles of 4 over 6 x 6 pixels are whole and take passes over the input
    channels; with a residual add and an output halo, each output pixel is found in its row again:
    stored by exactly one item, the halo by none. Convs that read an input halo or are not 1x1 keep
    their rows, and a tile that divides the row is not offered twice."""
    wl = conv2d_wl(C=32, H=H, W=H, K=32, k=1, s=1, p=0, hin=0, hout=1, residual=True)
    tpl = template.select(wl)
    space = tpl.space(wl)
    cfg = space.from_values(dict(tpl.default_config(wl, space).values, tile_ow=tile, tile_oh=1, tile_oc_blocks=2,
                                 flat=True, c_chunk=chunk))
    assert space.is_valid(cfg)
    assert not space.is_valid(space.from_values(dict(cfg.values, tile_ow=3, c_chunk=0)))     # 3 divides the row
    got, want, fn, args = testing.run(wl, tpl, cfg)
    assert testing.max_rel_error(got, want) <= 1e-5
    kb = choose_block(32)
    writers = testing.stores_per_output(fn, args).reshape(1, 32 // kb, H + 2, H + 2, kb)
    assert (writers[:, :, 1:-1, 1:-1] == 1).all() and writers.sum() == 32 * H * H, np.bincount(writers.ravel())
    for other in (dict(k=1, p=0, hin=1), dict(k=3, p=1, hin=1)):
        wl2 = conv2d_wl(C=32, H=H, W=H, K=32, s=1, hout=1, **other)
        assert tpl.space(wl2).values("flat") == [False]


@pytest.mark.parametrize("act,reassoc", [("Relu", False), ("Clip", False), ("Swish", True)])
def test_direct_conv_sums_in_order_unless_a_polynomial_needs_reassociation(act, reassoc):
    """Allowed to reassociate, LLVM vectorised a tile's loop over input channels (horizontal sums)
    instead of its output channels whenever it had unrolled that loop first: on AVX2, MobileNetV2's
    1x1 convs ran 5-8x onnxruntime's time (docs/performance.md). The sigmoid polynomial of a SiLU
    epilogue vectorises only with it, so that kernel keeps it."""
    wl = conv2d_wl(C=16, H=2, W=28, K=96, k=1, s=1, p=0, hin=0, hout=1, act=act)
    tpl = template.select(wl)
    cfg = tpl.default_config(wl, tpl.space(wl))
    src = tpl.build(wl, cfg).source
    flags = next(ln for ln in src.splitlines() if ln.startswith("@numba.cfunc("))
    assert ("'reassoc'" in flags) == reassoc and "'contract'" in flags
    got, want, _, _ = testing.run(wl, tpl, cfg)
    assert testing.max_rel_error(got, want) <= 1e-5


@pytest.mark.parametrize("case", [
    dict(C=16, H=14, W=14, K=32, k=3, s=1, p=6, hin=6, hout=0, dil=6, residual=True),
    dict(C=8, H=9, W=7, K=16, k=3, s=2, p=4, hin=4, hout=1, dil=4, act="Clip"),
    dict(C=16, H=4, W=4, K=16, k=3, s=1, p=1, hin=1, hout=1),
], ids=["dil6", "dil4s2", "map4"])
def test_tiles_skip_the_taps_that_read_padding(case):
    """Where most products would read the zero halo (a dilated conv on a small map), each tile runs
    only the taps that reach the input for some of its pixels; every config agrees with the
    reference, and on the 14x14 map the default's tile computes fewer products than a row's."""
    from modelc.kernels.conv2d import BOUNDED_TAPS
    from modelc.kernels.conv_geometry import computed_taps, conv_geometry, padding_share
    wl = conv2d_wl(**case)
    g = conv_geometry(wl)
    assert padding_share(g) > BOUNDED_TAPS
    tpl = template.select(wl)
    space = tpl.space(wl)
    valid = space.valid_indices()
    rng = np.random.default_rng(len(valid))
    default = tpl.default_config(wl, space)
    assert space.is_valid(default)
    if case["H"] == 14:         # (tiles of a row of 4 or 7 have too few accumulators to compare)
        assert computed_taps(g, default["tile_oh"], default["tile_ow"]) < computed_taps(g, 1, g.OW)
    assert "khl" in tpl.build(wl, default).source
    for cfg in [default] + [space.get(int(i)) for i in rng.choice(valid, 3, replace=False)]:
        got, want, _, _ = testing.run(wl, tpl, cfg)
        assert testing.max_rel_error(got, want) <= 1e-5, str(cfg)
    ordinary = conv2d_wl(C=16, H=14, W=14, K=32, k=3, s=1, p=1, hin=1, hout=1)
    assert padding_share(conv_geometry(ordinary)) < BOUNDED_TAPS
    assert "khl" not in tpl.build(ordinary, tpl.default_config(ordinary, tpl.space(ordinary))).source


@pytest.mark.parametrize("k", [1, 3])
def test_passes_over_input_channels_give_the_same_sums(k):
    """c_chunk: the tiles of an output-channel tile run over a share of the input channels at a
    time, their sums waiting on the stack between passes; every pass count and tile gives the
    outputs of one pass (with the epilogue's residual add after the last pass only)."""
    wl = conv2d_wl(C=64, H=6, W=8, K=48, k=k, s=1, p=k // 2, hin=k // 2, hout=1, residual=True)
    tpl = template.select(wl)
    space = tpl.space(wl)
    chunks = [c for c in space.values("c_chunk") if c]
    assert chunks
    default = tpl.default_config(wl, space).values
    ran = 0
    for c in chunks:
        for owt, oh, pf in ((4, 1, 0), (2, 2, 1), (8, 1, 0)):
            cfg = space.from_values(dict(default, c_chunk=c, tile_ow=owt, tile_oh=oh, tile_oc_blocks=1, prefetch=pf))
            if space.is_valid(cfg):
                got, want, _, _ = testing.run(wl, tpl, cfg)
                assert testing.max_rel_error(got, want) <= 1e-5, str(cfg)
                ran += 1
    assert ran >= len(chunks)
    # tiles that would overlap (shifted back at the row's end) never pass over the channels
    assert not space.is_valid(space.from_values(dict(default, c_chunk=chunks[0], tile_ow=3)))


@pytest.mark.parametrize("k", [1, 3])
def test_prefetching_weights_changes_no_sum(k):
    """prefetch: a hint ahead of the weight loads (the next pass's, the next filter row's or
    block's, past the end at the last tile): bit-identical outputs in either reduction order."""
    wl = conv2d_wl(C=48, H=7, W=7, K=32, k=k, s=1, p=k // 2, hin=k // 2, hout=1, residual=True)
    tpl = template.select(wl)
    space = tpl.space(wl)
    default = tpl.default_config(wl, space).values
    orders = space.values("reduction_order")[:1 if k == 1 else 2]
    for order, chunk, owt in itertools.product(orders, (0, 1), (7, 3)):
        base = dict(default, reduction_order=order, c_chunk=chunk, tile_ow=owt, tile_oh=1, tile_oc_blocks=2)
        plain, fetch = space.from_values(dict(base, prefetch=0)), space.from_values(dict(base, prefetch=1))
        if not space.is_valid(fetch):
            continue
        assert "prefetch(w, " in tpl.build(wl, fetch).source and "prefetch(" not in tpl.build(wl, plain).source
        got, want, _, _ = testing.run(wl, tpl, fetch)
        assert testing.max_rel_error(got, want) <= 1e-5, str(fetch)
        assert np.array_equal(got, testing.run(wl, tpl, plain)[0]), str(fetch)


@pytest.mark.parametrize("k", [1, 3])
def test_items_split_by_rows_give_the_same_outputs(k, monkeypatch):
    """Items split by output rows (each thread walking every output-channel tile of its rows): with
    shifted last tiles along rows, columns and channels alike the outputs are those of the split by
    channel tiles, bit for bit."""
    from modelc.kernels import conv2d
    wl = conv2d_wl(C=32, H=9, W=10, K=80, k=k, s=1, p=k // 2, hin=k // 2, hout=1, residual=True)
    tpl = template.select(wl)
    space = tpl.space(wl)
    default = dict(tpl.default_config(wl, space).values, c_chunk=0, prefetch=0)
    # shifted along rows and columns, along channels (80 = 5 blocks of 16, or 10 of 8 on AVX2, whose
    # 16 registers take fewer accumulators), and a taller tile: the first of each the target admits
    for tiles in (((4, 2, 2), (4, 2, 1)), ((5, 1, 4), (1, 1, 4)), ((3, 4, 1),)):
        cfg = next(c for c in (space.from_values(dict(default, tile_ow=owt, tile_oh=oh, tile_oc_blocks=m))
                               for owt, oh, m in tiles) if space.is_valid(c))
        monkeypatch.setattr(conv2d, "splits_by_rows", lambda *a: False)
        chans, by_channels = testing.run(wl, tpl, cfg)[0], tpl.build(wl, cfg).source
        monkeypatch.setattr(conv2d, "splits_by_rows", lambda *a: True)
        assert tpl.build(wl, cfg).source != by_channels
        got, want, _, _ = testing.run(wl, tpl, cfg)
        assert testing.max_rel_error(got, want) <= 1e-5, str(cfg)
        assert np.array_equal(got, chans), str(cfg)


@pytest.mark.parametrize("k,s", [(1, 1), (3, 2)])
def test_broadcasts_loaded_pixel_by_pixel_give_the_same_sums(k, s, monkeypatch):
    """Tiles loading each pixel's broadcast by its FMAs (where hoisting them all would spill) sum in
    the usual order: with shifted last tiles along rows, columns and channels, outputs bit for bit
    those of the usual source, whatever the host's own rule."""
    wl = conv2d_wl(C=32, H=13, W=11, K=80, k=k, s=s, p=k // 2, hin=k // 2, hout=1, residual=True)
    tpl = template.select(wl)
    space = tpl.space(wl)
    default = dict(tpl.default_config(wl, space).values, c_chunk=0, prefetch=0)
    for owt, oh, m in ((5, 2, 2), (3, 4, 1), (4, 1, 4)):
        cfg = space.from_values(dict(default, tile_ow=owt, tile_oh=oh, tile_oc_blocks=m))
        monkeypatch.setattr(Target, "broadcasts_by_pixel", lambda *a: False)
        usual, src = testing.run(wl, tpl, cfg)[0], tpl.build(wl, cfg).source
        monkeypatch.setattr(Target, "broadcasts_by_pixel", lambda *a: True)
        by_pixel = tpl.build(wl, cfg).source
        assert "x0_0 = " in src and "x0_0 = " not in by_pixel and by_pixel.count("xv = ") == owt * oh
        got, want, _, _ = testing.run(wl, tpl, cfg)
        assert testing.max_rel_error(got, want) <= 1e-5, str(cfg)
        assert np.array_equal(got, usual), str(cfg)
