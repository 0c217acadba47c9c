"""float16 models on generated kernels: te kernels load and store float16 bits and compute in
float32 (kernels/intrinsics.h2f). The conversions against numpy's on every bit pattern; a float16
CNN (blocked layout with halos, convs, pools, dense) against onnxruntime with no numpy fallback."""
from __future__ import annotations

import ctypes

import numba
import numpy as np
import onnxruntime as ort
import pytest
from numba import carray, types
from onnx import TensorProto, helper, numpy_helper

import modelc
from modelc import target
from modelc.kernels.intrinsics import f2h, h2f, r16

pytestmark = pytest.mark.skipif(not target.current().converts_half, reason="the CPU does not convert float16")


@numba.cfunc(types.void(types.CPointer(types.uint16), types.CPointer(types.float32),
                        types.CPointer(types.uint16), types.CPointer(types.float32), types.intp))
def _convert(h, f, back, rounded, n):
    hs, fs, bs, rs = carray(h, n), carray(f, n), carray(back, n), carray(rounded, n)
    for i in range(n):
        fs[i] = h2f(hs[i])          # every float16 to float32
        bs[i] = f2h(rs[i])          # float32 to float16 bits
        rs[i] = r16(rs[i])          # float32 rounded to a float16 value


def _run(bits, values):
    n = bits.size
    f, back, rounded = np.empty(n, np.float32), np.empty(n, np.uint16), values.astype(np.float32).copy()
    fn = ctypes.CFUNCTYPE(None, *[ctypes.c_void_p] * 4, ctypes.c_ssize_t)(_convert.address)
    fn(bits.ctypes.data, f.ctypes.data, back.ctypes.data, rounded.ctypes.data, n)
    return f, back, rounded


def test_conversions_match_numpy_on_every_float16_and_at_rounding_ties():
    bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    halves = bits.view(np.float16)
    rng = np.random.default_rng(0)
    # float32 values: random over float16's range and beyond, exact halfway points between
    # neighbouring float16 values (ties to even), subnormals, overflow, signed zeros, inf, NaN
    h32 = halves[np.isfinite(halves)].astype(np.float32)
    mids = ((h32[:-1].astype(np.float64) + h32[1:]) / 2).astype(np.float32)
    values = np.concatenate([rng.standard_normal(20000).astype(np.float32) * 10.0 ** rng.integers(-8, 6, 20000),
                             mids, [6e-8, 3e-8, -2.9e-8, 65519.0, 65520.0, 1e6, -0.0, 0.0, np.inf, -np.inf, np.nan]])
    values = np.resize(values.astype(np.float32), bits.size)
    f, back, rounded = _run(bits, values)
    want = halves.astype(np.float32)
    nan = np.isnan(want)
    assert (np.isnan(f) == nan).all() and (f[~nan].view(np.uint32) == want[~nan].view(np.uint32)).all()
    with np.errstate(over="ignore"):
        want16 = values.astype(np.float16)
    nan = np.isnan(want16)
    assert (np.isnan(back.view(np.float16)) == nan).all()
    assert (back[~nan] == want16.view(np.uint16)[~nan]).all()
    assert (rounded[~nan].view(np.uint32) == want16[~nan].astype(np.float32).view(np.uint32)).all()


def _cnn(rng):
    """conv 3x3 s2 + relu, maxpool 3x3 s2 p1, depthwise 3x3 + residual add, global average pool,
    flatten, gemm + sigmoid: float16 throughout."""
    def w(name, *shape, scale=0.3):
        return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float16), name)
    inits = [w("w1", 64, 3, 3, 3), w("b1", 64), w("w2", 64, 1, 3, 3), w("b2", 64), w("g", 10, 64), w("gb", 10)]
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], strides=[2, 2]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["p1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1], group=64),
             helper.make_node("Add", ["c2", "p1"], ["a2"]),
             helper.make_node("GlobalAveragePool", ["a2"], ["gp"]),
             helper.make_node("Flatten", ["gp"], ["f"]),
             helper.make_node("Gemm", ["f", "g", "gb"], ["d"], transB=1),
             helper.make_node("Sigmoid", ["d"], ["y"])]
    g = helper.make_graph(nodes, "cnn16", [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [1, 3, 30, 28])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [1, 10])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_float16_cnn_runs_te_kernels_and_agrees_with_onnxruntime():
    rng = np.random.default_rng(0)
    m = _cnn(rng)
    mod = modelc.compile(m)
    assert not mod.fallbacks
    steps = [s for s in mod.profile(1) if s["template"] != "(view)"]
    assert steps and all(s["template"] == "te_group" for s in steps), steps
    sess = ort.InferenceSession(m.SerializeToString())
    for seed in range(3):
        x = np.random.default_rng(seed).standard_normal((1, 3, 30, 28)).astype(np.float16)
        got = mod.run({"x": x})["y"]
        want = sess.run(None, {"x": x})[0]
        assert got.dtype == np.float16 and got.shape == want.shape
        # a few float16 ulps at the output's scale (float16's epsilon is 9.8e-4)
        err = np.abs(got.astype(np.float32) - want.astype(np.float32)).max() / np.abs(want.astype(np.float32)).max()
        assert err < 4e-3, err


def test_float16_tasks_tune_without_failed_measurements(tmp_path, caplog):
    """The measurer checks a float16 kernel at float16's precision and evicts its float16 arrays;
    the module check skips a tunable group that runs as a view (the Flatten: no kernel to time)."""
    import dataclasses

    from modelc.kernels.template import get
    from modelc.kernels.workload import Workload
    from modelc.tune import module_check
    from modelc.tune import records as R
    from modelc.tune.measure import MeasureOptions
    m = _cnn(np.random.default_rng(1))
    graph = modelc.from_onnx(m)
    log = str(tmp_path / "cnn16.jsonl")
    modelc.tune(graph, n_trials=9, log=log, trials_per_round=3, verbose=0, module_check=0,
                measure_options=MeasureOptions(number=2, repeat=2, min_repeat_ms=1))
    recs = R.load_records(log)
    assert len(recs) == 9 and all(r.error == R.NO_ERROR for r in recs), [r.error_msg for r in recs if r.error]
    caplog.set_level("INFO", logger="modelc")
    with modelc.ApplyHistoryBest(log):
        modelc.compile(graph)
    assert f"{len({r.key for r in recs})} of" in caplog.text
    # a second config of every measured workload, the reshape's among them, then the check
    with R.RecordWriter(log) as w:
        for r in {r.key: r for r in recs}.values():
            space = get(r.template).space(Workload(r.workload))
            other = next(space.get(i).values for i in range(len(space)) if space.get(i).values != r.config)
            w.write(dataclasses.replace(r, config=dict(other), costs=[r.cost * 2]))
    assert any(r.desc.startswith("reshape") for r in recs)
    checked = module_check.check(graph, log)
    assert checked and not any(r.desc.startswith("reshape") for r in checked)


def _attention16(rng):
    """A float16 attention block as exporters write it (an -inf causal mask through CastLike, a
    Softmax on the last axis), a LogSoftmax over heads (columns) and a reflect Pad."""
    B, H, S, D = 2, 4, 12, 16
    f16 = lambda a: numpy_helper.from_array(a.astype(np.float16))      # noqa: E731
    causal = np.triu(np.ones((S, S), bool), 1)
    inits = [numpy_helper.from_array(causal, "causal"),
             numpy_helper.from_array(np.array([-np.inf], np.float32), "ninf"),
             f16(np.array(D ** -0.5)), numpy_helper.from_array(np.array([0, 0, 1, 0, 0, 0, 2, 0], np.int64), "pads")]
    inits[2].name = "scale"
    nodes = [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["q", "kt"], ["qk"]),
             helper.make_node("Mul", ["qk", "scale"], ["s"]),
             helper.make_node("CastLike", ["ninf", "q"], ["fill"]),
             helper.make_node("Where", ["causal", "fill", "s"], ["masked"]),
             helper.make_node("Softmax", ["masked"], ["p"], axis=-1),
             helper.make_node("MatMul", ["p", "v"], ["o"]),
             helper.make_node("LogSoftmax", ["o"], ["lo"], axis=1),
             helper.make_node("Pad", ["lo", "pads"], ["y"], mode="reflect")]
    io = lambda n, s: helper.make_tensor_value_info(n, TensorProto.FLOAT16, s)    # noqa: E731
    g = helper.make_graph(nodes, "attn16", [io(n, (B, H, S, D)) for n in "qkv"], [io("y", (B, H, S + 3, D))], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_float16_attention_softmax_and_reflect_pad_run_kernels():
    """float16 Softmax/LogSoftmax on the softmax template (rows and columns), the -inf fill folded,
    a reflect Pad declared in te: no group on the numpy fallback, onnxruntime's answer to float16's
    precision."""
    m = _attention16(np.random.default_rng(0))
    mod = modelc.compile(m)
    assert not mod.fallbacks
    templates = {s["template"] for s in mod.profile(1)}
    assert "softmax" in templates and "reference" not in templates, templates
    sess = ort.InferenceSession(m.SerializeToString())
    for seed in range(2):
        rng = np.random.default_rng(seed)
        feeds = {n: (rng.standard_normal((2, 4, 12, 16)) * 2).astype(np.float16) for n in "qkv"}
        got, want = mod.run(feeds)["y"], sess.run(None, feeds)[0]
        assert got.dtype == np.float16 and got.shape == want.shape
        err = np.abs(got.astype(np.float32) - want.astype(np.float32)).max() / np.abs(want.astype(np.float32)).max()
        assert err < 4e-3, err


def test_a_float16_value_read_twice_keeps_groups_of_one_output():
    """g = Gather(x) read by a Cast (whose float32 feeds a matmul) and, for its type only, by a
    CastLike: closing that diamond made one group of two outputs, which float16's te kernels do
    not take (the numpy fallback ran it; ONNX's linear-attention cases once the matmuls read views)."""
    idx = numpy_helper.from_array(np.array(1, np.int64), "i")
    nodes = [helper.make_node("Gather", ["x", "i"], ["g"], axis=0),
             helper.make_node("Cast", ["g"], ["c"], to=TensorProto.FLOAT),
             helper.make_node("MatMul", ["c", "c"], ["d"]),
             helper.make_node("CastLike", ["d", "g"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [3, 8, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [8, 8])], [idx])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
    mod = modelc.compile(m)
    assert not mod.fallbacks
    x = np.random.default_rng(1).standard_normal((3, 8, 8)).astype(np.float16)
    want = ort.InferenceSession(m.SerializeToString()).run(None, {"x": x})[0].astype(np.float32)
    got = mod.run({"x": x})["y"].astype(np.float32)
    assert np.abs(got - want).max() <= 4e-3 * np.abs(want).max()


def test_float16_gru_steps_run_te_kernels():
    """A float16 GRU written out over its steps (frontend/recurrent.py): each step's Gather of the
    input projection at one time position lowers to te, so no group runs on the reference."""
    rng = np.random.default_rng(1)
    f16 = TensorProto.FLOAT16
    w = numpy_helper.from_array((rng.standard_normal((1, 24, 5)) * 0.4).astype(np.float16), "W")
    r = numpy_helper.from_array((rng.standard_normal((1, 24, 8)) * 0.4).astype(np.float16), "R")
    node = helper.make_node("GRU", ["x", "W", "R"], ["y", "h"], hidden_size=8)
    g = helper.make_graph([node], "gru16", [helper.make_tensor_value_info("x", f16, [4, 2, 5])],
                          [helper.make_tensor_value_info("y", f16, [4, 1, 2, 8]),
                           helper.make_tensor_value_info("h", f16, [1, 2, 8])], [w, r])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 14)])
    m.ir_version = 8
    x = rng.standard_normal((4, 2, 5)).astype(np.float16)
    mod = modelc.compile(m)
    assert not mod.fallbacks, mod.fallback_reasons
    got = mod.run({"x": x})
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    for name, wv in zip(("y", "h"), want):   # float16 steps round each op: a few float16 ulps apart
        np.testing.assert_allclose(got[name].astype(np.float32), wv.astype(np.float32), atol=4e-3, rtol=0)
