"""Every ONNX output comes back under its own name, in the model's order, with onnxruntime's values -
also when a channel-blocked kernel produces it, or the graph reads it again."""
import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import modelc
from workloads import onnx_model

F = TensorProto.FLOAT
RNG = np.random.default_rng(0)


def _w(name, shape):
    return numpy_helper.from_array((RNG.standard_normal(shape) * 0.2).astype(np.float32), name)


def _model(nodes, outputs, inits, x_shape=(1, 16, 9, 11)):
    return onnx_model(nodes, [helper.make_tensor_value_info("x", F, list(x_shape))],
                      [helper.make_tensor_value_info(o, F, None) for o in outputs], inits, ir_version=8)


CASES = {
    "conv": ([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])], ["y"], [_w("w", (32, 16, 3, 3))]),
    "conv_relu": ([helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
                   helper.make_node("Relu", ["c"], ["y"])], ["y"], [_w("w", (32, 16, 3, 3))]),
    "pool_after_conv": ([helper.make_node("Conv", ["x", "w"], ["c"]),
                         helper.make_node("MaxPool", ["c"], ["y"], kernel_shape=[3, 3], strides=[2, 2]),
                         helper.make_node("AveragePool", ["c"], ["z"], kernel_shape=[2, 2], strides=[2, 2])],
                        ["y", "z"], [_w("w", (16, 16, 1, 1))]),
    "residual": ([helper.make_node("Conv", ["x", "w1"], ["a"], pads=[1, 1, 1, 1]),
                  helper.make_node("Relu", ["a"], ["ar"]),
                  helper.make_node("Conv", ["ar", "w2"], ["b"], pads=[1, 1, 1, 1]),
                  helper.make_node("Add", ["b", "x"], ["s"]),
                  helper.make_node("Relu", ["s"], ["y"])],
                 ["y"], [_w("w1", (16, 16, 3, 3)), _w("w2", (16, 16, 3, 3))]),
    "depthwise": ([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1], group=16)],
                  ["y"], [_w("w", (16, 1, 3, 3))]),
    "concat": ([helper.make_node("Conv", ["x", "wa"], ["a"]),
                helper.make_node("Conv", ["x", "wb"], ["b"], pads=[1, 1, 1, 1]),
                helper.make_node("Concat", ["a", "b"], ["y"], axis=1),
                helper.make_node("Conv", ["y", "wc"], ["z"], pads=[1, 1, 1, 1])],
               ["z", "y"], [_w("wa", (16, 16, 1, 1)), _w("wb", (16, 16, 3, 3)), _w("wc", (8, 32, 3, 3))]),
    # intermediate outputs that the graph also reads (feature pyramids, detection heads)
    "used_inside": ([helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
                     helper.make_node("Relu", ["c1"], ["r1"]),
                     helper.make_node("Conv", ["r1", "w2"], ["c2"], strides=[2, 2], pads=[1, 1, 1, 1]),
                     helper.make_node("GlobalAveragePool", ["c2"], ["g"]),
                     helper.make_node("Flatten", ["g"], ["f"])],
                    ["f", "r1", "c2"], [_w("w1", (16, 16, 3, 3)), _w("w2", (32, 16, 3, 3))]),
    "input_passthrough": ([helper.make_node("Identity", ["x"], ["y"]),
                           helper.make_node("Conv", ["x", "w"], ["z"])], ["z", "y"], [_w("w", (16, 16, 1, 1))]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_outputs_keep_their_names_and_values(case):
    nodes, outputs, inits = CASES[case]
    model = _model(nodes, outputs, inits)
    x = RNG.standard_normal((1, 16, 9, 11)).astype(np.float32)
    mod = modelc.compile(model.SerializeToString())
    got = mod.run({"x": x})
    assert list(got) == outputs
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for name, want in zip(outputs, sess.run(outputs, {"x": x})):
        assert got[name].shape == want.shape, name
        assert np.abs(got[name] - want).max() <= 1e-5 * max(np.abs(want).max(), 1e-30), name
    if len(outputs) == 1:
        assert np.array_equal(mod(x), got[outputs[0]])


def test_infinite_masks_survive_fast_math():
    """Attention masks are -inf: kernels must not be compiled assuming finite values (with LLVM's
    `ninf`, a Pad of -inf followed by an Add folded the padding away)."""
    F = TensorProto.FLOAT
    mask = numpy_helper.from_array(np.array([0, 0, 0, -np.inf, -np.inf, 0], np.float32).reshape(1, 1, 1, 6), "mask")
    pads = numpy_helper.from_array(np.array([0, 0, 0, 0, 0, 0, 0, 2], np.int64), "pads")
    ninf = numpy_helper.from_array(np.array(-np.inf, np.float32), "ninf")
    nodes = [helper.make_node("Pad", ["s", "pads", "ninf"], ["p"]),
             helper.make_node("Add", ["p", "mask"], ["b"]),
             helper.make_node("Softmax", ["b"], ["y"], axis=-1),
             helper.make_node("ReduceMax", ["b", "axes"], ["m"], keepdims=1)]
    axes = numpy_helper.from_array(np.array([-1], np.int64), "axes")
    model = onnx_model(nodes, [helper.make_tensor_value_info("s", F, [2, 3, 4, 4])],
                       [helper.make_tensor_value_info("y", F, [2, 3, 4, 6]),
                        helper.make_tensor_value_info("m", F, [2, 3, 4, 1])], [mask, pads, ninf, axes],
                       opset=18, ir_version=8)
    s = RNG.standard_normal((2, 3, 4, 4)).astype(np.float32)
    s[0, 0, 0, :2] = -np.inf                   # a partly masked row (a fully masked one: see notes)
    mod = modelc.compile(model.SerializeToString())
    got = mod.run({"s": s})
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for name, want in zip(["y", "m"], sess.run(["y", "m"], {"s": s})):
        np.testing.assert_allclose(got[name], want, rtol=1e-5, atol=1e-6, err_msg=name)
