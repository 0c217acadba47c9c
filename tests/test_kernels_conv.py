"""Depthwise and generic convolution templates against the reference executor.

Hand-made workloads (the JSON `extract.workload_of` writes) cover MobileNetV2-style depthwise
layers in the blocked layout (stride 1/2, output halos, ReLU6, residual add) and the fallback's
cases: grouped, dilated, asymmetric pads, 1-d, 3-d, odd channels, plain and blocked layouts,
several outputs, ConvTranspose. Each runs its default config and a few seeded random configs.
"""
import re
import random

import pytest

from modelc.kernels import template, templates, testing  # noqa: F401  (registers the templates)
from modelc.target import Target
from workloads import conv_wl, dw_wl

TOL = 1e-5
# a CPU whose registers hold tiles AVX2's refuse; the float kernels here are plain numba loops, which numba
# compiles for the host, so a kernel generated for it runs on any x86 machine
AVX512 = Target.from_features("znver4", "+avx,+avx2,+fma,+avx512f,+avx512bw,+avx512vl", threads=2)


def check(wl, name, extra=(), n_random=0, seed=0):
    """The default config, `extra` variations of it and `n_random` random valid configs agree
    with the reference (every config a separate compile: keep the lists short)."""
    t = template.select(wl)
    assert t.name == name
    sp = t.space(wl)
    default = t.default_config(wl, sp)
    cfgs = [default] + [sp.from_values({**default.values, **e}) for e in extra]
    rng = random.Random(seed)
    cfgs += [sp.get(i) for i in rng.sample(sp.valid_indices(), n_random)]
    for cfg in cfgs:
        assert sp.is_valid(cfg), str(cfg)
        got, want, _, _ = testing.run(wl, t, cfg)
        for g, w in zip(got, want):
            assert g.shape == w.shape
        err = testing.max_rel_error(got, want)
        assert err <= TOL, f"{name} {cfg}: max rel error {err:.2e}"


# ---- depthwise ------------------------------------------------------------------------------

@pytest.mark.parametrize("case,extra", [
    (dict(c=32, h=13, s=1, hout=1), [dict(tile_oh=2, rows_per_task=4, tile_ow=4)]),   # ReLU6, halo
    (dict(c=48, h=11, w=9, s=2), [dict(unroll_kh=False, tile_ow=3)]),                  # stride 2
    (dict(c=16, h=8, s=1, res=True, clip=False, hout=1), []),                          # residual
    # (2 x 4 pixels: within the 8 accumulators AVX2 leaves a tile, as within AVX-512's 16)
    (dict(c=24, h=9, k=5, p=2, hin=2, s=2), [dict(tile_oh=2, rows_per_task=4, unroll_kh=False, tile_ow=4)]),
    (dict(c=32, h=10, d=2, p=2, hin=2, bias=False, n=2), []),      # dilation 2, batch 2, no bias
])
def test_depthwise(case, extra):
    check(dw_wl(**case), "depthwise_conv2d", extra)


MOBILENET_DW = [(32, 112, 1), (96, 112, 2), (144, 56, 1), (144, 56, 2), (192, 28, 1), (192, 28, 2),
                (384, 14, 1), (576, 14, 1), (576, 14, 2), (960, 7, 1)]


@pytest.mark.parametrize("c,h,s", MOBILENET_DW)
def test_depthwise_mobilenet_space(c, h, s):
    """MobileNetV2's depthwise layers: taken, a valid default with enough parallel tasks."""
    wl = dw_wl(c, h, s=s, hout=1)
    t = template.select(wl)
    assert t.name == "depthwise_conv2d"
    sp = t.space(wl)
    cfg = t.default_config(wl, sp)
    assert sp.is_valid(cfg) and len(sp.valid_indices()) > 10
    src = t.build(wl, cfg).source
    assert "prange" in src and re.search(r"out0\[b__\d+ \+ lit__\d+\]", src)   # stores from one base


def test_depthwise_not_taken():
    # halo smaller than the pads, or a plain input: the generic fallback
    assert template.select(dw_wl(32, 8, p=1, hin=0)).name == "conv_generic"
    wl = conv_wl([1, 32, 8, 8], [32, 1, 3, 3], group=32, pads=[1] * 4)
    assert template.select(wl).name == "conv_generic"


# ---- generic --------------------------------------------------------------------------------

GENERIC = {
    "grouped": (lambda: conv_wl([1, 32, 9, 9], [32, 4, 3, 3], group=8, pads=[1] * 4, relu=True),
                [dict(stage_row=False, tile_ow=4, tile_oc=2)]),
    "grouped_blocked": (lambda: conv_wl([1, 32, 8, 8], [64, 8, 3, 3], group=4, strides=[2, 2],
                                        pads=[1] * 4, x_layout=[16, 1], out_layout=[16, 1],
                                        clip=True, res=True, res_layout=[16, 0]),
                        [dict(vector_axis="ow", tile_oc=4, stage_row=True, unroll_kw=True)]),
    "oc_border": (lambda: conv_wl([1, 8, 9, 10], [16, 8, 3, 3], strides=[2, 1], dilations=[1, 2],
                                  pads=[1, 2, 0, 1], relu=True),
                  [dict(tile_ow=4, tile_oc=8)]),
    "dilated_asym": (lambda: conv_wl([2, 5, 12, 11], [7, 5, 3, 2], dilations=[2, 3],
                                     pads=[2, 0, 1, 3], strides=[1, 2], res=True),
                     [dict(stage_row=True, unroll_kw=False)]),
    "conv1d": (lambda: conv_wl([2, 6, 40], [10, 3, 5], group=2, strides=[2], pads=[2, 1],
                               relu=True), [dict(tile_ow=7, stage_row=True)]),
    "conv3d": (lambda: conv_wl([1, 3, 6, 7, 8], [4, 3, 3, 3, 3], pads=[1, 0, 1, 1, 1, 0],
                               strides=[1, 2, 1], bias=False, outputs="all", relu=True),
               [dict(unroll_kw=False, tile_ow=2)]),
    # a 1x1 grouped conv over plain rows: a 1-d conv over the flattened image (ShuffleNet v1)
    "grouped_1x1_flat": (lambda: conv_wl([1, 24, 9, 11], [32, 6, 1, 1], group=4, relu=True, res=True,
                                         outputs="all"),
                         [dict(vector_axis="ow", tile_ow=32, tile_oc=2), dict(vector_axis="ow", tile_ow=99, tile_oc=4),
                          dict(vector_axis="oc", tile_ow=8, tile_oc=8)]),
    # tiles of 16 channels over two groups of 8 (an odd number of groups: the last tile half empty)
    "pair_tail": (lambda: conv_wl([1, 40, 7, 7], [40, 8, 3, 3], group=5, pads=[1] * 4, x_layout=[8, 1],
                                  out_layout=[8, 1], relu=True, res=True, res_layout=[8, 0]),
                  [dict(tile_ow=4, stage_row=False), dict(unroll_kw=False)]),
    # an ungrouped 3-d conv to 23 channels: the second tile runs past them
    "wide_3d": (lambda: conv_wl([1, 5, 3, 6, 7], [23, 5, 1, 3, 3], pads=[0, 1, 1, 0, 1, 1], strides=[1, 2, 1],
                                relu=True, res=True),
                [dict(tile_ow=2)]),
    # ... over groups of 24: some tiles within a group, some split at its edge; flattened rows (16 pixels of
    # 16 channels: a tile AVX-512's registers hold, not AVX2's, so its variation is AVX-512's on every host)
    "pair_1x1": (lambda: conv_wl([1, 48, 5, 5], [48, 24, 1, 1], group=2, relu=True, outputs="all"),
                 [dict(tile_ow=16)], AVX512),
    # groups of 56 (RegNetY-8GF's): tiles of two or three channel vectors within a group, the last
    # one part zero weights (and a padded bias), blocked in and out, residual add
    "padded_groups": (lambda: conv_wl([1, 112, 6, 9], [112, 56, 3, 3], group=2, pads=[1] * 4, x_layout=[8, 1],
                                      out_layout=[8, 0], relu=True, res=True, res_layout=[8, 0]), []),
    "padded_groups_s2": (lambda: conv_wl([1, 112, 9, 9], [112, 56, 3, 3], group=2, pads=[1] * 4, strides=[2, 2],
                                         relu=True), []),
    "float64": (lambda: conv_wl([1, 3, 7, 7], [5, 3, 3, 3], pads=[1] * 4, dtype="float64",
                                clip=True), []),
    "convT": (lambda: conv_wl([1, 6, 5, 4], [6, 2, 3, 3], op="ConvTranspose", group=3,
                              strides=[2, 2], pads=[1, 0, 0, 1], relu=True,
                              extra_attrs={"output_padding": [1, 0]}),
              [dict(tile_ow=1, tile_oc=1, unroll_kw=False)]),
    "convT1d": (lambda: conv_wl([1, 4, 9], [4, 3, 4], op="ConvTranspose", strides=[3],
                                dilations=[2], pads=[2, 1]), []),
}


@pytest.mark.parametrize("name", sorted(GENERIC))
def test_generic(name):
    """The host's default config and the case's variations of it; a case whose variations are tiles only a named
    target's registers hold (AVX-512's) checks them, and that target's default, under its description on every host."""
    from modelc import target
    make, extra, *sized_for = GENERIC[name]
    if not sized_for:
        check(make(), "conv_generic", extra)
        return
    check(make(), "conv_generic")
    with target.use(sized_for[0]):
        check(make(), "conv_generic", extra)


def test_a_1x1_conv_over_plain_rows_runs_over_the_flattened_image():
    """Its tiles span rows (99 pixels of a 9 x 11 image); not where an epilogue operand is neither the
    image nor one value per channel, or where the input is blocked."""
    from modelc.kernels.conv_generic import _geometry
    g, flat = _geometry(GENERIC["grouped_1x1_flat"][0]())
    assert flat == 11 and g.spatial_out == (99,)
    assert _geometry(GENERIC["grouped"][0]())[1] is None                        # 3x3, padded
    assert _geometry(conv_wl([1, 32, 8, 8], [64, 8, 1, 1], group=4, x_layout=[16, 0]))[1] is None
    wl = conv_wl([1, 24, 9, 11], [32, 6, 1, 1], group=4, res=True)
    wl.inputs[-1].shape = (1, 32, 9, 1)                                          # broadcast along a row
    assert _geometry(wl)[1] is None


def test_pair_tiles_where_groups_are_half_vectors():
    """Groups of 8k channels (k odd) take the 16-channel tile by default; past the last channel only
    with a packed (constant) bias, which is padded with the weights."""
    for name in ("pair_tail", "pair_1x1", "wide_3d"):
        wl = GENERIC[name][0]()
        t = template.select(wl)
        assert t.default_config(wl, t.space(wl))["tile_oc"] == 16, name
    wl = GENERIC["pair_tail"][0]()
    wl.inputs[2].const = False
    assert 16 not in template.select(wl).space(wl).knobs[1].values
    from modelc.kernels.channel_tiles import wide_tile as _wide_tile
    from modelc.kernels.conv_geometry import conv_geometry
    for w, group, wide in (([32, 8, 3, 3], 4, True), ([32, 16, 3, 3], 2, False), ([32, 4, 3, 3], 8, False),
                           ([40, 32, 3, 3], 1, True), ([4, 32, 3, 3], 1, False)):
        wl = conv_wl([1, 32, 8, 8], w, group=group, pads=[1] * 4)
        assert _wide_tile(wl, conv_geometry(wl)) == wide, (w, group)


def test_padded_tiles_within_groups_of_8_times_odd_channels():
    """Every padded tile the host's space offers agrees with the reference; on AVX-512 (half-vector
    pairs would blend two groups per FMA) the default takes one, on AVX2 it keeps the pair tile."""
    from modelc import target
    from modelc.kernels.conv_generic import PAIR
    for name in ("padded_groups", "padded_groups_s2"):
        wl = GENERIC[name][0]()
        tpl = template.select(wl)
        sp = tpl.space(wl)
        padded = [m for m in sp.knobs[1].values if m > PAIR and 56 % m]
        assert padded, sp.knobs[1].values
        base = tpl.default_config(wl, sp).values
        extra = []
        for m in padded:
            # tiles of 2 and 4 pixels where the registers hold them, else the widest they do (AVX2's 16
            # registers hold one pixel of 32 channels: four vectors, their weights and a broadcast)
            tiles = [dict(tile_oc=m, tile_ow=t, vector_axis="oc") for t in sp.knobs[0].values]
            fits = [e for e in tiles if sp.is_valid(sp.from_values({**base, **e}))]
            assert fits, (m, sp.knobs[0].values)
            extra += [e for e in fits if e["tile_ow"] in (2, 4)] or fits[-1:]
        check(wl, "conv_generic", extra)
    wl = GENERIC["padded_groups"][0]()
    isas = {"avx2": target.Target.from_features("znver3", "+avx,+avx2,+fma,+sse4.1,+sse4.2", threads=2),
            "avx512": target.Target.from_features("znver4", "+avx,+avx2,+fma,+avx512f,+avx512bw,+avx512vl",
                                                  threads=2)}
    for isa, tg in isas.items():
        with target.use(tg):
            t = template.select(wl)
            cfg = t.default_config(wl, t.space(wl))
        assert cfg["vector_axis"] == "oc" and cfg["tile_oc"] == (32 if isa == "avx512" else PAIR), (isa, cfg)


@pytest.mark.parametrize("shape,w,group", [([1, 16, 4, 10, 14], [32, 16, 3, 3, 3], 1),
                                           ([1, 128, 6, 16], [128, 8, 3, 3], 16)])
def test_generic_channel_tiles_fit_the_target(shape, w, group):
    """An "oc" tile's default holds up to two vectors of channels per pixel and at least the
    accumulators that keep the FMA pipes busy, within the registers its weights and broadcast leave
    (AVX2 took 32 channels - four vectors - for one pixel: a 3-d conv ran 2x slower so); on AVX-512
    32 channels x 7 pixels, as before. The kernel agrees with the reference."""
    from modelc import target
    isas = {"avx2": target.Target.from_features("znver3", "+avx,+avx2,+fma,+sse4.1,+sse4.2", threads=2),
            "avx512": target.Target.from_features("znver4", "+avx,+avx2,+fma,+avx512f,+avx512bw,+avx512vl",
                                                  threads=2)}
    wl = conv_wl(shape, w, group=group, pads=[1] * (2 * (len(shape) - 2)))
    for isa, tg in isas.items():
        with target.use(tg):
            t = template.select(wl)
            cfg = t.default_config(wl, t.space(wl))
            lanes = tg.lanes(4)
            vectors = -(-cfg["tile_oc"] // lanes)
            assert cfg["vector_axis"] == "oc" and vectors <= 2 and tg.tile_fits(cfg["tile_ow"], vectors), (isa, cfg)
            assert cfg["tile_ow"] * vectors >= tg.accumulators_in_flight, (isa, cfg)
            if isa == "avx512" and group == 1:
                assert (cfg["tile_oc"], cfg["tile_ow"]) == (32, 7), cfg
    check(wl, "conv_generic")


def test_generic_random_configs():
    check(GENERIC["grouped_blocked"][0](), "conv_generic", n_random=2, seed=3)


@pytest.mark.parametrize("tile_oh,rows,unroll", [(2, 7, True), (2, 7, False), (3, 4, True), (4, 7, False)])
def test_depthwise_items_store_only_their_own_rows(tile_oh, rows, unroll):
    """Rows in blocks of `rows` per item and tiles of `tile_oh` rows: a tile reaching past its block,
    or the last one shifted back, stored rows of another item, from another thread (the same race as
    conv2d's shifted tiles). Each item is run alone on an output full of NaN, to count who stores what."""
    import numpy as np
    wl = dw_wl(32, 11, hin=1, hout=0, clip=True)
    tpl = template.select(wl)
    space = tpl.space(wl)
    cfg = space.from_values({"tile_ow": 4, "tile_oh": tile_oh, "rows_per_task": rows, "unroll_kh": unroll})
    got, want, fn, args = testing.run(wl, tpl, cfg)
    assert testing.max_rel_error(got, want) <= 1e-5
    writers = testing.stores_per_output(fn, args)
    assert writers.min() == 1 and writers.max() == 1, np.bincount(writers)
