"""Normalisations run on generated kernels only (no numpy fallback) with onnxruntime's values:
InstanceNormalization, GroupNormalization, LayerNormalization with graph-input scale/B and its Mean
and InvStdDev outputs, LpNormalization (p 1 and 2, any axis), LRN, also after a conv (blocked
layouts) - within 1e-5 of the output scale."""
import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import modelc

F = TensorProto.FLOAT
RNG = np.random.default_rng(0)
TOL = 1e-5
pytestmark = pytest.mark.filterwarnings("ignore:onnx.checker rejects the model")


def _w(name, shape, scale=0.3, shift=0.0):
    return numpy_helper.from_array((RNG.standard_normal(shape) * scale + shift).astype(np.float32), name)


def _check(nodes, inputs, outputs, inits=(), opset=18, shift=0.0):
    """Compile, assert no fallback, compare every output with onnxruntime."""
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, F, list(s)) for n, s in inputs],
                          [helper.make_tensor_value_info(o, F, None) for o in outputs], list(inits))
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    blob = model.SerializeToString()
    feeds = {n: (RNG.standard_normal(s) * 2 + shift).astype(np.float32) for n, s in inputs}
    mod = modelc.compile(blob)
    assert not mod.fallbacks, mod.fallbacks
    got = mod.run(feeds)
    sess = ort.InferenceSession(blob, providers=["CPUExecutionProvider"])
    for name, want in zip(outputs, sess.run(outputs, feeds)):
        assert got[name].shape == want.shape, name
        err = np.abs(got[name].astype(np.float64) - want).max()
        assert err <= TOL * max(np.abs(want).max(), 1e-30), (name, err)


@pytest.mark.parametrize("shape", [(2, 3, 5, 7), (1, 4, 10), (2, 8, 3, 4, 5)])
def test_instance_norm(shape):
    c = shape[1]
    _check([helper.make_node("InstanceNormalization", ["x", "s", "b"], ["y"], epsilon=1e-3)],
           [("x", shape)], ["y"], [_w("s", (c,), shift=1.0), _w("b", (c,))], shift=3.0)


def test_instance_norm_long_rows_offset():
    """Rows beyond 4096 elements (float32 chunk sums added in float64), far from zero mean."""
    _check([helper.make_node("InstanceNormalization", ["x", "s", "b"], ["y"])],
           [("x", (1, 3, 70, 90))], ["y"], [_w("s", (3,), shift=1.0), _w("b", (3,))], shift=100.0)


def test_instance_norm_graph_input_scale():
    _check([helper.make_node("InstanceNormalization", ["x", "s", "b"], ["y"])],
           [("x", (2, 3, 6, 5)), ("s", (3,)), ("b", (3,))], ["y"])


@pytest.mark.parametrize("groups", [1, 2, 6])
def test_group_norm(groups):
    _check([helper.make_node("GroupNormalization", ["x", "s", "b"], ["y"], num_groups=groups, epsilon=1e-4)],
           [("x", (2, 6, 5, 4))], ["y"], [_w("s", (6,), shift=1.0), _w("b", (6,))], opset=21)


@pytest.mark.parametrize("axis", [-1, 1, 0])
def test_layer_norm_graph_inputs_and_statistics(axis):
    shape = (3, 4, 5)
    tail = shape[axis % 3:]
    _check([helper.make_node("LayerNormalization", ["x", "s", "b"], ["y", "mean", "inv"], axis=axis)],
           [("x", shape), ("s", tail), ("b", tail)], ["y", "mean", "inv"], opset=17, shift=1.0)


def test_layer_norm_graph_input_scale_broadcast():
    _check([helper.make_node("LayerNormalization", ["x", "s"], ["y"], axis=-2)],
           [("x", (2, 3, 4, 8)), ("s", (1, 8))], ["y"], opset=17)


def test_layer_norm_unused_statistics_constant_scale():
    _check([helper.make_node("LayerNormalization", ["x", "s", "b"], ["y", "mean", ""]),
            helper.make_node("Relu", ["y"], ["z"])],
           [("x", (4, 32))], ["z"], [_w("s", (32,)), _w("b", (32,))], opset=17)


@pytest.mark.parametrize("p,axis,shape",
                         [(2, -1, (2, 3, 4)), (2, 0, (3, 2)), (1, 1, (2, 5, 3)), (1, 0, (7,))])
def test_lp_norm(p, axis, shape):
    _check([helper.make_node("LpNormalization", ["x"], ["y"], p=p, axis=axis)], [("x", shape)], ["y"])


def test_lp_norm_zero_row():
    init = numpy_helper.from_array(np.array([[0, 0, 0], [1, 2, 2]], np.float32), "z")
    _check([helper.make_node("Add", ["x", "z"], ["a"]), helper.make_node("Mul", ["a", "zero"], ["m"]),
            helper.make_node("LpNormalization", ["m"], ["y"], p=2, axis=0)],
           [("x", (2, 3))], ["y"], [init, numpy_helper.from_array(np.zeros((2, 3), np.float32), "zero")])


# odd sizes: onnxruntime refuses even ones
@pytest.mark.parametrize("size,beta", [(1, 0.75), (3, 0.75), (5, 0.75), (5, 0.6), (9, 1.0)])
def test_lrn(size, beta):
    _check([helper.make_node("LRN", ["x"], ["y"], size=size, alpha=2e-3, beta=beta, bias=1.5)],
           [("x", (2, 7, 5, 6))], ["y"])


def test_lrn_epilogue():
    """LRN absorbs the elementwise chain after it (a per-channel scale here)."""
    _check([helper.make_node("LRN", ["x"], ["n"], size=3, alpha=1e-2, beta=0.75, bias=2.0),
            helper.make_node("Mul", ["n", "s"], ["y"])],
           [("x", (1, 6, 4, 5))], ["y"], [_w("s", (6, 1, 1), shift=1.0)])


def test_conv_instance_norm_relu():
    _check([helper.make_node("Conv", ["x", "w", "cb"], ["c"], pads=[1, 1, 1, 1]),
            helper.make_node("InstanceNormalization", ["c", "s", "b"], ["n"]),
            helper.make_node("Relu", ["n"], ["y"])],
           [("x", (1, 8, 12, 12))], ["y"],
           [_w("w", (32, 8, 3, 3)), _w("cb", (32,)), _w("s", (32,), shift=1.0), _w("b", (32,))])


def test_conv_relu_lrn_pool():
    """AlexNet's head: conv -> relu -> LRN -> max pool, in blocked layouts."""
    _check([helper.make_node("Conv", ["x", "w", "cb"], ["c"], strides=[2, 2], pads=[2, 2, 2, 2]),
            helper.make_node("Relu", ["c"], ["r"]),
            helper.make_node("LRN", ["r"], ["n"], size=5, alpha=1e-4, beta=0.75, bias=1.0),
            helper.make_node("MaxPool", ["n"], ["y"], kernel_shape=[3, 3], strides=[2, 2])],
           [("x", (1, 3, 23, 23))], ["y"], [_w("w", (48, 3, 5, 5), scale=1.0), _w("cb", (48,))])


def test_lrn_template_every_config():
    """Every config of the LRN template's space (rows per task, parallel) against the reference."""
    from modelc.kernels import template, testing
    from modelc.kernels.workload import Workload
    wl = Workload({"version": 1, "inputs": [{"shape": [2, 5, 3, 7], "dtype": "float32", "const": False}],
                   "ops": [{"op": "LRN", "attrs": {"size": 3, "alpha": 0.01, "beta": 0.75, "bias": 1.0},
                            "args": ["i0"]}],
                   "params": {}, "outputs": [{"shape": [2, 5, 3, 7], "dtype": "float32", "value": "v0"}]})
    t = template.select(wl)
    assert t.name == "lrn"
    sp = t.space(wl)
    for k in range(len(sp)):
        got, want, _, _ = testing.run(wl, t, sp.get(k))
        assert testing.max_rel_error(got, want) <= TOL, sp.get(k)
