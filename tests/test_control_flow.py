"""If, Loop and sequences known at import (frontend/control_flow.py): inlined, unrolled and
resolved, then compiled; each model against onnxruntime, which runs the control flow itself."""
import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import modelc
from modelc.errors import ModelcError

RNG = np.random.default_rng(0)


def _i64(name, v):
    return numpy_helper.from_array(np.asarray(v, np.int64), name)


def _model(nodes, inputs, outputs, inits=(), opset=17):
    g = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info(o, TensorProto.FLOAT, None)
                                               for o in outputs], list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def _check(m, feeds):
    mod = modelc.compile(m)
    assert not mod.fallbacks, mod.fallbacks
    got = mod.run(feeds)
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    for o, w in zip(m.graph.output, want):
        np.testing.assert_allclose(got[o.name], w, rtol=1e-6, atol=1e-6)
    return mod


def _branch(name, node, out):
    return helper.make_graph([node], name, [], [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)])


def test_if_on_a_shape_becomes_its_branch():
    """TorchScript's `if x.shape[1] == 4:`: the condition is known at import."""
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Gather", ["s", "one"], ["c1"], axis=0),
             helper.make_node("Equal", ["c1", "four"], ["cond"]),
             helper.make_node("If", ["cond"], ["y"],
                              then_branch=_branch("then", helper.make_node("Relu", ["x"], ["t"]), "t"),
                              else_branch=_branch("else", helper.make_node("Neg", ["x"], ["e"]), "e"))]
    m = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4, 3])], ["y"],
               [_i64("one", 1), _i64("four", 4)])
    _check(m, {"x": RNG.standard_normal((2, 4, 3)).astype(np.float32)})
    ops = modelc.from_onnx(m).op_counts()
    assert "If" not in ops and ops.get("Relu") == 1 and "Neg" not in ops


def test_loop_with_carried_values_scan_outputs_and_a_sequence():
    """A Loop over a fixed range: a carried value, a scan output, a sequence filled with SequenceInsert
    (as TorchScript writes a Python list), read back by SequenceAt and ConcatFromSequence; an If
    nested in the body reads the iteration number and an outer tensor."""
    body_nodes = [
        helper.make_node("Mul", ["v_in", "two"], ["v2"]),
        helper.make_node("Add", ["v2", "x"], ["v_out"]),
        helper.make_node("Add", ["i", "one"], ["i1"]),
        helper.make_node("Slice", ["x", "i", "i1", "zero"], ["row"]),
        helper.make_node("SequenceInsert", ["seq_in", "row"], ["seq_out"]),
        helper.make_node("Greater", ["i", "zero"], ["late"]),
        helper.make_node("If", ["late"], ["scan"],
                         then_branch=_branch("then", helper.make_node("Sigmoid", ["v_out"], ["t"]), "t"),
                         else_branch=_branch("else", helper.make_node("Identity", ["x"], ["e"]), "e")),
        helper.make_node("Identity", ["c_in"], ["c_out"]),
    ]
    body = helper.make_graph(
        body_nodes, "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, [1]),
         helper.make_tensor_value_info("c_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_in", TensorProto.FLOAT, None),
         helper.make_tensor_sequence_value_info("seq_in", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("c_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_out", TensorProto.FLOAT, None),
         helper.make_tensor_sequence_value_info("seq_out", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("scan", TensorProto.FLOAT, None)])
    nodes = [helper.make_node("SequenceEmpty", [], ["seq0"], dtype=TensorProto.FLOAT),
             helper.make_node("Loop", ["trips", "true", "v0", "seq0"], ["v", "seq", "scans"], body=body),
             helper.make_node("SequenceAt", ["seq", "minus_one"], ["last_row"]),
             helper.make_node("ConcatFromSequence", ["seq"], ["rows"], axis=0),
             helper.make_node("SequenceLength", ["seq"], ["n"]),
             helper.make_node("Cast", ["n"], ["nf"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["last_row", "nf"], ["y1"]),
             helper.make_node("Add", ["rows", "v"], ["y2"]),
             helper.make_node("Relu", ["scans"], ["y3"])]
    inits = [_i64("trips", 3), numpy_helper.from_array(np.array(True), "true"), _i64("one", [1]),
             _i64("zero", [0]), _i64("minus_one", -1), numpy_helper.from_array(np.float32(2), "two"),
             numpy_helper.from_array(np.zeros((3, 5), np.float32), "v0")]
    m = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 5])], ["y1", "y2", "y3"], inits)
    _check(m, {"x": RNG.standard_normal((3, 5)).astype(np.float32)})


def test_split_to_sequence_and_erase():
    nodes = [helper.make_node("SplitToSequence", ["x", "sizes"], ["seq"], axis=1),
             helper.make_node("SequenceErase", ["seq", "zero"], ["rest"]),
             helper.make_node("ConcatFromSequence", ["rest"], ["y"], axis=0, new_axis=1),
             helper.make_node("SplitToSequence", ["x"], ["cols"], axis=1, keepdims=0),
             helper.make_node("SequenceAt", ["cols", "two"], ["z"])]
    m = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 6])], ["y", "z"],
               [_i64("sizes", [2, 2, 2]), _i64("zero", 0), _i64("two", 2)])
    _check(m, {"x": RNG.standard_normal((2, 6)).astype(np.float32)})


def test_control_flow_on_data_runs_after_the_compiled_part():
    nodes = [helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
             helper.make_node("Greater", ["s", "zero"], ["cond"]),
             helper.make_node("If", ["cond"], ["y"], name="data_if",
                              then_branch=_branch("then", helper.make_node("Relu", ["x"], ["t"]), "t"),
                              else_branch=_branch("else", helper.make_node("Neg", ["x"], ["e"]), "e"))]
    m = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])], ["y"],
               [numpy_helper.from_array(np.float32(0), "zero")])
    mod = modelc.compile(m)      # the If, its condition decided by the data, runs in the tail
    assert mod.tail is not None and mod.tail.starts[0][0] == "data_if"
    assert "depends on the model's inputs" in mod.tail.starts[0][1]
    for x in ([1, -2, 3, 0.5], [-1, -2, -3, 0.5]):
        x = np.array(x, np.float32)
        np.testing.assert_array_equal(mod.run({"x": x})["y"], np.maximum(x, 0) if x.sum() > 0 else -x)


def test_a_sequence_cannot_be_a_model_output():
    m = _model([helper.make_node("SequenceConstruct", ["x", "x"], ["y"])],
               [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])], ["y"])
    m.graph.output[0].CopyFrom(helper.make_tensor_sequence_value_info("y", TensorProto.FLOAT, None))
    with pytest.raises(ModelcError, match="sequence"):
        modelc.compile(m)


def test_a_loop_that_never_ends_is_refused():
    """No trip count and a condition that stays true, in a body of no nodes: a crafted model must end
    in an error naming the loop, not an endless import."""
    body = helper.make_graph(
        [], "body", [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                     helper.make_tensor_value_info("c", TensorProto.BOOL, []),
                     helper.make_tensor_value_info("v", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("c", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v", TensorProto.FLOAT, None)])
    m = _model([helper.make_node("Loop", ["", "true", "x"], ["y"], body=body, name="endless")],
               [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])], ["y"],
               [numpy_helper.from_array(np.array(True), "true")])
    with pytest.raises(ModelcError, match="endless.*would exceed"):
        modelc.from_onnx(m)


def test_scan_over_a_static_length_is_written_out():
    """A Scan carrying a running sum over axis 1 of one input, read backwards, and over axis 0
    of another; its scan outputs stacked along axes 0 and 1 (one of them reversed)."""
    f = TensorProto.FLOAT
    body = helper.make_graph(
        [helper.make_node("Add", ["s_in", "a"], ["s_out"]),
         helper.make_node("Mul", ["s_out", "b"], ["y1"]),
         helper.make_node("Relu", ["a"], ["y2"])], "body",
        [helper.make_tensor_value_info("s_in", f, [3]), helper.make_tensor_value_info("a", f, [3]),
         helper.make_tensor_value_info("b", f, [3])],
        [helper.make_tensor_value_info(x, f, [3]) for x in ("s_out", "y1", "y2")])
    node = helper.make_node("Scan", ["s0", "xa", "xb"], ["s", "ys1", "ys2"], body=body, num_scan_inputs=2,
                            scan_input_axes=[1, 0], scan_input_directions=[1, 0],
                            scan_output_axes=[0, -1], scan_output_directions=[0, 1])
    m = _model([node], [helper.make_tensor_value_info("s0", f, [3]), helper.make_tensor_value_info("xa", f, [3, 5]),
                        helper.make_tensor_value_info("xb", f, [5, 3])], ["s", "ys1", "ys2"], opset=16)
    feeds = {"s0": RNG.standard_normal(3).astype(np.float32), "xa": RNG.standard_normal((3, 5)).astype(np.float32),
             "xb": RNG.standard_normal((5, 3)).astype(np.float32)}
    _check(m, feeds)
    assert "Scan" not in modelc.from_onnx(m).op_counts()


def test_scan_inputs_of_different_lengths_are_refused():
    f = TensorProto.FLOAT
    body = helper.make_graph([helper.make_node("Add", ["a", "b"], ["y"])], "body",
                             [helper.make_tensor_value_info(x, f, [2]) for x in "ab"],
                             [helper.make_tensor_value_info("y", f, [2])])
    node = helper.make_node("Scan", ["xa", "xb"], ["ys"], body=body, num_scan_inputs=2, name="scan")
    m = _model([node], [helper.make_tensor_value_info("xa", f, [4, 2]),
                        helper.make_tensor_value_info("xb", f, [3, 2])], ["ys"], opset=16)
    with pytest.raises(ModelcError, match="scan.*different lengths"):
        modelc.from_onnx(m)
