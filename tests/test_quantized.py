"""Quantized models: ONNX's quantized ops and onnxruntime's quantized contrib ops, compiled to
generated kernels, against onnxruntime. Integer results must be onnxruntime's integers exactly:
the sums are exact in float32 and the requantization is onnxruntime's own arithmetic. Products of
uint8 by int8 are checked against the exact reference's integers instead on CPUs without VNNI,
where onnxruntime's kernels saturate them (integer_reference.py)."""
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as T
from onnx import helper
from onnx import numpy_helper as nh

import modelc
from modelc.errors import ModelcError, ModelLoadError, ShapeError, UnsupportedOpError

from integer_reference import integer_outputs, onnxruntime_outputs

MS = "com.microsoft"
_ELEM = {np.dtype(np.uint8): T.UINT8, np.dtype(np.int8): T.INT8, np.dtype(np.float32): T.FLOAT,
         np.dtype(np.int32): T.INT32, np.dtype(np.uint16): T.UINT16, np.dtype(np.int16): T.INT16}


def _model(op, feeds: dict, consts: dict, inputs: list, out_dtype, attrs=None, domain="", opset=21):
    """One node `op` over `inputs` (names in feeds, consts, or "" for an omitted input)."""
    node = helper.make_node(op, inputs, ["y"], domain=domain, **(attrs or {}))
    g = helper.make_graph([node], "q", [helper.make_tensor_value_info(k, _ELEM[v.dtype], list(v.shape))
                                        for k, v in feeds.items()],
                          [helper.make_tensor_value_info("y", out_dtype, None)],
                          [nh.from_array(np.asarray(v), k) for k, v in consts.items()])
    ops = [helper.make_opsetid("", opset)] + ([helper.make_opsetid(MS, 1)] if domain else [])
    return helper.make_model(g, opset_imports=ops)


def _both(model, feeds, u8s8=False):
    """modelc's output and onnxruntime's; with `u8s8` (uint8 x int8 products, which onnxruntime may
    saturate), integer_reference.py's: onnxruntime's where its sums are exact, else the reference's."""
    want = (integer_outputs if u8s8 else onnxruntime_outputs)(model, feeds)[0]
    got = modelc.compile(model).run(feeds)["y"]
    assert got.dtype == want.dtype and got.shape == want.shape
    return got, want


def _steps(got, want) -> int:
    return int(np.abs(got.astype(np.int64) - want.astype(np.int64)).max()) if got.size else 0


rng = np.random.default_rng(7)
u8 = lambda *s: rng.integers(0, 256, s).astype(np.uint8)                # noqa: E731
i8 = lambda *s: rng.integers(-127, 128, s).astype(np.int8)              # noqa: E731
f32 = lambda v: np.asarray(v, np.float32)                               # noqa: E731


@pytest.mark.parametrize("zp_dtype", [np.uint8, np.int8])
def test_quantize_dequantize_per_tensor_and_axis(zp_dtype):
    x = (rng.standard_normal((2, 4, 5, 6)) * 3).astype(np.float32)
    x.flat[:8] = [0.25, 0.75, -0.25, -2.5, 1.5, 1e6, -1e6, 0.0]            # ties and saturation
    zp = np.array(3, zp_dtype)
    got, want = _both(_model("QuantizeLinear", {"x": x}, {"s": f32(0.5), "z": zp}, ["x", "s", "z"],
                             _ELEM[np.dtype(zp_dtype)]), {"x": x})
    assert _steps(got, want) == 0
    s = f32([0.02, 0.5, 0.013, 1.0])
    z = np.array([0, 1, -2 if zp_dtype == np.int8 else 2, 5], zp_dtype)
    got, want = _both(_model("QuantizeLinear", {"x": x}, {"s": s, "z": z}, ["x", "s", "z"],
                             _ELEM[np.dtype(zp_dtype)], {"axis": 1}), {"x": x})
    assert _steps(got, want) == 0
    q = want
    got, want = _both(_model("DequantizeLinear", {"q": q}, {"s": s, "z": z}, ["q", "s", "z"], T.FLOAT,
                             {"axis": 1}), {"q": q})
    np.testing.assert_array_equal(got, want)


def test_blocked_quantization_and_int32_dequantize():
    x = rng.standard_normal((3, 8)).astype(np.float32)
    s = (rng.random((3, 3)) + 0.1).astype(np.float32)
    z = rng.integers(0, 10, (3, 3)).astype(np.uint8)
    m = _model("QuantizeLinear", {"x": x}, {"s": s, "z": z}, ["x", "s", "z"], T.UINT8,
               {"axis": 1, "block_size": 3})
    got = modelc.compile(m).run({"x": x})["y"]
    want = onnx.reference.ReferenceEvaluator(m).run(None, {"x": x})[0]
    np.testing.assert_array_equal(got, want)
    b = rng.integers(-5000, 5000, (16,)).astype(np.int32)
    got, want = _both(_model("DequantizeLinear", {"b": b}, {"s": f32(0.003)}, ["b", "s"], T.FLOAT), {"b": b})
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("form", ["3x3", "strided-depthwise", "1x1-no-bias"])
def test_qlinearconv_is_onnxruntimes_integers(form):
    c, m, k, group, attrs = {"3x3": (8, 16, 3, 1, {"pads": [1, 1, 1, 1]}),
                             "strided-depthwise": (8, 8, 3, 8, {"pads": [1, 1, 1, 1], "strides": [2, 2]}),
                             "1x1-no-bias": (16, 24, 1, 1, {})}[form]
    x = u8(1, c, 12, 12)
    w = i8(m, c // group, k, k)
    consts = {"xs": f32(0.05), "xz": np.uint8(128), "w": w, "ws": (rng.random(m) * 0.02 + 0.005).astype(np.float32),
              "wz": np.zeros(m, np.int8), "ys": f32(0.8), "yz": np.uint8(100),
              "b": rng.integers(-3000, 3000, m).astype(np.int32)}
    inputs = ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz"] + ([] if form == "1x1-no-bias" else ["b"])
    # onnxruntime's depthwise kernel gives exact sums without VNNI too; its other convs saturate there
    got, want = _both(_model("QLinearConv", {"x": x}, consts, inputs, T.UINT8, {"group": group, **attrs}), {"x": x},
                      u8s8=group == 1)
    assert _steps(got, want) == 0 and len(np.unique(want)) > 50     # a real spread, not all saturated


@pytest.mark.parametrize("shape_a,shape_b,dt", [((6, 40), (40, 10), np.uint8), ((2, 5, 32), (32, 7), np.int8)])
def test_qlinearmatmul_and_matmulinteger(shape_a, shape_b, dt):
    a = u8(*shape_a) if dt == np.uint8 else i8(*shape_a)
    b = i8(*shape_b)
    consts = {"as": f32(0.03), "az": np.array(7, dt), "b": b, "bs": f32(0.02), "bz": np.int8(0),
              "ys": f32(0.3), "yz": np.array(5, dt)}
    u8s8 = dt == np.uint8       # (onnxruntime sums int8 x int8 products exactly without VNNI too)
    got, want = _both(_model("QLinearMatMul", {"a": a}, consts, ["a", "as", "az", "b", "bs", "bz", "ys", "yz"],
                             _ELEM[np.dtype(dt)]), {"a": a}, u8s8)
    assert _steps(got, want) == 0
    got, want = _both(_model("MatMulInteger", {"a": a}, {"b": b, "az": np.array(7, dt)}, ["a", "b", "az"],
                             T.INT32), {"a": a}, u8s8)
    np.testing.assert_array_equal(got, want)


def test_convinteger_and_dynamic_quantization():
    x = u8(1, 4, 9, 9)
    w = u8(6, 4, 3, 3)
    got, want = _both(_model("ConvInteger", {"x": x}, {"w": w, "xz": np.uint8(120), "wz": np.uint8(128)},
                             ["x", "w", "xz", "wz"], T.INT32), {"x": x})
    np.testing.assert_array_equal(got, want)
    v = np.array([0, 2, -3, -2.5, 1.34, 0.5], np.float32)      # -2.5 / scale sits 1 ulp off a tie
    node = helper.make_node("DynamicQuantizeLinear", ["v"], ["y", "s", "z"])
    g = helper.make_graph([node], "d", [helper.make_tensor_value_info("v", T.FLOAT, [6])],
                          [helper.make_tensor_value_info(n, t, None) for n, t in
                           (("y", T.UINT8), ("s", T.FLOAT), ("z", T.UINT8))])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    got = modelc.compile(m).run({"v": v})
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"v": v})
    for k, w_ in zip("ysz", want):
        np.testing.assert_array_equal(got[k], w_)
    assert got["y"][3] == 26


def _contrib(op, x, attrs=None, extra_inputs=(), extra_consts=None, y_zp=True):
    consts = {"xs": f32(0.07), "xz": np.uint8(110), "ys": f32(0.05), "yz": np.uint8(120), **(extra_consts or {})}
    inputs = ["x", "xs", "xz", *extra_inputs, "ys"] + (["yz"] if y_zp else [])
    return _model(op, {"x": x}, consts, inputs, T.UINT8, attrs, domain=MS)


@pytest.mark.parametrize("op,attrs", [("QLinearSigmoid", {}), ("QLinearLeakyRelu", {"alpha": 0.1}),
                                      ("QLinearGlobalAveragePool", {"channels_last": 0}),
                                      ("QLinearGlobalAveragePool", {"channels_last": 1}),
                                      ("QLinearAveragePool", {"kernel_shape": [3, 3], "strides": [2, 2],
                                                              "pads": [1, 1, 1, 1], "count_include_pad": 1}),
                                      ("QLinearSoftmax", {"opset": 13, "axis": -1})])
def test_contrib_unary_ops_agree_with_onnxruntime(op, attrs):
    x = u8(2, 8, 7, 7)
    got, want = _both(_contrib(op, x, attrs), {"x": x})
    # onnxruntime computes these through a 256-entry table of its float results: at most one step,
    # where an entry sits on a rounding tie (which flips every element of that value, 0.4% of them)
    assert _steps(got, want) <= 1 and np.mean(got != want) < 0.01


@pytest.mark.parametrize("op,b_shape", [("QLinearAdd", (2, 8, 7, 7)), ("QLinearAdd", (1, 8, 1, 1)),
                                        ("QLinearMul", (2, 8, 7, 7))])
def test_contrib_binary_ops_agree_with_onnxruntime(op, b_shape):
    a, b = u8(2, 8, 7, 7), u8(*b_shape)
    consts = {"as": f32(0.0425), "az": np.uint8(145), "bs": f32(0.0388), "bz": np.uint8(123),
              "cs": f32(0.0262), "cz": np.uint8(3)}
    m = _model(op, {"a": a, "b": b}, consts, ["a", "as", "az", "b", "bs", "bz", "cs", "cz"], T.UINT8, domain=MS)
    got, want = _both(m, {"a": a, "b": b})
    if op == "QLinearAdd":          # MLAS's two fused multiply-adds, as MulAdd: exactly
        assert _steps(got, want) == 0
    else:                           # the float product between a dequantize and a quantize
        assert _steps(got, want) <= 1 and np.mean(got != want) < 0.005


def test_qlinearconcat_and_qgemm():
    a, b = u8(2, 3, 4), u8(2, 5, 4)
    consts = {"ys": f32(0.05), "yz": np.uint8(128), "as": f32(0.04), "az": np.uint8(100), "bs": f32(0.06),
              "bz": np.uint8(140)}
    m = _model("QLinearConcat", {"a": a, "b": b}, consts, ["ys", "yz", "a", "as", "az", "b", "bs", "bz"], T.UINT8,
               {"axis": 1}, domain=MS)
    got, want = _both(m, {"a": a, "b": b})
    assert _steps(got, want) <= 1
    x, w = u8(4, 32), i8(10, 32)
    consts = {"xs": f32(0.05), "xz": np.uint8(128), "w": w, "ws": (rng.random(10) * 0.02).astype(np.float32),
              "wz": np.zeros(10, np.int8), "c": rng.integers(-2000, 2000, 10).astype(np.int32),
              "ys": f32(0.4), "yz": np.uint8(128)}
    for inputs, out in ((["x", "xs", "xz", "w", "ws", "wz", "c", "ys", "yz"], T.UINT8),
                        (["x", "xs", "xz", "w", "ws", "wz", "c"], T.FLOAT)):
        m = _model("QGemm", {"x": x}, consts, inputs, out, {"transB": 1}, domain=MS)
        got, want = _both(m, {"x": x}, u8s8=True)       # the float output too: the sums, scaled
        if out == T.UINT8:
            assert _steps(got, want) == 0
        else:
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6 * np.abs(want).max())


def _small_net():
    """conv -> relu -> conv + skip -> relu -> global pool -> gemm, float32, seeded."""
    r = np.random.default_rng(3)
    w = lambda *s: nh.from_array((r.standard_normal(s) * (2 / np.prod(s[1:])) ** 0.5).astype(np.float32))  # noqa
    inits = []
    for name, t in (("w1", w(16, 3, 3, 3)), ("w2", w(16, 16, 3, 3)), ("w3", w(16, 16, 3, 3)), ("fc", w(10, 16))):
        t.name = name
        inits.append(t)
    inits += [nh.from_array((r.standard_normal(16) * 0.1).astype(np.float32), f"b{k}") for k in (1, 2, 3)]
    inits.append(nh.from_array(np.zeros(10, np.float32), "fcb"))
    p = {"pads": [1, 1, 1, 1]}
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], **p), helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], **p), helper.make_node("Relu", ["c2"], ["r2"]),
             helper.make_node("Conv", ["r2", "w3", "b3"], ["c3"], **p), helper.make_node("Add", ["c3", "r1"], ["s"]),
             helper.make_node("Relu", ["s"], ["r3"]), helper.make_node("GlobalAveragePool", ["r3"], ["g"]),
             helper.make_node("Flatten", ["g"], ["f"]),
             helper.make_node("Gemm", ["f", "fc", "fcb"], ["out"], transB=1)]
    g = helper.make_graph(nodes, "net", [helper.make_tensor_value_info("x", T.FLOAT, [1, 3, 24, 24])],
                          [helper.make_tensor_value_info("out", T.FLOAT, [1, 10])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("fmt", ["QOperator", "QDQ"])
def test_onnxruntime_quantized_network(tmp_path, fmt):
    """A network quantized by onnxruntime's own tool, in both formats: onnxruntime's integers
    exactly. QOperator holds QLinearConv, QLinearAdd, QLinearGlobalAveragePool, QGemm; QDQ holds
    float ops between DequantizeLinear and QuantizeLinear, which onnxruntime's optimiser fuses into
    those integer ops, and so does modelc (frontend/qdq.py). Their uint8 x int8 products: the exact
    reference's integers where onnxruntime's saturate (integer_reference.py)."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
    r = np.random.default_rng(11)
    xs = [r.standard_normal((1, 3, 24, 24)).astype(np.float32) for _ in range(5)]

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter({"x": x} for x in xs[:4])

        def get_next(self):
            return next(self.it, None)

    src, dst = tmp_path / "f.onnx", tmp_path / "q.onnx"
    onnx.save(_small_net(), src)
    quantize_static(str(src), str(dst), Reader(), quant_format=getattr(QuantFormat, fmt),
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
    q = onnx.load(dst)
    ops = {n.op_type for n in q.graph.node}
    assert ("QLinearConv" in ops and "QLinearAdd" in ops) if fmt == "QOperator" else "DequantizeLinear" in ops
    mod = modelc.compile(str(dst))
    for x in xs:
        got, want = mod.run({"x": x})["out"], integer_outputs(dst, {"x": x})[0]
        assert np.abs(got - want).max() <= 1e-6 * np.abs(want).max()


def test_qdq_groups_fuse_only_when_exact():
    """DQ -> Conv -> Relu -> Q fuses into one QLinearConv (the Q's zero point clamps as the ReLU
    did); a group whose float output is also a graph output stays float ops, by the spec."""
    from modelc.frontend import qdq
    r = np.random.default_rng(5)
    inits = [nh.from_array(np.float32(0.05), "xs"), nh.from_array(np.uint8(128), "xz"),
             nh.from_array(r.integers(-60, 60, (8, 4, 3, 3)).astype(np.int8), "w"),
             nh.from_array(np.full(8, 0.01, np.float32), "ws"), nh.from_array(np.zeros(8, np.int8), "wz"),
             nh.from_array(np.float32(0.2), "ys"), nh.from_array(np.uint8(0), "yz")]
    nodes = [helper.make_node("DequantizeLinear", ["x", "xs", "xz"], ["xf"]),
             helper.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wf"], axis=0),
             helper.make_node("Conv", ["xf", "wf"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("QuantizeLinear", ["r", "ys", "yz"], ["y"])]
    outs = [helper.make_tensor_value_info("y", T.UINT8, [1, 8, 6, 6])]
    for extra in ([], [helper.make_tensor_value_info("c", T.FLOAT, [1, 8, 6, 6])]):
        g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", T.UINT8, [1, 4, 6, 6])],
                              outs + extra, inits)
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
        fused = [n.op_type for n in qdq.fuse_groups(m).graph.node]
        assert ("QLinearConv" in fused) == (not extra) and ("Relu" in fused) == bool(extra)
        x = u8(1, 4, 6, 6)
        got = modelc.compile(m).run({"x": x})
        want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
        # unfused, both run the spec's float conv, summed in different orders: a step on a tie
        assert _steps(got["y"], want[0]) <= (1 if extra else 0)


def test_quantized_errors_name_the_problem():
    x = u8(1, 4, 5, 5)
    bad = _model("QLinearAdd", {"x": x}, {"s": f32(0.1)}, ["x", "s", "x"], T.UINT8, domain=MS)
    with pytest.raises(ModelLoadError, match="QLinearAdd.*3 inputs"):
        modelc.compile(bad)
    bad = _contrib("QLinearSigmoid", x, {"beta": 2.0})
    with pytest.raises(ModelLoadError, match="attribute.*beta"):
        modelc.compile(bad)
    unknown = _model("QLinearFoo", {"x": x}, {}, ["x"], T.UINT8, domain=MS)
    with pytest.raises(UnsupportedOpError, match="com.microsoft.QLinearFoo"):
        modelc.compile(unknown)
    v = rng.standard_normal((2, 3)).astype(np.float32)
    wrong = _model("QuantizeLinear", {"v": v}, {"s": f32([0.1, 0.2]), "z": np.zeros(2, np.uint8)},
                   ["v", "s", "z"], T.UINT8, {"axis": 1})
    with pytest.raises(ShapeError, match="scale of shape \\[2\\].*axis 1.*\\[2, 3\\]"):
        modelc.compile(wrong)
    fp8 = _model("QuantizeLinear", {"v": v}, {"s": f32(0.1)}, ["v", "s"], T.FLOAT8E4M3FN,
                 {"output_dtype": T.FLOAT8E4M3FN})
    with pytest.raises(ModelcError, match="uint8, int8"):
        modelc.compile(fp8)


def test_integer_round_trip_dropped_through_max_pool():
    """Round -> Clip to [0, 255] -> Cast uint8 -> MaxPool -> Cast float32 is the MaxPool of the
    floats themselves: the casts go (passes/simplify.py), the result does not change; a Clip
    wider than uint8 keeps them."""
    from modelc.frontend import from_onnx
    from modelc.passes import optimize
    # the pool's result read by two Casts (a ResNet's stem: its block's conv and residual add) too
    for hi, dropped, readers in ((255.0, True, 1), (300.0, False, 1), (255.0, True, 2), (300.0, False, 2)):
        inits = [nh.from_array(f32(0.0), "lo"), nh.from_array(f32(hi), "hi")]
        nodes = [helper.make_node("Round", ["x"], ["r"]), helper.make_node("Clip", ["r", "lo", "hi"], ["c"]),
                 helper.make_node("Cast", ["c"], ["q"], to=T.UINT8),
                 helper.make_node("MaxPool", ["q"], ["p"], kernel_shape=[2, 2], strides=[2, 2])]
        if readers == 1:
            nodes.append(helper.make_node("Cast", ["p"], ["y"], to=T.FLOAT))
        else:
            nodes += [helper.make_node("Cast", ["p"], ["y1"], to=T.FLOAT),
                      helper.make_node("Cast", ["p"], ["y2"], to=T.FLOAT),
                      helper.make_node("Sigmoid", ["y2"], ["s2"]), helper.make_node("Add", ["y1", "s2"], ["y"])]
        g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", T.FLOAT, [1, 2, 6, 6])],
                              [helper.make_tensor_value_info("y", T.FLOAT, [1, 2, 3, 3])], inits)
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
        ops = [n.op_type for n in optimize(from_onnx(m), fuse_ops=False).topo()]
        assert ("Cast" not in ops) == dropped and "MaxPool" in ops
        x = (rng.standard_normal((1, 2, 6, 6)) * 200).astype(np.float32)
        want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
        np.testing.assert_array_equal(modelc.compile(m).run({"x": x})["y"], want)


def test_crafted_qdq_cycle_is_a_clear_error():
    """Two QuantizeLinear reading each other's output as zero point, under a fusable Add: the QDQ
    matcher follows the chain no further than the graph is long, and the import names the node."""
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z2"], ["z1"]),
             helper.make_node("QuantizeLinear", ["x", "s", "z1"], ["z2"]),
             helper.make_node("DequantizeLinear", ["z1", "s"], ["d"]),
             helper.make_node("Add", ["d", "d"], ["a"]),
             helper.make_node("QuantizeLinear", ["a", "s"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", T.FLOAT, [4])],
                          [helper.make_tensor_value_info("y", T.UINT8, [4])], [nh.from_array(f32(0.1), "s")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(ModelLoadError, match="QuantizeLinear.*reads tensor 'z2'"):
        modelc.compile(m)
