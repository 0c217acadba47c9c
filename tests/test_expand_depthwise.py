"""A 1x1 conv fused with the depthwise conv that reads it (kernels/expand_depthwise.py) and the
pass that fuses them (passes/fuse_depthwise.py): kernels against the reference executor over
strides, filter sizes, asymmetric pads, dilation, batches, both activations and a residual; every
output element stored by exactly one parallel item; the pass fuses only what the template takes
and what is worth it, and compiled models agree with onnxruntime."""
import dataclasses

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import modelc
from modelc import target
from modelc.extract import extract_tasks
from modelc.kernels import template, templates, testing  # noqa: F401  (registers the templates)
from modelc.kernels.expand_depthwise import dw_lanes
from modelc.kernels.layout import choose_block
from modelc.kernels.workload import Workload
from workloads import onnx_model

TOL = 1e-5
# CPU descriptions whose tiles a test names on every host: the float32 fused kernel is plain numba source (no
# ISA intrinsics), which numba compiles for the host, so a kernel generated for either runs on any x86 machine
ISAS = {"avx2": target.Target.from_features("znver3", "+avx,+avx2,+fma,+sse4.1,+sse4.2", threads=2),
        "avx512": target.Target.from_features("znver4", "+avx,+avx2,+fma,+avx512f,+avx512bw,+avx512vl", threads=2)}
AVX512 = ISAS["avx512"]
CLIP = {"p0": {"dtype": "float32", "shape": [], "value": 0.0}, "p1": {"dtype": "float32", "shape": [], "value": 6.0}}


def ed_wl(c, k, h, w=None, kh=3, s=1, pads=None, d=1, n=1, hin=0, hout=0, act1="Clip", act2="Clip",
          bias1=True, bias2=True, res=False, k1=1, s1=1):
    """The workload `workload_of` writes for Conv k1 x k1 (stride s1, padding k1 // 2, from the input's
    halo) [+ bias] + act1 -> depthwise Conv [+ bias] + act2 [+ residual Add], in the blocked layout."""
    p1 = k1 // 2
    x_h, x_w = h, w or h
    h, w = (x_h + 2 * p1 - k1) // s1 + 1, (x_w + 2 * p1 - k1) // s1 + 1        # the expanded tensor
    hin = max(hin, p1)
    pads = pads if pads is not None else [(kh - 1) * d // 2] * 4
    oh = (h + pads[0] + pads[2] - d * (kh - 1) - 1) // s + 1
    ow = (w + pads[1] + pads[3] - d * (kh - 1) - 1) // s + 1
    cb, b = choose_block(c), choose_block(k)
    inputs = [{"shape": [n, c, x_h, x_w], "dtype": "float32", "const": False, "layout": [cb, hin]},
              {"shape": [k, c, k1, k1], "dtype": "float32", "const": True}]
    ops = [{"op": "Conv", "attrs": {"dilations": [1, 1], "kernel_shape": [k1, k1], "pads": [p1] * 4,
                                    "strides": [s1, s1]}, "args": ["i0", "i1"]}]
    if bias1:
        inputs.append({"shape": [k], "dtype": "float32", "const": True})
        ops[0]["args"].append("i2")
    params = {}

    def act(kind):
        v = f"v{len(ops) - 1}"
        if kind == "Clip":
            params.update(CLIP)
            ops.append({"op": "Clip", "attrs": {}, "args": [v, "p0", "p1"]})
        elif kind == "SiLU":                  # x * sigmoid(x), as two ops: the epilogue reads x twice
            ops.append({"op": "Sigmoid", "attrs": {}, "args": [v]})
            ops.append({"op": "Mul", "attrs": {}, "args": [v, f"v{len(ops) - 1}"]})
        elif kind:
            ops.append({"op": kind, "attrs": {}, "args": [v]})
    act(act1)
    inputs.append({"shape": [k, 1, kh, kh], "dtype": "float32", "const": True})
    dw = {"op": "Conv", "attrs": {"kernel_shape": [kh, kh], "strides": [s, s], "pads": pads, "dilations": [d, d],
                                  "group": k}, "args": [f"v{len(ops) - 1}", f"i{len(inputs) - 1}"]}
    if bias2:
        inputs.append({"shape": [k], "dtype": "float32", "const": True})
        dw["args"].append(f"i{len(inputs) - 1}")
    ops.append(dw)
    if res:
        inputs.append({"shape": [n, k, oh, ow], "dtype": "float32", "const": False, "layout": [b, 0]})
        ops.append({"op": "Add", "attrs": {}, "args": [f"v{len(ops) - 1}", f"i{len(inputs) - 1}"]})
    act(act2)
    return Workload({"version": 1, "inputs": inputs, "ops": ops, "params": params,
                     "outputs": [{"shape": [n, k, oh, ow], "dtype": "float32", "value": f"v{len(ops) - 1}",
                                  "layout": [b, hout]}]})


def check(wl, extra=()):
    t = template.select(wl)
    assert t.name == "expand_depthwise"
    sp = t.space(wl)
    default = t.default_config(wl, sp)
    for cfg in [default] + [sp.from_values({**default.values, **e}) for e in extra]:
        assert sp.is_valid(cfg), str(cfg)
        got, want, _, _ = testing.run(wl, t, cfg)
        err = testing.max_rel_error(got, want)
        assert err <= TOL, f"{cfg}: max rel error {err:.2e}"


@pytest.mark.parametrize("case,extra", [
    (dict(c=16, k=32, h=9, s=1, hout=1), [dict(tile_ow=4, tile_dw=2, row_groups=3)]),
    (dict(c=16, k=32, h=11, w=9, s=2, hin=1), [dict(tile_ow=7, tile_dw=4, row_groups=2, tile_oc_blocks=2)]),
    (dict(c=24, k=48, h=10, kh=5, s=2, act1="SiLU", act2="SiLU", n=2),
     [dict(row_groups=4, tile_oc_blocks=3, tile_ow=4)]),
    (dict(c=8, k=16, h=9, kh=3, s=2, pads=[0, 0, 1, 1], bias1=False, bias2=False, act1="Relu", act2=None), []),
    (dict(c=16, k=16, h=12, d=2, res=True, act2=None), [dict(tile_dw=1, row_groups=6)]),
    (dict(c=3, k=32, h=23, k1=3, s1=2, act1="SiLU"), [dict(tile_ow=4, row_groups=3, tile_oc_blocks=2)]),  # stem
    (dict(c=4, k=32, h=10, w=13, k1=3, s1=1, s=2, n=2), [dict(tile_ow=2, tile_dw=2)]),
])
def test_fused_kernel_agrees_with_the_reference(case, extra):
    """The host's default config; and on every host AVX-512's default and the `extra` tiles, which are sized
    for its 32 registers and blocks of 16 channels (AVX2's 16 registers refuse some of them)."""
    check(ed_wl(**case))
    with target.use(AVX512):
        check(ed_wl(**case), extra)


@pytest.mark.parametrize("s,groups,m", [(1, 4, 1), (2, 3, 2)])
def test_every_output_is_stored_by_one_item(s, groups, m):
    """Row groups overlap in the ring rows they compute, never in the output rows they store."""
    wl = ed_wl(16, 32, 13, s=s, hout=1)
    tpl = template.select(wl)
    sp = tpl.space(wl)
    cfg = sp.from_values({**tpl.default_config(wl, sp).values, "row_groups": groups, "tile_dw": 4,
                                                       "tile_oc_blocks": m})
    got, want, fn, args = testing.run(wl, tpl, cfg)
    assert testing.max_rel_error(got, want) <= TOL
    out = wl.outputs[0]
    writers = testing.stores_per_output(fn, args).reshape(out.shape[0], -1, out.shape[2] + 2, out.shape[3] + 2,
                                                          out.layout[0])[:, :, 1:-1, 1:-1]
    assert writers.min() == 1 and writers.max() == 1, np.bincount(writers.ravel())


def test_not_taken():
    """A first conv whose padding is not in the input's halo, a 1x1 epilogue reading another tensor,
    a second conv that is not depthwise, rows so wide that the ring would not fit a thread's stack, a
    3x3 first conv over more than an image's channels."""
    stem = ed_wl(3, 32, 9, k1=3, s1=2).json
    assert template.select(Workload(stem)).name == "expand_depthwise"
    no_halo = dict(stem, inputs=[dict(stem["inputs"][0], layout=[3, 0])] + stem["inputs"][1:])
    assert template.select(Workload(no_halo)).name != "expand_depthwise"
    # (5 ring rows of 2504 columns: past MAX_RING_FLOATS in blocks of 4, 8 or 16 channels, on any x86 host)
    assert template.select(ed_wl(16, 32, 4, w=2500, kh=5)).name != "expand_depthwise"
    assert template.select(ed_wl(16, 32, 8, k1=3)).name != "expand_depthwise"       # conv2d's work
    wl = ed_wl(16, 32, 8)
    j = dict(wl.json)
    ops = [dict(o) for o in j["ops"]]
    ops[1] = {"op": "Add", "attrs": {}, "args": ["v0", f"i{len(j['inputs'])}"]}
    res = {"shape": [1, 32, 8, 8], "dtype": "float32", "const": False, "layout": [choose_block(32), 0]}
    inputs = j["inputs"] + [res]
    assert template.select(Workload(dict(j, ops=ops, inputs=inputs))).name != "expand_depthwise"
    ops = [dict(o) for o in j["ops"]]
    ops[2] = dict(ops[2], attrs={**ops[2]["attrs"], "group": 1})
    inputs = [dict(t) for t in j["inputs"]]
    inputs[3]["shape"] = [32, 32, 3, 3]
    assert template.select(Workload(dict(j, ops=ops, inputs=inputs))).name != "expand_depthwise"


# ---- the pass ----------------------------------------------------------------------------------

def _block_model(k=64, hw=32, expand_out=False, second_reader=False, seed=0):
    """x -> Conv 1x1 (16 -> k) -> Clip -> depthwise 3x3 s1 -> Clip -> Conv 1x1 (k -> 16) -> y."""
    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array((rng.standard_normal(s) * 0.3).astype(np.float32), n) for n, s in
             [("w1", (k, 16, 1, 1)), ("b1", (k,)), ("w2", (k, 1, 3, 3)), ("b2", (k,)), ("w3", (16, k, 1, 1))]]
    inits += [numpy_helper.from_array(np.float32(0), "lo"), numpy_helper.from_array(np.float32(6), "hi")]
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["e"], name="expand"),
             helper.make_node("Clip", ["e", "lo", "hi"], ["ea"], name="expand_act"),
             helper.make_node("Conv", ["ea", "w2", "b2"], ["d"], name="dw", group=k, pads=[1, 1, 1, 1]),
             helper.make_node("Clip", ["d", "lo", "hi"], ["da"], name="dw_act"),
             helper.make_node("Conv", ["da", "w3"], ["y"], name="project")]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, hw, hw])]
    if expand_out:
        outputs.append(helper.make_tensor_value_info("ea", TensorProto.FLOAT, [1, k, hw, hw]))
    if second_reader:
        nodes.append(helper.make_node("Conv", ["ea", "w3"], ["z"], name="other"))
        outputs.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 16, hw, hw]))
    return onnx_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, hw, hw])],
                      outputs, inits)


def _templates(model):
    return [t.template for t in extract_tasks(model)]


def test_pass_fuses_the_pair_and_the_module_agrees_with_onnxruntime(tmp_path):
    model = _block_model()
    assert "expand_depthwise" in _templates(model)
    tasks = extract_tasks(model)
    desc = next(t.desc for t in tasks if t.template == "expand_depthwise")
    assert desc == "conv2d_bias_clip_depthwise_conv2d_bias_clip 1x16x32x32 k64 1x1 s1 p0 + 3x3 s1 p1"
    x = np.random.default_rng(1).standard_normal((1, 16, 32, 32)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    mod = modelc.compile(model)
    assert "conv2d_bias_clip_depthwise_conv2d_bias_clip" in mod.step_names
    got = mod.run({"x": x})["y"]
    assert np.abs(got - want[0]).max() <= 1e-4 * np.abs(want[0]).max()
    path = tmp_path / "block.mc"                 # a saved module regenerates the fused kernel from data
    mod.save(str(path))
    again = modelc.load(str(path)).run({"x": x})["y"]
    assert np.array_equal(again, got)


def test_pass_can_be_disabled():
    """`fuse_depthwise.disabled()` compiles the pair as two groups (benchmarks/fusion.py's baseline)."""
    from modelc.passes import fuse_depthwise
    model = _block_model()
    with fuse_depthwise.disabled():
        assert "expand_depthwise" not in _templates(model)
    assert "expand_depthwise" in _templates(model)


@pytest.mark.parametrize("kw", [dict(expand_out=True), dict(second_reader=True)])
def test_pass_leaves_a_shared_expanded_tensor_alone(kw):
    assert "expand_depthwise" not in _templates(_block_model(**kw))


def test_pass_fuses_only_what_outgrows_the_l1_caches():
    """The rule reads the target's description: the same tensor is fused for a CPU whose L1 caches
    it outgrows and left alone for one whose caches hold it."""
    model = _block_model(k=16, hw=16)                       # 16 x 16 x 16 floats: 16 KiB
    base = target.current()
    small = dataclasses.replace(base, l1d_bytes=4096, threads=2)
    large = dataclasses.replace(base, l1d_bytes=48 << 10, threads=2)
    with target.use(small):
        assert "expand_depthwise" in _templates(model)
    with target.use(large):
        assert "expand_depthwise" not in _templates(model)


@pytest.mark.parametrize("isa", ["avx2", "avx512"])
def test_defaults_fit_the_target(isa):
    """The default tiles come from the target: on AVX2 (16 registers of 8 floats, blocks of 8) and on
    AVX-512 (32 of 16) the 1x1 tile fits the accumulator registers, and the kernel is right."""
    tg = (target.Target.from_features("znver3", "+avx,+avx2,+fma,+sse4.1,+sse4.2", threads=2) if isa == "avx2"
          else target.Target.from_features("znver4", "+avx,+avx2,+fma,+avx512f,+avx512bw,+avx512vl", threads=2))
    with target.use(tg):
        wl = ed_wl(24, 48, 14, s=2, hin=1, hout=1)
        tpl = template.select(wl)
        sp = tpl.space(wl)
        cfg = tpl.default_config(wl, sp)
        b = wl.outputs[0].layout[0]
        assert b == tg.lanes(4)
        # two vectors of channels per broadcast input where the FMA cannot take it from memory
        assert cfg["tile_oc_blocks"] == (2 if isa == "avx2" else 1)
        accumulators = cfg["tile_ow"] * cfg["tile_oc_blocks"]
        assert tg.accumulators_in_flight <= accumulators <= tg.max_tile_vectors
        check(wl)


def test_blocks_narrower_than_a_vector_fill_one_together():
    """Channel counts with few factors of two come in blocks narrower than a vector (on AVX-512 72 are
    9 blocks of 8, 116 are 29 of 4, ShuffleNetV2 x2.0's 122 are 61 of 2): a tile takes as many blocks
    as fill a vector, the last one shifted back to end at the last block (ShuffleNetV2 x2.0's fused
    blocks ran 1.8-5.2x faster so than a block per tile), the tile fits the accumulator registers,
    and the kernel is right with the default and other block counts."""
    tg = target.Target.from_features("znver4", "+avx,+avx2,+fma,+avx512f,+avx512bw,+avx512vl", threads=2)
    with target.use(tg):
        for k, m in ((72, 2), (116, 4), (122, 8), (96, 1)):
            wl = ed_wl(24, k, 12, hin=1, hout=1)
            tpl = template.select(wl)
            cfg = tpl.default_config(wl, tpl.space(wl))
            b = wl.outputs[0].layout[0]
            assert (cfg["tile_oc_blocks"], cfg["tile_oc_blocks"] * b) == (m, tg.lanes(4)), (k, cfg)
            assert cfg["tile_ow"] <= tg.max_tile_vectors
            check(wl, [dict(tile_oc_blocks=1), dict(tile_oc_blocks=2, tile_dw=4, row_groups=2)])


@pytest.mark.parametrize("isa", ["avx2", "avx512"])
def test_a_shifted_last_tile_stores_every_output(isa):
    """Where the blocks per tile do not divide the blocks (9 of 8 channels, tiles of 2 and 4), the last
    tile recomputes blocks its neighbour stored, and every output is stored at least once: for AVX-512
    (a depthwise lane loop spans two blocks) and AVX2 (one block each), whose tiles of 4 blocks take
    fewer pixels of the first conv (the widest its registers hold)."""
    with target.use(ISAS[isa]):
        wl = ed_wl(16, 72, 9, s=2, hout=1, res=True)
        tpl = template.select(wl)
        sp = tpl.space(wl)
        out = wl.outputs[0]
        for m in (2, 4):
            values = {**tpl.default_config(wl, sp).values, "tile_oc_blocks": m, "row_groups": 2}
            owt = max(t for t in sp.knobs[0].values if t <= values["tile_ow"] and
                      sp.is_valid(sp.from_values({**values, "tile_ow": t})))
            cfg = sp.from_values({**values, "tile_ow": owt})
            assert sp.is_valid(cfg)
            got, want, fn, args = testing.run(wl, tpl, cfg)
            assert testing.max_rel_error(got, want) <= TOL
            writers = testing.stores_per_output(fn, args).reshape(out.shape[0], -1, out.shape[2] + 2,
                                                                  out.shape[3] + 2, out.layout[0])[:, :, 1:-1, 1:-1]
            assert writers.min() >= 1 and writers.max() <= 2


@pytest.mark.parametrize("k,m", [(72, 1), (72, 2), (160, 4)])
def test_polynomial_epilogues_run_over_whole_rows(k, m):
    """SiLU's epilogues run as loops over a row once its tiles are summed (the first conv's in the
    ring, the depthwise conv's from a row of the item's own, a residual read at each element's own
    block and lane), where a row holds several tiles; a Clip's, or a row of one tile, stay in the
    tile. Shifted last tiles (9 blocks of 8 in tiles of 2, 10 of 16 in tiles of 4) store every output.
    The blocks and tiles are AVX-512's (32 registers: its default depthwise tile under SiLU spans a row
    of 7, where AVX2's takes 4 pixels), on every host."""
    with target.use(AVX512):
        wl = ed_wl(16, k, 20, act1="SiLU", act2="SiLU", res=True, hout=1)
        tpl = template.select(wl)
        sp = tpl.space(wl)
        out = wl.outputs[0]
        cfg = sp.from_values({**tpl.default_config(wl, sp).values, "tile_oc_blocks": m, "tile_ow": 4, "tile_dw": 4,
                              "row_groups": 2})
        assert sp.is_valid(cfg)
        b = out.layout[0]
        # (blocks narrower than the depthwise conv's lane loop keep their tile's stores: `dw_lanes`)
        assert tpl.row_epilogues(wl, cfg) == (True, dw_lanes(b, m, target.current().lanes(4)) == b)
        assert ("orow[" in tpl.build(wl, cfg).source) == tpl.row_epilogues(wl, cfg)[1]
        got, want, fn, args = testing.run(wl, tpl, cfg)
        assert testing.max_rel_error(got, want) <= TOL
        writers = testing.stores_per_output(fn, args).reshape(out.shape[0], -1, out.shape[2] + 2, out.shape[3] + 2,
                                                              out.layout[0])[:, :, 1:-1, 1:-1]
        assert writers.min() >= 1 and writers.max() <= 2
        assert tpl.row_epilogues(ed_wl(16, k, 20, res=True, hout=1), cfg) == (False, False)     # Clips
        small = ed_wl(16, k, 7, act1="SiLU", act2="SiLU")         # rows of 7: one tile each, by default
        one = tpl.default_config(small, tpl.space(small))
        assert one["tile_ow"] >= 7 and one["tile_dw"] >= 7 and tpl.row_epilogues(small, one) == (False, False)
        check(small)


@pytest.mark.parametrize("isa", ["avx2", "avx512"])
def test_depthwise_tile_leaves_registers_to_a_polynomial_epilogue(isa):
    """SiLU's sigmoid keeps a few vectors live per depthwise pixel: the default depthwise tile takes a
    quarter of the registers under it (AVX2: 4 pixels, where 8 spilled), half under a Clip."""
    tg = (target.Target.from_features("znver3", "+avx,+avx2,+fma,+sse4.1,+sse4.2", threads=2) if isa == "avx2"
          else target.Target.from_features("znver4", "+avx,+avx2,+fma,+avx512f,+avx512bw,+avx512vl", threads=2))
    with target.use(tg):
        tiles = {}
        for act in ("Clip", "SiLU"):
            wl = ed_wl(24, 96, 28, act1=act, act2=act)
            tpl = template.select(wl)
            tiles[act] = tpl.default_config(wl, tpl.space(wl))["tile_dw"]
            vec = -(-wl.outputs[0].layout[0] // tg.lanes(4))
            assert tiles[act] * vec <= tg.vector_registers // (4 if act == "SiLU" else 2)
        assert tiles == ({"Clip": 8, "SiLU": 4} if isa == "avx2" else {"Clip": 8, "SiLU": 8})
        check(wl)


def _bn(name, x, out, c, rng, inits):
    """A BatchNormalization node with seeded statistics (the passes fold it into the conv before it)."""
    for suffix, v in (("s", 1 + 0.1 * rng.standard_normal(c)), ("b", 0.1 * rng.standard_normal(c)),
                      ("m", 0.1 * rng.standard_normal(c)), ("v", 1 + 0.1 * rng.random(c))):
        inits.append(numpy_helper.from_array(v.astype(np.float32), f"{name}_{suffix}"))
    return helper.make_node("BatchNormalization", [x, *(f"{name}_{s}" for s in "sbmv")], [out], name=name)


def _exported_block(kind: str):
    """Blocks as torchvision exports them (Conv without bias + BatchNormalization + activation):
    ShuffleNetV2's branch (1x1 + ReLU, depthwise 3x3 s2 without activation, 1x1 + ReLU) behind a
    channel shuffle, and MobileNetV3's (1x1 + HardSwish, depthwise 5x5 + HardSwish, squeeze-excitation
    with HardSigmoid, 1x1, residual)."""
    rng = np.random.default_rng(3)
    inits, nodes = [], []

    def w(name, shape):
        inits.append(numpy_helper.from_array((rng.standard_normal(shape) * np.sqrt(2 / np.prod(shape[1:])))
                                             .astype(np.float32), name))
        return name
    c, k = 24, 72
    if kind == "shufflenet":
        inits.append(numpy_helper.from_array(np.array([1, 2, c // 2, 20, 20], np.int64), "s5"))
        inits.append(numpy_helper.from_array(np.array([1, c, 20, 20], np.int64), "s4"))
        nodes += [helper.make_node("Reshape", ["x", "s5"], ["r5"]),
                  helper.make_node("Transpose", ["r5"], ["t5"], perm=[0, 2, 1, 3, 4]),
                  helper.make_node("Reshape", ["t5", "s4"], ["xs"]),
                  helper.make_node("Conv", ["xs", w("w1", (k, c, 1, 1))], ["e"]), _bn("bn1", "e", "eb", k, rng, inits),
                  helper.make_node("Relu", ["eb"], ["ea"]),
                  helper.make_node("Conv", ["ea", w("w2", (k, 1, 3, 3))], ["d"], group=k, strides=[2, 2],
                                   pads=[1, 1, 1, 1]), _bn("bn2", "d", "db", k, rng, inits),
                  helper.make_node("Conv", ["db", w("w3", (c, k, 1, 1))], ["p"]), _bn("bn3", "p", "pb", c, rng, inits),
                  helper.make_node("Relu", ["pb"], ["y"])]
        out = [1, c, 10, 10]
    else:
        nodes += [helper.make_node("Conv", ["x", w("w1", (k, c, 1, 1))], ["e"]), _bn("bn1", "e", "eb", k, rng, inits),
                  helper.make_node("HardSwish", ["eb"], ["ea"]),
                  helper.make_node("Conv", ["ea", w("w2", (k, 1, 5, 5))], ["d"], group=k, pads=[2, 2, 2, 2]),
                  _bn("bn2", "d", "db", k, rng, inits), helper.make_node("HardSwish", ["db"], ["da"]),
                  helper.make_node("GlobalAveragePool", ["da"], ["g"]),
                  helper.make_node("Conv", ["g", w("ws1", (16, k, 1, 1))], ["g1"]),
                  helper.make_node("Relu", ["g1"], ["g2"]),
                  helper.make_node("Conv", ["g2", w("ws2", (k, 16, 1, 1))], ["g3"]),
                  helper.make_node("HardSigmoid", ["g3"], ["g4"], alpha=1 / 6),
                  helper.make_node("Mul", ["da", "g4"], ["se"]),
                  helper.make_node("Conv", ["se", w("w3", (c, k, 1, 1))], ["p"]), _bn("bn3", "p", "pb", c, rng, inits),
                  helper.make_node("Add", ["pb", "x"], ["y"])]
        out = [1, c, 20, 20]
    return onnx_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, 20, 20])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, out)], inits)


@pytest.mark.parametrize("kind", ["shufflenet", "mobilenetv3"])
def test_exported_blocks_fuse_and_agree_with_onnxruntime(kind):
    model = _exported_block(kind)
    mod = modelc.compile(model)
    assert any("depthwise" in n and n.startswith("conv2d") for n in mod.step_names), mod.step_names
    x = np.random.default_rng(2).standard_normal((1, 24, 20, 20)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got = mod.run({"x": x})["y"]
    assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max()


@pytest.mark.parametrize("isa", ["avx2", "avx512"])
def test_rows_of_odd_widths_take_a_whole_row_tile(isa):
    """Rows of 10 or 19 pixels (EfficientNet-B3 at 300x300) had only tiles of 2 or 4 pixels without
    waste: the row and its half are candidates, and the default is no longer latency-bound."""
    tg = (target.Target.from_features("znver3", "+avx,+avx2,+fma,+sse4.1,+sse4.2", threads=2) if isa == "avx2"
          else target.Target.from_features("znver4", "+avx,+avx2,+fma,+avx512f,+avx512bw,+avx512vl", threads=2))
    with target.use(tg):
        for h, kh in ((10, 5), (19, 3)):
            wl = ed_wl(32, 96, h, kh=kh, act1="SiLU", act2="SiLU")
            tpl = template.select(wl)
            cfg = tpl.default_config(wl, tpl.space(wl))
            assert cfg["tile_ow"] * cfg["tile_oc_blocks"] >= tg.accumulators_in_flight, (h, cfg)
            assert cfg["tile_dw"] >= min(h, tg.accumulators_in_flight) // 2, (h, cfg)
        check(wl)
