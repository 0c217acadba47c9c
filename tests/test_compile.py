"""modelc.compile end to end: every example model against onnxruntime, save/load, errors, safety."""
import glob
import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import models
import modelc
from modelc.errors import InputError, ModelcError
from modelc.kernels import cache

SHAPES = {"transformer": None}


@pytest.fixture(scope="module")
def compiled():
    return {}


def _module(compiled, name):
    if name not in compiled:
        path = models.cached_path(name)
        shape = SHAPES.get(name, {"input": (1, 3, 224, 224)})
        compiled[name] = (path, modelc.compile(path, shape=shape))
    return compiled[name]


@pytest.mark.parametrize("name", sorted(models.MODELS))
def test_example_model_matches_onnxruntime(compiled, name):
    path, mod = _module(compiled, name)
    assert not mod.fallbacks, f"groups without a kernel: {mod.fallbacks}"
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    spec = mod.input_specs[0]
    for seed in range(3):
        x = np.random.default_rng(seed).standard_normal(spec["shape"]).astype(np.float32)
        want = sess.run(None, {spec["name"]: x})[0]
        got = mod(x)
        scale = float(np.abs(want).max())
        assert np.abs(got - want).max() <= 1e-4 * scale
        assert (got.reshape(got.shape[0], -1).argmax(-1) == want.reshape(want.shape[0], -1).argmax(-1)).all()


def test_save_load_round_trip_compiles_nothing(compiled, tmp_path, monkeypatch):
    path, mod = _module(compiled, "mobilenet_v2")
    out = tmp_path / "m.mc"
    mod.save(str(out))
    with open(out, "rb") as f:
        assert f.read(2) == b"PK"                    # a zip of JSON and .npy: data, not code
    calls = []
    monkeypatch.setattr(cache, "_compile_in_subprocesses", lambda *a, **k: calls.append(a))
    loaded = modelc.load(str(out))
    assert not calls                                  # every kernel came from the cache
    x = np.random.default_rng(5).standard_normal((1, 3, 224, 224)).astype(np.float32)
    np.testing.assert_array_equal(loaded(x), mod(x))
    assert mod.memory_report()["planned_bytes"] < mod.memory_report()["one_buffer_per_tensor_bytes"]


def test_load_rejects_bad_files(tmp_path):
    bad = tmp_path / "bad.mc"
    bad.write_bytes(b"not a module")
    with pytest.raises(ModelcError, match="not a modelc module"):
        modelc.load(str(bad))
    with pytest.raises(ModelcError, match="does not exist"):
        modelc.load(str(tmp_path / "missing.mc"))


def test_load_checks_format_version(compiled, tmp_path):
    import json
    import zipfile
    _, mod = _module(compiled, "mobilenet_v2")
    good, old = tmp_path / "a.mc", tmp_path / "b.mc"
    mod.save(str(good))
    with zipfile.ZipFile(good) as zin, zipfile.ZipFile(old, "w") as zout:
        for item in zin.namelist():
            data = zin.read(item)
            if item == "program.json":
                prog = json.loads(data)
                prog["format"] = 999
                data = json.dumps(prog).encode()
            zout.writestr(item, data)
    with pytest.raises(ModelcError, match="format 999"):
        modelc.load(str(old))


def test_wrong_inputs_give_clear_errors(compiled):
    _, mod = _module(compiled, "mobilenet_v2")
    with pytest.raises(InputError, match="shape"):
        mod(np.zeros((1, 3, 200, 224), np.float32))
    with pytest.raises(InputError, match="dtype"):
        mod(np.zeros((1, 3, 224, 224), np.float64))
    with pytest.raises(InputError, match="unknown"):
        mod.run({"image": np.zeros((1, 3, 224, 224), np.float32)})


def test_hostile_names_never_reach_generated_source(tmp_path, monkeypatch):
    evil = "x');import os;os.system('echo pwned')#"
    w = numpy_helper.from_array(np.ones((4, 3, 3, 3), np.float32), evil + "w")
    nodes = [helper.make_node("Conv", [evil, evil + "w"], [evil + "c"], name=evil, pads=[1, 1, 1, 1]),
             helper.make_node("Relu", [evil + "c"], [evil + "y"], name=evil + "2")]
    g = helper.make_graph(nodes, evil, [helper.make_tensor_value_info(evil, TensorProto.FLOAT, [1, 3, 8, 8])],
                          [helper.make_tensor_value_info(evil + "y", TensorProto.FLOAT, [1, 4, 8, 8])], [w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    monkeypatch.setenv("MODELC_CACHE_DIR", str(tmp_path))
    mod = modelc.compile(m)
    x = np.random.default_rng(0).standard_normal((1, 3, 8, 8)).astype(np.float32)
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {evil: x})[0]
    np.testing.assert_allclose(mod(x), want, rtol=1e-5, atol=1e-5)
    sources = glob.glob(os.path.join(str(tmp_path), "kernels", "*.py"))
    assert sources
    for src in sources:
        text = open(src).read()
        assert "pwned" not in text and "os.system" not in text


def test_cli_compile_and_run(tmp_path, capsys):
    from modelc.cli import main
    out = tmp_path / "m.mc"
    assert main(["compile", "mobilenet_v2", "-o", str(out), "-q"]) == 0
    x = np.random.default_rng(1).standard_normal((1, 3, 224, 224)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    assert main(["run", str(out), "--input", str(tmp_path / "x.npy"), "--output", str(tmp_path / "y.npy")]) == 0
    y = np.load(tmp_path / "y.npy")
    assert y.shape == (1, 1000)
    assert main(["run", str(tmp_path / "nope.mc")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_reductions_after_injective_or_elementwise_ops_get_kernels():
    """Inception's head (Concat -> ReduceMean) and RMS-norm-like x*x -> ReduceMean: the ops before a
    reduction must not be fused into it, or the group runs on the numpy fallback."""
    vi = helper.make_tensor_value_info
    F = TensorProto.FLOAT
    nodes = [helper.make_node("Concat", ["a", "b"], ["c"], axis=1),
             helper.make_node("ReduceMean", ["c", "axes"], ["m"], keepdims=1),
             helper.make_node("Mul", ["a", "a"], ["sq"]),
             helper.make_node("ReduceMean", ["sq", "axes"], ["r"], keepdims=1),
             helper.make_node("Sqrt", ["r"], ["s"])]
    g = helper.make_graph(nodes, "g", [vi("a", F, [1, 32, 5, 5]), vi("b", F, [1, 16, 5, 5])],
                          [vi("m", F, [1, 48, 1, 1]), vi("s", F, [1, 32, 1, 1])],
                          [numpy_helper.from_array(np.array([2, 3], np.int64), "axes")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    mod = modelc.compile(model.SerializeToString())
    assert not mod.fallbacks, f"groups without a kernel: {mod.fallbacks}"
    rng = np.random.default_rng(0)
    feeds = {"a": rng.standard_normal((1, 32, 5, 5)).astype(np.float32),
             "b": rng.standard_normal((1, 16, 5, 5)).astype(np.float32)}
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    got = mod.run(feeds)
    for name, want in zip(["m", "s"], sess.run(["m", "s"], feeds)):
        assert np.abs(got[name] - want).max() <= 1e-5 * np.abs(want).max()


def _check_against_ort(model, feeds, tol=1e-5):
    model.ir_version = 8
    mod = modelc.compile(model.SerializeToString())
    assert not mod.fallbacks, f"groups without a kernel: {mod.fallbacks}"
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = sess.run(None, feeds)[0]
    got = mod(**feeds)
    assert got.shape == want.shape
    assert np.abs(got - want).max() <= tol * np.abs(want).max()


@pytest.mark.parametrize("mode,ctm", [("linear", "half_pixel"), ("linear", "align_corners"),
                                      ("nearest", "asymmetric"), ("cubic", "pytorch_half_pixel")])
def test_resize_after_a_blocked_conv_gets_a_kernel(mode, ctm):
    """Segmentation heads upsample conv outputs (blocked NCHW16c) and concatenate them."""
    vi = helper.make_tensor_value_info
    F = TensorProto.FLOAT
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((32, 3, 3, 3)).astype(np.float32), "w")
    scales = numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales")
    sizes = numpy_helper.from_array(np.array([1, 32, 29, 21], np.int64), "sizes")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Resize", ["c", "", "scales"], ["up"], mode=mode, coordinate_transformation_mode=ctm),
             helper.make_node("Resize", ["c", "", "", "sizes"], ["up2"], mode=mode, coordinate_transformation_mode=ctm),
             helper.make_node("Resize", ["up2", "", "", "sizes2"], ["down"], mode=mode,
                              coordinate_transformation_mode=ctm),
             helper.make_node("Concat", ["up", "down"], ["y"], axis=1)]
    g = helper.make_graph(nodes, "g", [vi("x", F, [1, 3, 12, 10])], [vi("y", F, [1, 64, 24, 20])],
                          [w, scales, sizes, numpy_helper.from_array(np.array([1, 32, 24, 20], np.int64), "sizes2")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    _check_against_ort(model, {"x": rng.standard_normal((1, 3, 12, 10)).astype(np.float32)})


def test_global_pool_of_a_video_network_gets_a_kernel():
    vi = helper.make_tensor_value_info
    F = TensorProto.FLOAT
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3, 3)).astype(np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1] * 6),
             helper.make_node("GlobalAveragePool", ["c"], ["a"]),
             helper.make_node("GlobalMaxPool", ["c"], ["m"]),
             helper.make_node("Add", ["a", "m"], ["y"])]
    g = helper.make_graph(nodes, "g", [vi("x", F, [1, 3, 4, 6, 6])], [vi("y", F, [1, 8, 1, 1, 1])], [w])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    _check_against_ort(model, {"x": rng.standard_normal((1, 3, 4, 6, 6)).astype(np.float32)})


def test_grouped_convs_keep_the_blocked_layout_where_they_vectorise_over_channels():
    """ResNeXt/RegNet blocks: a grouped conv with 8k output channels per group reads and writes
    the blocked layout of the convs around it (no transforms), one with fewer runs on plain rows."""
    vi = helper.make_tensor_value_info
    F = TensorProto.FLOAT
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal(s).astype(np.float32), n) for n, s in
             [("w1", (64, 16, 1, 1)), ("w2", (64, 16, 3, 3)), ("w3", (64, 8, 3, 3)), ("w4", (32, 64, 1, 1))]]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"]), helper.make_node("Relu", ["a"], ["ar"]),
             helper.make_node("Conv", ["ar", "w2"], ["b"], pads=[1, 1, 1, 1], group=4),    # 16 per group
             helper.make_node("Relu", ["b"], ["br"]),
             helper.make_node("Conv", ["br", "w3"], ["c"], pads=[1, 1, 1, 1], group=8),    # 8 per group
             helper.make_node("Conv", ["c", "w4"], ["y"], strides=[2, 2], group=1)]
    g = helper.make_graph(nodes, "g", [vi("x", F, [1, 16, 10, 12])], [vi("y", F, [1, 32, 5, 6])], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    _check_against_ort(model, {"x": rng.standard_normal((1, 16, 10, 12)).astype(np.float32)})
    steps = modelc.compile(model).program["steps"]
    assert [s["pattern"] for s in steps if "layout" in s["pattern"]] == ["layout_transform"] * 2   # in, out
    assert [s["workload"]["inputs"][0].get("layout") is not None for s in steps if s["pattern"].startswith("group")] \
        == [True, True]
    w5 = numpy_helper.from_array(rng.standard_normal((64, 4, 3, 3)).astype(np.float32), "w5")
    mixed = helper.make_graph([nodes[0], nodes[1], helper.make_node("Conv", ["ar", "w5"], ["y"], pads=[1, 1, 1, 1],
                                                                     group=16)], "g",
                              [vi("x", F, [1, 16, 10, 12])], [vi("y", F, [1, 64, 10, 12])], inits[:1] + [w5])
    model = helper.make_model(mixed, opset_imports=[helper.make_opsetid("", 13)])
    _check_against_ort(model, {"x": rng.standard_normal((1, 16, 10, 12)).astype(np.float32)})
    steps = modelc.compile(model).program["steps"]
    assert [s["workload"]["inputs"][0].get("layout") for s in steps if s["pattern"].startswith("group")] == [None]


@pytest.mark.parametrize("branch_channels", [(16, 32), (8, 12)])
def test_concat_of_conv_branches_feeding_a_conv(branch_channels):
    """Inception/SqueezeNet blocks: the Concat writes the next conv's blocked layout (with its halo)
    directly when the branches are whole blocks, and still computes right when they are not."""
    vi = helper.make_tensor_value_info
    F = TensorProto.FLOAT
    rng = np.random.default_rng(0)
    ca, cb = branch_channels
    inits = [numpy_helper.from_array(rng.standard_normal(s).astype(np.float32), n) for n, s in
             [("wa", (ca, 16, 1, 1)), ("wb", (cb, 16, 3, 3)), ("wc", (32, ca + cb, 3, 3))]]
    nodes = [helper.make_node("Conv", ["x", "wa"], ["a"]), helper.make_node("Relu", ["a"], ["ar"]),
             helper.make_node("Conv", ["x", "wb"], ["b"], pads=[1, 1, 1, 1]),
             helper.make_node("Concat", ["ar", "b"], ["c"], axis=1),
             helper.make_node("Conv", ["c", "wc"], ["y"], pads=[1, 1, 1, 1])]
    g = helper.make_graph(nodes, "g", [vi("x", F, [1, 16, 9, 11])], [vi("y", F, [1, 32, 9, 11])], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    _check_against_ort(model, {"x": rng.standard_normal((1, 16, 9, 11)).astype(np.float32)})


def test_compile_and_info_say_which_groups_fall_back_and_why(tmp_path, capsys):
    from modelc.cli import main
    F = TensorProto.FLOAT
    # TopK's template takes k up to select.MAX_K: a larger k still runs the numpy reference
    k = numpy_helper.from_array(np.array([300], np.int64), "k")
    nodes = [helper.make_node("TopK", ["x", "k"], ["y", "i"], axis=-1)]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, [2, 400])],
                          [helper.make_tensor_value_info("y", F, [2, 300]),
                           helper.make_tensor_value_info("i", TensorProto.INT64, [2, 300])], [k])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    m.ir_version = 8
    path = str(tmp_path / "m.onnx")
    onnx.save(m, path)
    for argv in (["info", path], ["compile", path, "-q", "-o", str(tmp_path / "m.mc")]):
        assert main(argv) == 0
        out = capsys.readouterr().out
        assert "1 group(s) run the numpy reference" in out, out
        assert "no kernel template handles TopK" in out, out


@pytest.mark.parametrize("chain", ["max_equal_where", "logsumexp", "normalize", "masked_rows"])
def test_reductions_whose_results_broadcast_back_get_kernels(chain):
    """x == max(x), x - max(x), x / sum(x): the reduction is one kernel, the broadcast back another
    (they fell back to numpy as one group); a chain that ends in a compare changes type."""
    F = TensorProto.FLOAT
    axes = numpy_helper.from_array(np.array([-1], np.int64), "axes")
    c = {"ninf": numpy_helper.from_array(np.array(-np.inf, np.float32), "ninf"),
         "zero": numpy_helper.from_array(np.array(0, np.float32), "zero")}
    mk = helper.make_node
    nodes = {
        "max_equal_where": [mk("ReduceMax", ["x", "axes"], ["m"], keepdims=1), mk("Equal", ["x", "m"], ["e"]),
                            mk("Where", ["e", "x", "zero"], ["y"])],
        "logsumexp": [mk("ReduceMax", ["x", "axes"], ["m"], keepdims=1), mk("Sub", ["x", "m"], ["d"]),
                      mk("Exp", ["d"], ["ex"]), mk("ReduceSum", ["ex", "axes"], ["s"], keepdims=1),
                      mk("Log", ["s"], ["l"]), mk("Add", ["l", "m"], ["y"])],
        "normalize": [mk("Abs", ["x"], ["a"]), mk("ReduceSum", ["a", "axes"], ["s"], keepdims=1),
                      mk("Div", ["x", "s"], ["y"])],
        # a row is fully masked when its max is -inf (ONNX Attention's safe softmax)
        "masked_rows": [mk("ReduceMax", ["x", "axes"], ["m"], keepdims=1), mk("Equal", ["m", "ninf"], ["e"]),
                        mk("Where", ["e", "zero", "x"], ["y"])],
    }[chain]
    out_shape = [3, 4, 1] if chain == "logsumexp" else [3, 4, 7]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, [3, 4, 7])],
                          [helper.make_tensor_value_info("y", F, out_shape)], [axes, *c.values()])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    x = np.random.default_rng(0).standard_normal((3, 4, 7)).astype(np.float32)
    x[1, 2] = -np.inf
    x[0, 0, :3] = -np.inf
    if chain in ("logsumexp", "normalize"):
        x[x == -np.inf] = -30.0
    model.ir_version = 8
    mod = modelc.compile(model.SerializeToString())
    assert not mod.fallbacks, f"groups without a kernel: {mod.fallbacks}"
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got = mod(x)
    scale = np.abs(want[np.isfinite(want)]).max()
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * scale)     # infinities must match exactly


@pytest.mark.parametrize("attrs,b_const,c_shape", [({"transA": 1}, True, (6,)), ({}, False, (4, 6)),
                                                   ({"transB": 1, "alpha": 0.5, "beta": 2.0}, False, (1, 6)),
                                                   ({"alpha": 3.0}, True, (4, 6)),
                                                   ({"transA": 1, "transB": 1}, False, None)])
def test_gemm_in_any_form_gets_kernels(attrs, b_const, c_shape):
    """A Gemm that is not a dense layer is rewritten as Transpose / MatMul / Mul / Add."""
    F = TensorProto.FLOAT
    rng = np.random.default_rng(0)
    a_shape = (5, 4) if attrs.get("transA") else (4, 5)
    b_shape = (6, 5) if attrs.get("transB") else (5, 6)
    inputs, inits, feeds = [helper.make_tensor_value_info("a", F, list(a_shape))], [], {}
    feeds["a"] = rng.standard_normal(a_shape).astype(np.float32)
    b = rng.standard_normal(b_shape).astype(np.float32)
    if b_const:
        inits.append(numpy_helper.from_array(b, "b"))
    else:
        inputs.append(helper.make_tensor_value_info("b", F, list(b_shape)))
        feeds["b"] = b
    names = ["a", "b"]
    if c_shape:
        inputs.append(helper.make_tensor_value_info("c", F, list(c_shape)))
        feeds["c"] = rng.standard_normal(c_shape).astype(np.float32)
        names.append("c")
    g = helper.make_graph([helper.make_node("Gemm", names, ["y"], **attrs)], "g", inputs,
                          [helper.make_tensor_value_info("y", F, [4, 6])], inits)
    _check_against_ort(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), feeds)


def test_reduce_log_sum_gets_a_kernel():
    F = TensorProto.FLOAT
    axes = numpy_helper.from_array(np.array([1], np.int64), "axes")
    g = helper.make_graph([helper.make_node("ReduceLogSum", ["x", "axes"], ["y"], keepdims=0)], "g",
                          [helper.make_tensor_value_info("x", F, [3, 50, 4])],
                          [helper.make_tensor_value_info("y", F, [3, 4])], [axes])
    x = np.abs(np.random.default_rng(0).standard_normal((3, 50, 4))).astype(np.float32)
    _check_against_ort(helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)]), {"x": x})


@pytest.mark.parametrize("et,dt", [(TensorProto.UINT8, np.uint8), (TensorProto.UINT64, np.uint64)])
def test_sign_of_large_unsigned_values(et, dt):
    g = helper.make_graph([helper.make_node("Sign", ["x"], ["y"])], "g", [helper.make_tensor_value_info("x", et, [4])],
                          [helper.make_tensor_value_info("y", et, [4])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    x = np.array([0, 1, np.iinfo(dt).max, np.iinfo(dt).max // 2 + 1], dt)
    mod = modelc.compile(m.SerializeToString())
    assert not mod.fallbacks
    assert mod(x).tolist() == [0, 1, 1, 1]
