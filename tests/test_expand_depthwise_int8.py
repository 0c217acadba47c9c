"""A quantized 1x1 conv on integer dot products fused with its depthwise conv
(kernels/expand_depthwise_int8.py): exact against the reference executor for every knob's extremes
in both dot-product forms, per-tensor and per-channel requantization, and quantized models fused by
the pass agree with onnxruntime bit for bit (with the exact reference where onnxruntime's uint8 x int8
products saturate: integer_reference.py)."""
import copy
from dataclasses import replace

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import modelc
from modelc import target
from modelc.kernels import testing
from modelc.kernels.int_dot import dot_form
from modelc.kernels.layout import choose_block
from modelc.kernels.template import get, select, untuned
from modelc.kernels.workload import Workload
from modelc.target import Target

from integer_reference import integer_outputs

ED8 = get("expand_depthwise_int8")
HOST = Target.host()
INT16 = replace(HOST, isa=tuple(f for f in HOST.isa if "vnni" not in f))
NO_DOT = replace(HOST, isa=tuple(f for f in HOST.isa if "vnni" not in f and f not in ("avx2", "avx512bw")))


def _form(name):
    if name == "vnni" and not HOST.int8_dot_lanes or not HOST.int16_dot_lanes:
        pytest.skip(f"this CPU has no {name} dot product")
    # int16_256: AVX2's 256-bit int16 pairs (blocks of 8 channels), which any AVX2 host runs
    return {"vnni": HOST, "int16": INT16, "int16_256": replace(INT16, vector_bits=256)}[name]


def _scalar(v):
    return {"dtype": "float32", "shape": [], "value": float(v)}


def qed_wl(c, k, h, w=None, kh=3, s=1, x_min=-128, per_channel=False, n=1, hin=0, hout=0, bias=True,
           res=False, k1=1, s1=1):
    """The workload of a quantized MobileNet block's pair as the importer writes it: Conv 1x1 (exact,
    x_min) + bias, requantized (Mul by one scale or one per channel, Round, Add the zero point, Clip
    to uint8, Sub the zero point), a depthwise Conv kh x kh + bias requantized the same way [+ a
    float residual], in the blocked layout."""
    w = w or h
    p1, x_h, x_w = k1 // 2, h, w
    h, w = (x_h + 2 * p1 - k1) // s1 + 1, (x_w + 2 * p1 - k1) // s1 + 1       # the expanded tensor
    pad = (kh - 1) // 2
    oh, ow = (h + 2 * pad - kh) // s + 1, (w + 2 * pad - kh) // s + 1
    cb, b = choose_block(c), choose_block(k)
    inputs = [{"shape": [n, c, x_h, x_w], "dtype": "float32", "const": False, "layout": [cb, max(hin, p1)]},
              {"shape": [k, c, k1, k1], "dtype": "float32", "const": True}]
    conv = {"op": "Conv", "attrs": {"dilations": [1, 1], "kernel_shape": [k1, k1], "pads": [p1] * 4,
                                    "strides": [s1, s1], "exact": 1, "x_min": x_min}, "args": ["i0", "i1"]}
    if bias:
        inputs.append({"shape": [k], "dtype": "float32", "const": True})
        conv["args"].append("i2")
    ops, params = [conv], {}

    def requantize(zp):
        v = f"v{len(ops) - 1}"
        if per_channel:
            inputs.append({"shape": [k, 1, 1], "dtype": "float32", "const": True})
            scale = f"i{len(inputs) - 1}"
        else:
            scale = f"p{len(params)}"
            params[scale] = _scalar(7.3e-4)
        names = [f"p{len(params) + j}" for j in range(3)]
        params.update({names[0]: _scalar(zp), names[1]: _scalar(0), names[2]: _scalar(255)})
        for op, args, attrs in (("Mul", [v, scale], {"exact": 1}), ("Round", [None], {}), ("Add", [None, names[0]], {}),
                                ("Clip", [None, names[1], names[2]], {}), ("Sub", [None, names[0]], {})):
            args = [a or f"v{len(ops) - 1}" for a in args]
            ops.append({"op": op, "attrs": attrs, "args": args})
    requantize(9)
    inputs.append({"shape": [k, 1, kh, kh], "dtype": "float32", "const": True})
    dw = {"op": "Conv", "attrs": {"kernel_shape": [kh, kh], "strides": [s, s], "pads": [pad] * 4, "dilations": [1, 1],
                                  "group": k, "exact": 1}, "args": [f"v{len(ops) - 1}", f"i{len(inputs) - 1}"]}
    if bias:
        inputs.append({"shape": [k], "dtype": "float32", "const": True})
        dw["args"].append(f"i{len(inputs) - 1}")
    ops.append(dw)
    requantize(5)
    if res:
        inputs.append({"shape": [n, k, oh, ow], "dtype": "float32", "const": False, "layout": [b, 0]})
        ops.append({"op": "Add", "attrs": {}, "args": [f"v{len(ops) - 1}", f"i{len(inputs) - 1}"]})
    return Workload({"version": 1, "inputs": inputs, "ops": ops, "params": params,
                     "outputs": [{"shape": [n, k, oh, ow], "dtype": "float32", "value": f"v{len(ops) - 1}",
                                  "layout": [b, hout]}]})


def _inputs(wl, x_min, seed=1):
    """The centered input over the whole byte range, int8 weights, integer biases; per-channel scales
    as the workload holds them; small integer depthwise weights (as a quantized model's)."""
    rng = np.random.default_rng(seed)
    out = []
    for k, t in enumerate(wl.inputs):
        if k == 0:
            x = rng.integers(x_min, x_min + 256, t.shape)
            x.flat[:2] = [x_min, x_min + 255]
        elif t.const and len(t.shape) == 3:      # a per-channel requantization scale
            x = rng.uniform(1e-4, 2e-3, t.shape)
        elif t.const and len(t.shape) == 4:
            x = rng.integers(-128, 128, t.shape)
        elif t.const:
            x = rng.integers(-3000, 3000, t.shape)
        else:
            x = rng.standard_normal(t.shape)
        out.append(np.asarray(x, np.float32))
    return out


def _extremes(space, default):
    out = [default]
    for knob in space.knobs:
        for v in (knob.values[0], knob.values[-1]):
            cfg = space.from_values(dict(default.values, **{knob.name: v}))
            if space.is_valid(cfg) and all(cfg.values != c.values for c in out):
                out.append(cfg)
    return out


CASES = [(dict(c=16, k=96, h=14), -9), (dict(c=24, k=144, h=9, w=11, s=2, per_channel=True, hout=1), 0),
         (dict(c=40, k=96, h=7, kh=5, per_channel=True, res=True, n=2, bias=False), -255),
         (dict(c=3, k=32, h=8, hin=1), -128),
         # a stem: 3x3 stride 2 over an image's channels (a patch of 3 rows, the halo its padding)
         (dict(c=3, k=32, h=23, w=20, k1=3, s1=2, per_channel=True), -128), (dict(c=4, k=48, h=9, k1=3, s=2), 0)]


@pytest.mark.parametrize("case, x_min, form", [(c, x, "vnni") for c, x in CASES] +
                         [(c, x, "int16") for c, x in CASES[:2] + CASES[4:5]] + [(CASES[2][0], -128, "int16_256")],
                         ids=lambda c: f"c{c['c']}k{c['k']}h{c['h']}k{c.get('k1', 1)}" if isinstance(c, dict)
                         else str(c))
def test_knob_extremes_are_exact(case, x_min, form):
    with target.use(_form(form)):
        wl = qed_wl(x_min=x_min, **case)
        assert ED8.matches(wl) and select(wl).name == "expand_depthwise" and untuned(wl, select(wl)) is ED8
        space = ED8.space(wl)
        cfgs = _extremes(space, ED8.default_config(wl, space))
        ins = _inputs(wl, x_min)
        for cfg in cfgs:
            got, want, _, _ = testing.run(wl, ED8, cfg, inputs=ins)
            if case.get("res"):        # exact integers, then a float32 add (one rounding, as the reference's)
                np.testing.assert_allclose(got[0], want[0], rtol=1e-6, atol=1e-6 * np.abs(want[0]).max())
            else:
                np.testing.assert_array_equal(got[0], want[0], err_msg=str(cfg.values))
        assert len(cfgs) >= 3


def test_what_it_takes():
    """Integer dot products on the CPU, the importer's note on the first conv, an expansion (at least
    twice the channels); channel constants in its epilogue are the float template's too."""
    if not HOST.int16_dot_lanes:
        pytest.skip("this CPU has no integer dot product")
    wl = qed_wl(16, 32, 8, per_channel=True)
    with target.use(HOST):
        assert ED8.matches(wl) and get("expand_depthwise").matches(wl)
    with target.use(NO_DOT):
        assert not ED8.matches(wl) and get("expand_depthwise").matches(wl)
    with target.use(HOST):                  # no expansion (ShuffleNetV2's branches): apart, as measured
        flat = qed_wl(32, 32, 8)
        assert not ED8.matches(flat) and get("expand_depthwise").matches(flat)
    for attrs in ({"x_min": 3}, {"x_min": None}, {"exact": 0}):
        j = copy.deepcopy(wl.json)
        j["ops"][0]["attrs"].update(attrs)
        with target.use(HOST):
            assert not ED8.matches(Workload(j)), attrs
    # a per-channel constant of another shape (varying along the rows) is not a channel's
    j = copy.deepcopy(wl.json)
    k = next(i for i, t in enumerate(j["inputs"]) if t["shape"] == [32, 1, 1])
    j["inputs"][k] = dict(j["inputs"][k], shape=[32, 8, 1])
    assert not get("expand_depthwise").matches(Workload(j))


def _qblock(per_channel, seed=0):
    """QLinearConv 16 -> 96 (1x1), a depthwise QLinearConv 3x3 and a 1x1 96 -> 16 on 28x28 (MobileNetV2's
    block), weight scales per tensor or per output channel."""
    rng = np.random.default_rng(seed)
    inits, nodes, x = [], [], "x"
    for k, (cin, cout, ks, group) in enumerate(((16, 96, 1, 1), (96, 96, 3, 96), (96, 16, 1, 1))):
        p = f"c{k}_"
        ws = rng.uniform(0.002, 0.006, cout).astype(np.float32) if per_channel else np.array(0.004, np.float32)
        inits += [numpy_helper.from_array(np.array(0.02, np.float32), p + "xs"),
                  numpy_helper.from_array(np.array(7, np.uint8), p + "xz"),
                  numpy_helper.from_array(rng.integers(-128, 128, (cout, cin // group, ks, ks)).astype(np.int8),
                                          p + "w"),
                  numpy_helper.from_array(ws, p + "ws"),
                  numpy_helper.from_array(np.zeros(ws.shape, np.int8), p + "wz"),
                  numpy_helper.from_array(np.array(0.05, np.float32), p + "ys"),
                  numpy_helper.from_array(np.array(7, np.uint8), p + "yz"),
                  numpy_helper.from_array(rng.integers(-2000, 2000, cout).astype(np.int32), p + "b")]
        names = [x] + [p + s for s in ("xs", "xz", "w", "ws", "wz", "ys", "yz", "b")]
        nodes.append(helper.make_node("QLinearConv", names, [p + "y"], pads=[ks // 2] * 4, group=group))
        x = p + "y"
    g = helper.make_graph(nodes, "qed", [helper.make_tensor_value_info("x", TensorProto.UINT8, [1, 16, 28, 28])],
                          [helper.make_tensor_value_info(x, TensorProto.UINT8, [1, 16, 28, 28])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])


@pytest.mark.parametrize("per_channel", [False, True])
def test_a_quantized_block_is_fused_on_dot_products(per_channel):
    """With an integer dot product the pair is one expand_depthwise_int8 kernel; without, one
    expand_depthwise kernel of float32 FMAs; onnxruntime's bytes either way (where they are exact
    sums: integer_reference.py)."""
    model = _qblock(per_channel)
    x = np.random.default_rng(1).integers(0, 256, (1, 16, 28, 28)).astype(np.uint8)
    want = integer_outputs(model, {"x": x})[0]
    for tg in [t for t in (HOST, INT16) if t.int16_dot_lanes] + [NO_DOT]:
        dots = bool(dot_form(tg))
        with target.use(tg):
            mod = modelc.compile(model)
        steps = [s["template"] for s in mod.program["steps"]]
        fused = "expand_depthwise_int8" if dots else "expand_depthwise"
        assert fused in steps and ("conv2d_int8" in steps) == dots, steps
        np.testing.assert_array_equal(mod.run({"x": x})["c2_y"], want)


def test_a_saved_module_loads_with_the_loading_cpus_form(tmp_path):
    """Saved with one dot product, the fused kernel builds the loading CPU's (the same bytes) and is
    refused, naming the step, where that CPU has none (its kernel would abort the process)."""
    if not HOST.int16_dot_lanes:
        pytest.skip("this CPU has no integer dot product")
    mod = modelc.compile(_qblock(True))
    step = next(k for k, s in enumerate(mod.program["steps"]) if s["template"] == "expand_depthwise_int8")
    path = str(tmp_path / "q.modelc")
    mod.save(path)
    x = np.random.default_rng(1).integers(0, 256, (1, 16, 28, 28)).astype(np.uint8)
    want = mod.run({"x": x})["c2_y"]
    with target.use(INT16):
        np.testing.assert_array_equal(modelc.load(path).run({"x": x})["c2_y"], want)
    refused = rf"steps\[{step}\]\.template.*expand_depthwise_int8"
    with target.use(NO_DOT), pytest.raises(modelc.ModelcError, match=refused):
        modelc.load(path)
