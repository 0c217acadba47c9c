"""Quantized convs read their input as bytes (passes/byte_inputs.py): the kernels that do, exact
against the reference for every padding in both dot forms; where the pass applies and where not;
whole quantized models equal to onnxruntime's bytes (the exact reference's, where onnxruntime's
uint8 x int8 products saturate: integer_reference.py)."""
import copy

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import modelc
from modelc import target
from modelc.frontend import from_onnx
from modelc.kernels.template import get, select
from modelc.kernels.workload import Workload
from modelc.passes import optimize
from modelc.target import Target

from integer_reference import integer_outputs
from test_expand_depthwise_int8 import _form, _inputs, qed_wl
from test_kernels_conv2d_int8 import _knob_extremes, _run
from workloads import conv2d_wl

NO_DOT = Target.from_features("x86-64", "+sse4.1,+sse4.2")


def as_bytes(j: dict, dtype: str, z: int, to_bytes: bool = False) -> Workload:
    """Workload JSON `j` (a quantized conv's) reading input 0 as `dtype` bytes q with x_zero z (the
    conv of q - z); with `to_bytes`, its output clipped and cast to uint8."""
    j = copy.deepcopy(j)
    lo = int(np.iinfo(dtype).min)
    j["inputs"][0]["dtype"] = dtype
    j["ops"][0]["attrs"].update(exact=1, x_min=lo - z, x_zero=z)
    if to_bytes:
        n = len(j["params"])
        j["params"].update({f"p{n}": {"dtype": "float32", "shape": [], "value": 0.0},
                            f"p{n + 1}": {"dtype": "float32", "shape": [], "value": 255.0}})
        j["ops"] += [{"op": "Clip", "attrs": {}, "args": [f"v{len(j['ops']) - 1}", f"p{n}", f"p{n + 1}"]},
                     {"op": "Cast", "attrs": {"to": 2}, "args": [f"v{len(j['ops'])}"]}]
        j["outputs"][0].update(dtype="uint8", value=f"v{len(j['ops']) - 1}")
    return Workload(j)


def _byte_inputs(wl, seed=0):
    """test_expand_depthwise_int8's inputs (int8 weights, integer biases, per-channel scales, float
    residuals), input 0 bytes over the whole range (both ends included)."""
    ins = _inputs(wl, 0, seed)
    info = np.iinfo(wl.inputs[0].dtype)
    x = np.random.default_rng(seed).integers(info.min, int(info.max) + 1, wl.inputs[0].shape)
    x.flat[:2] = [info.min, info.max]
    return [x.astype(info.dtype)] + ins[1:]


def _exact_on_bytes(wl, name: str, floats: str):
    """The kernels of `name`'s default and two knob extremes for `wl`, which `name` takes and
    `floats`, its float32 template, does not."""
    tpl = select(wl)
    assert tpl is get(name) and not get(floats).matches(wl)
    space = tpl.space(wl)
    default = tpl.default_config(wl, space)
    return [tpl.build(wl, cfg) for cfg in [default] + _knob_extremes(space, default)[:2]]


def _check(wl, kernels):
    """Each kernel gives the reference's outputs exactly, in the output's dtype."""
    ins = _byte_inputs(wl)
    for kernel in kernels:
        got, want = _run(wl, kernel, ins)
        assert got[0].dtype == want[0].dtype == wl.outputs[0].dtype
        np.testing.assert_array_equal(got[0], want[0])


CONV_CASES = [  # (conv2d_wl case, byte type, x_zero): padding 1 and 3 (stride 2), no padding, dilation
    (dict(C=16, H=10, W=9, K=40, k=3, s=1, p=1, hin=0, hout=1, act=None), "uint8", 37, True),
    (dict(C=3, H=20, W=19, K=32, k=7, s=2, p=3, hin=0, hout=0, bias=False, act="Relu"), "uint8", 0, False),
    (dict(C=24, H=7, W=13, K=48, k=1, s=1, p=0, hin=0, hout=0, act=None), "int8", -5, True),
    # a halo from elsewhere (a residual's) holds zero bytes, not the zero point: never read as padding
    (dict(C=16, H=12, W=12, K=16, k=3, s=1, p=2, hin=2, hout=0, dil=2, act=None), "uint8", 128, False),
]


@pytest.mark.parametrize("case, dtype, z, to_bytes, form",
                         [(*c, "vnni") for c in CONV_CASES] + [(*c, "int16") for c in CONV_CASES[1::2]],
                         ids=lambda v: f"c{v['C']}k{v['K']}p{v['p']}" if isinstance(v, dict) else str(v))
def test_conv2d_int8_reads_bytes_exactly(case, dtype, z, to_bytes, form):
    """Default and knob extremes, against the reference's conv of q - z (padded with its zeros)."""
    with target.use(_form(form)):
        wl = as_bytes(conv2d_wl(**case).json, dtype, z, to_bytes)
        kernels = _exact_on_bytes(wl, "conv2d_int8", "conv2d")
    _check(wl, kernels)


ED_CASES = [(dict(c=16, k=96, h=14), "uint8", 9), (dict(c=24, k=144, h=9, w=11, s=2, per_channel=True), "int8", 3),
            # stems: 3x3 stride 2 over an image's channels, the padding written where the rows convert
            (dict(c=3, k=32, h=23, w=20, k1=3, s1=2, per_channel=True), "uint8", 114),
            (dict(c=4, k=48, h=9, k1=3, s=2, hin=1), "int8", 0)]


@pytest.mark.parametrize("case, dtype, z, form", [(*c, "vnni") for c in ED_CASES] +
                         [(*c, "int16") for c in ED_CASES[1:3]],
                         ids=lambda v: f"c{v['c']}k{v['k']}k{v.get('k1', 1)}" if isinstance(v, dict) else str(v))
def test_expand_depthwise_int8_reads_bytes_exactly(case, dtype, z, form):
    with target.use(_form(form)):
        wl = as_bytes(qed_wl(**case).json, dtype, z, to_bytes=True)
        kernels = _exact_on_bytes(wl, "expand_depthwise_int8", "expand_depthwise")
    assert wl.outputs[0].dtype == np.uint8
    _check(wl, kernels)


def test_only_templates_that_read_bytes_build_them():
    """A byte workload no such template takes runs on the numpy reference, never on a float kernel."""
    wl = as_bytes(conv2d_wl(C=16, H=10, W=9, K=40, k=3, s=1, p=1, hin=0, hout=1, act=None).json, "uint8", 3)
    with target.use(NO_DOT):
        assert select(wl).name == "reference"
    j = copy.deepcopy(wl.json)
    j["ops"][0]["attrs"]["x_zero"] = 2.5            # crafted: not an integer, so no kernel takes it
    with target.use(_form("int16")):
        assert select(Workload(j)).name == "reference"


def _qnet(x_zp=37, pool=False, seed=0):
    """A uint8 image -> QLinearConv 3x3 (pad 1) -> QLinearConv 1x1 -> QLinearAdd of the two (a
    residual) -> QLinearConv 3x3 stride 2 [and a MaxPool of the first conv's output, concatenated]."""
    rng = np.random.default_rng(seed)
    inits, nodes = [], []

    def const(name, v):
        inits.append(numpy_helper.from_array(np.asarray(v), name))
        return name

    def qconv(x, xz, cin, cout, k, s, name):
        ws = rng.uniform(0.002, 0.006, cout).astype(np.float32)
        names = [x, const(name + "xs", np.float32(0.03)), xz,
                 const(name + "w", rng.integers(-128, 128, (cout, cin, k, k)).astype(np.int8)),
                 const(name + "ws", ws), const(name + "wz", np.zeros(cout, np.int8)),
                 const(name + "ys", np.float32(0.05)), const(name + "yz", np.uint8(100 + cout % 50)),
                 const(name + "b", rng.integers(-2000, 2000, cout).astype(np.int32))]
        nodes.append(helper.make_node("QLinearConv", names, [name + "y"], pads=[k // 2] * 4, strides=[s, s]))
        return name + "y", name + "yz", name + "ys"
    a, az, as_ = qconv("x", const("xz", np.uint8(x_zp)), 8, 32, 3, 1, "c0_")
    b, bz, bs = qconv(a, az, 32, 32, 1, 1, "c1_")
    nodes.append(helper.make_node("QLinearAdd", [a, as_, az, b, bs, bz, const("ss", np.float32(0.06)),
                                                 const("sz", np.uint8(90))], ["s"], domain="com.microsoft"))
    out, _, _ = qconv("s", "sz", 32, 48, 3, 2, "c2_")
    if pool:
        nodes.append(helper.make_node("MaxPool", [a], ["p"], kernel_shape=[2, 2], strides=[2, 2]))
        nodes.append(helper.make_node("QLinearConcat", [const("cs", np.float32(0.05)), const("cz", np.uint8(100)),
                                                        out, "c2_ys", "c2_yz", "p", as_, az], ["cat"],
                                      axis=1, domain="com.microsoft"))
        out = "cat"
    shape = [1, 48 + 32 * pool, 8, 8]
    g = helper.make_graph(nodes, "qnet", [helper.make_tensor_value_info("x", TensorProto.UINT8, [1, 8, 16, 16])],
                          [helper.make_tensor_value_info(out, TensorProto.UINT8, shape)], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13), helper.make_opsetid("com.microsoft", 1)])


def _byte_convs(model, tg):
    with target.use(tg):
        g = optimize(from_onnx(model), fuse_ops=False)
    return {n.name: (n.attrs.get("x_zero"), str(g.tensors[n.inputs[0]].dtype)) for n in g.topo() if n.op_type == "Conv"}


@pytest.mark.parametrize("form, pool", [("vnni", False), ("vnni", True), ("int16", False)])
def test_quantized_models_move_bytes_and_give_onnxruntimes(form, pool):
    """Every conv reads bytes (the model's input too), unless its input is also read by a MaxPool
    (that would need a kernel of its own to widen them); no kernel only casts; onnxruntime's bytes
    (where they are exact sums: integer_reference.py)."""
    tg = _form(form)
    model = _qnet(pool=pool)
    convs = _byte_convs(model, tg)
    readers = [v for v in convs.values() if v[0] is not None]
    assert all(dt in ("uint8", "int8") for _, dt in readers)
    assert len(readers) == (2 if pool else 3), convs
    assert set(_byte_convs(model, NO_DOT).values()) == {(None, "float32")}
    x = np.random.default_rng(1).integers(0, 256, (1, 8, 16, 16)).astype(np.uint8)
    want = integer_outputs(model, {"x": x})[0]
    with target.use(tg):
        mod = modelc.compile(model)
    casts = [s for s in mod.program["steps"] if s["pattern"].startswith("cast")]
    assert all(s["outputs"] == [mod.output_specs[0]["name"]] for s in casts), casts     # only the model's output
    assert not mod.fallbacks
    got = mod.run({"x": x})
    np.testing.assert_array_equal(next(iter(got.values())), want)


def _qdq_residual(seed=0):
    """QDQ: x -> Q -> DQ -> Conv 3x3 (int8 weights through a DQ) -> Q -> DQ, + the first DQ's value
    in float32: the centered input (q - zp) is read by the conv and by that dequantize's Mul."""
    rng = np.random.default_rng(seed)
    c = 16
    inits = [numpy_helper.from_array(np.float32(0.05), "s"), numpy_helper.from_array(np.uint8(37), "z"),
             numpy_helper.from_array(rng.integers(-128, 128, (c, c, 3, 3)).astype(np.int8), "wq"),
             numpy_helper.from_array(rng.uniform(0.002, 0.006, c).astype(np.float32), "ws"),
             numpy_helper.from_array(np.zeros(c, np.int8), "wz"),
             numpy_helper.from_array(np.float32(0.08), "s2"), numpy_helper.from_array(np.uint8(120), "z2")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q0"]),
             helper.make_node("DequantizeLinear", ["q0", "s", "z"], ["d0"]),
             helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["w"], axis=0),
             helper.make_node("Conv", ["d0", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("QuantizeLinear", ["c", "s2", "z2"], ["q1"]),
             helper.make_node("DequantizeLinear", ["q1", "s2", "z2"], ["d1"]),
             helper.make_node("Add", ["d1", "d0"], ["y"])]
    g = helper.make_graph(nodes, "qdq", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, 10, 10])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, c, 10, 10])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])


def test_a_centered_input_read_by_a_conv_and_a_residual():
    """The conv reads the bytes; the residual widens them in its own kernel; onnxruntime's values."""
    tg = _form("vnni")
    model = _qdq_residual()
    assert [v for v in _byte_convs(model, tg).values()] == [(37, "uint8")]
    x = np.random.default_rng(2).standard_normal((1, 16, 10, 10)).astype(np.float32) * 3
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    with target.use(tg):
        mod = modelc.compile(model)
    assert not mod.fallbacks
    np.testing.assert_array_equal(mod.run({"x": x})["y"], want)


def test_the_pass_can_be_switched_off():
    """As fuse_depthwise can: float32 tensors between quantized kernels, as before the pass."""
    tg = _form("vnni")
    with modelc.passes.byte_inputs.disabled():
        assert set(_byte_convs(_qnet(), tg).values()) == {(None, "float32")}
    assert (37, "uint8") in _byte_convs(_qnet(), tg).values()
