"""Graph passes: each keeps the graph valid and the reference outputs unchanged."""
import math

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import models
import modelc
from modelc import passes, reference
from modelc.passes import fuse
from workloads import onnx_model


def _vi(name, shape, t=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, t, shape)


def _const(name, arr):
    return numpy_helper.from_array(np.asarray(arr), name)


def _feeds(graph, seed=0):
    rng = np.random.default_rng(seed)
    return {n: rng.standard_normal(graph.tensors[n].shape).astype(graph.tensors[n].dtype)
            for n in graph.inputs}


def _assert_close(got, want):
    for k in want:
        scale = max(float(np.abs(want[k]).max()), 1e-6)
        assert np.abs(got[k] - want[k]).max() <= 1e-4 * scale, k


@pytest.mark.parametrize("name", sorted(models.MODELS))
def test_every_pass_preserves_outputs(name):
    graph = modelc.from_onnx(models.cached_path(name), shape=None, default_batch=1)
    feeds = _feeds(graph)
    want = reference.run(graph, feeds)
    g = graph.copy()
    for p in passes.PIPELINE + [fuse]:
        g = p(g)
        g.verify()
        _assert_close(reference.run(g, feeds), want)
    assert all(n.op_type == "Fused" for n in g.topo())


def test_shape_chain_folds_to_a_constant_reshape():
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
             helper.make_node("Unsqueeze", ["n", "ax0"], ["nu"]),
             helper.make_node("Concat", ["nu", "minus1"], ["shape"], axis=0),
             helper.make_node("Reshape", ["x", "shape"], ["y"])]
    inits = [_const("zero", np.array(0, np.int64)), _const("ax0", np.array([0], np.int64)),
             _const("minus1", np.array([-1], np.int64))]
    g = modelc.from_onnx(onnx_model(nodes, [_vi("x", ["N", 3, 4])], [_vi("y", ["N", 12])], inits),
                         shape={"x": (2, 3, 4)})
    opt = passes.optimize(g, fuse_ops=False, verify=True)
    assert [n.op_type for n in opt.topo()] == ["Reshape"]
    assert opt.value(opt.topo()[0].inputs[1]).tolist() == [2, 12]


def test_castlike_of_a_constant_folds_whatever_its_dtype_operand():
    """CastLike's second operand gives only a dtype: the -inf fill of an attention mask folds."""
    nodes = [helper.make_node("CastLike", ["ninf", "x"], ["fill"]),
             helper.make_node("Where", ["mask", "fill", "x"], ["y"])]
    inits = [_const("ninf", np.array([-np.inf], np.float32)), _const("mask", np.array([True, False, True]))]
    g = modelc.from_onnx(onnx_model(nodes, [_vi("x", [2, 3], TensorProto.FLOAT16)],
                                    [_vi("y", [2, 3], TensorProto.FLOAT16)], inits))
    opt = passes.optimize(g, fuse_ops=False, verify=True)
    assert [n.op_type for n in opt.topo()] == ["Where"]
    fill = opt.value(opt.topo()[0].inputs[1])
    assert fill.dtype == np.float16 and fill.tolist() == [-np.inf]
    x = np.arange(6, dtype=np.float16).reshape(2, 3)
    np.testing.assert_array_equal(reference.run(opt, {"x": x})["y"], np.where([True, False, True], -np.inf, x))


def _conv_bn_model():
    rng = np.random.default_rng(1)
    inits = [_const("w", rng.standard_normal((8, 3, 3, 3)).astype(np.float32)),
             _const("gamma", rng.uniform(0.5, 1.5, 8).astype(np.float32)),
             _const("beta", rng.standard_normal(8).astype(np.float32)),
             _const("mean", rng.standard_normal(8).astype(np.float32)),
             _const("var", rng.uniform(0.5, 2, 8).astype(np.float32))]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "gamma", "beta", "mean", "var"], ["b"]),
             helper.make_node("Relu", ["b"], ["r"]),
             helper.make_node("BatchNormalization", ["r", "gamma", "beta", "mean", "var"], ["y"])]
    return onnx_model(nodes, [_vi("x", [1, 3, 8, 8])], [_vi("y", [1, 8, 8, 8])], inits)


def test_batchnorm_folds_into_conv_and_lone_bn_becomes_scale_shift():
    g = modelc.from_onnx(_conv_bn_model())
    opt = passes.optimize(g, fuse_ops=False, verify=True)
    assert [n.op_type for n in opt.topo()] == ["Conv", "Relu", "Mul", "Add"]
    feeds = _feeds(g)
    _assert_close(reference.run(opt, feeds), reference.run(g, feeds))
    fused = passes.optimize(g)
    assert [n.attrs["pattern"] for n in fused.topo()] == ["conv2d_bias_relu_mul_add"]


def test_gemm_and_matmul_add_become_dense():
    rng = np.random.default_rng(2)
    inits = [_const("w", rng.standard_normal((16, 8)).astype(np.float32)),
             _const("c", rng.standard_normal(16).astype(np.float32)),
             _const("w2", rng.standard_normal((16, 4)).astype(np.float32)),
             _const("b2", rng.standard_normal(4).astype(np.float32))]
    nodes = [helper.make_node("Gemm", ["x", "w", "c"], ["h"], transB=1, alpha=0.5, beta=2.0),
             helper.make_node("MatMul", ["h", "w2"], ["m"]),
             helper.make_node("Add", ["b2", "m"], ["y"])]
    g = modelc.from_onnx(onnx_model(nodes, [_vi("x", [3, 8])], [_vi("y", [3, 4])], inits))
    opt = passes.optimize(g, fuse_ops=False, verify=True)
    assert [n.op_type for n in opt.topo()] == ["Dense", "Dense"]
    assert all(len(n.inputs) == 3 for n in opt.topo())
    feeds = _feeds(g)
    _assert_close(reference.run(opt, feeds), reference.run(g, feeds))


def _layernorm_nodes(x, out, use_pow=True):
    sq = helper.make_node("Pow", ["d", "two"], ["sq"]) if use_pow else helper.make_node("Mul", ["d", "d"], ["sq"])
    return [helper.make_node("ReduceMean", [x, "axes"], ["mu"], keepdims=1),
            helper.make_node("Sub", [x, "mu"], ["d"]), sq,
            helper.make_node("ReduceMean", ["sq", "axes"], ["var"], keepdims=1),
            helper.make_node("Add", ["var", "eps"], ["ve"]),
            helper.make_node("Sqrt", ["ve"], ["std"]),
            helper.make_node("Div", ["d", "std"], ["n"]),
            helper.make_node("Mul", ["n", "gamma"], ["ng"]),
            helper.make_node("Add", ["ng", "beta"], [out])]


@pytest.mark.parametrize("use_pow", [True, False])
def test_decomposed_layernorm_is_recognised(use_pow):
    rng = np.random.default_rng(3)
    inits = [_const("axes", np.array([-1], np.int64)), _const("two", np.array(2.0, np.float32)),
             _const("eps", np.array(1e-5, np.float32)),
             _const("gamma", rng.standard_normal(16).astype(np.float32)),
             _const("beta", rng.standard_normal(16).astype(np.float32))]
    g = modelc.from_onnx(onnx_model(_layernorm_nodes("x", "y", use_pow), [_vi("x", [2, 5, 16])],
                                     [_vi("y", [2, 5, 16])], inits, opset=18))
    opt = passes.optimize(g, fuse_ops=False, verify=True)
    assert [n.op_type for n in opt.topo()] == ["LayerNormalization"]
    feeds = _feeds(g)
    _assert_close(reference.run(opt, feeds), reference.run(g, feeds))


@pytest.mark.parametrize("form", ["x_half_then_mul", "mul_then_half", "half_of_sum_then_x"])
def test_gelu_decompositions_are_recognised(form):
    inits = [_const("sqrt2", np.array(math.sqrt(2), np.float32)), _const("one", np.array(1.0, np.float32)),
             _const("half", np.array(0.5, np.float32))]
    head = [helper.make_node("Div", ["x", "sqrt2"], ["s"]), helper.make_node("Erf", ["s"], ["e"]),
            helper.make_node("Add", ["e", "one"], ["a"])]
    tail = {"x_half_then_mul": [helper.make_node("Mul", ["x", "half"], ["h"]),
                                helper.make_node("Mul", ["h", "a"], ["y"])],
            "mul_then_half": [helper.make_node("Mul", ["x", "a"], ["m"]),
                              helper.make_node("Mul", ["m", "half"], ["y"])],
            "half_of_sum_then_x": [helper.make_node("Mul", ["a", "half"], ["m"]),
                                   helper.make_node("Mul", ["x", "m"], ["y"])]}[form]
    g = modelc.from_onnx(onnx_model(head + tail, [_vi("x", [4, 32])], [_vi("y", [4, 32])], inits))
    opt = passes.optimize(g, fuse_ops=False, verify=True)
    assert [n.op_type for n in opt.topo()] == ["Gelu"]
    feeds = _feeds(g)
    _assert_close(reference.run(opt, feeds), reference.run(g, feeds))


def test_cse_and_dce():
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Relu", ["x"], ["b"]),
             helper.make_node("Add", ["a", "b"], ["y"]), helper.make_node("Exp", ["x"], ["dead"])]
    g = modelc.from_onnx(onnx_model(nodes, [_vi("x", [4])], [_vi("y", [4])]))
    opt = passes.optimize(g, fuse_ops=False, verify=True)
    assert [n.op_type for n in opt.topo()] == ["Relu", "Add"]
    x = np.array([-1, 0, 1, 2], np.float32)
    np.testing.assert_array_equal(reference.run(opt, {"x": x})["y"], 2 * np.maximum(x, 0))


def test_identity_before_graph_output_keeps_the_output_name():
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Identity", ["a"], ["y"])]
    g = modelc.from_onnx(onnx_model(nodes, [_vi("x", [4])], [_vi("y", [4])]))
    opt = passes.optimize(g, fuse_ops=False, verify=True)
    assert opt.outputs == ["y"] and [n.op_type for n in opt.topo()] == ["Relu"]


@pytest.mark.parametrize("pads,dropped", [([0, 0, 0, 0], True), ([0, 1, 0, -1], False), ([0, 0, 1, 0], False)])
def test_a_pad_by_zeros_is_dropped(pads, dropped):
    """Swin pads its maps to whole windows, by nothing at 224 x 224: a copy of each map per block.
    A pad that crops one side and pads the other keeps the shape but moves the values: it stays."""
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Pad", ["a", "pads"], ["p"]),
             helper.make_node("Exp", ["p"], ["y"])]
    g = modelc.from_onnx(onnx_model(nodes, [_vi("x", [3, 5])], [_vi("y", None)],
                                    [_const("pads", np.array(pads, np.int64))]))
    opt = passes.optimize(g, fuse_ops=False, verify=True)
    assert ("Pad" not in opt.op_counts()) == dropped
    feeds = _feeds(g)
    _assert_close(reference.run(opt, feeds), reference.run(g, feeds))


@pytest.mark.parametrize("shape,perm,reshape", [
    ([1, 7, 8], [1, 0, 2], True), ([7, 1, 8], None, False), ([7, 1, 1, 8], [2, 0, 1, 3], True),
    ([1, 7, 8], [0, 2, 1], False), ([7, 1, 8, 1], [3, 0, 1, 2], True), ([2, 1, 3], [2, 1, 0], False)])
def test_a_transpose_moving_only_axes_of_length_1_is_a_reshape(shape, perm, reshape):
    """torch's sequence-first attention at batch 1 transposes 1 x 197 x 768 to 197 x 1 x 768 before
    each projection: the elements stay in order, so it is a view, not a copy kernel."""
    attrs = {} if perm is None else {"perm": perm}
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Transpose", ["a"], ["t"], **attrs),
             helper.make_node("Exp", ["t"], ["y"])]
    g = modelc.from_onnx(onnx_model(nodes, [_vi("x", shape)], [_vi("y", None)]))
    opt = passes.optimize(g, fuse_ops=False, verify=True)
    assert ("Transpose" not in opt.op_counts()) == reshape
    feeds = _feeds(g)
    want = reference.run(g, feeds)
    _assert_close(reference.run(opt, feeds), want)
    _assert_close(modelc.compile(g).run(feeds), want)


@pytest.mark.parametrize("equation,a,b", [
    ("bhid,bhjd->bhij", (2, 3, 5, 4), (2, 3, 6, 4)), ("bhij,bhjd->bhid", (2, 3, 5, 6), (2, 3, 6, 4)),
    ("ik,jk->ij", (5, 4), (6, 4)), ("bij,jk->bik", (2, 5, 4), (4, 3)), ("bi,bj->bij", (3, 5), (3, 4)),
    ("ij,ij->i", (5, 4), (5, 4)), ("...ij,...jk->...ki", (2, 5, 4), (2, 4, 3)), ("ij,jk->", (3, 4), (4, 2))])
def test_einsum_becomes_matmul_where_it_can(equation, a, b):
    g = modelc.from_onnx(onnx_model([helper.make_node("Einsum", ["a", "b"], ["y"], equation=equation)],
                                     [_vi("a", list(a)), _vi("b", list(b))],
                                     [_vi("y", list(np.einsum(equation, np.ones(a), np.ones(b)).shape))], opset=12))
    opt = passes.optimize(g, fuse_ops=False, verify=True)
    lowered = "Einsum" not in opt.op_counts()
    assert lowered == (equation != "ij,jk->")          # a label summed within one operand stays
    feeds = _feeds(g)
    _assert_close(reference.run(opt, feeds), reference.run(g, feeds))



@pytest.mark.parametrize("x,k,d,s,pads,kept,new_pads", [
    ([1, 8, 14, 14], [3, 3], [24, 24], [1, 1], [24, 24, 24, 24], [1, 1], [0, 0, 0, 0]),   # ASPP: the centre
    ([1, 8, 14, 14], [3, 3], [12, 12], [1, 1], [12, 12, 12, 12], [3, 3], [12, 12, 12, 12]),  # all reach in
    ([1, 8, 14, 14], [3, 3], [16, 1], [1, 1], [16, 1, 16, 1], [1, 3], [0, 1, 0, 1]),      # one axis
    ([1, 8, 6, 6], [3, 3], [4, 1], [2, 1], [9, 0, 1, 0], [2, 3], [5, 0, 1, 0]),          # stride, uneven pads
    ([1, 4, 9], [5], [3], [1], [10, 2], [4], [7, 2]),                                     # 1-d
    ([1, 4, 2], [3], [2], [1], [3, 0], [2], [1, 0]),             # cut no further than the pad covers
    ([1, 4, 3, 5, 5], [3, 3, 3], [5, 1, 1], [1, 1, 1], [5, 1, 1, 5, 1, 1], [1, 3, 3], [0, 1, 1, 0, 1, 1]),
])
def test_filter_taps_that_only_read_padding_are_cut(x, k, d, s, pads, kept, new_pads):
    """Taps whose every read falls in the padding are dropped with the pads they cover (DeepLabV3's
    ASPP on a 14x14 map: 3x3 taps 24 apart become a 1x1 conv); the outputs stay the same."""
    rng = np.random.default_rng(7)
    inits = [_const("w", rng.standard_normal([6, x[1]] + k).astype(np.float32)),
             _const("b", rng.standard_normal(6).astype(np.float32))]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["y"], dilations=d, strides=s, pads=pads)]
    n = len(k)
    y = x[:1] + [6] + [(x[2 + i] + pads[i] + pads[n + i] - d[i] * (k[i] - 1) - 1) // s[i] + 1 for i in range(n)]
    model = onnx_model(nodes, [_vi("x", x)], [_vi("y", y)], inits)
    g = modelc.from_onnx(model)
    opt = passes.prune_dead_taps(passes.canonicalize(g.copy()))     # (3-d: before convs_as_2d)
    opt.verify()
    (conv,) = opt.topo()
    assert list(opt.tensors[conv.inputs[1]].shape[2:]) == kept == conv.attrs["kernel_shape"]
    assert conv.attrs["pads"] == new_pads
    assert all(dd == 1 for dd, kk in zip(conv.attrs["dilations"], kept) if kk == 1)
    assert opt.tensors[conv.outputs[0]].shape == g.tensors["y"].shape
    feeds = _feeds(g)
    want = reference.run(g, feeds)
    _assert_close(reference.run(opt, feeds), want)
    _assert_close({"y": modelc.compile(model)(feeds["x"])}, want)


@pytest.mark.parametrize("op,axes,keepdims,opset,want", [
    ("ReduceMean", [2, 3], 1, 13, "GlobalAveragePool"),
    ("ReduceMean", [-1, -2], 1, 18, "GlobalAveragePool"),
    ("ReduceMax", [3, 2], 1, 18, "GlobalMaxPool"),
    ("ReduceMean", [2, 3], 0, 13, "GlobalAveragePool Reshape"),
    ("ReduceMean", [1, 2], 1, 18, "ReduceMean"),
])
def test_a_mean_over_an_images_spatial_axes_is_a_global_pool(op, axes, keepdims, opset, want):
    """The dynamo exporter writes adaptive average pooling (every squeeze-excitation block) as
    ReduceMean over axes 2 and 3: it becomes the global pool, which runs in the blocked layout."""
    inits = [_const("axes", np.array(axes, np.int64))] if opset >= 18 else []
    kw = {} if opset >= 18 else {"axes": axes}
    node = helper.make_node(op, ["x", "axes"] if opset >= 18 else ["x"], ["y"], keepdims=keepdims, **kw)
    shape = [2, 8, 5, 6]
    reduced = [a % 4 for a in axes]
    out = [1 if i in reduced else s for i, s in enumerate(shape) if keepdims or i not in reduced]
    g = modelc.from_onnx(onnx_model([node], [_vi("x", shape)], [_vi("y", out)], inits, opset=opset))
    opt = passes.optimize(g, fuse_ops=False, verify=True)
    assert [n.op_type for n in opt.topo()] == want.split()
    feeds = _feeds(g)
    _assert_close(reference.run(opt, feeds), reference.run(g, feeds))


def test_squeeze_excitation_of_a_dynamo_export_stays_blocked():
    """conv -> ReduceMean(2, 3) -> 1x1 convs -> gate x feature map, as the dynamo exporter writes
    EfficientNet's blocks: no layout transform but the model's input and output."""
    rng = np.random.default_rng(5)
    inits = [_const("w0", rng.standard_normal((32, 16, 3, 3)).astype(np.float32)),
             _const("w1", rng.standard_normal((8, 32, 1, 1)).astype(np.float32)),
             _const("w2", rng.standard_normal((32, 8, 1, 1)).astype(np.float32)),
             _const("w3", rng.standard_normal((16, 32, 1, 1)).astype(np.float32)),
             _const("axes", np.array([2, 3], np.int64))]
    nodes = [helper.make_node("Conv", ["x", "w0"], ["a"], pads=[1, 1, 1, 1]),
             helper.make_node("ReduceMean", ["a", "axes"], ["m"], keepdims=1),
             helper.make_node("Conv", ["m", "w1"], ["s1"]), helper.make_node("Relu", ["s1"], ["s1r"]),
             helper.make_node("Conv", ["s1r", "w2"], ["s2"]), helper.make_node("Sigmoid", ["s2"], ["gate"]),
             helper.make_node("Mul", ["a", "gate"], ["g"]), helper.make_node("Conv", ["g", "w3"], ["y"])]
    model = onnx_model(nodes, [_vi("x", [1, 16, 12, 12])], [_vi("y", [1, 16, 12, 12])], inits, opset=18)
    mod = modelc.compile(model)
    assert [s["pattern"] for s in mod.program["steps"]].count("layout_transform") == 2
    x = np.random.default_rng(1).standard_normal((1, 16, 12, 12)).astype(np.float32)
    want = reference.run(modelc.from_onnx(model), {"x": x})["y"]
    assert np.abs(mod(x) - want).max() <= 1e-4 * np.abs(want).max()


@pytest.mark.parametrize("opset,split", [(11, [3, 5]), (13, [6, 2]), (18, None)])
def test_split_becomes_one_slice_per_output(opset, split):
    """Each Slice is a one-output injective op that fuses with its readers (ShuffleNetV2's dynamo
    export: no layout transform for the half that goes on to a conv)."""
    inits, kw, ins = [], {}, ["x"]
    if split is not None and opset >= 13:
        inits, ins = [_const("split", np.array(split, np.int64))], ["x", "split"]
    elif split is not None:
        kw["split"] = split
    else:
        kw["num_outputs"] = 2
    sizes = split or [4, 4]
    node = helper.make_node("Split", ins, ["a", "b"], axis=1, **kw)
    outs = [_vi("a", [2, sizes[0], 3]), _vi("b", [2, sizes[1], 3])]
    g = modelc.from_onnx(onnx_model([node], [_vi("x", [2, 8, 3])], outs, inits, opset=opset))
    opt = passes.optimize(g, fuse_ops=False, verify=True)
    assert [n.op_type for n in opt.topo()] == ["Slice", "Slice"]
    feeds = _feeds(g)
    _assert_close(reference.run(opt, feeds), reference.run(g, feeds))


def test_convs_over_one_pixel_become_dense_layers():
    """A squeeze-excitation block's 1x1 convs on the pooled 1x1 map, and a fully connected layer
    written as a conv whose window is its whole input (VGG-style): Dense layers, their activations
    on [N, K] so they stay epilogues, and no reshape between two of them; a padded 3x3 conv over one
    pixel too, once its taps that read only padding are cut. A grouped one stays a conv."""
    rng = np.random.default_rng(6)
    inits = [_const("w1", rng.standard_normal((8, 32, 1, 1)).astype(np.float32)),
             _const("b1", rng.standard_normal(8).astype(np.float32)),
             _const("w2", rng.standard_normal((32, 8, 1, 1)).astype(np.float32)),
             _const("wg", rng.standard_normal((32, 4, 1, 1)).astype(np.float32)),
             _const("wp", rng.standard_normal((32, 32, 3, 3)).astype(np.float32)),
             _const("wf", rng.standard_normal((10, 32, 5, 5)).astype(np.float32))]
    nodes = [helper.make_node("GlobalAveragePool", ["x"], ["m"]),
             helper.make_node("Conv", ["m", "w1", "b1"], ["s1"]), helper.make_node("Relu", ["s1"], ["s1r"]),
             helper.make_node("Conv", ["s1r", "w2"], ["s2"]), helper.make_node("HardSigmoid", ["s2"], ["gate"]),
             helper.make_node("Conv", ["gate", "wg"], ["grp"], group=8),
             helper.make_node("Conv", ["grp", "wp"], ["pad"], pads=[1, 1, 1, 1]),
             helper.make_node("Mul", ["x", "pad"], ["g"]),
             helper.make_node("Conv", ["g", "wf"], ["y"])]
    g = modelc.from_onnx(onnx_model(nodes, [_vi("x", [2, 32, 5, 5])], [_vi("y", [2, 10, 1, 1])], inits))
    opt = passes.optimize(g, fuse_ops=False, verify=True)
    ops = [n.op_type for n in opt.topo()]
    assert ops.count("Dense") == 4 and ops.count("Conv") == 1, ops
    d1, d2 = [n for n in opt.topo() if n.op_type == "Dense"][:2]
    assert opt.producer(d2.inputs[0]).op_type == "Relu" and opt.producer(opt.producer(d2.inputs[0]).inputs[0]) is d1
    feeds = _feeds(g)
    _assert_close(reference.run(opt, feeds), reference.run(g, feeds))
    fused = passes.optimize(g)
    assert all(n.op_type != "Relu" for n in fused.topo())       # the ReLU is the dense kernel's epilogue


def test_silu_between_two_one_pixel_convs_stays_on_the_dense_rows():
    """TorchScript's SiLU is x * sigmoid(x): both read the conv's output, and both move to [N, K]."""
    rng = np.random.default_rng(7)
    inits = [_const("w1", rng.standard_normal((8, 32, 1, 1)).astype(np.float32)),
             _const("w2", rng.standard_normal((32, 8, 1, 1)).astype(np.float32))]
    nodes = [helper.make_node("GlobalAveragePool", ["x"], ["m"]),
             helper.make_node("Conv", ["m", "w1"], ["s1"]), helper.make_node("Sigmoid", ["s1"], ["sg"]),
             helper.make_node("Mul", ["s1", "sg"], ["silu"]),
             helper.make_node("Conv", ["silu", "w2"], ["s2"]), helper.make_node("Sigmoid", ["s2"], ["gate"]),
             helper.make_node("Mul", ["x", "gate"], ["y"])]
    g = modelc.from_onnx(onnx_model(nodes, [_vi("x", [1, 32, 5, 5])], [_vi("y", [1, 32, 5, 5])], inits))
    opt = passes.optimize(g, fuse_ops=False, verify=True)
    d1, d2 = [n for n in opt.topo() if n.op_type == "Dense"]
    assert len(opt.tensors[d2.inputs[0]].shape) == 2                 # no reshape between the two
    feeds = _feeds(g)
    _assert_close(reference.run(opt, feeds), reference.run(g, feeds))


def _fused(nodes, inputs, outputs, inits=()):
    g = modelc.from_onnx(onnx_model(nodes, inputs, outputs, list(inits), opset=17))
    opt = passes.optimize(g, verify=True)
    feeds = _feeds(g)
    _assert_close(reference.run(opt, feeds), reference.run(g, feeds))
    return g, [n for n in opt.topo()]


def test_an_elementwise_diamond_closes_into_one_group():
    """A value read twice ends a single-consumer chain; the chains meet again, so (as TVM's
    dominator-based fusion does) the whole diamond is one kernel: a GRU-style gate mix."""
    nodes = [helper.make_node("Sigmoid", ["x"], ["z"]),
             helper.make_node("Tanh", ["y"], ["n"]),
             helper.make_node("Sub", ["one", "z"], ["zc"]),
             helper.make_node("Mul", ["zc", "n"], ["a"]),
             helper.make_node("Mul", ["z", "h"], ["b"]),
             helper.make_node("Add", ["a", "b"], ["out"])]
    g, fused = _fused(nodes, [_vi("x", [2, 16]), _vi("y", [2, 16]), _vi("h", [2, 16])], [_vi("out", [2, 16])],
                      [_const("one", np.float32(1))])
    assert len(fused) == 1 and fused[0].outputs == ["out"]


def _conv_diamond(extra_reader=False):
    """Conv -> y; y * tanh(softplus(y)) with a Neg between (a near-Mish no pattern names); with
    `extra_reader`, y is a graph output too."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["y"], pads=[1, 1, 1, 1]),
             helper.make_node("Softplus", ["y"], ["sp"]),
             helper.make_node("Neg", ["sp"], ["ng"]),
             helper.make_node("Tanh", ["ng"], ["t"]),
             helper.make_node("Mul", ["y", "t"], ["out"])]
    outputs = [_vi("out", [1, 16, 8, 8])] + ([_vi("y", [1, 16, 8, 8])] if extra_reader else [])
    return _fused(nodes, [_vi("x", [1, 8, 8, 8])], outputs,
                  [_const("w", rng.standard_normal((16, 8, 3, 3)).astype(np.float32)),
                   _const("b", rng.standard_normal(16).astype(np.float32))])


def test_a_diamond_after_a_conv_becomes_its_epilogue():
    """A conv's value read twice (x * f(x)) ends its chain of epilogue ops; the elementwise group that
    reads it (and nothing else does) joins the conv's group: one kernel, no pass over x of its own."""
    g, fused = _conv_diamond()
    assert len(fused) == 1 and fused[0].outputs == ["out"]
    assert sorted(fused[0].subgraph.op_counts()) == ["Conv", "Mul", "Neg", "Softplus", "Tanh"]
    mod = modelc.compile(g)
    steps = [s["pattern"] for s in mod.program["steps"]]
    assert not mod.fallbacks and "conv2d_bias_softplus_neg_tanh_mul" in steps, steps
    feeds = _feeds(g)
    _assert_close(mod.run(feeds), reference.run(g, feeds))


def test_a_conv_value_also_returned_keeps_its_own_group():
    g, fused = _conv_diamond(extra_reader=True)
    assert len(fused) == 2


@pytest.mark.parametrize("conv_first", [True, False])
def test_elementwise_ops_on_a_residual_run_in_the_conv_epilogue_that_reads_them(conv_first):
    """A residual dequantized on its way to the add (r * scale + shift, read only by the conv's
    epilogue) joins the conv's group after the conv, whichever group fusion grew first (the conv's,
    leaving r's ops a group of their own; or r's, reaching the add): one kernel, the conv its anchor,
    no pass over r of its own; not where r's result is also returned."""
    rng = np.random.default_rng(0)
    inits = [_const("w", rng.standard_normal((16, 8, 3, 3)).astype(np.float32)),
             _const("s", np.float32(0.5)), _const("t", np.float32(-3.0))]
    nodes = [helper.make_node("Mul", ["r", "s"], ["rs"]),
             helper.make_node("Add", ["rs", "t"], ["rd"]),
             helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["y", "rd"], ["out"]),
             helper.make_node("Relu", ["out"], ["z"])]
    if conv_first:
        nodes = nodes[2:3] + nodes[:2] + nodes[3:]
    inputs = [_vi("x", [1, 8, 8, 8]), _vi("r", [1, 16, 8, 8])]
    g, fused = _fused(nodes, inputs, [_vi("z", [1, 16, 8, 8])], inits)
    assert len(fused) == 1 and sorted(fused[0].subgraph.op_counts()) == ["Add", "Conv", "Mul", "Relu"]
    mod = modelc.compile(g)
    steps = [(s["pattern"], s["template"]) for s in mod.program["steps"]]
    assert not mod.fallbacks and ("conv2d_mul_add_add_relu", "conv2d") in steps, steps
    feeds = _feeds(g)
    _assert_close(mod.run(feeds), reference.run(g, feeds))
    _, fused = _fused(nodes, inputs, [_vi("z", [1, 16, 8, 8]), _vi("rd", [1, 16, 8, 8])], inits)
    assert len(fused) == 2


def test_a_value_also_read_elsewhere_stays_an_output_of_the_merged_group():
    """An LSTM cell: the new cell state is both the next step's input (a graph output here) and
    read by the hidden state's ops; one group computes both, storing both from one loop."""
    nodes = [helper.make_node("Sigmoid", ["f"], ["fs"]),
             helper.make_node("Mul", ["fs", "c"], ["kept"]),
             helper.make_node("Tanh", ["g"], ["gt"]),
             helper.make_node("Add", ["kept", "gt"], ["c_new"]),
             helper.make_node("Tanh", ["c_new"], ["ct"]),
             helper.make_node("Sigmoid", ["o"], ["os"]),
             helper.make_node("Mul", ["os", "ct"], ["h_new"])]
    g, fused = _fused(nodes, [_vi(n, [1, 32]) for n in ("f", "c", "g", "o")],
                      [_vi("c_new", [1, 32]), _vi("h_new", [1, 32])])
    assert len(fused) == 1 and sorted(fused[0].outputs) == ["c_new", "h_new"]
    mod = modelc.compile(g)
    assert not mod.fallbacks
    feeds = _feeds(g)
    _assert_close(mod.run(feeds), reference.run(g, feeds))


def test_the_parts_of_a_concat_join_it():
    """A part of a Concat (or Pad) of the loop's size is read once per element, not broadcast:
    torch.roll's two slices and their concat, on each of two axes (Swin's shifted windows), are
    one kernel, and so are strided slices concatenated along channels (Swin's patch merging)."""
    def sl(x, y, start, end, axis, step=1):
        names = [f"{y}_{k}" for k in "seap"]
        return ([helper.make_node("Slice", [x, *names], [y])],
                [_const(n, np.array([v], np.int64)) for n, v in zip(names, (start, end, axis, step))])
    nodes, consts = [], []
    for x, y, axis in (("x", "r1", 1), ("r1", "r2", 2)):       # roll by 3 along axes 1 and 2
        for part, (a, b) in (("a", (-3, 1 << 30)), ("b", (0, -3))):
            n, c = sl(x, f"{y}{part}", a, b, axis)
            nodes += n
            consts += c
        nodes.append(helper.make_node("Concat", [f"{y}a", f"{y}b"], [y], axis=axis))
    for k, (h, w) in enumerate(((0, 0), (1, 0), (0, 1), (1, 1))):             # x[:, h::2, w::2, :]
        n1, c1 = sl("r2", f"h{k}", h, 1 << 30, 1, 2)
        n2, c2 = sl(f"h{k}", f"m{k}", w, 1 << 30, 2, 2)
        nodes += n1 + n2
        consts += c1 + c2
    nodes.append(helper.make_node("Concat", [f"m{k}" for k in range(4)], ["out"], axis=3))
    g, fused = _fused(nodes, [_vi("x", [1, 8, 8, 16])], [_vi("out", [1, 4, 4, 64])], consts)
    assert len(fused) <= 2, [n.subgraph.op_counts() for n in fused]
    mod = modelc.compile(g)
    assert not mod.fallbacks
    feeds = _feeds(g)
    _assert_close(mod.run(feeds), reference.run(g, feeds))


def test_a_value_read_broadcast_or_of_another_shape_is_not_merged():
    """A [1, 16] gate broadcast over [8, 16] would be recomputed for every row, so it does not join
    that reader; it may join its reader of its own shape (the Relu), storing both from one loop."""
    nodes = [helper.make_node("Sigmoid", ["s"], ["gate"]),
             helper.make_node("Tanh", ["gate"], ["t"]),
             helper.make_node("Mul", ["x", "t"], ["out"]),
             helper.make_node("Relu", ["gate"], ["r"])]
    g, fused = _fused(nodes, [_vi("s", [1, 16]), _vi("x", [8, 16])], [_vi("out", [8, 16]), _vi("r", [1, 16])])
    by_output = {o: n for n in fused for o in n.outputs}
    assert "Sigmoid" not in by_output["out"].subgraph.op_counts()
    assert sorted(by_output["r"].outputs) == ["gate", "r"]
