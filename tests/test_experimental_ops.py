"""ONNX's experimental ops of opset 1 (frontend/experimental.py), as old zoo models hold them, compiled
and compared with numpy's computation of ONNX's definitions and, where it still runs them, with
onnxruntime; bad attributes are named."""
import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import modelc
from modelc.errors import ModelcError
from workloads import onnx_model

pytestmark = pytest.mark.filterwarnings("ignore:onnx.checker rejects")
F = TensorProto.FLOAT
RNG = np.random.default_rng(0)
X = RNG.standard_normal((1, 3, 8, 10)).astype(np.float32)


def _run(nodes, out_shape, inits=(), opset=7, ort_runs=True):
    m = onnx_model(nodes, [helper.make_tensor_value_info("x", F, list(X.shape))],
                   [helper.make_tensor_value_info("y", F, out_shape)], inits, opset)
    mod = modelc.compile(m)
    assert not mod.fallbacks, mod.fallbacks
    got = mod(X)
    if ort_runs:      # (onnxruntime keeps these ops of opset 1, not the fills)
        want, = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": X})
        _close(got, want)
    return got


def _close(got, want):
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-6 * float(np.abs(want).max()))


def test_image_scaler_before_a_conv_as_tiny_yolov2_has_it():
    w = (RNG.standard_normal((4, 3, 3, 3)) * 0.2).astype(np.float32)
    nodes = [helper.make_node("ImageScaler", ["x"], ["s"], scale=0.5, bias=[0.1, -0.2, 0.3]),
             helper.make_node("Conv", ["s", "w"], ["y"], pads=[1, 1, 1, 1])]
    got = _run(nodes, [1, 4, 8, 10], [numpy_helper.from_array(w, "w")])
    s = X * 0.5 + np.array([0.1, -0.2, 0.3], np.float32).reshape(1, 3, 1, 1)
    sp = np.pad(s, ((0, 0), (0, 0), (1, 1), (1, 1)))
    want = np.einsum("nchwij,kcij->nkhw", np.lib.stride_tricks.sliding_window_view(sp, (3, 3), axis=(2, 3)), w)
    _close(got, want)


@pytest.mark.parametrize("op,attrs,fn", [
    ("Scale", {"scale": 2.5}, lambda x: 2.5 * x),
    ("Affine", {"alpha": -1.5, "beta": 0.25}, lambda x: -1.5 * x + 0.25),
    ("ScaledTanh", {"alpha": 2.0, "beta": 0.5}, lambda x: 2.0 * np.tanh(0.5 * x)),
    ("ParametricSoftplus", {"alpha": 0.7, "beta": 1.3}, lambda x: 0.7 * np.log1p(np.exp(1.3 * x))),
])
def test_elementwise_experimental_ops(op, attrs, fn):
    got = _run([helper.make_node(op, ["x"], ["y"], **attrs)], list(X.shape))
    _close(got, fn(X.astype(np.float64)))


@pytest.mark.parametrize("attrs,want", [
    ({"border": [1, 2, 3, 1]}, X[:, :, 2:7, 1:7]),
    ({"border": [1, 2, 0, 0], "scale": [4, 5]}, X[:, :, 2:6, 1:6]),
])
def test_crop_by_borders_or_to_a_size(attrs, want):
    got = _run([helper.make_node("Crop", ["x"], ["y"], **attrs)], list(want.shape))
    np.testing.assert_array_equal(got, want)


def test_fills_become_constants():
    nodes = [helper.make_node("ConstantFill", ["x"], ["c"], value=2.0),
             helper.make_node("GivenTensorFill", [], ["g"], values=[1.0, 2.0, 3.0], shape=[1, 3, 1, 1]),
             helper.make_node("Mul", ["x", "g"], ["m"]),
             helper.make_node("Add", ["m", "c"], ["y"])]
    got = _run(nodes, list(X.shape), ort_runs=False)
    _close(got, X * np.array([1, 2, 3], np.float32).reshape(1, 3, 1, 1) + 2.0)


@pytest.mark.parametrize("node,match", [
    (helper.make_node("ImageScaler", ["x"], ["y"], scale=1.0, bias=[0.1, 0.2]), "bias has 2 values for 3 channels"),
    (helper.make_node("Crop", ["x"], ["y"], border=[0, 6, 0, 6]), "does not fit its 8 x 10 input"),
    (helper.make_node("Crop", ["x"], ["y"], border=[0, 0, 0]), "border = .left, top, right, bottom."),
    (helper.make_node("GivenTensorFill", [], ["y"], values=[1.0], shape=[100000, 100000, 1000]),
     "needs .* GiB but .* of memory is available"),
])
def test_bad_attributes_are_named(node, match):
    node.name = "old_node"
    m = onnx_model([node], [helper.make_tensor_value_info("x", F, list(X.shape))],
                   [helper.make_tensor_value_info("y", F, None)], (), 7)
    with pytest.raises(ModelcError, match=match) as e:
        modelc.compile(m)
    assert "old_node" in str(e.value)
