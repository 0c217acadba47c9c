"""Generated kernels for the elementwise ops and ArgMax/ArgMin that used to run on the numpy
fallback: each op is a tiny model compiled end to end (no fallback group), its values checked
against onnxruntime (or, where onnxruntime has no kernel or no defined answer, the reference
executor and ONNX's own conformance cases), special values included."""
import numpy as np
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

import modelc

F32 = np.float32
NAN, INF = np.nan, np.inf
SPECIAL = [NAN, INF, -INF, 0.0, -0.0, 1e-30, 0.5, -0.5, 1.5, -1.5, 2.5, -2.5, 1.0, -1.0]


def _model(op, ins, attrs=None, out_dtype=None, opset=18, consts=()):
    """A one-node model: `ins` (name -> array) are graph inputs, so they reach the kernel at run
    time (constants would be folded away), `consts` initializers."""
    vi = helper.make_tensor_value_info
    tt = helper.np_dtype_to_tensor_dtype
    out_dtype = np.dtype(out_dtype or next(iter(ins.values())).dtype)
    node = helper.make_node(op, list(ins) + [n for n, _ in consts], ["y"], **(attrs or {}))
    g = helper.make_graph([node], "g", [vi(k, tt(v.dtype), v.shape) for k, v in ins.items()],
                          [vi("y", tt(out_dtype), None)],
                          [numpy_helper.from_array(np.asarray(v), n) for n, v in consts])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def _chain(nodes, ins, out_dtype, inits=(), opset=18):
    vi = helper.make_tensor_value_info
    tt = helper.np_dtype_to_tensor_dtype
    g = helper.make_graph(nodes, "g", [vi(k, tt(v.dtype), v.shape) for k, v in ins.items()],
                          [vi("y", tt(np.dtype(out_dtype)), None)],
                          [numpy_helper.from_array(np.asarray(v), n) for n, v in inits])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def _ort(m, feeds):
    s = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    return s.run(None, feeds)[0]


def _reference(m, feeds):
    return modelc.reference.run(modelc.from_onnx(m), feeds)["y"]


def assert_same(got, want, rtol=2e-6):
    """Integers and booleans exactly; floats: NaN and +-inf at the same positions, finite values
    within `rtol` of the output's scale (float32 rounding, not more)."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, got.dtype, want.shape, want.dtype)
    if want.dtype.kind != "f":
        np.testing.assert_array_equal(got, want)
        return
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg="NaN positions")
    inf = np.isinf(want)
    np.testing.assert_array_equal(np.isinf(got), inf, err_msg="inf positions")
    np.testing.assert_array_equal(got[inf], want[inf])
    fin = np.isfinite(want)
    if fin.any():
        scale = max(float(np.abs(want[fin]).max()), 1e-30)
        err = float(np.abs(got[fin].astype(np.float64) - want[fin]).max())
        assert err <= rtol * scale, f"max error {err:.3g} for output scale {scale:.3g}"


def _compile_run(m, feeds):
    mod = modelc.compile(m)
    assert not mod.fallbacks, mod.fallback_reasons
    return mod.run(feeds)["y"]


def _floats(lo, hi, n=40, seed=0, dtype=F32, special=True):
    x = np.random.default_rng(seed).uniform(lo, hi, n)
    if special:
        x = np.concatenate([SPECIAL, x])
    return x.astype(dtype).reshape(-1, 2 if x.size % 2 == 0 else 1)


# ---- float unary ops, against onnxruntime ------------------------------------------------------

UNARY = {
    "Tan": ((-1.5, 1.5), {}), "Asin": ((-1.0, 1.0), {}), "Acos": ((-1.0, 1.0), {}),
    "Atan": ((-50, 50), {}), "Sinh": ((-9, 9), {}), "Cosh": ((-9, 9), {}),
    "Asinh": ((-1e3, 1e3), {}), "Acosh": ((1, 1e3), {}), "Atanh": ((-1.0, 1.0), {}),
    "Round": ((-6, 6), {}), "Erf": ((-3, 3), {}),
    "Celu": ((-6, 6), {"alpha": 1.5}), "ThresholdedRelu": ((-3, 3), {"alpha": 0.7}),
    "HardSigmoid": ((-5, 5), {"alpha": 0.3, "beta": 0.4}),
    "Shrink": ((-3, 3), {"lambd": 0.8, "bias": 0.3}),
}


@pytest.mark.parametrize("op", sorted(UNARY))
def test_float_unary_op_matches_onnxruntime(op):
    (lo, hi), attrs = UNARY[op]
    x = _floats(lo, hi)
    if op in ("Sinh", "Cosh"):
        x[-1] = [100.0, -100.0]                  # overflow to +-inf in float32
    if op == "Round":
        x[-1] = [0.49999997, -0.49999997]        # not rounded up by a + 0.5
    m = _model(op, {"x": x}, attrs)
    assert_same(_compile_run(m, {"x": x}), _ort(m, {"x": x}))


@pytest.mark.parametrize("op", ["Atanh", "Round", "Sinh", "Acos"])
def test_float64_unary_op_matches_reference(op):
    """float64 against numpy's functions (onnxruntime has no float64 kernel for most of these)."""
    (lo, hi), attrs = UNARY[op]
    x = _floats(lo, hi, dtype=np.float64)
    m = _model(op, {"x": x}, attrs)
    assert_same(_compile_run(m, {"x": x}), _reference(m, {"x": x}), rtol=1e-12)


def test_round_is_half_to_even():
    x = np.array([-3.5, -2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 3.5, 8388607.5, -0.4], F32)
    got = _compile_run(_model("Round", {"x": x}), {"x": x})
    np.testing.assert_array_equal(got, [-4, -2, -2, -0.0, 0, 2, 2, 4, 8388608, -0.0])


# ---- IsNaN / IsInf ------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [F32, np.float64])
@pytest.mark.parametrize("op,attrs", [("IsNaN", {}), ("IsInf", {}), ("IsInf", {"detect_positive": 0}),
                                      ("IsInf", {"detect_negative": 0})])
def test_isnan_isinf_match_onnxruntime(op, attrs, dtype):
    x = np.array([NAN, -NAN, INF, -INF, 0.0, -0.0, 1.0, np.finfo(dtype).max, -np.finfo(dtype).max,
                  np.finfo(dtype).tiny, 5e-324 if dtype == np.float64 else 1e-45, 3.0], dtype)
    m = _model(op, {"x": x}, attrs, out_dtype=bool, opset=20)
    assert_same(_compile_run(m, {"x": x}), _ort(m, {"x": x}))


@pytest.mark.parametrize("nodes,out", [
    # NaN and inf made inside the kernel, where fast-math could otherwise assume them away
    ([helper.make_node("Sub", ["x", "x"], ["d"]), helper.make_node("IsNaN", ["d"], ["y"])], bool),
    ([helper.make_node("Sqrt", ["x"], ["d"]), helper.make_node("IsNaN", ["d"], ["y"])], bool),
    ([helper.make_node("Mul", ["x", "big"], ["d"]), helper.make_node("IsInf", ["d"], ["y"])], bool),
    ([helper.make_node("Mul", ["x", "big"], ["d"]), helper.make_node("IsNaN", ["d"], ["n"]),
      helper.make_node("IsInf", ["d"], ["i"], detect_negative=0), helper.make_node("Or", ["n", "i"], ["y"])], bool),
])
def test_isnan_isinf_of_values_computed_in_the_kernel(nodes, out):
    x = np.array([[NAN, INF, -INF, 0.0, -2.0, 3e30, -3e30, 1.0]], F32)
    m = _chain(nodes, {"x": x}, out, [("big", np.float32(1e10))])
    assert_same(_compile_run(m, {"x": x}), _ort(m, {"x": x}))


# ---- Mod ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [F32, np.float64])
@pytest.mark.parametrize("fmod", [0, 1])
def test_float_mod_special_values_and_signed_zeros(dtype, fmod):
    """fmod=1 against onnxruntime; fmod=0 (which ONNX reserves for integers and onnxruntime
    refuses for floats) against numpy's mod; zeros keep the sign numpy gives them."""
    a = np.array([0.0, -0.0, 0.0, -0.0, -3.0, 3.0, -1.0, 1.0, INF, -INF, 1.0, 1.0, NAN, 1.0,
                  5.5, -5.5, 5.5, -5.5, 6.0, -6.0, 1e30, -7.25], dtype)
    b = np.array([-2.0, 2.0, 2.0, -2.0, INF, INF, -INF, -INF, 2.0, 2.0, 0.0, -0.0, 2.0, NAN,
                  2.0, 2.0, -2.0, -2.0, -3.0, 3.0, 3.0, 0.5], dtype)
    m = _model("Mod", {"a": a, "b": b}, {"fmod": fmod})
    with np.errstate(all="ignore"):
        want = np.fmod(a, b) if fmod else np.mod(a, b)
    got = _compile_run(m, {"a": a, "b": b})
    assert_same(got, want, rtol=0)
    fin = np.isfinite(want)
    np.testing.assert_array_equal(np.signbit(got[fin]), np.signbit(want[fin]), err_msg="signed zeros")
    if fmod:
        assert_same(got, _ort(m, {"a": a, "b": b}), rtol=0)


INT_TYPES = [np.int8, np.int32, np.int64, np.uint8, np.uint64]


def _ints(dtype, n, seed):
    info = np.iinfo(dtype)
    rng = np.random.default_rng(seed)
    x = rng.integers(info.min, info.max, n, dtype=dtype, endpoint=True)
    small = rng.integers(max(info.min, -20), 20, n).astype(dtype)
    return np.concatenate([x, small, np.array([info.min, info.max, 0, 1], dtype)])


@pytest.mark.parametrize("dtype", INT_TYPES)
@pytest.mark.parametrize("fmod", [0, 1])
def test_integer_mod_matches_onnxruntime(dtype, fmod):
    """Python's sign (the divisor's) for fmod=0, C's (the dividend's) for fmod=1; large values,
    negative divisors, no zero divisor (onnxruntime's integer division by zero traps)."""
    a = _ints(dtype, 24, 1)
    b = _ints(dtype, 24, 2)
    b[b == 0] = 7
    if np.dtype(dtype).kind == "i":
        b[(a == np.iinfo(dtype).min) & (b == -1)] = 3          # INT_MIN % -1 traps in C
        b[:6] = [3, -3, 3, -3, -7, 5]
        a[:6] = [7, 7, -7, -7, 20, -20]
    m = _model("Mod", {"a": a, "b": b}, {"fmod": fmod})
    got = _compile_run(m, {"a": a, "b": b})
    assert_same(got, _ort(m, {"a": a, "b": b}))
    with np.errstate(all="ignore"):
        assert_same(got, np.fmod(a, b) if fmod else np.mod(a, b))


def test_integer_mod_by_zero_and_int_min_by_minus_one_give_numpy_values():
    """Cases onnxruntime leaves undefined (a hardware trap in C): the kernel gives numpy's 0 and
    never a trap."""
    a = np.array([7, -7, 0, np.iinfo(np.int64).min, np.iinfo(np.int64).min], np.int64)
    b = np.array([0, 0, 0, -1, 0], np.int64)
    for fmod in (0, 1):
        m = _model("Mod", {"a": a, "b": b}, {"fmod": fmod})
        assert_same(_compile_run(m, {"a": a, "b": b}), _reference(m, {"a": a, "b": b}))
        assert_same(_compile_run(m, {"a": a, "b": b}), np.zeros(5, np.int64))


def test_mod_broadcast_with_a_scalar_divisor_constant():
    a = _floats(-20, 20, special=False)
    m = _model("Mod", {"a": a}, {"fmod": 1}, consts=[("b", np.float32(-2.5))])
    assert_same(_compile_run(m, {"a": a}), _ort(m, {"a": a}), rtol=0)


# ---- bitwise, shifts, logic ---------------------------------------------------------------------

@pytest.mark.parametrize("op", ["BitwiseAnd", "BitwiseOr", "BitwiseXor"])
@pytest.mark.parametrize("dtype", [np.int8, np.int64, np.uint16, np.uint64])
def test_bitwise_binary_matches_onnxruntime(op, dtype):
    a = _ints(dtype, 20, 3).reshape(4, 11)
    b = _ints(dtype, 5, 4)[:11]                             # broadcast along the rows
    m = _model(op, {"a": a, "b": b})
    assert_same(_compile_run(m, {"a": a, "b": b}), _ort(m, {"a": a, "b": b}))


@pytest.mark.parametrize("dtype", [np.int8, np.int64, np.uint8, np.uint64])
def test_bitwise_not_matches_onnxruntime(dtype):
    x = _ints(dtype, 20, 5)
    m = _model("BitwiseNot", {"x": x})
    assert_same(_compile_run(m, {"x": x}), _ort(m, {"x": x}))


@pytest.mark.parametrize("direction", ["LEFT", "RIGHT"])
@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.uint32, np.uint64])
def test_bitshift_unsigned_matches_onnxruntime(direction, dtype):
    bits = np.dtype(dtype).itemsize * 8
    x = _ints(dtype, 24, 6)
    s = (np.arange(x.size) % bits).astype(dtype)
    m = _model("BitShift", {"x": x, "s": s}, {"direction": direction}, opset=11)
    assert_same(_compile_run(m, {"x": x, "s": s}), _ort(m, {"x": x, "s": s}))


@pytest.mark.parametrize("direction", ["LEFT", "RIGHT"])
@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64, np.uint8])
def test_bitshift_out_of_range_shifts_follow_onnx(direction, dtype):
    """Opset 28: signed types shift arithmetically; a shift that is negative or >= the width
    gives 0, or -1 for a right shift of a negative value (not LLVM's poison)."""
    bits = np.dtype(dtype).itemsize * 8
    signed = np.dtype(dtype).kind == "i"
    x = np.array([1, 5, 100, -1, -100, 3, -3, 7] if signed else [1, 5, 100, 255, 3, 7, 9, 11]).astype(dtype)
    s = np.array([1, bits - 1, bits, bits + 5, 2, -1 if signed else 0, bits, 3], dtype)
    m = _model("BitShift", {"x": x, "s": s}, {"direction": direction}, opset=28 if signed else 11)
    got = _compile_run(m, {"x": x, "s": s})
    assert_same(got, _reference(m, {"x": x, "s": s}))
    spill = np.where((x < 0) & (direction == "RIGHT"), -1, 0) if signed else 0
    out = (s < 0) | (s >= bits)
    np.testing.assert_array_equal(got[out], np.broadcast_to(spill, x.shape)[out].astype(dtype))


def test_xor_broadcast_matches_onnxruntime():
    rng = np.random.default_rng(7)
    a = rng.integers(0, 2, (3, 4, 5)).astype(bool)
    b = rng.integers(0, 2, (4, 1)).astype(bool)
    m = _model("Xor", {"a": a, "b": b})
    assert_same(_compile_run(m, {"a": a, "b": b}), _ort(m, {"a": a, "b": b}))


@pytest.mark.parametrize("op", ["Neg", "Abs", "Sign"])
@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64])
def test_integer_neg_abs_sign_wrap_like_onnxruntime(op, dtype):
    x = _ints(dtype, 20, 8)
    m = _model(op, {"x": x})
    assert_same(_compile_run(m, {"x": x}), _ort(m, {"x": x}))


def test_integer_neg_wraps_inside_a_fused_chain():
    """-(-128) is -128 in int8 for the next op too, not 128 (numba computes in int64)."""
    x = np.array([-128, -5, 0, 5, 127], np.int8)
    nodes = [helper.make_node("Neg", ["x"], ["n"]), helper.make_node("Less", ["n", "z"], ["y"])]
    m = _chain(nodes, {"x": x}, bool, [("z", np.int8(0))])
    assert_same(_compile_run(m, {"x": x}), _ort(m, {"x": x}))


@pytest.mark.parametrize("dtype", [np.int32, np.uint8])
def test_integer_shrink_matches_reference(dtype):
    x = _ints(dtype, 20, 9)
    m = _model("Shrink", {"x": x}, {"lambd": 1.5, "bias": 1.5})
    assert_same(_compile_run(m, {"x": x}), _reference(m, {"x": x}))


def test_castlike_matches_onnxruntime():
    x = _floats(-100, 100, special=False)
    t = np.zeros(1, np.int32)
    m = _model("CastLike", {"x": x, "t": t}, out_dtype=np.int32)
    assert_same(_compile_run(m, {"x": x, "t": t}), _ort(m, {"x": x, "t": t}))


# ---- in fused groups: conv and reduction epilogues -----------------------------------------------

def test_new_ops_in_a_conv_epilogue():
    rng = np.random.default_rng(10)
    x = rng.standard_normal((1, 3, 9, 9)).astype(F32)
    w = rng.standard_normal((16, 3, 3, 3)).astype(F32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Celu", ["c"], ["e"], alpha=0.5),
             helper.make_node("Atan", ["e"], ["y"])]
    m = _chain(nodes, {"x": x}, F32, [("w", w)])
    assert_same(_compile_run(m, {"x": x}), _ort(m, {"x": x}), rtol=1e-5)


def test_isinf_in_a_reduce_epilogue():
    x = _floats(-3, 3, special=False).reshape(4, -1)
    x[1, 2], x[3, 0] = INF, -INF
    nodes = [helper.make_node("ReduceMax", ["x"], ["r"], keepdims=0),
             helper.make_node("IsInf", ["r"], ["y"])]
    m = _chain(nodes, {"x": x}, bool, opset=20)
    assert_same(_compile_run(m, {"x": x}), _ort(m, {"x": x}))


# ---- ArgMax / ArgMin ----------------------------------------------------------------------------

ARG_CASES = [((6, 37), -1), ((70, 5), 0), ((5, 70), 0), ((3, 4, 70), 1), ((2, 3, 4), 2), ((8,), 0),
             ((3, 1, 4), 1)]


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("shape,axis", ARG_CASES)
def test_argmax_argmin_match_onnxruntime(op, shape, axis):
    """Rows and columns (a block of 64 lanes and a tail), keepdims, select_last_index; ties from
    small integers stored as floats."""
    x = np.random.default_rng(11).integers(-3, 4, shape).astype(F32)
    for keepdims, last in ((1, 0), (0, 1)):
        m = _model(op, {"x": x}, {"axis": axis, "keepdims": keepdims, "select_last_index": last},
                   out_dtype=np.int64, opset=13)
        assert_same(_compile_run(m, {"x": x}), _ort(m, {"x": x}))


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint8, np.float64])
def test_argmax_other_dtypes(dtype):
    x = _ints(np.int8, 30, 12).reshape(4, 16).astype(dtype)
    for op in ("ArgMax", "ArgMin"):
        m = _model(op, {"x": x}, {"axis": 1, "keepdims": 0}, out_dtype=np.int64, opset=13)
        assert_same(_compile_run(m, {"x": x}), _ort(m, {"x": x}))


@pytest.mark.parametrize("axis", [0, 1])
def test_argmax_with_nan_and_inf_follows_numpy(axis):
    """NaN is the extreme of both, as numpy (the reference) has it (onnxruntime compares plainly
    and its answer depends on where the NaN is)."""
    x = np.array([[1, NAN, 3, NAN, 0], [NAN, 1, 2, 2, 1], [1, 2, 2, 1, NAN], [INF, -INF, INF, -INF, 0]], F32)
    for op in ("ArgMax", "ArgMin"):
        for last in (0, 1):
            m = _model(op, {"x": x}, {"axis": axis, "keepdims": 0, "select_last_index": last},
                       out_dtype=np.int64, opset=13)
            assert_same(_compile_run(m, {"x": x}), _reference(m, {"x": x}))


def test_argmax_with_an_epilogue():
    x = np.random.default_rng(13).standard_normal((5, 9, 7)).astype(F32)
    nodes = [helper.make_node("ArgMax", ["x"], ["a"], axis=1, keepdims=0),
             helper.make_node("Cast", ["a"], ["c"], to=1),
             helper.make_node("Mul", ["c", "k"], ["y"])]
    m = _chain(nodes, {"x": x}, F32, [("k", np.float32(0.5))])
    assert_same(_compile_run(m, {"x": x}), _ort(m, {"x": x}))


# ---- ONNX's conformance cases -------------------------------------------------------------------

# a sample (all of these ops' cases, float16/bfloat16 aside, passed when this was written)
CONFORMANCE = ("test_mod_float_edge_cases_fmod_0_float32", "test_mod_int64_fmod", "test_mod_mixed_sign_int8",
               "test_bitshift_right_int8_negative_input", "test_bitshift_left_int32_overflow",
               "test_bitshift_right_int8_shift_ge_width", "test_bitwise_and_ui8_bcast_4v3d",
               "test_isinf_negative", "test_round", "test_shrink_soft", "test_acosh",
               "test_argmax_negative_axis_keepdims_random_select_last_index", "test_xor_bcast4v4d")


def test_onnx_conformance_cases_compile_without_fallback():
    from onnx.backend.test.case.node import collect_testcases
    # every case (~8 s): collect_testcases(op) fills one process-wide list once, so a filtered
    # call would see only the first filter's cases
    cases = {c.name: c for c in collect_testcases() if c.name in CONFORMANCE}
    assert len(cases) == len(CONFORMANCE)
    for name, case in sorted(cases.items()):
        m = case.model
        for inputs, outputs in case.data_sets:
            feeds = {i.name: v for i, v in zip(m.graph.input, inputs)}
            mod = modelc.compile(m)
            assert not mod.fallbacks, (name, mod.fallback_reasons)
            got = mod.run(feeds)
            for o, want in zip(m.graph.output, outputs):
                assert_same(got[o.name], np.asarray(want), rtol=1e-6)


# ---- BatchNormalization whose statistics are inputs (not folded) ---------------------------------

@pytest.mark.parametrize("shape,after_conv", [((2, 4, 5, 5), True), ((3, 6), False), ((2, 1, 7), False)])
def test_batchnorm_with_runtime_statistics(shape, after_conv):
    """Constant statistics fold into a Mul + Add; these come from the graph's inputs: an injective
    group of its own (a conv before it keeps its epilogue kernel), with the ops after it."""
    rng = np.random.default_rng(14)
    c = shape[1]
    x = rng.standard_normal(shape).astype(F32)
    mean = rng.standard_normal(c).astype(F32)
    var = rng.uniform(0.5, 2.0, c).astype(F32)
    inits = [("s", rng.standard_normal(c).astype(F32)), ("b", rng.standard_normal(c).astype(F32))]
    nodes = [helper.make_node("BatchNormalization", ["h" if after_conv else "x", "s", "b", "mean", "var"], ["n"],
                              epsilon=1e-3),
             helper.make_node("Relu", ["n"], ["y"])]
    if after_conv:
        nodes.insert(0, helper.make_node("Conv", ["x", "w"], ["h"], pads=[1, 1, 1, 1]))
        inits.append(("w", rng.standard_normal((c, c, 3, 3)).astype(F32)))
    m = _chain(nodes, {"x": x, "mean": mean, "var": var}, F32, inits, opset=15)
    feeds = {"x": x, "mean": mean, "var": var}
    assert_same(_compile_run(m, feeds), _ort(m, feeds), rtol=1e-5)


@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64, np.uint64])
def test_integer_div_is_exact_and_truncates(dtype):
    """Integer Div in integers, toward zero: through float64 int64 quotients beyond 2^53 lost
    their low digits (in the kernel and the reference alike)."""
    a = _ints(dtype, 30, 15)
    b = _ints(dtype, 30, 16)
    b[b == 0] = 3
    if np.dtype(dtype).kind == "i":
        b[(a == np.iinfo(dtype).min) & (b == -1)] = 3
        a[:4], b[:4] = [-7, 7, -7, 7], [2, -2, -2, 2]
    m = _model("Div", {"a": a, "b": b}, opset=14)
    got = _compile_run(m, {"a": a, "b": b})
    assert_same(got, _ort(m, {"a": a, "b": b}))
    assert_same(_reference(m, {"a": a, "b": b}), got)


@pytest.mark.parametrize("anchor", ["MatMul", "AveragePool", "Conv"])
def test_an_epilogue_that_changes_the_dtype_starts_its_own_group(anchor):
    """MatMul -> IsInf and AveragePool -> Sqrt -> IsNaN ran on the fallback (the dense and pool
    templates store the anchor's dtype): the dtype-changing op is now an injective group."""
    rng = np.random.default_rng(17)
    x = (rng.standard_normal((1, 4, 6, 6)) * 3).astype(F32)
    inits = [("big", np.float32(1e37))]
    if anchor == "MatMul":
        nodes = [helper.make_node("MatMul", ["x", "w"], ["a"])]
        inits.append(("w", rng.standard_normal((6, 8)).astype(F32)))
    elif anchor == "AveragePool":
        nodes = [helper.make_node("AveragePool", ["x"], ["a"], kernel_shape=[2, 2])]
    else:
        nodes = [helper.make_node("Conv", ["x", "w"], ["a"], pads=[1, 1, 1, 1])]
        inits.append(("w", rng.standard_normal((8, 4, 3, 3)).astype(F32)))
    nodes += [helper.make_node("Mul", ["a", "big"], ["b"]), helper.make_node("IsInf", ["b"], ["i"]),
              helper.make_node("Sqrt", ["a"], ["s"]), helper.make_node("IsNaN", ["s"], ["n"]),
              helper.make_node("Or", ["i", "n"], ["y"])]
    m = _chain(nodes, {"x": x}, bool, inits, opset=20)
    assert_same(_compile_run(m, {"x": x}), _ort(m, {"x": x}))
