"""The injective template: data movement and elementwise chains, compiled end to end."""
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import modelc
from workloads import onnx_model


def _model(nodes, x_shape, inits=(), opset=17):
    return onnx_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits, opset, ir_version=8)


def _c(name, v, dt=np.int64):
    return numpy_helper.from_array(np.asarray(v, dt), name)


CASES = {
    "transpose_reshape": ([helper.make_node("Transpose", ["x"], ["t"], perm=[0, 2, 1, 3]),
                           helper.make_node("Reshape", ["t", "s"], ["y"])], [2, 3, 4, 5], [_c("s", [2, 4, 15])]),
    "concat_slice_neg_step": ([helper.make_node("Concat", ["x", "x"], ["c"], axis=1),
                               helper.make_node("Slice", ["c", "st", "en", "ax", "sp"], ["y"])], [2, 5, 3],
                              [_c("st", [7]), _c("en", [0]), _c("ax", [1]), _c("sp", [-2])]),
    "pad_gather_exp": ([helper.make_node("Pad", ["x", "pads", "v"], ["p"]),
                        helper.make_node("Gather", ["p", "idx"], ["g"], axis=1),
                        helper.make_node("Exp", ["g"], ["y"])], [2, 4],
                       [_c("pads", [0, 1, 1, 2]), _c("v", 0.5, np.float32), _c("idx", [[0, 3], [-1, 2]])]),
    "expand_mul_sigmoid": ([helper.make_node("Expand", ["x", "shp"], ["e"]),
                            helper.make_node("Mul", ["e", "k"], ["m"]),
                            helper.make_node("Sigmoid", ["m"], ["y"])], [3, 1],
                           [_c("shp", [2, 3, 4]), _c("k", np.linspace(-2, 2, 4), np.float32)]),
    "channel_shuffle": ([helper.make_node("Reshape", ["x", "s1"], ["r"]),
                         helper.make_node("Transpose", ["r"], ["t"], perm=[0, 2, 1, 3, 4]),
                         helper.make_node("Reshape", ["t", "s2"], ["y"])], [1, 12, 3, 5],
                        [_c("s1", [1, 2, 6, 3, 5]), _c("s2", [1, 12, 3, 5])]),
    "reshape_merge_split_middle": ([helper.make_node("Reshape", ["x", "s1"], ["r"]),
                                    helper.make_node("Unsqueeze", ["r", "ax"], ["u"]),
                                    helper.make_node("Reshape", ["u", "s2"], ["y"])], [2, 6, 4, 3],
                                   [_c("s1", [2, 4, 6, 3]), _c("ax", [1]), _c("s2", [2, 3, 8, 3])]),
    "split_add": ([helper.make_node("Split", ["x"], ["a", "b"], axis=2, num_outputs=2),
                   helper.make_node("Add", ["a", "b"], ["y"])], [2, 3, 8], []),
    "erf_gelu_chain": ([helper.make_node("Div", ["x", "r2"], ["d"]), helper.make_node("Erf", ["d"], ["e"]),
                        helper.make_node("Add", ["e", "one"], ["a"]), helper.make_node("Mul", ["x", "a"], ["m"]),
                        helper.make_node("Mul", ["m", "half"], ["y"])], [4, 33],
                       [_c("r2", np.sqrt(2), np.float32), _c("one", 1.0, np.float32), _c("half", 0.5, np.float32)]),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_injective_group_matches_reference(name):
    nodes, shape, inits = CASES[name]
    m = _model(nodes, shape, inits, opset=18)
    mod = modelc.compile(m)
    assert not mod.fallbacks
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    want = modelc.reference.run(modelc.from_onnx(m), {"x": x})["y"]
    got = mod(x)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_division_by_zero_gives_inf_as_onnx_says():
    nodes = [helper.make_node("Div", ["x", "d"], ["y"])]
    m = _model(nodes, [4], [_c("d", [0.0, 0.0, 0.0, 4.0], np.float32)])
    with np.errstate(divide="ignore", invalid="ignore"):
        y = modelc.compile(m)(np.array([1, -1, 0, 2], np.float32))
    assert y[0] == np.inf and y[1] == -np.inf and np.isnan(y[2]) and y[3] == 0.5


@pytest.mark.parametrize("shape,layout,items", [
    ((1, 3, 40, 24), [3, 1], 40),           # an image into a 3-lane block: an item per row
    ((2, 8, 5, 7), [4, 0], 2 * 2 * 5),      # short rows of 4-lane blocks
    ((2, 16, 5, 7), [8, 0], 2 * 2 * 5),      # a vector's worth of lanes from plain rows: a row, lane by lane
    ((1, 4, 2, 2), [4, 1], 2 * 2),          # too few rows to share: an item per pixel
])
def test_layout_transform_items_are_rows_when_the_block_is_narrow(shape, layout, items):
    from dataclasses import replace

    from modelc import target
    from modelc.kernels import cache, testing
    from modelc.kernels.template import get
    from modelc.kernels.workload import Workload
    wl = Workload({"version": 1, "inputs": [{"shape": list(shape), "dtype": "float32", "const": False}],
                   "ops": [{"op": "Identity", "attrs": {}, "args": ["i0"]}], "params": {},
                   "outputs": [{"shape": list(shape), "dtype": "float32", "value": "v0", "layout": layout}]})
    tpl = get("injective")
    with target.use(replace(target.current(), threads=2)):      # the rule counts rows per thread
        k = tpl.build(wl, tpl.space(wl).get(0))
    assert cache.load(k.source).n_items == items
    got, want, *_ = testing.run(wl, tpl, tpl.space(wl).get(0))
    assert testing.max_rel_error(got, want) == 0


def test_a_channel_concat_of_whole_blocks_runs_a_loop_per_part():
    """DenseNet's concat + BN + ReLU: one loop over each part's blocks, reading that part alone,
    whatever the part's layout."""
    from modelc.kernels import testing
    from modelc.kernels.template import get
    from modelc.kernels.workload import Workload

    def wl(after):
        parts = [{"shape": [1, c, 3, 4], "dtype": "float32", "const": False, "layout": [8, 0]} for c in (16, 8, 24)]
        ops = [{"op": "Concat", "attrs": {"axis": 1}, "args": ["i0", "i1", "i2"]},
               {"op": "Mul", "attrs": {}, "args": ["v0", "i3"]},
               {"op": after, "attrs": {}, "args": ["v1"]}]
        return Workload({"version": 1, "ops": ops, "params": {},
                         "inputs": parts + [{"shape": [1, 48, 1, 1], "dtype": "float32", "const": True}],
                         "outputs": [{"shape": [1, 48, 3, 4], "dtype": "float32", "value": "v2", "layout": [8, 0]}]})
    tpl = get("injective")
    for after, loops in (("Relu", 3), ("Identity", 3)):
        w = wl(after)
        k = tpl.build(w, tpl.space(w).get(0))
        assert k.source.count("for it in range(") == loops
        got, want, *_ = testing.run(w, tpl, tpl.space(w).get(0))
        assert testing.max_rel_error(got, want) == 0
    w = wl("Relu")
    w.inputs[1].layout = None                   # a part in plain rows: still whole blocks of the output
    got, want, *_ = testing.run(w, tpl, tpl.space(w).get(0))
    assert testing.max_rel_error(got, want) == 0


def test_reshape_groups_pair_the_shortest_runs_of_equal_counts():
    from modelc.kernels.index_map import reshape_groups
    assert reshape_groups([1, 197, 1, 3, 768], [197, 1, 2304]) == [([0, 1], [0]), ([2], [1]), ([3, 4], [2])]
    assert reshape_groups((197, 1, 2304), (1, 197, 1, 3, 768)) == [([0], [0, 1]), ([1], [2]), ([2], [3, 4])]
    assert reshape_groups([6, 4], [4, 6]) == [([0, 1], [0, 1])]
    assert reshape_groups([5], [5, 1, 1]) == [([0], [0, 1, 2])]
    assert reshape_groups([2, 0], [0]) is None and reshape_groups([2, 3], [7]) is None


@pytest.mark.parametrize("src,mid,perm,dst", [
    ([197, 1, 2304], [1, 197, 1, 3, 768], [3, 1, 2, 0, 4], [3, 197, 1, 768]),   # ViT-B/16's QKV split
    ([4, 6, 10], [4, 2, 3, 2, 5], [0, 3, 1, 4, 2], [8, 10, 1, 3]),
    ([1, 12, 5], [1, 3, 4, 5], [0, 2, 1, 3], [1, 1, 60]),
    ([6, 1, 4], [2, 3, 4, 1], [3, 0, 2, 1], [8, 3])])
def test_reshape_transpose_reshape_reads_group_by_group(src, mid, perm, dst):
    """A reshape re-linearises only the axes it splits or merges: the QKV split reads a row of
    768 contiguously, no division per element (it divided every element by 2304: 3.2x
    onnxruntime's time in ViT-B/16); any such chain agrees with numpy."""
    m = _model([helper.make_node("Reshape", ["x", "a"], ["r"]), helper.make_node("Transpose", ["r"], ["t"], perm=perm),
                helper.make_node("Reshape", ["t", "b"], ["y"])], src, [_c("a", mid), _c("b", dst)])
    mod = modelc.compile(m)
    x = np.random.default_rng(0).standard_normal(src).astype(np.float32)
    np.testing.assert_array_equal(mod(x), x.reshape(mid).transpose(perm).reshape(dst))
    if src == [197, 1, 2304]:
        from modelc.kernels.template import get
        from modelc.kernels.workload import Workload
        (step,) = [s for s in mod.program["steps"] if s["template"] == "injective"]
        wl = Workload(step["workload"])
        kernel = get("injective").build(wl, get("injective").default_config(wl, get("injective").space(wl)))
        assert "//" not in kernel.source.split("for a3 in range(768):")[1]
