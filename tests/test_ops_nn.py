"""NN, linear-algebra and reduction ops against onnxruntime, on single-node models.

Each case builds a one-node ONNX model, imports it with modelc (which also cross-checks our shape
rules with ONNX's shape inference) and compares the reference executor with onnxruntime at 1e-4
relative to the output's scale.
"""
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import helper, numpy_helper

import modelc
from modelc import reference
from modelc.errors import UnsupportedOpError

FEW = settings(max_examples=20, deadline=None, derandomize=True,
               suppress_health_check=[HealthCheck.too_slow])


def _model(op, inputs, consts=None, n_outputs=1, opset=22, **attrs):
    """A one-node model: `inputs` become graph inputs, then `consts` initializers."""
    consts = consts or {}
    names = list(inputs) + list(consts)
    outs = [f"y{i}" for i in range(n_outputs)]
    node = helper.make_node(op, names, outs, **attrs)
    g = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
         for k, v in inputs.items()],
        [helper.make_empty_tensor_value_info(o) for o in outs],
        [numpy_helper.from_array(v, k) for k, v in consts.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 10   # what onnxruntime reads
    m = onnx.shape_inference.infer_shapes(m)       # types the outputs for onnxruntime
    first = next(iter(inputs.values()))
    for out in m.graph.output:       # where ONNX cannot (normalizations): the first input's type
        if not out.type.tensor_type.elem_type:
            out.type.CopyFrom(helper.make_tensor_type_proto(
                helper.np_dtype_to_tensor_dtype(first.dtype), first.shape))
    return m


def _ort(model, feeds):
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def check(op, inputs, consts=None, n_outputs=1, opset=22, rtol=1e-4, **attrs):
    """Run `op` in modelc's reference executor and in onnxruntime; outputs must agree."""
    model = _model(op, inputs, consts, n_outputs, opset, **attrs)
    expected = _ort(model, inputs)
    graph = modelc.from_onnx(model)
    got = reference.run(graph, inputs)
    for i, exp in enumerate(expected):
        res = got[f"y{i}"]
        assert res.dtype == exp.dtype and res.shape == exp.shape, (op, i, res.shape, exp.shape)
        scale = float(np.abs(exp).max()) if exp.size and exp.dtype.kind == "f" else 0.0
        np.testing.assert_allclose(res, exp, rtol=rtol, atol=rtol * max(scale, 1e-6),
                                   err_msg=f"{op} output {i} {attrs}")
    return got


def _rand(rng, shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


# ---- convolutions ----------------------------------------------------------------------------

@st.composite
def conv_cases(draw, transpose=False):
    nd = draw(st.integers(1, 3))
    group_kind = draw(st.sampled_from(["one", "grouped", "depthwise"]))
    g = {"one": 1, "grouped": draw(st.integers(2, 3)),
         "depthwise": draw(st.integers(2, 6))}[group_kind]
    cg = 1 if group_kind == "depthwise" else draw(st.integers(1, 3))
    mg = draw(st.integers(1, 3))
    kernel = [draw(st.integers(1, 3 if nd == 3 else 4)) for _ in range(nd)]
    strides = [draw(st.integers(1, 3)) for _ in range(nd)]
    auto_pad = draw(st.sampled_from(["NOTSET", "NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"]))
    # onnxruntime refuses dilations with SAME padding
    dil = [1 if "SAME" in auto_pad else draw(st.integers(1, 2)) for _ in range(nd)]
    size = [draw(st.integers((k - 1) * d + 1, (k - 1) * d + (4 if nd == 3 else 7)))
            for k, d in zip(kernel, dil)]
    attrs = {"group": g, "kernel_shape": kernel, "strides": strides, "dilations": dil}
    if auto_pad == "NOTSET":
        attrs["pads"] = [draw(st.integers(0, k - 1)) for k in kernel * 2]
    else:
        attrs["auto_pad"] = auto_pad
    if transpose:
        if auto_pad == "NOTSET" and draw(st.booleans()):
            attrs["output_padding"] = [draw(st.integers(0, s - 1)) for s in strides]
        w_shape = (g * cg, mg, *kernel)
    else:
        w_shape = (g * mg, cg, *kernel)
    n = draw(st.integers(1, 2))
    return (n, g * cg, *size), w_shape, draw(st.booleans()), attrs, draw(st.integers(0, 99))


@FEW
@given(conv_cases())
def test_conv_matches_onnxruntime(case):
    x_shape, w_shape, bias, attrs, seed = case
    rng = np.random.default_rng(seed)
    consts = {"w": _rand(rng, w_shape)}
    if bias:
        consts["b"] = _rand(rng, (w_shape[0],))
    check("Conv", {"x": _rand(rng, x_shape)}, consts, **attrs)


@FEW
@given(conv_cases(transpose=True))
def test_conv_transpose_matches_onnxruntime(case):
    x_shape, w_shape, bias, attrs, seed = case
    rng = np.random.default_rng(seed)
    consts = {"w": _rand(rng, w_shape)}
    if bias:
        consts["b"] = _rand(rng, (w_shape[1] * attrs["group"],))
    check("ConvTranspose", {"x": _rand(rng, x_shape)}, consts, **attrs)


def test_conv_transpose_output_shape_and_grouped_depthwise():
    rng = np.random.default_rng(0)
    x = _rand(rng, (1, 4, 5, 6))
    check("ConvTranspose", {"x": x}, {"w": _rand(rng, (4, 2, 3, 3))}, group=2, strides=[2, 3],
          output_shape=[12, 17])
    check("Conv", {"x": _rand(rng, (2, 32, 9, 9))}, {"w": _rand(rng, (32, 1, 3, 3))}, group=32,
          strides=[2, 2], pads=[1, 1, 1, 1])


# ---- pools -----------------------------------------------------------------------------------

@st.composite
def pool_cases(draw):
    nd = draw(st.integers(1, 3))
    kernel = [draw(st.integers(1, 3)) for _ in range(nd)]
    strides = [draw(st.integers(1, 3)) for _ in range(nd)]
    dil = [draw(st.integers(1, 2)) for _ in range(nd)]
    size = [draw(st.integers((k - 1) * d + 1, (k - 1) * d + 6)) for k, d in zip(kernel, dil)]
    attrs = {"kernel_shape": kernel, "strides": strides, "dilations": dil,
             "ceil_mode": int(draw(st.booleans()))}
    if draw(st.booleans()):
        attrs["pads"] = [draw(st.integers(0, (k - 1) * d // 2))
                         for k, d in zip(kernel * 2, dil * 2)]
    shape = (draw(st.integers(1, 2)), draw(st.integers(1, 3)), *size)
    return shape, attrs, draw(st.integers(0, 99))


@FEW
@given(pool_cases(), st.booleans())
def test_max_pool_and_indices_match_onnxruntime(case, storage_order):
    shape, attrs, seed = case
    x = _rand(np.random.default_rng(seed), shape)
    check("MaxPool", {"x": x}, n_outputs=2 if len(shape) == 4 else 1,
          storage_order=int(storage_order and len(shape) == 4), **attrs)


@FEW
@given(pool_cases(), st.booleans())
def test_average_pool_matches_onnxruntime(case, count_include_pad):
    shape, attrs, seed = case
    x = _rand(np.random.default_rng(seed), shape)
    check("AveragePool", {"x": x}, count_include_pad=int(count_include_pad), **attrs)


def test_pools_same_padding_and_global():
    rng = np.random.default_rng(1)
    x = _rand(rng, (2, 3, 7, 8))
    for auto_pad in ("SAME_UPPER", "SAME_LOWER", "VALID"):
        check("MaxPool", {"x": x}, kernel_shape=[3, 2], strides=[2, 2], auto_pad=auto_pad)
        check("AveragePool", {"x": x}, kernel_shape=[3, 3], strides=[2, 1], auto_pad=auto_pad)
    check("GlobalAveragePool", {"x": x})
    check("GlobalMaxPool", {"x": x})
    check("LpPool", {"x": x}, kernel_shape=[2, 3], strides=[1, 2], p=3, pads=[1, 1, 0, 1])


# ---- normalizations and softmax ----------------------------------------------------------------

def test_normalizations_match_onnxruntime():
    rng = np.random.default_rng(2)
    x = _rand(rng, (2, 6, 5, 4))
    c = {k: _rand(rng, (6,)) for k in ("s", "b", "m")}
    c["v"] = np.abs(_rand(rng, (6,))) + 0.1
    check("BatchNormalization", {"x": x}, c, epsilon=1e-3)
    check("InstanceNormalization", {"x": x}, {"s": c["s"], "b": c["b"]})
    check("GroupNormalization", {"x": x}, {"s": c["s"], "b": c["b"]}, num_groups=3, opset=21)
    check("LRN", {"x": x}, size=3, alpha=1e-2, beta=0.6, bias=2.0)
    check("LpNormalization", {"x": x}, axis=1, p=1)
    for axis in (-1, 2):
        check("LayerNormalization", {"x": x}, {"s": _rand(rng, x.shape[axis:]),
                                               "b": _rand(rng, x.shape[axis:])},
              n_outputs=3, axis=axis, opset=17)


def test_batchnorm_training_is_unsupported():
    x = np.zeros((1, 2, 3), np.float32)
    p = {k: np.ones(2, np.float32) for k in ("s", "b", "m", "v")}
    with pytest.raises(UnsupportedOpError, match="training_mode"):
        modelc.from_onnx(_model("BatchNormalization", {"x": x}, p, training_mode=1, opset=15))
    with pytest.raises(UnsupportedOpError, match="training"):   # opset 7: extra outputs train
        modelc.from_onnx(_model("BatchNormalization", {"x": x}, p, n_outputs=5, opset=7))


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax", "Hardmax"])
def test_softmax_family_all_opsets(op):
    rng = np.random.default_rng(3)
    x = _rand(rng, (2, 3, 4))
    for axis in (-1, 0, 1, 2):
        check(op, {"x": x}, axis=axis, opset=13)
    for axis in (0, 1, 2, -2):
        check(op, {"x": x}, axis=axis, opset=11)
    check(op, {"x": x}, opset=9)   # default axis 1 before opset 13


# ---- linear algebra --------------------------------------------------------------------------

@pytest.mark.parametrize("ta,tb", [(0, 0), (1, 0), (0, 1), (1, 1)])
@pytest.mark.parametrize("c_shape", [None, (), (5,), (1, 5), (4, 1), (4, 5)])
def test_gemm_transposes_and_c_broadcast(ta, tb, c_shape):
    rng = np.random.default_rng(4)
    a = _rand(rng, (3, 4) if ta else (4, 3))
    b = _rand(rng, (5, 3) if tb else (3, 5))
    consts = {"b": b}
    if c_shape is not None:
        consts["c"] = _rand(rng, c_shape)
    check("Gemm", {"a": a}, consts, transA=ta, transB=tb, alpha=0.5, beta=2.0, opset=13)


def test_gemm_opset6_broadcast_attribute():
    rng = np.random.default_rng(5)
    model = _model("Gemm", {"a": _rand(rng, (2, 3))}, {"b": _rand(rng, (3, 4)),
                                                      "c": _rand(rng, (4,))}, broadcast=1, opset=6)
    g = modelc.from_onnx(model)
    assert "broadcast" not in [n for n in g.topo()][0].attrs


@pytest.mark.parametrize("sa,sb", [((3,), (3,)), ((3,), (2, 3, 4)), ((2, 3, 4), (4,)),
                                   ((5, 1, 2, 3), (4, 3, 6)), ((2, 3), (3, 7)),
                                   ((1, 4, 3), (3, 2))])
def test_matmul_numpy_semantics(sa, sb):
    rng = np.random.default_rng(6)
    check("MatMul", {"a": _rand(rng, sa), "b": _rand(rng, sb)}, opset=13)
    check("MatMul", {"a": rng.integers(-5, 5, sa).astype(np.int32),
                     "b": rng.integers(-5, 5, sb).astype(np.int32)}, opset=13)


@pytest.mark.parametrize("eq,shapes", [("ij,jk->ik", [(2, 3), (3, 4)]),
                                       ("...ii->...i", [(2, 3, 3)]),
                                       ("bij,bjk", [(2, 3, 4), (2, 4, 5)]),
                                       ("i,i", [(5,), (5,)])])
def test_einsum(eq, shapes):
    rng = np.random.default_rng(7)
    check("Einsum", {f"x{i}": _rand(rng, s) for i, s in enumerate(shapes)}, equation=eq, opset=12)


# ---- reductions --------------------------------------------------------------------------------

REDUCES = ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1",
           "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare"]


@pytest.mark.parametrize("op", REDUCES)
def test_reductions_both_axes_forms(op):
    rng = np.random.default_rng(8)
    x = np.abs(_rand(rng, (3, 4, 5))) + 0.5
    for axes, keep in [([1], 1), ([0, -1], 0), (None, 1), (None, 0)]:
        consts = {} if axes is None else {"axes": np.array(axes, np.int64)}
        check(op, {"x": x}, consts, keepdims=keep, opset=18)
        attrs = {} if axes is None else {"axes": axes}
        check(op, {"x": x}, keepdims=keep, opset=11, **attrs)    # axes as an attribute
    check(op, {"x": x}, {"axes": np.zeros(0, np.int64)}, noop_with_empty_axes=1, opset=18)


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
def test_arg_reductions_with_ties(op):
    x = np.array([[1, 3, 3, 0], [2, 2, -1, -1]], np.float32)
    for axis in (0, 1, -1):
        for last in (0, 1):
            check(op, {"x": x}, axis=axis, keepdims=last, select_last_index=last, opset=13)


def test_cumsum():
    rng = np.random.default_rng(9)
    x = _rand(rng, (3, 4))
    for axis in (0, -1):
        for exclusive in (0, 1):
            for rev in (0, 1):
                check("CumSum", {"x": x}, {"axis": np.array(axis, np.int64)},
                      exclusive=exclusive, reverse=rev, opset=14)


# ---- older opsets ------------------------------------------------------------------------------

@pytest.mark.filterwarnings("ignore:onnx.checker rejects")   # GroupNormalization-18 is deprecated
def test_old_opset_forms():
    rng = np.random.default_rng(10)
    x = _rand(rng, (2, 3, 6, 5))
    p = {k: _rand(rng, (3,)) for k in ("s", "b", "m")}
    p["v"] = np.abs(_rand(rng, (3,))) + 0.5
    new = check("BatchNormalization", {"x": x}, p, opset=15, epsilon=1e-3)["y0"]
    old = modelc.from_onnx(_model("BatchNormalization", {"x": x}, p, opset=5, is_test=1,
                                  epsilon=1e-3, consumed_inputs=[0, 0, 0, 1, 1]))
    np.testing.assert_array_equal(reference.run(old, {"x": x})["y0"], new)   # no ORT kernel for 5
    check("BatchNormalization", {"x": x}, p, opset=7, spatial=1, momentum=0.8)
    per_act = {k: _rand(rng, (3, 6, 5)) for k in ("s", "b", "m")}
    per_act["v"] = np.abs(_rand(rng, (3, 6, 5))) + 0.5
    check("BatchNormalization", {"x": x}, per_act, opset=7, spatial=0)
    check("MaxPool", {"x": x}, n_outputs=2, opset=8, kernel_shape=[3, 2], strides=[2, 2])
    check("MaxPool", {"x": x}, opset=10, kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1)
    check("AveragePool", {"x": x}, opset=7, kernel_shape=[3, 3], pads=[1, 1, 1, 1],
          count_include_pad=1)
    check("AveragePool", {"x": x}, opset=10, kernel_shape=[2, 3], strides=[2, 2], ceil_mode=1)
    check("Gemm", {"a": _rand(rng, (4, 3))}, {"b": _rand(rng, (3, 2)), "c": _rand(rng, (2,))},
          opset=9, alpha=2.0)
    check("ReduceMean", {"x": x}, opset=13, axes=[1, 3], keepdims=0)
    check("ReduceSum", {"x": x}, opset=11, axes=[-1])
    g = {"s": _rand(rng, (3,)), "b": _rand(rng, (3,))}          # opset 18: one value per group
    check("GroupNormalization", {"x": np.concatenate([x, x], 1)}, g, num_groups=3, opset=18)
    check("GroupNormalization", {"x": np.concatenate([x, x], 1), **g}, num_groups=3, opset=18)
