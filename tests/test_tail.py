"""The data-dependent tail: nodes whose shapes the data decides (box filtering) run on ONNX's
reference evaluator after the compiled part, and agree with onnxruntime."""
import threading

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import modelc
from modelc import reference
from modelc.errors import ModelcError
from modelc.runtime import load
from modelc.runtime.tail import FAST_OPS

RNG = np.random.default_rng(0)
pytestmark = pytest.mark.filterwarnings("ignore:onnx.checker rejects")


def _vi(name, shape, et=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, et, shape)


def _ort(m, feeds):
    s = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    return s.run(None, feeds)


def detector(n_anchors=64, classes=3, threshold=0.7, opset=13):
    """A conv head scoring anchors, then what torchvision's exports do with the scores: a score
    threshold (NonZero), NMS over the survivors, the kept boxes gathered, and a TopK of as many
    boxes as survived (a count the data decides)."""
    w = (RNG.standard_normal((classes + 4, 8, 3, 3)) * 0.3).astype(np.float32)
    anchors = np.sort(RNG.random((n_anchors, 2, 2)) * 20, axis=1).reshape(n_anchors, 4).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["feat"], pads=[1, 1, 1, 1]),
        helper.make_node("Reshape", ["feat", "flat"], ["f2"]),          # [C+4, n]
        helper.make_node("Transpose", ["f2"], ["f3"], perm=[1, 0]),     # [n, C+4]
        helper.make_node("Slice", ["f3", "s0", "s1", "ax1"], ["logits"]),
        helper.make_node("Slice", ["f3", "s1", "s2", "ax1"], ["deltas"]),
        helper.make_node("Sigmoid", ["logits"], ["probs"]),             # [n, C]
        helper.make_node("Add", ["anchors", "deltas"], ["boxes2"]),     # [n, 4]
        helper.make_node("ReduceMax", ["probs"], ["best"], axes=[1], keepdims=0),
        helper.make_node("Greater", ["best", "thr"], ["keep"]),
        helper.make_node("NonZero", ["keep"], ["nz"], name="filter_scores"),
        _axes0("Squeeze", "nz", "idx", opset),
        helper.make_node("Gather", ["boxes2", "idx"], ["kb"], axis=0),
        helper.make_node("Gather", ["probs", "idx"], ["kp"], axis=0),
        _axes0("Unsqueeze", "kb", "kb3", opset),
        helper.make_node("Transpose", ["kp"], ["kpt"], perm=[1, 0]),
        _axes0("Unsqueeze", "kpt", "kp3", opset),
        helper.make_node("NonMaxSuppression", ["kb3", "kp3", "maxout", "iou", "thr"], ["sel"], name="nms"),
        helper.make_node("Gather", ["sel", "two"], ["bi"], axis=1),
        helper.make_node("Gather", ["kb", "bi"], ["boxes"], axis=0),
        helper.make_node("Shape", ["bi"], ["nsel"]),
        helper.make_node("Gather", ["sel", "one"], ["cls"], axis=1),
        helper.make_node("Cast", ["cls"], ["clsf"], to=TensorProto.FLOAT),
        helper.make_node("TopK", ["clsf", "nsel"], ["top", "topi"]),
        helper.make_node("ReduceMax", ["feat"], ["energy"], axes=[0, 2, 3], keepdims=0),
    ]
    side = int(np.sqrt(n_anchors))
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(anchors, "anchors"),
             numpy_helper.from_array(np.array([classes + 4, -1], np.int64), "flat"),
             numpy_helper.from_array(np.array([0], np.int64), "s0"),
             numpy_helper.from_array(np.array([classes], np.int64), "s1"),
             numpy_helper.from_array(np.array([classes + 4], np.int64), "s2"),
             numpy_helper.from_array(np.array([1], np.int64), "ax1"),
             numpy_helper.from_array(np.float32(threshold), "thr"),
             numpy_helper.from_array(np.array([0], np.int64), "zero1"),
             numpy_helper.from_array(np.array([40], np.int64), "maxout"),
             numpy_helper.from_array(np.array([0.2], np.float32), "iou"),
             numpy_helper.from_array(np.int64(2), "two"), numpy_helper.from_array(np.int64(1), "one")]
    outs = [_vi("boxes", None), _vi("top", None), helper.make_tensor_value_info("sel", TensorProto.INT64, None),
            _vi("energy", [classes + 4])]
    g = helper.make_graph(nodes, "detector", [_vi("x", [1, 8, side, side])], outs, inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)]), side


def _axes0(op, x, y, opset):
    """Squeeze or Unsqueeze of axis 0, in the form of the opset (an attribute before 13)."""
    if opset >= 13:
        return helper.make_node(op, [x, "zero1"], [y])
    return helper.make_node(op, [x], [y], axes=[0])


def _same(got: dict, want: list, names):
    for n, w in zip(names, want):
        g = got[n]
        assert g.shape == w.shape and g.dtype == w.dtype, (n, g.shape, w.shape)
        if w.size:
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5 * max(float(np.abs(w).max()), 1))


@pytest.mark.parametrize("opset", [10, 13])
def test_a_detector_compiles_its_backbone_and_filters_boxes_on_the_evaluator(tmp_path, opset):
    """At opset 10 (the old zoo's: TopK's count as an input, axes as attributes) and 13."""
    m, side = detector(opset=opset)
    mod = modelc.compile(m)
    assert mod.tail is not None and mod.program["steps"], "the conv head is compiled, the filtering is not"
    assert [o["name"] for o in mod.output_specs] == ["boxes", "top", "sel", "energy"]
    assert mod.output_specs[0]["shape"] is None and mod.output_specs[3]["shape"] == [7]
    names = [o.name for o in m.graph.output]
    counts = set()
    for k in range(4):
        x = RNG.standard_normal((1, 8, side, side)).astype(np.float32)
        want = _ort(m, {"x": x})
        got = mod.run({"x": x})
        assert list(got) == names
        _same(got, want, names)
        counts.add(got["sel"].shape[0])
    assert len(counts) > 1, "the inputs should select different numbers of boxes"
    # the numpy reference executor runs the same tail
    graph = modelc.from_onnx(m)
    x = RNG.standard_normal((1, 8, side, side)).astype(np.float32)
    _same(reference.run(graph, {"x": x}), _ort(m, {"x": x}), names)
    # saved and loaded, the tail travels with the module
    mod.save(str(tmp_path / "det.mc"))
    again = load(str(tmp_path / "det.mc"))
    _same(again.run({"x": x}), _ort(m, {"x": x}), names)


def test_no_box_left_gives_empty_outputs():
    m, side = detector(threshold=2.0)          # sigmoid never exceeds 2
    mod = modelc.compile(m)
    x = RNG.standard_normal((1, 8, side, side)).astype(np.float32)
    got = mod.run({"x": x})
    assert got["boxes"].shape == (0, 4) and got["sel"].shape == (0, 3) and got["top"].shape == (0,)
    _same(got, _ort(m, {"x": x}), [o.name for o in m.graph.output])


def test_a_module_with_a_tail_runs_from_many_threads():
    m, side = detector()
    mod = modelc.compile(m)
    xs = [RNG.standard_normal((1, 8, side, side)).astype(np.float32) for _ in range(6)]
    want = [mod.run({"x": x}) for x in xs]
    errors = []

    def work(i):
        try:
            for _ in range(5):
                got = mod.run({"x": xs[i]})
                for k in want[i]:
                    assert np.array_equal(got[k], want[i][k])
        except Exception as e:       # pragma: no cover - reported below
            errors.append(e)
    threads = [threading.Thread(target=work, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def test_control_flow_and_counts_decided_by_the_data_run_in_the_tail():
    """An If on the data, a Loop whose trip count is data, a Reshape to a shape computed from data."""
    then = helper.make_graph([helper.make_node("Relu", ["x"], ["t"])], "then", [], [_vi("t", [4])])
    other = helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "else", [], [_vi("e", [4])])
    body = helper.make_graph(
        [helper.make_node("Identity", ["c"], ["c_out"]), helper.make_node("Add", ["v", "x"], ["v_out"]),
         helper.make_node("ReduceSum", ["v"], ["scan"], keepdims=0)], "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("c", TensorProto.BOOL, []), _vi("v", [4])],
        [helper.make_tensor_value_info("c_out", TensorProto.BOOL, []), _vi("v_out", [4]), _vi("scan", [])])
    nodes = [helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
             helper.make_node("Greater", ["s", "zero"], ["cond"]),
             helper.make_node("If", ["cond"], ["y"], name="data_if", then_branch=then, else_branch=other),
             helper.make_node("Abs", ["s"], ["a"]),
             helper.make_node("Ceil", ["a"], ["ac"]),
             helper.make_node("Cast", ["ac"], ["trips"], to=TensorProto.INT64),
             helper.make_node("Loop", ["trips", "", "x"], ["acc", "sums"], name="data_loop", body=body)]
    m = helper.make_model(helper.make_graph(
        nodes, "g", [_vi("x", [4])], [_vi("y", [4]), _vi("acc", [4]), _vi("sums", None)],
        [numpy_helper.from_array(np.float32(0), "zero")]), opset_imports=[helper.make_opsetid("", 13)])
    mod = modelc.compile(m)
    assert mod.tail is not None
    for x in ([1, -2, 3, 0.5], [-1, -2, -3, 0.5], [0.1, 0.1, 0.1, 0.1], [0, 0, 0, 0]):
        x = np.array(x, np.float32)
        _same(mod.run({"x": x}), _ort(m, {"x": x}), ["y", "acc", "sums"])


def test_nms_agrees_with_onnxruntime_on_ties_limits_and_both_box_forms():
    bad = []
    for trial in range(80):
        b, c, n = int(RNG.integers(1, 3)), int(RNG.integers(1, 4)), int(RNG.integers(0, 300))
        boxes = (RNG.random((b, n, 4)) * 10).astype(np.float32)
        if trial % 3 == 0:
            boxes = np.round(boxes)                   # touching edges, equal boxes
        scores = RNG.random((b, c, n)).astype(np.float32)
        if trial % 4 == 0:
            scores = np.round(scores * 4) / 4         # equal scores: the lower index first
        ins = ["boxes", "scores", "lim", "iou"] + (["thr"] if trial % 2 else [])
        node = helper.make_node("NonMaxSuppression", ins, ["sel"], center_point_box=trial % 5 == 0)
        m = helper.make_model(helper.make_graph(
            [node], "g", [_vi("boxes", None), _vi("scores", None),
                          helper.make_tensor_value_info("lim", TensorProto.INT64, None), _vi("iou", None),
                          _vi("thr", None)][:len(ins)],
            [helper.make_tensor_value_info("sel", TensorProto.INT64, None)]),
            opset_imports=[helper.make_opsetid("", 13)])
        feeds = dict(zip(ins, [boxes, scores, np.array([RNG.integers(0, 40) if trial % 3 else 10 ** 6], np.int64),
                               np.array([RNG.choice([0.0, 0.3, 0.5, 1.0])], np.float32),
                               np.array([RNG.choice([0.0, 0.5])], np.float32)]))
        got = ReferenceEvaluator(m, new_ops=FAST_OPS).run(None, feeds)[0].reshape(-1, 3)
        if not np.array_equal(got, _ort(m, feeds)[0].reshape(-1, 3)):
            bad.append(trial)
    assert not bad


def test_roi_align_agrees_with_onnxruntime():
    worst = 0.0
    for trial in range(40):
        c, h, w = int(RNG.integers(1, 9)), int(RNG.integers(1, 12)), int(RNG.integers(1, 12))
        x = RNG.standard_normal((2, c, h, w)).astype(np.float32)
        n = int(RNG.integers(0, 6))
        lo = RNG.random((n, 2)) * np.array([w, h]) * 1.5 - 2
        rois = np.concatenate([lo, lo + RNG.random((n, 2)) * 6], 1).astype(np.float32)
        attrs = dict(output_height=int(RNG.integers(1, 5)), output_width=int(RNG.integers(1, 5)),
                     sampling_ratio=int(RNG.integers(0, 3)), spatial_scale=float(RNG.choice([1.0, 0.5])),
                     mode="avg" if trial % 3 else "max",
                     coordinate_transformation_mode="half_pixel" if trial % 2 else "output_half_pixel")
        m = helper.make_model(helper.make_graph(
            [helper.make_node("RoiAlign", ["x", "rois", "bi"], ["y"], **attrs)], "g",
            [_vi("x", None), _vi("rois", None), helper.make_tensor_value_info("bi", TensorProto.INT64, None)],
            [_vi("y", None)]), opset_imports=[helper.make_opsetid("", 16)])
        feeds = {"x": x, "rois": rois, "bi": RNG.integers(0, 2, n).astype(np.int64)}
        got = ReferenceEvaluator(m, new_ops=FAST_OPS).run(None, feeds)[0]
        want = _ort(m, feeds)[0]
        assert got.shape == want.shape
        if want.size:
            worst = max(worst, float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-6)))
    assert worst < 1e-5


def test_scatter_of_whole_rows_and_gather_nd_agree_with_onnxruntime():
    data = RNG.standard_normal((6, 5, 3)).astype(np.float32)
    rows = np.array([4, 0, 2], np.int64)
    idx = np.broadcast_to(rows[:, None, None], (3, 5, 3)).copy()
    upd = RNG.standard_normal((3, 5, 3)).astype(np.float32)
    scattered = idx.copy()
    scattered[1, 2, 1] = 5                      # not whole rows: the general path
    nd = RNG.integers(-3, 3, (4, 2)).astype(np.int64)
    nodes = [helper.make_node("ScatterElements", ["d", "i", "u"], ["a"], axis=0),
             helper.make_node("ScatterElements", ["d", "j", "u"], ["b"], axis=0),
             helper.make_node("GatherND", ["d", "k"], ["c"]),
             helper.make_node("Flatten", ["e"], ["f"], axis=1)]
    m = helper.make_model(helper.make_graph(
        nodes, "g", [_vi("d", None), helper.make_tensor_value_info("i", TensorProto.INT64, None),
                     helper.make_tensor_value_info("j", TensorProto.INT64, None), _vi("u", None),
                     helper.make_tensor_value_info("k", TensorProto.INT64, None), _vi("e", None)],
        [_vi("a", None), _vi("b", None), _vi("c", None), _vi("f", None)]), opset_imports=[helper.make_opsetid("", 13)])
    feeds = {"d": data, "i": idx, "j": scattered, "u": upd, "k": nd, "e": np.zeros((0, 4, 2), np.float32)}
    got = ReferenceEvaluator(m, new_ops=FAST_OPS).run(None, feeds)
    for g, w in zip(got, _ort(m, feeds)):
        assert g.shape == w.shape and np.array_equal(g, w)


def test_a_saved_tail_is_checked_before_it_runs(tmp_path):
    import json
    import zipfile
    m, side = detector()
    path = str(tmp_path / "det.mc")
    modelc.compile(m).save(path)

    def rewrite(name, change):
        out = str(tmp_path / name)
        with zipfile.ZipFile(path) as src, zipfile.ZipFile(out, "w") as dst:
            for item in src.infolist():
                data = change(item.filename, src.read(item.filename))
                if data is not None:
                    dst.writestr(item.filename, data)
        return out

    def custom_domain(name, data):
        if name != "tail.onnx":
            return data
        t = onnx.load_from_string(data)
        t.graph.node[0].domain = "com.example"
        t.opset_import.append(helper.make_opsetid("com.example", 1))
        return t.SerializeToString()
    with pytest.raises(ModelcError, match="com.example"):
        load(rewrite("domain.mc", custom_domain))
    with pytest.raises(ModelcError, match="tail"):
        load(rewrite("garbage.mc", lambda n, d: b"\x08\x07not a model\xff" if n == "tail.onnx" else d))
    with pytest.raises(ModelcError, match="holds none"):
        load(rewrite("missing.mc", lambda n, d: None if n == "tail.onnx" else d))

    def wrong_input(name, data):
        if name != "program.json":
            return data
        p = json.loads(data)
        p["tail"]["inputs"][0] = "not_a_tensor"
        return json.dumps(p)
    with pytest.raises(ModelcError, match="not_a_tensor"):
        load(rewrite("input.mc", wrong_input))


def test_a_model_that_is_all_tail_runs_without_a_compiled_part():
    """Unique of the input (nothing to compile), and of a constant (no input at all)."""
    x = np.array([2, 1, 1, 3, 4, 3], np.int64)
    for inputs, inits, feeds in (([helper.make_tensor_value_info("x", TensorProto.INT64, [6])], [], {"x": x}),
                                 ([], [numpy_helper.from_array(x, "x")], {})):
        m = helper.make_model(helper.make_graph(
            [helper.make_node("Unique", ["x"], ["y", "i", "inv", "n"], sorted=1)], "g", inputs,
            [helper.make_tensor_value_info(n, TensorProto.INT64, None) for n in ("y", "i", "inv", "n")], inits),
            opset_imports=[helper.make_opsetid("", 13)])
        mod = modelc.compile(m)
        assert not mod.program["steps"]
        _same(mod.run(feeds), _ort(m, feeds), ["y", "i", "inv", "n"])


def test_an_if_known_at_import_whose_branch_filters_boxes_goes_to_the_tail():
    """torchvision's `if boxes.numel() == 0` may be decided by shapes; its branch still holds NMS."""
    boxes = RNG.random((1, 30, 4)).astype(np.float32) * 10
    nms = helper.make_graph(
        [helper.make_node("NonMaxSuppression", ["boxes", "scores", "maxout", "iou"], ["sel"])], "nms", [],
        [helper.make_tensor_value_info("sel", TensorProto.INT64, None)])
    empty = helper.make_graph(
        [helper.make_node("Constant", [], ["none"], value=numpy_helper.from_array(np.zeros((0, 3), np.int64)))],
        "none", [], [helper.make_tensor_value_info("none", TensorProto.INT64, None)])
    nodes = [helper.make_node("Size", ["boxes"], ["n"]),
             helper.make_node("Equal", ["n", "zero"], ["is_empty"]),
             helper.make_node("If", ["is_empty"], ["out"], then_branch=empty, else_branch=nms, name="maybe_nms")]
    m = helper.make_model(helper.make_graph(
        nodes, "g", [_vi("boxes", [1, 30, 4]), _vi("scores", [1, 2, 30])],
        [helper.make_tensor_value_info("out", TensorProto.INT64, None)],
        [numpy_helper.from_array(np.int64(0), "zero"), numpy_helper.from_array(np.array([5], np.int64), "maxout"),
         numpy_helper.from_array(np.array([0.3], np.float32), "iou")]), opset_imports=[helper.make_opsetid("", 13)])
    mod = modelc.compile(m)
    assert mod.tail.starts[0][0] == "maybe_nms" and "NonMaxSuppression" in mod.tail.starts[0][1]
    feeds = {"boxes": boxes, "scores": RNG.random((1, 2, 30)).astype(np.float32)}
    _same(mod.run(feeds), _ort(m, feeds), ["out"])


def test_info_and_compile_say_where_the_tail_begins(tmp_path, capsys):
    from modelc.cli import main
    m, side = detector()
    path = str(tmp_path / "det.onnx")
    onnx.save(m, path)
    for argv in (["info", path], ["compile", path, "-q", "-o", str(tmp_path / "det.mc")]):
        assert main(argv) == 0
        out = capsys.readouterr().out
        assert "run on ONNX's reference evaluator" in out, out
        assert "filter_scores: node 'filter_scores' (NonZero) decides its output's shape" in out, out
    main(["info", path])
    out = capsys.readouterr().out
    assert "output  boxes (its shape decided by the data" in out and "output  energy:float32[7]" in out, out
