"""A squeeze-excitation gate multiplied into a convolution's input runs inside the convolution
(passes/scale_conv.py, ScaledConv): where the rewrite applies and where it must not, its kernels
(the conv2d template and the te declaration) under sampled schedules against the reference, and
compiled models against onnxruntime."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import modelc
from modelc import passes
from modelc.frontend import from_onnx
from modelc.kernels import templates  # noqa: F401  (registers every template)
from modelc.kernels import testing
from modelc.kernels.template import get
from modelc.kernels.workload import Workload
from modelc.tune.tuning import tuning_tasks
from workloads import onnx_model


def _init(name, shape, rng, scale=0.3):
    return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)


def se_model(n=1, c=24, hw=10, k=40, kernel=1, pad=0, bias=True, gate_first=False, residual=False,
             group=1, extra_use=False, const_gate=False, spatial_gate=False):
    """conv 3x3 -> relu -> [global pool -> 1x1 -> relu -> 1x1 -> sigmoid] -> Mul -> conv (-> add)."""
    rng = np.random.default_rng(c + k + kernel)
    inits = [_init("w0", (c, c, 3, 3), rng), _init("b0", (c,), rng),
             _init("w1", (8, c, 1, 1), rng), _init("b1", (8,), rng),
             _init("w2", (c, 8, 1, 1), rng), _init("b2", (c,), rng),
             _init("w3", (k, c // group, kernel, kernel), rng)]
    nodes = [helper.make_node("Conv", ["x", "w0", "b0"], ["c0"], pads=[1] * 4),
             helper.make_node("Relu", ["c0"], ["r0"])]
    if const_gate:
        inits.append(numpy_helper.from_array(rng.uniform(0.1, 1, (1, c, 1, 1)).astype(np.float32), "g"))
    elif spatial_gate:
        nodes += [helper.make_node("ReduceMean", ["r0"], ["p"], axes=[1], keepdims=1),
                  helper.make_node("Sigmoid", ["p"], ["g"])]
    else:
        nodes += [helper.make_node("GlobalAveragePool", ["r0"], ["p"]),
                  helper.make_node("Conv", ["p", "w1", "b1"], ["f1"]),
                  helper.make_node("Relu", ["f1"], ["f1r"]),
                  helper.make_node("Conv", ["f1r", "w2", "b2"], ["f2"]),
                  helper.make_node("Sigmoid", ["f2"], ["g"])]
    nodes.append(helper.make_node("Mul", ["g", "r0"] if gate_first else ["r0", "g"], ["m"]))
    conv_in = ["m", "w3"]
    if bias:
        inits.append(_init("b3", (k,), rng))
        conv_in.append("b3")
    oh = hw + 2 * pad - kernel + 1
    nodes.append(helper.make_node("Conv", conv_in, ["y0" if residual else "y"], pads=[pad] * 4, group=group))
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [n, k, oh, oh])]
    if residual:
        inits.append(_init("res", (1, k, oh, oh), rng))
        nodes.append(helper.make_node("Add", ["y0", "res"], ["y"]))
    if extra_use:
        outputs.append(helper.make_tensor_value_info("m", TensorProto.FLOAT, [n, c, hw, hw]))
    return onnx_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n, c, hw, hw])],
                      outputs, inits)


def _ops(model):
    g = passes.optimize(from_onnx(model.SerializeToString()), fuse_ops=False)
    return [n.op_type for n in g.topo()]


@pytest.mark.parametrize("kw", [{}, {"gate_first": True}, {"n": 2}, {"bias": False}, {"residual": True}])
def test_the_gate_moves_into_the_convolution(kw):
    ops = _ops(se_model(**kw))
    assert ops.count("ScaledConv") == 1 and "Mul" not in ops


@pytest.mark.parametrize("kw", [
    {"extra_use": True},          # the product is also a model output: it must be computed
    {"const_gate": True},         # a constant per-channel scale is not a run-time gate
    {"spatial_gate": True},       # a [1, 1, H, W] gate scales pixels, not channels
    {"group": 2},                 # grouped convolutions: only groups of 1 read the gate
    {"kernel": 3, "pad": 1},      # padding: the halo must stay 0 whatever the gate (0 * inf)
])
def test_the_rewrite_keeps_away_from_what_it_cannot_take(kw):
    ops = _ops(se_model(**kw))
    assert "ScaledConv" not in ops and "Mul" in ops


def _sess_run(model, x):
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})


@pytest.mark.parametrize("kw", [{"gate_first": True, "n": 2, "c": 20, "k": 24, "hw": 7},
                                {"bias": False, "residual": True}, {"kernel": 3, "c": 32, "k": 16}])
def test_compiled_models_match_onnxruntime(kw):
    model = se_model(**kw)
    mod = modelc.compile(model.SerializeToString())
    assert not mod.fallbacks
    shape = model.graph.input[0].type.tensor_type.shape
    x = np.random.default_rng(3).standard_normal([d.dim_value for d in shape.dim]).astype(np.float32)
    got, want = mod(x), _sess_run(model, x)[0]
    assert np.abs(got - want).max() <= 1e-5 * max(1.0, np.abs(want).max())


def _scaled_workloads(model):
    return [t for t in tuning_tasks(from_onnx(model.SerializeToString()))
            if t.desc.startswith("scaled_conv2d")]


@pytest.mark.parametrize("kw", [{"n": 2, "residual": True}, {"kernel": 3, "c": 32, "k": 16}])
def test_scaled_conv_kernels_under_sampled_schedules(kw):
    tasks = _scaled_workloads(se_model(**kw))
    assert {t.template for t in tasks} == {"conv2d", "te_conv2d"}
    for task in tasks:
        wl = Workload(task.workload)
        assert wl.anchor.op == "ScaledConv"
        tpl = get(task.template)
        for cfg in testing.sampled_configs(tpl, wl, valid=2, draws=200, seed=7):
            got, want, fn, args = testing.run(wl, tpl, cfg, seed=2)
            assert testing.max_rel_error(got, want) < 1e-5, (task.template, dict(cfg.values))


def test_nonfinite_gates_propagate_as_in_the_reference():
    """A gate of inf or NaN: conv(x * s) and conv(x, w * s) agree on where the output is not finite."""
    tasks = _scaled_workloads(se_model())
    wl = Workload(tasks[0].workload)
    inputs = wl.random_inputs(seed=4)
    s_arg = int(wl.anchor.args[3][1:])
    inputs[s_arg] = inputs[s_arg].copy()
    inputs[s_arg][0, 3, 0, 0] = np.inf
    inputs[s_arg][0, 5, 0, 0] = np.nan
    for name in ("conv2d", "te_conv2d"):
        tpl = get(name)
        got, want, _, _ = testing.run(wl, tpl, tpl.default_config(wl, tpl.space(wl)), inputs=inputs)
        assert np.array_equal(np.isnan(got[0]), np.isnan(want[0]))


def test_a_saved_module_rebuilds_the_scaled_convolution(tmp_path):
    from modelc.runtime.module import load
    model = se_model(n=2, residual=True)
    mod = modelc.compile(model.SerializeToString())
    mod.save(str(tmp_path / "se.mc"))
    x = np.random.default_rng(5).standard_normal((2, 24, 10, 10)).astype(np.float32)
    assert np.array_equal(load(str(tmp_path / "se.mc"))(x), mod(x))


def test_the_per_layer_report_gives_the_gates_multiply_to_the_scaled_convolution():
    from modelc.compiler import lower
    from modelc.layers import group_names
    graph = from_onnx(se_model().SerializeToString())
    mul = next(n.name for n in graph.topo() if n.op_type == "Mul")
    fused = lower(graph)
    groups = group_names(graph, fused)
    owner = [i for i, names in enumerate(groups) if mul in names]
    assert len(owner) == 1
    assert fused.topo()[owner[0]].attrs["pattern"].startswith("scaled_conv2d")


def test_scaled_conv_with_broadcasts_loaded_pixel_by_pixel(monkeypatch):
    """Where a tile loads each pixel's broadcast by its FMAs, the scaled weight vectors are the
    pixels' common operand (each scaled once a channel, not once a pixel), and the sums are right."""
    from modelc.target import Target
    monkeypatch.setattr(Target, "broadcasts_by_pixel", lambda *a: True)
    task = next(t for t in _scaled_workloads(se_model(n=2, residual=True)) if t.template == "conv2d")
    wl, tpl = Workload(task.workload), get("conv2d")
    for cfg in testing.sampled_configs(tpl, wl, valid=2, draws=200, seed=3):
        assert "* (w[wo + np.uintp(j)] * sc)" in tpl.build(wl, cfg).source
        got, want, _, _ = testing.run(wl, tpl, cfg, seed=2)
        assert testing.max_rel_error(got, want) < 1e-5, dict(cfg.values)
