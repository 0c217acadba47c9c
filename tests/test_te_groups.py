"""Fused ONNX groups declared in te (modelc/te/groups.py): every generated kernel against the
reference executor under its default and sampled schedules, over the module's physical buffers
(blocked activations with halos, packed weights); the groups no template takes compile without
the numpy fallback; a faster te record replaces the template's kernel in `compile`."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import modelc
from modelc.kernels import templates  # noqa: F401  (registers every template)
from modelc.kernels import testing
from modelc.kernels.template import alternatives, get, select
from modelc.kernels.workload import Workload
from modelc.te.template import declared


def _t(shape, dtype="float32", const=False, layout=None, value=None):
    d = {"shape": list(shape), "dtype": dtype, "const": const}
    if layout:
        d["layout"] = list(layout)
    if value is not None:
        d["value"] = value
    return d


def _wl(inputs, ops, out, params=None):
    return Workload({"version": 1, "inputs": inputs, "ops": ops, "params": params or {}, "outputs": [out]})


def _conv_attrs(k, s=1, p=0, d=1, group=1):
    return {"dilations": [d, d], "kernel_shape": [k, k], "pads": [p] * 4, "strides": [s, s], "group": group}


def conv_residual():
    """conv 3x3 + bias + residual + ReLU, blocked in and out with a halo: the ResNet block's form."""
    return _wl([_t((1, 16, 9, 7), layout=(8, 1)), _t((16, 16, 3, 3), const=True), _t((16,), const=True),
                _t((1, 16, 9, 7), layout=(8, 1))],
               [{"op": "Conv", "attrs": _conv_attrs(3, p=1), "args": ["i0", "i1", "i2"]},
                {"op": "Add", "attrs": {}, "args": ["v0", "i3"]}, {"op": "Relu", "attrs": {}, "args": ["v1"]}],
               _t((1, 16, 9, 7), layout=(8, 1), value="v2"))


def conv_guarded():
    """Padding wider than the input's halo (a guarded read), stride and dilation, plain output, clip."""
    return _wl([_t((1, 8, 11, 10), layout=(8, 1)), _t((12, 8, 3, 3), const=True)],
               [{"op": "Conv", "attrs": _conv_attrs(3, s=2, p=2, d=2), "args": ["i0", "i1"]},
                {"op": "Clip", "attrs": {}, "args": ["v0", "p0", "p1"]}],
               _t((1, 12, 6, 5), value="v1"),
               {"p0": {"dtype": "float32", "shape": [], "value": 0.0},
                "p1": {"dtype": "float32", "shape": [], "value": 6.0}})


def conv_plain():
    """NCHW in and out (no layout), 1x1, bias, sigmoid."""
    return _wl([_t((1, 6, 5, 7)), _t((10, 6, 1, 1), const=True), _t((10,), const=True)],
               [{"op": "Conv", "attrs": _conv_attrs(1), "args": ["i0", "i1", "i2"]},
                {"op": "Sigmoid", "attrs": {}, "args": ["v0"]}],
               _t((1, 10, 5, 7), value="v1"))


def depthwise():
    return _wl([_t((1, 16, 10, 9), layout=(8, 1)), _t((16, 1, 3, 3), const=True), _t((16,), const=True)],
               [{"op": "Conv", "attrs": _conv_attrs(3, s=2, p=1, group=16), "args": ["i0", "i1", "i2"]},
                {"op": "HardSwish", "attrs": {}, "args": ["v0"]}],
               _t((1, 16, 5, 5), layout=(8, 0), value="v1"))


def conv_grouped():
    """groups=2 of 4 input channels each, blocked output: the output channel picks its group's inputs."""
    return _wl([_t((1, 8, 6, 6)), _t((16, 4, 3, 3), const=True)],
               [{"op": "Conv", "attrs": _conv_attrs(3, group=2), "args": ["i0", "i1"]}],
               _t((1, 16, 4, 4), layout=(8, 0), value="v0"))


def conv1d_weights_f16():
    """A causal depthwise 1-d conv whose weights are an input (a state-space block's), float16."""
    return _wl([_t((2, 4, 11), "float16"), _t((4, 1, 4), "float16")],
               [{"op": "Conv", "attrs": {"group": 4, "kernel_shape": [4], "dilations": [1], "pads": [0, 0],
                                         "strides": [1]}, "args": ["i0", "i1"]}],
               _t((2, 4, 8), "float16", value="v0"))


def conv3d_f16():
    return _wl([_t((1, 3, 5, 6, 7), "float16"), _t((4, 3, 2, 3, 3), "float16", const=True),
                _t((4,), "float16", const=True)],
               [{"op": "Conv", "attrs": {"kernel_shape": [2, 3, 3], "dilations": [1, 2, 1], "pads": [0, 1, 1, 1, 0, 1],
                                         "strides": [2, 1, 2]}, "args": ["i0", "i1", "i2"]}],
               _t((1, 4, 3, 3, 4), "float16", value="v0"))


def dense_gelu():
    return _wl([_t((3, 5, 24)), _t((24, 20), const=True), _t((20,), const=True)],
               [{"op": "Dense", "attrs": {}, "args": ["i0", "i1", "i2"]}, {"op": "Gelu", "attrs": {}, "args": ["v0"]}],
               _t((3, 5, 20), value="v1"))


def matmul_where_f64():
    """A batched float64 matmul broadcast against a 2-d operand, masked (attention's form)."""
    return _wl([_t((2, 3, 5, 4), "float64"), _t((4, 6), "float64"), _t((5, 6), "bool")],
               [{"op": "MatMul", "attrs": {}, "args": ["i0", "i1"]},
                {"op": "Where", "attrs": {}, "args": ["i2", "v0", "p0"]}],
               _t((2, 3, 5, 6), "float64", value="v1"),
               {"p0": {"dtype": "float64", "shape": [], "value": -1e9}})


def einsum(eq, shapes, out):
    return _wl([_t(s, "float64") for s in shapes],
               [{"op": "Einsum", "attrs": {"equation": eq}, "args": [f"i{k}" for k in range(len(shapes))]}],
               _t(out, "float64", value="v0"))


def _axes(*axes):
    return {"p0": {"dtype": "int64", "shape": [len(axes)], "value": list(axes)}}


def reduce_bool():
    return _wl([_t((4, 5, 6), "bool")], [{"op": "ReduceMax", "attrs": {"keepdims": 0}, "args": ["i0", "p0"]}],
               _t((5,), "bool", value="v0"), _axes(0, 2))


def reduce_l2():
    return _wl([_t((3, 7, 5))], [{"op": "ReduceL2", "attrs": {"keepdims": 1}, "args": ["i0", "p0"]}],
               _t((3, 7, 1), value="v0"), _axes(-1))


def _f16(wl: Workload) -> Workload:
    """The same group over float16 tensors (constants and parameters too)."""
    j = wl.json

    def conv(d):
        return {**d, "dtype": "float16"} if d.get("dtype") == "float32" else d
    return Workload({**j, "inputs": [conv(t) for t in j["inputs"]], "outputs": [conv(t) for t in j["outputs"]],
                     "params": {k: conv(v) for k, v in j.get("params", {}).items()}})


def _pool_attrs(op, k, s=1, p=(0, 0, 0, 0), d=1, **kw):
    return {"kernel_shape": [k, k], "strides": [s, s], "pads": list(p), "dilations": [d, d], **kw} \
        if not op.startswith("Global") else {}


def pool(op, shape, out, layout=None, out_layout=None, **attrs):
    ops = [{"op": op, "attrs": _pool_attrs(op, **attrs) if attrs else {}, "args": ["i0"]}]
    return _wl([_t(shape, "float16", layout=layout)], ops, _t(out, "float16", layout=out_layout, value="v0"))


def transpose_reshape_f16():
    return _wl([_t((2, 3, 4, 5), "float16")],
               [{"op": "Transpose", "attrs": {"perm": [0, 2, 3, 1]}, "args": ["i0"]},
                {"op": "Reshape", "attrs": {}, "args": ["v0", "p0"]},
                {"op": "Sigmoid", "attrs": {}, "args": ["v1"]}],
               _t((8, 15), "float16", value="v2"), {"p0": {"dtype": "int64", "shape": [2], "value": [8, 15]}})


def _ints(**named):
    return {k: {"dtype": "int64", "shape": [len(v)], "value": list(v)} for k, v in named.items()}


def slice_f16():
    """Steps of 2 and -1 (ONNX's clamping of negative steps), then a Relu."""
    return _wl([_t((3, 8, 6), "float16")],
               [{"op": "Slice", "attrs": {}, "args": ["i0", "p0", "p1", "p2", "p3"]},
                {"op": "Relu", "attrs": {}, "args": ["v0"]}],
               _t((3, 4, 5), "float16", value="v1"), _ints(p0=[1, 5], p1=[8, 0], p2=[1, 2], p3=[2, -1]))


def concat_f16():
    return _wl([_t((2, 3, 5), "float16"), _t((2, 4, 5), "float16"), _t((2, 1, 5), "float16")],
               [{"op": "Concat", "attrs": {"axis": 1}, "args": ["i0", "i1", "i2"]},
                {"op": "Mul", "attrs": {}, "args": ["v0", "v0"]}],
               _t((2, 8, 5), "float16", value="v1"))


def pad_f16(mode, pads=(0, 2, -1, 0, 1, 3)):
    """Pads and crops on one axis, both sides; wrap's pad of 3 on the cropped axis of 3 wraps twice."""
    params = _ints(p0=pads)
    params["p1"] = {"dtype": "float16", "shape": [], "value": 1.5}
    out = tuple(d + lo + hi for d, lo, hi in zip((3, 5, 4), pads[:3], pads[3:]))
    return _wl([_t((3, 5, 4), "float16")],
               [{"op": "Pad", "attrs": {"mode": mode}, "args": ["i0", "p0", "p1"]}],
               _t(out, "float16", value="v0"), params)


# case: (workload, the te template that builds it, the template `compile` picks by default)
CASES = {"conv_residual": (conv_residual, "te_conv2d", "conv2d"),
         "conv_guarded": (conv_guarded, "te_conv", "conv_generic"),
         "conv_plain": (conv_plain, "te_conv", "conv_generic"),
         "conv_grouped": (conv_grouped, "te_conv", "conv_generic"),
         "conv1d_weights_f16": (conv1d_weights_f16, "te_group", "te_group"),
         "conv3d_f16": (conv3d_f16, "te_group", "te_group"),
         "depthwise": (depthwise, "te_depthwise", "depthwise_conv2d"),
         "dense_gelu": (dense_gelu, "te_dense", "dense"),
         "matmul_where_f64": (matmul_where_f64, "te_group", "te_group"),
         "einsum_diagonal": (lambda: einsum("bii->bi", [(2, 5, 5)], (2, 5)), "te_group", "te_group"),
         "einsum_inner": (lambda: einsum("i,i", [(7,), (7,)], ()), "te_group", "te_group"),
         "einsum_three": (lambda: einsum("ij,jk,k->i", [(4, 5), (5, 3), (3,)], (4,)), "te_group", "te_group"),
         "reduce_bool": (reduce_bool, "te_group", "te_group"),
         "reduce_l2": (reduce_l2, "te_group", "reduce"),       # the reduce template's: te_group builds it too
         # float16: loads and stores its bits, computes in float32 (no hand-written template takes it)
         "conv_residual_f16": (lambda: _f16(conv_residual()), "te_group", "te_group"),
         "depthwise_f16": (lambda: _f16(depthwise()), "te_group", "te_group"),
         "dense_gelu_f16": (lambda: _f16(dense_gelu()), "te_group", "te_group"),
         "transpose_reshape_f16": (transpose_reshape_f16, "te_group", "te_group"),
         "maxpool_f16": (lambda: pool("MaxPool", (1, 16, 9, 8), (1, 16, 5, 4), (8, 1), (8, 1), k=3, s=2,
                                      p=(1, 1, 1, 1)), "te_group", "te_group"),
         "avgpool_f16": (lambda: pool("AveragePool", (1, 5, 8, 7), (1, 5, 5, 4), k=3, s=2, p=(1, 1, 1, 1), ceil_mode=1),
                         "te_group", "te_group"),
         "avgpool_pad_f16": (lambda: pool("AveragePool", (1, 5, 8, 7), (1, 5, 4, 4), k=2, s=2, p=(0, 1, 1, 0), d=2,
                                          count_include_pad=1, ceil_mode=1), "te_group", "te_group"),
         "global_avg_f16": (lambda: pool("GlobalAveragePool", (2, 16, 5, 6), (2, 16, 1, 1), (8, 0)),
                            "te_group", "te_group"),
         "global_max_f16": (lambda: pool("GlobalMaxPool", (2, 3, 5, 6), (2, 3, 1, 1)), "te_group", "te_group"),
         "slice_f16": (slice_f16, "te_group", "te_group"),
         "concat_f16": (concat_f16, "te_group", "te_group"),
         "pad_constant_f16": (lambda: pad_f16("constant"), "te_group", "te_group"),
         "pad_edge_f16": (lambda: pad_f16("edge"), "te_group", "te_group"),
         "pad_reflect_f16": (lambda: pad_f16("reflect", (0, 2, -1, 0, 1, 2)), "te_group", "te_group"),
         "pad_reflect_crop_f16": (lambda: pad_f16("reflect", (1, -2, 2, 0, 2, -1)), "te_group", "te_group"),
         "pad_wrap_f16": (lambda: pad_f16("wrap"), "te_group", "te_group"),
         "fmod_f16": (lambda: _wl([_t((4, 6), "float16"), _t((6,), "float16")],
                                  [{"op": "Mod", "attrs": {"fmod": 1}, "args": ["i0", "i1"]}],
                                  _t((4, 6), "float16", value="v0")), "te_group", "te_group"),
         "mod_divisor_sign_f16": (lambda: _wl([_t((4, 6), "float16"), _t((6,), "float16")],
                                              [{"op": "Mod", "attrs": {"fmod": 0}, "args": ["i0", "i1"]}],
                                              _t((4, 6), "float16", value="v0")), "te_group", "te_group")}


@pytest.mark.parametrize("case", sorted(CASES))
def test_declared_group_kernels_match_the_reference(case):
    make, name, default = CASES[case]
    wl = make()
    tpl = get(name)
    # where a template takes the group, the te declaration is its second algorithm, never the default
    assert select(wl).name == default
    assert name == default or name == "te_group" or name in [t.name for t in alternatives(wl, select(wl))]
    space = tpl.space(wl)
    rng = np.random.default_rng(len(case))
    sampled = [space.get(int(i)) for i in rng.permutation(len(space))[:400]]
    configs = [tpl.default_config(wl, space)] + [c for c in sampled if space.is_valid(c)][:2]
    assert len(configs) == 3
    for cfg in configs:
        got, want, fn, args = testing.run(wl, tpl, cfg, seed=1)
        err = testing.max_rel_error(got, want)
        # float16: the reference rounds every op's result, a te kernel too, but it sums in float32
        assert err < (2e-3 if case.endswith("_f16") else 1e-5), (case, dict(cfg.values), err)
    # one writer per output element, and a blocked result's halo stays zero
    counts = testing.stores_per_output(fn, args)
    out = wl.outputs[0]
    if out.layout and out.layout[1]:
        from modelc.kernels.layout import to_physical
        interior = to_physical(np.ones(out.shape, np.float32), out.layout).astype(bool)
        assert (counts[interior] == 1).all() and (counts[~interior] == 0).all()
    else:
        assert (counts == 1).all()


def test_integer_mod_declared_in_te_is_pythons():
    """ONNX Mod of integers (fmod=0): the divisor's sign, as numpy's mod (the injective template's too)."""
    wl = _wl([_t((4, 6), "int64"), _t((6,), "int64")], [{"op": "Mod", "attrs": {}, "args": ["i0", "i1"]}],
             _t((4, 6), "int64", value="v0"))
    tpl = get("te_group")
    x = np.arange(-12, 12, dtype=np.int64).reshape(4, 6)
    y = np.array([5, -5, 3, -3, 7, 1], np.int64)
    got, want, _, _ = testing.run(wl, tpl, tpl.default_config(wl, tpl.space(wl)), inputs=[x, y])
    np.testing.assert_array_equal(got[0], np.mod(x, y))
    np.testing.assert_array_equal(want[0], np.mod(x, y))


def test_blocked_conv_reads_the_halo_without_guards_and_weights_are_packed():
    d = declared(conv_residual())
    src, _ = get("te_conv2d").build(conv_residual(), get("te_conv2d").default_config(
        conv_residual(), get("te_conv2d").space(conv_residual()))).source, None
    assert d.args[:2] == ["out0", "in0"] and "te_w1" in d.args and "in3" in d.args
    assert d.plan.store is not None and " if " not in src          # no padding guard, no select
    assert " // " not in src.split("def kernel", 1)[1].split("for jj", 1)[1]   # no division in the lanes
    assert declared(conv_guarded()) is not None and " if " in get("te_conv").build(
        conv_guarded(), get("te_conv").default_config(conv_guarded(), get("te_conv").space(conv_guarded()))).source


@pytest.mark.parametrize("wl, why", [
    (_wl([_t((1, 8, 6, 6)), _t((8, 8, 3, 3), const=True)],
         [{"op": "Conv", "attrs": {**_conv_attrs(3), "auto_pad": "SAME_UPPER"}, "args": ["i0", "i1"]}],
         _t((1, 8, 6, 6), value="v0")),
     "auto_pad (the importer resolves it to pads)"),
    (_wl([_t((4, 6))], [{"op": "Softmax", "attrs": {"axis": -1}, "args": ["i0"]}], _t((4, 6), value="v0")),
     "an op not declared"),
    (_wl([_t((4, 6))], [{"op": "ReduceMax", "attrs": {}, "args": ["i0", "p0"]},
                        {"op": "Sub", "attrs": {}, "args": ["i0", "v0"]}], _t((4, 6), value="v1"), _axes(1)),
     "two kernels (a reduction read at other indices)"),
])
def test_groups_without_a_declaration(wl, why):
    assert declared(wl) is None, why


def _model(path):
    """Float64 einsums and a bool reduction: no hand-written template takes them."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((6, 4)), "w")
    nodes = [helper.make_node("Einsum", ["x", "w"], ["e"], equation="bij,jk->bik"),
             helper.make_node("Einsum", ["e"], ["d"], equation="bii->bi"),
             helper.make_node("Greater", ["d", "zero"], ["pos"]),
             helper.make_node("ReduceMax", ["pos", "axes"], ["any"], keepdims=0)]   # bool: opset 20
    zero = numpy_helper.from_array(np.zeros((), np.float64), "zero")
    axes = numpy_helper.from_array(np.array([1], np.int64), "axes")
    g = helper.make_graph(nodes, "einsums", [helper.make_tensor_value_info("x", TensorProto.DOUBLE, [3, 4, 6])],
                          [helper.make_tensor_value_info("d", TensorProto.DOUBLE, [3, 4]),
                           helper.make_tensor_value_info("any", TensorProto.BOOL, [3])], [w, zero, axes])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 20)])
    m.ir_version = 8
    onnx.save(m, path)


def test_groups_no_template_takes_compile_without_the_fallback(tmp_path):
    path = str(tmp_path / "einsums.onnx")
    _model(path)
    mod = modelc.compile(path)
    assert mod.fallbacks == []
    assert "te_group" in {s["template"] for s in mod.program["steps"]}
    x = np.random.default_rng(1).standard_normal((3, 4, 6))
    got = mod.run({"x": x})
    ref = modelc.reference.run(modelc.from_onnx(path), {"x": x})
    np.testing.assert_allclose(got["d"], ref["d"], rtol=1e-12, atol=1e-12 * np.abs(ref["d"]).max())
    np.testing.assert_array_equal(got["any"], ref["any"])
    # a saved module rebuilds its te kernels from the workloads it carries
    mod.save(str(tmp_path / "einsums.modelc"))
    again = modelc.load(str(tmp_path / "einsums.modelc")).run({"x": x})
    assert all(np.array_equal(again[k], got[k]) for k in got)


def test_a_faster_te_record_replaces_the_template_kernel(tmp_path):
    from modelc.tune import records as R
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array((rng.standard_normal((16, 16, 3, 3)) * 0.1).astype(np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], strides=[2, 2]),
             helper.make_node("Relu", ["c"], ["y"])]
    g = helper.make_graph(nodes, "conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 12, 12])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 6, 6])], [w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    path, log = str(tmp_path / "conv.onnx"), str(tmp_path / "log.jsonl")
    onnx.save(m, path)
    from modelc.tune.tuning import tuning_tasks
    tasks = {t.template: t for t in tuning_tasks(path)}
    assert {"conv2d", "te_conv2d"} <= set(tasks) and tasks["te_conv2d"].desc.endswith("[te]")
    t = tasks["te_conv2d"]
    wl = Workload(t.workload)
    space = get("te_conv2d").space(wl)
    cfg = next(c for c in map(space.get, range(len(space) // 3, len(space))) if space.is_valid(c))
    with R.RecordWriter(log) as wr:
        direct = get("conv2d").default_config(wl, get("conv2d").space(wl))
        for name, cost, values in [("conv2d", 2e-3, dict(direct.values)), ("te_conv2d", 1e-3, dict(cfg.values))]:
            wr.write(R.Record(t.key, t.desc, name, values, [cost] * 3, target=R.current_target(),
                              workload=t.workload, timestamp=1.0))
    with modelc.ApplyHistoryBest(log):
        mod = modelc.compile(path)
    step = next(s for s in mod.program["steps"] if s["key"] == t.key)
    assert step["template"] == "te_conv2d" and step["config"] == dict(cfg.values)
    x = rng.standard_normal((1, 16, 12, 12)).astype(np.float32)
    ref = modelc.reference.run(modelc.from_onnx(path), {"x": x})["y"]
    np.testing.assert_allclose(mod(x), ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())


def test_a_lowering_that_fails_leaves_the_group_to_its_template_and_says_so(monkeypatch, caplog):
    from modelc.te import template as te_template

    def broken(wl):
        raise IndexError("a lowering's bug")
    monkeypatch.setattr(te_template, "declare", broken)
    te_template._declared.cache_clear()
    try:
        wl = reduce_bool()
        assert declared(wl) is None and select(wl).name == "reference"
        assert "no te declaration for a ReduceMax group: IndexError: a lowering's bug" in caplog.text
    finally:
        te_template._declared.cache_clear()


def test_nan_propagates_as_in_the_reference():
    """max/min (Relu, Clip, te.max) are NaN in, NaN out, as numpy's maximum and onnxruntime: LLVM's
    maxnum would turn a NaN into the clip bound."""
    wl = conv_guarded()
    inputs = wl.random_inputs(3)
    inputs[0][0, 2, 4, 4] = np.nan
    tpl = get("te_conv")
    got, want, _, _ = testing.run(wl, tpl, tpl.default_config(wl, tpl.space(wl)), inputs=inputs)
    assert np.isnan(want[0]).any()
    np.testing.assert_array_equal(np.isnan(got[0]), np.isnan(want[0]))
    ok = ~np.isnan(want[0])
    np.testing.assert_allclose(got[0][ok], want[0][ok], rtol=1e-5, atol=1e-5 * np.abs(want[0][ok]).max())
