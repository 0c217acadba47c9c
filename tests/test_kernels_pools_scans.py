"""Generated kernels (no numpy fallback) for the pool forms and the scans/selections that used to
fall back: N-d MaxPool/AveragePool/LpPool (1-d, 3-d, dilations, ceil_mode, count_include_pad,
auto_pad, large pads, uint8/int8, the Indices output with storage_order), CumSum, Hardmax, TopK and
ReduceLogSumExp. Each is a tiny ONNX model compiled with `modelc.compile` and checked against
onnxruntime (relative to the output scale; NaN/inf positions exactly)."""
import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import modelc
from modelc import reference

TYPES = {np.float32: TensorProto.FLOAT, np.float64: TensorProto.DOUBLE, np.uint8: TensorProto.UINT8,
         np.int8: TensorProto.INT8, np.int32: TensorProto.INT32, np.int64: TensorProto.INT64}


def _model(op, x, attrs, n_out=1, consts=(), opset=19, out_types=None):
    """A one-node model: input x, constant extra inputs `consts`, `n_out` outputs."""
    inits = [numpy_helper.from_array(np.asarray(c), f"c{k}") for k, c in enumerate(consts)]
    node = helper.make_node(op, ["x"] + [f"c{k}" for k in range(len(consts))],
                            [f"y{k}" for k in range(n_out)], **attrs)
    out_types = out_types or [TYPES[x.dtype.type]] * n_out
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TYPES[x.dtype.type], x.shape)],
                              [helper.make_tensor_value_info(f"y{k}", t, None) for k, t in enumerate(out_types)],
                              initializer=inits)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 9
    return m


def check(model, x, tol=1e-6):
    mod = modelc.compile(model.SerializeToString())
    assert not mod.fallbacks, mod.fallbacks
    got = mod.run({"x": x})
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = sess.run(None, {"x": x})
    for k, w in enumerate(want):
        g = got[f"y{k}"]
        assert g.dtype == w.dtype and g.shape == w.shape, (g.dtype, g.shape, w.dtype, w.shape)
        if w.dtype.kind != "f":
            np.testing.assert_array_equal(g, w)
            continue
        np.testing.assert_array_equal(np.isnan(g), np.isnan(w))
        fin = np.isfinite(w)
        np.testing.assert_array_equal(g[~fin & ~np.isnan(w)], w[~fin & ~np.isnan(w)])
        scale = max(float(np.abs(w[fin]).max()) if fin.any() else 1.0, 1e-30)
        assert np.abs(g[fin] - w[fin]).max(initial=0) <= tol * scale


pytestmark = pytest.mark.filterwarnings("ignore:onnx.checker rejects")
rng = np.random.default_rng(0)


def randn(*shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


POOLS = [
    ("MaxPool", (1, 3, 11), {"kernel_shape": [3], "strides": [2], "pads": [1, 1]}),
    ("MaxPool", (1, 2, 5, 6, 7), {"kernel_shape": [2, 3, 2], "dilations": [2, 1, 2], "ceil_mode": 1}),
    ("MaxPool", (2, 3, 7, 7), {"kernel_shape": [3, 3], "auto_pad": "SAME_LOWER", "strides": [2, 2]}),
    ("MaxPool", (1, 2, 6, 6), {"kernel_shape": [2, 2], "pads": [1, 1, 1, 1]}),   # pads = window: Pool2d refuses
    ("MaxPool", (1, 3, 4, 6, 7), {"kernel_shape": [3, 3, 3], "pads": [1] * 6}),    # S3D's
    ("MaxPool", (1, 2, 5, 9, 9), {"kernel_shape": [1, 3, 3], "strides": [1, 2, 2], "pads": [0, 1, 1, 0, 1, 1]}),
    ("AveragePool", (1, 3, 9), {"kernel_shape": [4], "strides": [2], "pads": [2, 1], "count_include_pad": 1}),
    ("AveragePool", (1, 2, 6, 5, 7), {"kernel_shape": [3, 2, 3], "strides": [2, 2, 2], "pads": [1, 0, 1, 1, 1, 0],
                                          "ceil_mode": 1, "count_include_pad": 1}),
    ("AveragePool", (1, 2, 6, 5, 7), {"kernel_shape": [3, 2, 3], "dilations": [2, 2, 1], "ceil_mode": 1}),
    ("AveragePool", (1, 2, 8, 8), {"kernel_shape": [3, 3], "auto_pad": "SAME_UPPER"}),
    ("LpPool", (1, 3, 12), {"kernel_shape": [3], "strides": [2], "p": 2}),
    ("LpPool", (1, 2, 7, 8), {"kernel_shape": [3, 2], "pads": [1, 0, 1, 1], "dilations": [2, 1], "p": 3}),
    ("LpPool", (1, 2, 4, 5, 6), {"kernel_shape": [2, 2, 2], "auto_pad": "SAME_UPPER", "p": 1}),
]


@pytest.mark.parametrize("op,shape,attrs", POOLS, ids=[f"{p[0]}-{len(p[1]) - 2}d-{k}" for k, p in enumerate(POOLS)])
def test_pool_forms(op, shape, attrs):
    x = randn(*shape)
    opset = 18 if op == "LpPool" else 19
    check(_model(op, x, attrs, opset=opset), x)


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
def test_maxpool_int(dtype):
    x = rng.integers(np.iinfo(dtype).min, np.iinfo(dtype).max, (1, 2, 6, 7)).astype(dtype)
    check(_model("MaxPool", x, {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "strides": [2, 1]}), x)


@pytest.mark.parametrize("storage_order", [0, 1])
def test_maxpool_indices(storage_order):
    x = randn(2, 3, 6, 7)
    x[0, 0, :2, :2] = 1.0              # ties: the first tap (row-major) wins
    m = _model("MaxPool", x, {"kernel_shape": [3, 2], "strides": [2, 2], "pads": [1, 0, 1, 1],
                                  "storage_order": storage_order},
               n_out=2, out_types=[TensorProto.FLOAT, TensorProto.INT64])
    check(m, x)


def test_maxpool_nan_wins_as_in_the_reference():
    """A NaN in a window makes its max NaN (numpy's maximum, the reference), wherever it is."""
    x = randn(1, 2, 3, 5, 6)
    x[0, 0, 1, 2, 3] = np.nan
    x[0, 1, 0, 0, 0] = np.nan
    m = _model("MaxPool", x, {"kernel_shape": [2, 2, 2], "pads": [0, 1, 0, 1, 0, 1]})
    mod = modelc.compile(m)
    assert not mod.fallbacks
    want = modelc.reference.run(modelc.from_onnx(m), {"x": x})
    got = mod.run({"x": x})
    for k in want:
        np.testing.assert_array_equal(np.isnan(got[k]), np.isnan(want[k]))
        np.testing.assert_array_equal(got[k][~np.isnan(want[k])], want[k][~np.isnan(want[k])])


@pytest.mark.parametrize("shape,attrs", [
    ((1, 2, 3, 6, 7), {"kernel_shape": [1, 3, 2], "pads": [1, 1, 0, 1, 0, 1], "strides": [1, 2, 1]}),
    ((1, 2, 3, 4, 5, 6), {"kernel_shape": [2, 2, 3, 2], "pads": [1, 0, 1, 0, 0, 1, 1, 0]}),
    ((1, 2, 5, 4, 9), {"kernel_shape": [3, 2, 3], "strides": [2, 1, 3], "dilations": [2, 2, 2], "ceil_mode": 1}),
    ((1, 1, 2, 200, 200), {"kernel_shape": [2, 3, 3]})], ids=["frames-in-padding", "4d", "strided", "large-plane"])
def test_maxpool_by_planes_is_the_reference_exactly(shape, attrs):
    """3-d (and 4-d) max pools take each axis's taps in turn: whole frames, then rows, then columns.
    Frames all in the padding (onnxruntime refuses pads as wide as the window, the reference takes
    them: -inf), a 4-d window (onnxruntime has none), and a plane too large for the stack (by rows)."""
    from modelc.kernels import pool_nd
    x = randn(*shape)
    x[0, 0].flat[7] = np.nan
    m = _model("MaxPool", x, attrs)
    mod = modelc.compile(m)
    assert not mod.fallbacks
    assert [p["template"] for p in mod.profile(repeat=1, feeds={"x": x})] == ["pool_nd"]
    assert pool_nd._separable(_wl("MaxPool", shape, attrs)) == (shape[-1] < 200)
    want = reference.run(modelc.from_onnx(m), {"x": x})["y0"]
    np.testing.assert_array_equal(mod.run({"x": x})["y0"], want)


def test_pool_float64_and_inf():
    x = randn(1, 2, 9, dtype=np.float64)
    x[0, 0, 3] = np.inf
    x[0, 1, :] = -np.inf
    check(_model("MaxPool", x, {"kernel_shape": [2], "strides": [2], "ceil_mode": 1}), x)
    x32 = x.astype(np.float32)                          # onnxruntime has no float64 AveragePool
    check(_model("AveragePool", x32, {"kernel_shape": [3], "pads": [1, 1]}), x32)


@pytest.mark.parametrize("op,shape,axis,exclusive,reverse", [
    ("CumSum", (7,), 0, 0, 0), ("CumSum", (7,), 0, 1, 1), ("CumSum", (3, 5, 4), 1, 1, 0),
    ("CumSum", (3, 5, 4), -1, 0, 1), ("CumSum", (4, 6), 0, 1, 1),
    ("CumProd", (3, 5, 4), 1, 1, 1)])
def test_cumsum(op, shape, axis, exclusive, reverse):
    x = randn(*shape)
    if op == "CumProd":            # factors near one: products of a few dozen stay in range
        x = (1 + 0.2 * x).astype(np.float32)
    check(_model(op, x, {"exclusive": exclusive, "reverse": reverse}, consts=[np.int64(axis)],
                 opset=26 if op == "CumProd" else 19), x)


def test_cumsum_int():
    x = rng.integers(-50, 50, (3, 8)).astype(np.int32)
    check(_model("CumSum", x, {"exclusive": 1}, consts=[np.int32(1)]), x)


def test_cumprod_int_wraps_as_onnxruntime():
    """int32 products past 2**31 wrap around (the kernel multiplies in int64 and keeps the low bits)."""
    x = rng.integers(-1000, 1000, (3, 8)).astype(np.int32)
    check(_model("CumProd", x, {"reverse": 1}, consts=[np.int32(1)], opset=26), x)


@pytest.mark.parametrize("shape,axis", [((4, 6), -1), ((3, 4, 5), 1), ((3, 4, 5), 0)])
def test_hardmax(shape, axis):
    x = rng.integers(0, 3, shape).astype(np.float32)        # many ties: the first index wins
    check(_model("Hardmax", x, {"axis": axis}), x)


@pytest.mark.parametrize("shape,k,axis,largest", [
    ((3, 10), 3, -1, 1), ((3, 10), 4, 1, 0), ((4, 7, 3), 2, 1, 1), ((4, 7, 3), 7, 1, 0), ((5, 4), 1, 0, 1)])
def test_topk(shape, k, axis, largest):
    x = rng.integers(0, 4, shape).astype(np.float32)        # ties: the lower index first
    m = _model("TopK", x, {"axis": axis, "largest": largest}, n_out=2, consts=[np.array([k], np.int64)],
               out_types=[TensorProto.FLOAT, TensorProto.INT64])
    check(m, x)


def test_topk_int():
    x = rng.integers(-9, 9, (2, 12)).astype(np.int32)
    m = _model("TopK", x, {}, n_out=2, consts=[np.array([5], np.int64)],
               out_types=[TensorProto.INT32, TensorProto.INT64])
    check(m, x)


@pytest.mark.parametrize("shape,axes,keepdims", [
    ((3, 4, 5), [1], 1), ((3, 4, 5), [0, 2], 0), ((3, 4, 5), None, 1), ((3, 4, 5), [-1], 0)])
def test_reduce_logsumexp(shape, axes, keepdims):
    x = (randn(*shape) * 20).astype(np.float32)              # large values: exp would overflow
    x[0, 0, :] = -np.inf                                     # an all -inf row
    x[1, 1, 1] = np.inf
    consts = [] if axes is None else [np.array(axes, np.int64)]
    check(_model("ReduceLogSumExp", x, {"keepdims": keepdims}, consts=consts), x)


# ---- every template with a few configs of its space, against the reference executor ---------

def _wl(op, shape, attrs, params=(), outputs=None, dtype="float32"):
    from modelc.kernels.workload import Workload
    ps = {f"p{k}": {"dtype": np.asarray(v).dtype.name, "shape": list(np.shape(v)),
                    "value": np.asarray(v).tolist()} for k, v in enumerate(params)}
    wl = {"version": 1, "inputs": [{"shape": list(shape), "dtype": dtype, "const": False}],
          "ops": [{"op": op, "attrs": attrs, "args": ["i0"] + list(ps)}], "params": ps, "outputs": []}
    g = Workload({**wl, "outputs": [{"shape": [1], "dtype": dtype, "value": v} for v in (outputs or ["v0"])]})
    specs = g.value_specs()
    wl["outputs"] = [{"shape": list(specs[v].shape), "dtype": specs[v].dtype.name, "value": v}
                     for v in (outputs or ["v0"])]
    return Workload(wl)


CONFIG_CASES = [
    ("pool_nd", ("MaxPool", (2, 3, 5, 6, 4), {"kernel_shape": [2, 3, 2], "pads": [1, 1, 0, 0, 1, 1]},
                 (), ["v0.0", "v0.1"])),
    ("pool_nd", ("AveragePool", (2, 3, 9), {"kernel_shape": [3], "strides": [2], "ceil_mode": 1}, (), None)),
    ("pool_nd", ("LpPool", (2, 3, 9), {"kernel_shape": [3], "p": 3}, (), None)),
    ("cumsum", ("CumSum", (3, 7, 5), {"reverse": 1}, (np.int64(1),), None)),
    ("hardmax", ("Hardmax", (3, 7, 5), {"axis": 1}, (), None)),
    ("topk", ("TopK", (3, 9, 5), {"axis": 1, "largest": 0}, (np.array([4], np.int64),), ["v0.0", "v0.1"])),
    ("logsumexp", ("ReduceLogSumExp", (3, 7, 5), {"keepdims": 0}, (np.array([0, 2], np.int64),), None)),
]


@pytest.mark.parametrize("name,case", CONFIG_CASES, ids=[f"{c[0]}-{c[1][0]}-{k}" for k, c in enumerate(CONFIG_CASES)])
def test_configs_against_reference(name, case):
    from modelc.kernels import template, templates, testing  # noqa: F401  (registers templates)
    wl = _wl(*case)
    t = template.get(name)
    assert t.matches(wl) and template.select(wl) is t
    space = t.space(wl)
    for i in sorted({0, len(space) // 2, len(space) - 1}):
        got, want, _, _ = testing.run(wl, t, space.get(i))
        assert testing.max_rel_error(got, want) <= 1e-6, space.get(i)
