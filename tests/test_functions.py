"""Ops ONNX defines as functions of other ops (frontend/functions.py), imported as that body and
compiled; each model against onnxruntime, which runs these ops with kernels of its own."""
import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import modelc
from modelc.errors import ModelcError, UnsupportedOpError
from workloads import onnx_model

pytestmark = pytest.mark.filterwarnings("ignore:onnx.checker rejects")
RNG = np.random.default_rng(0)
F = TensorProto.FLOAT


def _model(nodes, inputs, outputs, opset):
    m = onnx_model(nodes, [helper.make_tensor_value_info(n, F, s) for n, s in inputs],
                   [helper.make_tensor_value_info(o, F, []) for o in outputs], opset=opset, ir_version=10)
    for o in m.graph.output:
        o.type.tensor_type.ClearField("shape")
    return m


def _check(m, feeds, rtol=2e-5):
    mod = modelc.compile(m)
    assert not mod.fallbacks, mod.fallbacks
    got = mod.run(feeds)
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    for o, w in zip(m.graph.output, want):
        scale = float(np.abs(w).max()) or 1.0
        np.testing.assert_allclose(got[o.name], w, rtol=0, atol=rtol * scale)
    return mod


def _x(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("causal", [0, 1])
def test_attention_on_3d_inputs_with_grouped_heads(causal):
    """PyTorch's exporter writes scaled_dot_product_attention as Attention from opset 23: 3-d
    inputs split into heads, 8 query heads sharing 2 key/value heads, causal or not."""
    node = helper.make_node("Attention", ["q", "k", "v"], ["y"], q_num_heads=8, kv_num_heads=2,
                            is_causal=causal)
    m = _model([node], [("q", [2, 7, 64]), ("k", [2, 7, 16]), ("v", [2, 7, 16])], ["y"], 23)
    mod = _check(m, {"q": _x(2, 7, 64), "k": _x(2, 7, 16), "v": _x(2, 7, 16)})
    assert "Attention" not in modelc.from_onnx(m).op_counts()
    assert mod.run({"q": _x(2, 7, 64), "k": _x(2, 7, 16), "v": _x(2, 7, 16)})["y"].shape == (2, 7, 64)


def test_attention_with_a_mask_a_cache_and_present_outputs():
    """4-d heads, an additive float mask, past keys and values: every output of the op."""
    node = helper.make_node("Attention", ["q", "k", "v", "mask", "pk", "pv"], ["y", "present_k", "present_v"],
                            scale=0.3)
    m = _model([node], [("q", [1, 4, 3, 8]), ("k", [1, 4, 3, 8]), ("v", [1, 4, 3, 8]), ("mask", [3, 5]),
                        ("pk", [1, 4, 2, 8]), ("pv", [1, 4, 2, 8])], ["y", "present_k", "present_v"], 23)
    feeds = {"q": _x(1, 4, 3, 8), "k": _x(1, 4, 3, 8), "v": _x(1, 4, 3, 8), "mask": _x(3, 5),
             "pk": _x(1, 4, 2, 8), "pv": _x(1, 4, 2, 8)}
    _check(m, feeds)


def test_rms_normalization():
    node = helper.make_node("RMSNormalization", ["x", "w"], ["y"], axis=-1, epsilon=1e-5)
    m = _model([node], [("x", [2, 5, 32]), ("w", [32])], ["y"], 23)
    _check(m, {"x": _x(2, 5, 32), "w": _x(32)})


def test_a_default_attribute_of_the_op_reaches_its_body():
    """MeanVarianceNormalization's body reads its `axes` attribute; left out, the schema's
    default [0, 2, 3] applies (dropping the reference would normalise over every axis)."""
    node = helper.make_node("MeanVarianceNormalization", ["x"], ["y"])
    m = _model([node], [("x", [2, 3, 4, 5])], ["y"], 13)
    x = _x(2, 3, 4, 5) * 3 + 1
    got = modelc.compile(m).run({"x": x})["y"]
    mean = x.mean(axis=(0, 2, 3), keepdims=True)
    want = (x - mean) / np.sqrt(((x - mean) ** 2).mean(axis=(0, 2, 3), keepdims=True))
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)


def test_an_op_with_neither_a_kernel_nor_a_body_is_still_named():
    node = helper.make_node("Det", ["x"], ["y"])
    m = _model([node], [("x", [5, 5])], ["y"], 13)
    with pytest.raises(UnsupportedOpError, match="Det"):
        modelc.from_onnx(m)


def test_a_body_that_cannot_be_built_names_the_node():
    """Query width 30 does not split into 8 heads: refused naming the node, not a numpy traceback."""
    node = helper.make_node("Attention", ["q", "k", "v"], ["y"], q_num_heads=8, kv_num_heads=8, name="attn")
    m = _model([node], [("q", [1, 4, 30]), ("k", [1, 4, 30]), ("v", [1, 4, 30])], ["y"], 23)
    with pytest.raises(ModelcError, match="attn"):
        modelc.from_onnx(m)
