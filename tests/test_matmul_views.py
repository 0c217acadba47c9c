"""Reshapes, transposes, slices and gathers that feed a MatMul become strided views it reads in
place, and those after a product views it stores through (passes/matmul_views.py, StridedMatMul);
sibling projections become one Dense (passes/merge_dense.py): which chains are views, where the
rewrites apply and where they must not, the GEMM under sampled schedules, compiled attention in
every exporter's form against onnxruntime, and crafted views in a document."""
from __future__ import annotations

import copy

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import modelc
from modelc import passes
from modelc.schema import DocumentError
from modelc.frontend import from_onnx
from modelc.kernels import templates  # noqa: F401  (registers every template)
from modelc.kernels import testing
from modelc.kernels.template import get
from modelc.kernels.workload import Workload
from modelc.passes.matmul_views import view_of
from modelc.tune.tuning import tuning_tasks
from modelc.validate import check_workload
from workloads import onnx_model


def _T(perm):
    return lambda v: np.transpose(v, perm)


def _R(shape):
    return lambda v: v.reshape(shape)


@pytest.mark.parametrize("shape, steps, view", [
    ((2, 6, 8), [_R((2, 6, 2, 4)), _T([0, 2, 1, 3])], (0, (48, 4, 8, 1))),     # heads split off: Q, V
    ((2, 6, 8), [_R((2, 6, 2, 4)), _T([0, 2, 3, 1])], (0, (48, 4, 1, 8))),     # K^T
    ((4, 6), [_T([1, 0]), _R((24,))], None),                                    # a transpose flattened
    ((4, 6), [_T([1, 0]), _R((6, 2, 2))], (0, (1, 12, 6))),                     # a strided axis split
    ((4, 6), [_T([1, 0]), _R((3, 8))], None),
    ((1, 5, 1, 7), [_R((5, 7)), _T([1, 0]), _R((7, 1, 5))], (0, (1, 0, 7))),
    ((6, 12), [lambda v: v[:, 4:8]], (4, (12, 1))),                             # a slice: an offset
    ((6, 3, 4), [lambda v: v[:, 2], _T([1, 0])], (8, (1, 12))),                 # a gather of one index
    ((6, 12), [lambda v: v[:, ::-1]], None),                                    # backwards
    ((6, 12), [lambda v: v[:, [0, 1, 3]]], None),                               # gaps
])
def test_which_chains_are_strided_views(shape, steps, view):
    assert view_of(shape, steps) == view


def attention(t=37, heads=4, dim=16, batch=1, extra_use=False, k_first=False, fused=None, q_scale=False,
              split_scale=False):
    """x [batch, t, heads x dim] -> Q, K, V (dense) -> heads -> softmax(Q K^T / 4) V -> [batch, t, heads x dim].
    `fused`: one projection to [.., 3 x heads x dim], split as exporters do: "slice" (a Slice per
    part, then heads) or "gather" (torch's MultiheadAttention: [.., 3, heads, dim] moved first, then
    Gather 0, 1 and 2). `split_scale`: Q and K^T each scaled before their product (Q x 0.5, K^T / 2), as
    torch's dynamo exporter writes scaled dot-product attention."""
    rng = np.random.default_rng(t + heads)
    e = heads * dim
    inits = [numpy_helper.from_array((rng.standard_normal((e, e)) * 0.2).astype(np.float32), f"w{n}")
             for n in "qkv"]
    inits += [numpy_helper.from_array(np.array([batch, t, heads, dim], np.int64), "split"),
              numpy_helper.from_array(np.array([batch, t, e], np.int64), "merge"),
              numpy_helper.from_array(np.array(4.0, np.float32), "scale")]
    nodes = []
    if fused:
        inits.append(numpy_helper.from_array(
            np.concatenate([numpy_helper.to_array(w) for w in inits[:3]], axis=1), "wqkv"))
        nodes.append(helper.make_node("MatMul", ["x", "wqkv"], ["qkv"]))
    if fused == "gather":
        inits += [numpy_helper.from_array(np.array([batch, t, 3, heads, dim], np.int64), "split3")]
        inits += [numpy_helper.from_array(np.array(i, np.int64), f"i{n}") for i, n in enumerate("qkv")]
        nodes += [helper.make_node("Reshape", ["qkv", "split3"], ["qkv5"]),
                  helper.make_node("Transpose", ["qkv5"], ["qkvt"], perm=[2, 0, 3, 1, 4])]    # [3, b, h, t, d]
        nodes += [helper.make_node("Gather", ["qkvt", f"i{n}"], [f"{n}h"], axis=0) for n in "qkv"]
        nodes += [helper.make_node("Identity", ["qh"], ["q"]), helper.make_node("Identity", ["vh"], ["v"]),
                  helper.make_node("Transpose", ["kh"], ["k"], perm=[0, 1, 3, 2])]
    else:
        for j, n in enumerate("qkv"):
            if fused == "slice":
                inits += [numpy_helper.from_array(np.array([j * e], np.int64), f"s{n}"),
                          numpy_helper.from_array(np.array([(j + 1) * e], np.int64), f"e{n}"),
                          numpy_helper.from_array(np.array([-1], np.int64), f"a{n}")]
                nodes.append(helper.make_node("Slice", ["qkv", f"s{n}", f"e{n}", f"a{n}"], [f"{n}0"]))
            elif n == "q" and q_scale:      # Q scaled before its heads split: an epilogue of its dense
                nodes += [helper.make_node("MatMul", ["x", "wq"], ["qm"]),
                          helper.make_node("Div", ["qm", "scale"], ["q0"])]
            else:
                nodes.append(helper.make_node("MatMul", ["x", f"w{n}"], [f"{n}0"]))
            nodes.append(helper.make_node("Reshape", [f"{n}0", "split"], [f"{n}1"]))
        nodes += [helper.make_node("Transpose", ["q1"], ["q"], perm=[0, 2, 1, 3]),
                  helper.make_node("Transpose", ["v1"], ["v"], perm=[0, 2, 1, 3])]
        if k_first:     # K^T as K's heads, then the last two axes swapped
            nodes += [helper.make_node("Transpose", ["k1"], ["k2"], perm=[0, 2, 1, 3]),
                      helper.make_node("Transpose", ["k2"], ["k"], perm=[0, 1, 3, 2])]
        else:
            nodes.append(helper.make_node("Transpose", ["k1"], ["k"], perm=[0, 2, 3, 1]))
    if split_scale:
        inits += [numpy_helper.from_array(np.array(0.5, np.float32), "half"),
                  numpy_helper.from_array(np.array([2.0], np.float32), "two")]
        nodes += [helper.make_node("Mul", ["half", "q"], ["qs"]), helper.make_node("Div", ["k", "two"], ["ks"])]
    nodes += [helper.make_node("MatMul", ["qs", "ks"] if split_scale else ["q", "k"], ["s0"]),
              helper.make_node("Div", ["s0", "scale"], ["s"]),
              helper.make_node("Softmax", ["s"], ["p"], axis=-1),
              helper.make_node("MatMul", ["p", "v"], ["o0"]),
              helper.make_node("Transpose", ["o0"], ["o1"], perm=[0, 2, 1, 3]),
              helper.make_node("Reshape", ["o1", "merge"], ["y"])]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, t, e])]
    if extra_use:
        outputs.append(helper.make_tensor_value_info("q", TensorProto.FLOAT, [batch, heads, t, dim]))
    return onnx_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, t, e])],
                      outputs, inits)


def _nodes(model):
    return passes.optimize(from_onnx(model.SerializeToString()), fuse_ops=False).topo()


def _ops(model):
    return [n.op_type for n in _nodes(model)]


@pytest.mark.parametrize("kw", [{}, {"batch": 2}, {"k_first": True}])
def test_heads_are_read_and_stored_in_place(kw):
    nodes = _nodes(attention(**kw))
    ops = [n.op_type for n in nodes]
    # Q (A of Q K^T) and V (B of P V, its columns contiguous) are read as views and P V stores the
    # heads merged back; K^T's columns would be a row apart, read or stored: K keeps its transpose
    assert ops.count("StridedMatMul") == 2 and "MatMul" not in ops
    assert ops.count("Transpose") == (2 if kw.get("k_first") else 1)
    stored = [n for n in nodes if "y_strides" in n.attrs]
    assert [n.op_type for n in stored] == ["StridedMatMul"]
    batch = 37 * 64 if kw.get("batch", 1) > 1 else 0
    assert stored[0].attrs["y_strides"] == [batch, 16, 64, 1]      # [b, h, t, d] -> [b, t, h x d]


def test_a_chain_that_is_also_a_model_output_stays():
    ops = _ops(attention(extra_use=True))
    assert ops.count("StridedMatMul") == 2          # Q x K^T reads Q's heads where the dense put them,
    assert ops.count("Transpose") == 2              # and Q's transpose stays for the output (and K^T)


def test_q_k_and_v_projections_become_one_dense():
    dense = [n for n in _nodes(attention()) if n.op_type == "Dense"]
    assert len(dense) == 1 and dense[0].inputs[0] == "x"
    w = numpy_helper.to_array(next(i for i in attention().graph.initializer if i.name == "wk"))
    merged = passes.optimize(from_onnx(attention().SerializeToString()), fuse_ops=False).value(dense[0].inputs[1])
    assert merged.shape == (64, 192) and np.array_equal(merged[:, 64:128], w)


def test_a_projection_with_an_epilogue_keeps_its_own_dense():
    dense = [n for n in _nodes(attention(q_scale=True)) if n.op_type == "Dense"]
    assert len(dense) == 2      # Q's (its Div fuses into it), and K's and V's together


@pytest.mark.parametrize("fused", ["slice", "gather"])
def test_q_and_v_are_read_where_one_projection_put_them(fused):
    nodes = _nodes(attention(fused=fused, batch=2))
    ops = [n.op_type for n in nodes]
    assert ops.count("StridedMatMul") == 2 and "MatMul" not in ops
    e, t = 64, 37
    qk, pv = [n for n in nodes if n.op_type == "StridedMatMul"]
    assert qk.attrs.get("a_offset", 0) == 0 and pv.attrs["b_offset"] == 2 * e      # Q at 0, V at 2E
    assert qk.attrs["a_strides"] == [t * 3 * e, 16, 3 * e, 1]                      # [b, h, t, d] of [b, t, 3E]
    # K^T's columns would be apart: K is still copied, by one kernel (slice or gather, and transpose)
    assert set(ops) - {"Dense", "StridedMatMul", "Div", "Softmax"} <= {"Slice", "Gather", "Reshape", "Transpose"}


def test_scales_of_q_and_k_move_past_their_product():
    """torch's scaled dot-product attention scales Q and K by the fourth root of 1/d each: moved past
    Q x K^T (its epilogue), Q and V are still read where the projection put them."""
    nodes = _nodes(attention(fused="gather", split_scale=True))
    ops = [n.op_type for n in nodes]
    assert ops.count("StridedMatMul") == 2 and "MatMul" not in ops
    qk = next(n for n in nodes if n.op_type == "StridedMatMul")
    (scale,) = [n for n in nodes if n.op_type == "Mul"]
    assert scale.inputs[0] == qk.outputs[0]
    g = passes.optimize(from_onnx(attention(fused="gather", split_scale=True).SerializeToString()), fuse_ops=False)
    assert float(g.value(scale.inputs[1])) == 0.25


def test_a_scale_read_elsewhere_stays():
    model = attention(split_scale=True, extra_use=True)
    model.graph.output.append(helper.make_tensor_value_info("ks", TensorProto.FLOAT, None))
    g = passes.optimize(from_onnx(model.SerializeToString()), fuse_ops=False)
    k_scale = [n for n in g.topo() if n.op_type == "Div" and n.outputs[0] == "ks"]
    assert len(k_scale) == 1            # K^T / 2 is a model output: it stays, and is read as it is


@pytest.mark.parametrize("kw", [{}, {"t": 16, "batch": 2, "heads": 2, "dim": 32}, {"k_first": True, "t": 9},
                                {"fused": "slice", "batch": 2}, {"fused": "gather", "t": 20}, {"q_scale": True},
                                {"fused": "gather", "t": 21, "split_scale": True}])
def test_compiled_attention_matches_onnxruntime(kw, tmp_path):
    model = attention(**kw)
    mod = modelc.compile(model.SerializeToString())
    assert not mod.fallbacks
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    x = np.random.default_rng(3).standard_normal(shape).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got = mod(x)
    assert np.abs(got - want).max() <= 1e-5 * max(1.0, np.abs(want).max())
    mod.save(str(tmp_path / "a.mc"))
    from modelc.runtime.module import load
    assert np.array_equal(load(str(tmp_path / "a.mc"))(x), got)


def _view_tasks(model):
    return [t for t in tuning_tasks(from_onnx(model.SerializeToString())) if t.desc.endswith("(views)")]


def test_strided_matmul_kernels_under_sampled_schedules():
    tasks = _view_tasks(attention(t=21, batch=2))
    assert len(tasks) == 2 and {t.template for t in tasks} == {"batch_matmul"}
    assert "->" in tasks[1].desc
    for task in tasks:
        wl = Workload(task.workload)
        assert wl.anchor.op == "StridedMatMul"
        tpl = get(task.template)
        for cfg in testing.sampled_configs(tpl, wl, valid=4, draws=300, seed=7):
            got, want, _, _ = testing.run(wl, tpl, cfg, seed=2)
            assert testing.max_rel_error(got, want) < 1e-5, dict(cfg.values)


@pytest.mark.parametrize("edit, says", [
    (lambda a: a.update(b_strides=[s * 1000 for s in a["b_strides"]]), "reads element"),
    (lambda a: a.update(a_shape=a["a_shape"][:-1]), "dimensions"),
    (lambda a: a.update(a_strides=[-1] * len(a["a_strides"])), "non-negative"),
])
def test_a_crafted_view_is_refused_by_name(edit, says):
    wl = copy.deepcopy(_view_tasks(attention())[0].workload)
    edit(wl["ops"][0]["attrs"])
    with pytest.raises(DocumentError, match=f"StridedMatMul.*{says}"):
        check_workload(wl)


@pytest.mark.parametrize("strides", [[0, 0, 0, 0], [2048, 16, 32, 1], [2048, 1, 64, 16], [1, 2, 3]])
def test_a_crafted_store_that_is_not_every_element_once_is_refused(strides):
    """Two elements stored in one place would race, one never stored would be garbage."""
    wl = copy.deepcopy(_view_tasks(attention(batch=2, t=32, heads=4, dim=16))[1].workload)
    wl["ops"][0]["attrs"]["y_strides"] = strides
    with pytest.raises(DocumentError, match="every element written once"):
        check_workload(wl)


def test_the_matmul_refuses_columns_apart():
    """A document may say what the pass never makes: B's columns apart. The GEMM does not match it
    (it reads columns contiguous), so the reference runs it, and gets it right."""
    wl = copy.deepcopy(_view_tasks(attention(t=16, dim=16))[1].workload)     # P [16 x 16] V [16 x 16]
    attrs = wl["ops"][0]["attrs"]
    attrs["b_strides"] = attrs["b_strides"][:-2] + [attrs["b_strides"][-1], attrs["b_strides"][-2]]
    check_workload(wl)
    assert not get("batch_matmul").matches(Workload(wl))


def row_attention(c=16, hw=6):
    """conv [C, H, W] -> per row h: softmax(F_h F_h^T) F_h with F_h = [C, W] -> back to [C, H, W] -> conv:
    a conv's output read through views and the product stored through one, next to convs."""
    rng = np.random.default_rng(c)
    inits = [numpy_helper.from_array((rng.standard_normal((c, 8, 3, 3)) * 0.2).astype(np.float32), "w0"),
             numpy_helper.from_array((rng.standard_normal((c, c, 3, 3)) * 0.1).astype(np.float32), "w1")]
    nodes = [helper.make_node("Conv", ["x", "w0"], ["f"], pads=[1] * 4),
             helper.make_node("Transpose", ["f"], ["fa"], perm=[0, 2, 1, 3]),      # [1, H, C, W]
             helper.make_node("Transpose", ["f"], ["fb"], perm=[0, 2, 3, 1]),      # [1, H, W, C]
             helper.make_node("Transpose", ["f"], ["fc"], perm=[0, 2, 1, 3]),
             helper.make_node("MatMul", ["fa", "fb"], ["s"]),                      # [1, H, C, C]
             helper.make_node("Softmax", ["s"], ["p"], axis=-1),
             helper.make_node("MatMul", ["p", "fc"], ["o"]),                       # [1, H, C, W]
             helper.make_node("Transpose", ["o"], ["g"], perm=[0, 2, 1, 3]),       # [1, C, H, W]
             helper.make_node("Conv", ["g", "w1"], ["y"], pads=[1] * 4)]
    return onnx_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, hw, hw])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, c, hw, hw])], inits)


def test_views_next_to_convolutions_match_onnxruntime():
    model = row_attention()
    ops = _ops(model)
    assert ops.count("StridedMatMul") == 2 and ops.count("Transpose") == 1      # (F_h^T: columns apart)
    mod = modelc.compile(model.SerializeToString())
    assert not mod.fallbacks
    x = np.random.default_rng(4).standard_normal((1, 8, 6, 6)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert np.abs(mod(x) - want).max() <= 1e-5 * max(1.0, np.abs(want).max())


def seq_first(t=12, batch=3, e=64):
    """x [B, T, E] @ W -> [T, B, E] (torch's sequence-first layout) -> Relu: a dense whose result is
    only moved, then read elementwise."""
    rng = np.random.default_rng(t)
    inits = [numpy_helper.from_array((rng.standard_normal((e, e)) * 0.2).astype(np.float32), "w")]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y0"]),
             helper.make_node("Transpose", ["y0"], ["y1"], perm=[1, 0, 2]),
             helper.make_node("Relu", ["y1"], ["y"])]
    return onnx_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, t, e])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [t, batch, e])], inits)


def test_a_dense_stores_its_rows_moved():
    model = seq_first()
    nodes = _nodes(model)
    dense = next(n for n in nodes if n.op_type == "Dense")
    assert dense.attrs["y_shape"] == [12, 3, 64] and dense.attrs["y_strides"] == [64, 3 * 64, 1]
    assert "Transpose" not in [n.op_type for n in nodes]
    mod = modelc.compile(model.SerializeToString())
    assert not mod.fallbacks
    x = np.random.default_rng(5).standard_normal((3, 12, 64)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert np.abs(mod(x) - want).max() <= 1e-5 * max(1.0, np.abs(want).max())
    task = next(t for t in tuning_tasks(from_onnx(model.SerializeToString())) if t.template == "dense")
    assert task.desc.endswith("-> 12x3x64")
    wl, tpl = Workload(task.workload), get("dense")
    for cfg in testing.sampled_configs(tpl, wl, valid=4, draws=200, seed=8):
        got, want, _, _ = testing.run(wl, tpl, cfg, seed=2)
        assert testing.max_rel_error(got, want) < 1e-5, dict(cfg.values)


@pytest.mark.parametrize("scales, moved", [((0.25, 3.0, 0.5), True),     # a chain of scales, and one on B
                                           ((1e-30, 1.0, 1e30), False)])  # a product past float32's range
def test_chained_scales_move_as_one_unless_out_of_range(scales, moved):
    a, b = np.float32(scales[0]), np.float32(scales[2])
    inits = [numpy_helper.from_array(np.array(v, np.float32), n) for v, n in zip(scales, "uvw")]
    nodes = [helper.make_node("Div", ["x", "u"], ["x1"]), helper.make_node("Mul", ["v", "x1"], ["x2"]),
             helper.make_node("Mul", ["y", "w"], ["y1"]), helper.make_node("MatMul", ["x2", "y1"], ["z"])]
    model = onnx_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [5, 7]),
                               helper.make_tensor_value_info("y", TensorProto.FLOAT, [7, 3])],
                       [helper.make_tensor_value_info("z", TensorProto.FLOAT, [5, 3])], inits)
    g = passes.optimize(from_onnx(model.SerializeToString()), fuse_ops=False)
    (mm,) = [n for n in g.topo() if n.op_type == "MatMul"]
    assert (mm.inputs == ["x", "y"]) == moved
    if moved:
        (scale,) = [n for n in g.topo() if n.op_type in ("Mul", "Div")]
        assert scale.inputs[0] == mm.outputs[0] and np.isclose(float(g.value(scale.inputs[1])), 3.0 * b / a)
    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal((5, 7)).astype(np.float32) * np.float32(1e-30),
             "y": rng.standard_normal((7, 3)).astype(np.float32)}
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    got = modelc.compile(model.SerializeToString())(**feeds)
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()


def test_float16_scales_stay_before_the_product():
    """A float16 operand is rounded once scaled (ONNX's float16 attention tests then differ by more
    than their 1e-3 if the scale moves): it stays."""
    nodes = [helper.make_node("Mul", ["x", "u"], ["x1"]), helper.make_node("MatMul", ["x1", "y"], ["z"])]
    model = onnx_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [5, 7]),
                               helper.make_tensor_value_info("y", TensorProto.FLOAT16, [7, 3])],
                       [helper.make_tensor_value_info("z", TensorProto.FLOAT16, [5, 3])],
                       [numpy_helper.from_array(np.array(0.3, np.float16), "u")])
    g = passes.optimize(from_onnx(model.SerializeToString()), fuse_ops=False)
    (mm,) = [n for n in g.topo() if n.op_type == "MatMul"]
    assert mm.inputs[0] == "x1"
