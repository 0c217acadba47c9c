"""Winograd conv template: every algorithm variant against the reference, what it matches, and
that compile uses it only where a tuning record says it is faster."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import modelc
from modelc.kernels import template, testing
from modelc.kernels.template import alternatives, get
from modelc.kernels.winograd import MATRICES
from modelc.kernels.workload import Workload
from modelc.tune import records as R
from modelc.extract import extract_tasks

from workloads import conv2d_wl

WINO = get("conv2d_winograd")


@pytest.mark.parametrize("m", sorted(MATRICES))
def test_transform_matrices_compute_a_3x3_correlation(m):
    BT, G, AT = (np.array(MATRICES[m][k], np.float64) for k in ("BT", "G", "AT"))
    rng = np.random.default_rng(m)
    d, g = rng.standard_normal((m + 2, m + 2)), rng.standard_normal((3, 3))
    want = np.array([[np.sum(d[i:i + 3, j:j + 3] * g) for j in range(m)] for i in range(m)])
    np.testing.assert_allclose(AT @ ((G @ g @ G.T) * (BT @ d @ BT.T)) @ AT.T, want, atol=1e-12)


CASES = [
    # odd output sizes (last tiles and groups shifted back), residual add, narrow blocks
    dict(C=16, H=10, W=9, K=32, k=3, s=1, p=1, hin=1, hout=1, residual=True),
    dict(C=24, H=7, W=13, K=40, k=3, s=1, p=1, hin=1, hout=0, act="Clip"),
    # no padding (a "valid" conv reads the input's halo-free interior), no bias
    dict(C=32, H=12, W=12, K=16, k=3, s=1, p=0, hin=0, hout=1, bias=False, act=None),
    # the smallest output F(2x2, 3x3) can tile
    dict(C=8, H=4, W=4, K=8, k=3, s=1, p=0, hin=0, hout=0),
    # dilated: Winograd on each interleaved grid of outputs (2 x 2 grids of 6 x 6; 4 x 4 grids of
    # 5 x 3, their last tiles shifted), a residual, and a valid conv
    dict(C=16, H=12, W=12, K=32, k=3, s=1, p=2, hin=2, hout=0, residual=True, dil=2),
    dict(C=16, H=20, W=12, K=16, k=3, s=1, p=4, hin=4, hout=1, dil=4),
    dict(C=16, H=14, W=14, K=16, k=3, s=1, p=0, hin=0, hout=0, dil=2, act="Clip"),
    # grids of unequal size where the dilation does not divide the output (13 = 7 + 6; 15 = 4 + 4 + 4 + 3)
    dict(C=16, H=13, W=13, K=16, k=3, s=1, p=2, hin=2, hout=0, dil=2, residual=True),
    dict(C=16, H=15, W=11, K=32, k=3, s=1, p=4, hin=4, hout=0, dil=4),
]


@pytest.mark.parametrize("case", CASES,
                         ids=lambda c: f"c{c['C']}k{c['K']}h{c['H']}w{c['W']}p{c['p']}d{c.get('dil', 1)}")
def test_every_variant_matches_the_reference(case):
    wl = conv2d_wl(**case)
    assert WINO.matches(wl) and template.select(wl).name == "conv2d"
    space = WINO.space(wl)
    default = WINO.default_config(wl, space)
    tts = space.knobs[1].values
    tried = set()
    # every tile size and transform, with the item orders and group sizes (1, odd, largest) mixed in
    for k, (m, transform) in enumerate((m, t) for m in space.knobs[0].values for t in ("per_block", "all_channels")):
        order = [["k", "tiles"], ["tiles", "k"]][k % 2]
        for tt in sorted({tts[0], tts[min(2, len(tts) - 1)], tts[-1]})[k % 2::2]:
            cfg = space.from_values(dict(default.values, tile_size=m, transform=transform, item_order=order,
                                         tile_tiles=tt))
            if not space.is_valid(cfg):
                continue
            tried.add(m)
            got, want, _, _ = testing.run(wl, WINO, cfg)
            # F(4x4, 3x3) rounds a little more than a direct sum (still ~1e-6 here)
            assert testing.max_rel_error(got, want) <= 1e-5, str(cfg)
    assert tried == set(space.knobs[0].values)


def test_channels_past_the_stack_are_transformed_in_chunks():
    """1,024 input channels: their transformed tiles (36 x tiles x C floats) outgrow the stack for
    groups of 2+ tiles, so the default takes "chunks" of the blocks, which divide them; every chunked
    config agrees with the reference, and with fewer channels "chunks" is not offered twice over."""
    from modelc.kernels.winograd import _chunk
    from modelc.kernels.conv_geometry import conv_geometry
    wl = conv2d_wl(C=1024, H=8, W=8, K=32, k=3, s=1, p=1, hin=1, hout=0)
    space = WINO.space(wl)
    default = WINO.default_config(wl, space)
    g = conv_geometry(wl)
    if default["tile_tiles"] > 1:
        assert default["transform"] == "chunks", default
    chunked = [c for c in (space.from_values(dict(default.values, tile_size=m, tile_tiles=tt, transform="chunks"))
                           for m in space.knobs[0].values for tt in space.knobs[1].values) if space.is_valid(c)]
    assert chunked
    for cfg in chunked[:3]:
        kt = cfg["tile_oc_blocks"] * g.KB
        d = _chunk(g, (cfg["tile_size"] + 2) ** 2, cfg["tile_tiles"], kt)
        assert 1 < d < g.C // g.cb and (g.C // g.cb) % d == 0, (cfg, d)
        got, want, _, _ = testing.run(wl, WINO, cfg)
        # F(4x4, 3x3) over 1,024 channels rounds more than F(2x2): 1.1-2.2e-5 of the output's scale
        # over three seeds (the direct sum 2.5e-6), where AVX2's spaces offer chunks of F(4x4) only
        assert testing.max_rel_error(got, want) <= (5e-5 if cfg["tile_size"] == 4 else 1e-5), str(cfg)
    # the next block's weights asked for ahead, chunk by chunk: a hint, the same bits
    off, on = (space.from_values(dict(cfg.values, tile_oc_blocks=1, prefetch=p)) for p in (0, 1))
    assert space.is_valid(on) and "prefetch(w" in WINO.build(wl, on).source
    assert all(np.array_equal(a, b) for a, b in zip(testing.run(wl, WINO, on)[0], testing.run(wl, WINO, off)[0]))
    small = conv2d_wl(C=16, H=8, W=8, K=16, k=3, s=1, p=1, hin=1, hout=0)
    sp = WINO.space(small)
    assert not any(sp.is_valid(sp.from_values(dict(WINO.default_config(small, sp).values, transform="chunks",
                                                   tile_tiles=tt))) for tt in sp.knobs[1].values)


@pytest.mark.parametrize("transform", ["per_block", "all_channels"])
def test_prefetching_the_next_blocks_weights_changes_no_output(transform):
    """The prefetch is a hint: with it every output bit is the same, whichever order items take
    (each group of tiles asking for its share of the next block's weights, or a block for all of
    them), and the last block's asks past the end of the weights load nothing."""
    wl = conv2d_wl(C=64, H=14, W=14, K=64, k=3, s=1, p=1, hin=1, hout=0, residual=True)
    space = WINO.space(wl)
    base = WINO.default_config(wl, space).values
    tried = 0
    for order in (["k", "tiles"], ["tiles", "k"]):
        for m in space.knobs[0].values:
            vals = dict(base, tile_size=m, transform=transform, item_order=order, tile_oc_blocks=1,
                        tile_tiles=7 if m == 2 else 4)
            off, on = (space.from_values(dict(vals, prefetch=p)) for p in (0, 1))
            if not space.is_valid(on):
                continue
            assert "prefetch(w" in WINO.build(wl, on).source and "prefetch(" not in WINO.build(wl, off).source
            a, want, _, _ = testing.run(wl, WINO, off)
            b, _, _, _ = testing.run(wl, WINO, on)
            assert testing.max_rel_error(a, want) <= 1e-5
            assert all(np.array_equal(x, y) for x, y in zip(a, b)), str(on)
            tried += 1
    assert tried >= 2


def test_a_batch_of_two_images():
    j = conv2d_wl(C=16, H=9, W=9, K=16, k=3, s=1, p=1, hin=1, hout=1, residual=True).json
    for t in j["inputs"][:1] + j["inputs"][-1:] + j["outputs"]:   # the image, the residual, the output
        t["shape"][0] = 2
    wl = Workload(j)
    space = WINO.space(wl)
    for m in space.knobs[0].values:
        cfg = space.from_values(dict(WINO.default_config(wl, space).values, tile_size=m))
        got, want, _, _ = testing.run(wl, WINO, cfg)
        assert testing.max_rel_error(got, want) <= 1e-5, str(cfg)


def test_what_it_matches():
    assert WINO.matches(conv2d_wl(C=16, H=8, W=8, K=16, k=3, s=1, p=1, hin=1, hout=0))
    for kw in (dict(k=3, s=2, p=1), dict(k=5, s=1, p=2), dict(k=1, s=1, p=0)):
        kw = {"H": 8, **kw}
        wl = conv2d_wl(C=16, W=8, K=16, hin=kw["p"], hout=0, **kw)
        # no Winograd; the te declaration stays a second algorithm
        assert not WINO.matches(wl) and [t.name for t in alternatives(wl, template.select(wl))] == ["te_conv2d"], kw
    # too small to hold one 2x2 output tile (on each grid, dilated)
    assert not WINO.matches(conv2d_wl(C=16, H=3, W=3, K=16, k=3, s=1, p=0, hin=0, hout=0))
    assert not WINO.matches(conv2d_wl(C=16, H=3, W=3, K=16, k=3, s=1, p=3, hin=3, hout=0, dil=3))
    assert not WINO.matches(conv2d_wl(C=16, H=5, W=8, K=16, k=3, s=1, p=2, hin=2, hout=0, dil=3))  # grids 2, 2, 1
    assert WINO.matches(conv2d_wl(C=16, H=8, W=8, K=16, k=3, s=1, p=2, hin=2, hout=0, dil=2))
    assert WINO.matches(conv2d_wl(C=16, H=9, W=8, K=16, k=3, s=1, p=2, hin=2, hout=0, dil=2))     # grids 5 and 4


def _model(path, hw=20):
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array((rng.standard_normal((32, 16, 3, 3)) * 0.1).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(32).astype(np.float32), "b")
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["y"])]
    g = helper.make_graph(nodes, "one_conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, hw, hw])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 32, hw, hw])], [w, b])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    onnx.save(m, path)


@pytest.mark.parametrize("faster", ["conv2d", "conv2d_winograd"])
def test_compile_takes_the_faster_algorithm_of_a_workload(tmp_path, faster):
    path = str(tmp_path / "m.onnx")
    _model(path)
    (task,) = [t for t in extract_tasks(path) if t.pattern.startswith("conv")]
    assert task.template == "conv2d" and task.alternatives == ["conv2d_winograd", "te_conv2d"]
    target = R.current_target()
    recs = []
    for name in ("conv2d", "conv2d_winograd"):
        tpl = get(name)
        wl = Workload(task.workload)
        cfg = tpl.default_config(wl, tpl.space(wl))
        cost = 1e-4 if name == faster else 2e-4
        recs.append(R.Record(task.key, task.desc, name, cfg.values, [cost], R.NO_ERROR, "", target,
                             task.workload, 1.0))
    with R.ApplyHistoryBest(recs):
        mod = modelc.compile(path)
    (step,) = [s for s in mod.program["steps"] if s["key"] == task.key]
    assert step["template"] == faster and step["config"] is not None
    x = np.random.default_rng(1).standard_normal((1, 16, 20, 20)).astype(np.float32)
    ref = modelc.reference.run(modelc.from_onnx(path), {"x": x})["y"]
    assert np.abs(mod(x) - ref).max() <= 1e-5 * np.abs(ref).max()
    best = R.ApplyHistoryBest(recs)
    best.report([step])
    assert "1 of 1" in best.summary


@pytest.mark.parametrize("hw,fma_bits,want", [(20, 256, "conv2d_winograd"), (13, 256, "conv2d_winograd"),
                                              (12, 256, "conv2d"), (7, 256, "conv2d"), (20, 512, "conv2d_winograd"),
                                              (24, 512, "conv2d_winograd"), (7, 512, "conv2d")])
def test_without_records_compile_runs_winograd_where_it_always_won(tmp_path, hw, fma_bits, want):
    """Untuned, on cores of 32 FLOPs a cycle (Zen 4's 512-bit FMAs on 256-bit pipes, AVX2) outputs
    of at least 16 tiles of 4x4 (13 x 13 and up) run Winograd, smaller ones the direct conv; on
    twice that (AVX-512 on full-width pipes) 32 tiles, of 4x4 (21 x 21 and up) or else of 2x2 (11 x
    11 to 20 x 20); either agrees with the reference."""
    import dataclasses
    from modelc import target
    path = str(tmp_path / "m.onnx")
    _model(path, hw)
    tg = target.current()
    with target.use(dataclasses.replace(tg, fma_bits=fma_bits, vector_bits=512)):
        mod = modelc.compile(path)
    assert [s["template"] for s in mod.program["steps"] if s["pattern"].startswith("conv")] == [want]
    x = np.random.default_rng(1).standard_normal((1, 16, hw, hw)).astype(np.float32)
    ref = modelc.reference.run(modelc.from_onnx(path), {"x": x})["y"]
    assert np.abs(mod(x) - ref).max() <= 1e-5 * np.abs(ref).max()


def test_a_record_of_the_direct_conv_alone_does_not_replace_untuned_winograd(tmp_path):
    """A log that never measured Winograd (one from before untuned modules ran it) says nothing
    against it: the module keeps Winograd's default; with a Winograd record too, the faster wins."""
    path = str(tmp_path / "m.onnx")
    _model(path, 28)            # 49 tiles: untuned Winograd on every target
    (task,) = [t for t in extract_tasks(path) if t.pattern.startswith("conv")]
    target = R.current_target()
    wl = Workload(task.workload)

    def record(name, cost):
        tpl = get(name)
        return R.Record(task.key, task.desc, name, tpl.default_config(wl, tpl.space(wl)).values, [cost],
                        R.NO_ERROR, "", target, task.workload, 1.0)
    algos = ["conv2d", "conv2d_winograd", "te_conv2d"]
    direct = [record("conv2d", 1e-4)]
    assert R.ApplyHistoryBest(direct).choose(task.key, algos, untuned="conv2d_winograd") is None
    assert R.ApplyHistoryBest(direct).choose(task.key, algos)[0] == "conv2d"
    with R.ApplyHistoryBest(direct):
        mod = modelc.compile(path)
    (step,) = [s for s in mod.program["steps"] if s["key"] == task.key]
    assert (step["template"], step["config"]) == ("conv2d_winograd", None)
    both = direct + [record("conv2d_winograd", 2e-4)]
    assert R.ApplyHistoryBest(both).choose(task.key, algos, untuned="conv2d_winograd")[0] == "conv2d"


def test_every_output_is_stored_by_exactly_one_item():
    """Tile rows and columns (10 x 9 outputs in 4 x 4 or 2 x 2 tiles), groups of tiles (9 tiles in
    twos) and channel blocks (3 blocks in twos) that would pass the end are shifted back; only the
    one that owns an output stores it. A shifted tile computes an output with other transform
    weights than the tile before (another rounding), so two writers made the result depend on which
    thread stored last. Each item is run alone on an output full of NaN, to count who stores what."""
    from modelc.kernels.conv_geometry import conv_geometry
    for wl in (conv2d_wl(C=16, H=10, W=9, K=48, k=3, s=1, p=1, hin=1, hout=0, residual=True),
               conv2d_wl(C=16, H=20, W=18, K=48, k=3, s=1, p=2, hin=2, hout=0, residual=True, dil=2),
               conv2d_wl(C=16, H=21, W=19, K=48, k=3, s=1, p=2, hin=2, hout=0, residual=True, dil=2)):
        _one_writer_each(wl, conv_geometry)


def _one_writer_each(wl, conv_geometry):
    space = WINO.space(wl)
    default = WINO.default_config(wl, space)
    n_blocks = 48 // conv_geometry(wl).KB                 # 3 of 16 channels (AVX-512), 6 of 8 (AVX2)
    blocks = next(b for b in reversed(space.knobs[2].values) if n_blocks % b)
    for m in space.knobs[0].values:
        cfg = space.from_values(dict(default.values, tile_size=m, tile_tiles=2, tile_oc_blocks=blocks))
        got, want, fn, args = testing.run(wl, WINO, cfg)
        assert testing.max_rel_error(got, want) <= 1e-5, str(cfg)
        writers = testing.stores_per_output(fn, args)
        assert writers.min() == 1 and writers.max() == 1, (str(cfg), np.bincount(writers))


def test_the_weight_transform_is_reused_only_for_the_same_weights():
    """Candidates of one task share the transformed weights; new values (even written into the
    same array) are transformed again."""
    from modelc.kernels.winograd import transformed_weights
    w = np.random.default_rng(0).standard_normal((8, 4, 3, 3)).astype(np.float32)

    def exact(w, m):
        G = np.array(MATRICES[m]["G"], np.float64)
        return np.einsum("ik,ockl,jl->ijoc", G, w.astype(np.float64), G).astype(np.float32)

    u = transformed_weights(w, 4)
    assert transformed_weights(w.copy(), 4) is u
    assert np.array_equal(u, exact(w, 4))
    assert np.array_equal(transformed_weights(w, 2), exact(w, 2))
    w[0, 0, 1, 1] += 1.0
    assert np.array_equal(transformed_weights(w, 4), exact(w, 4))


def test_dilated_convs_run_winograd_untuned_unless_most_products_read_padding():
    """Dilated by 2 on 28 x 28 (grids of 14 x 14), Winograd is the untuned choice; dilated by 12
    (grids of 3 and 2 rows, half the direct conv's products in the padding, which it skips) Winograd
    stays an algorithm for tuning to try, not the default (it ran 2.1x the direct conv's time)."""
    from modelc.kernels.conv2d import BOUNDED_TAPS
    from modelc.kernels.conv_geometry import conv_geometry, padding_share
    two = conv2d_wl(C=16, H=28, W=28, K=16, k=3, s=1, p=2, hin=2, hout=0, dil=2)
    twelve = conv2d_wl(C=16, H=28, W=28, K=16, k=3, s=1, p=12, hin=12, hout=0, dil=12)
    assert WINO.matches(two) and WINO.preferred(two)
    assert padding_share(conv_geometry(twelve)) > BOUNDED_TAPS
    assert WINO.matches(twelve) and not WINO.preferred(twelve)
