"""Frontend: import, input binding, and the errors a user can cause."""
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import modelc
from modelc import reference
from modelc.errors import ModelLoadError, ShapeError, UnsupportedOpError
from workloads import onnx_model


def _vi(name, shape, t=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, t, shape)


def test_import_binds_dynamic_batch_and_runs():
    b = numpy_helper.from_array(np.arange(4, dtype=np.float32), "b")
    m = onnx_model([helper.make_node("Add", ["x", "b"], ["t"]), helper.make_node("Relu", ["t"], ["y"])],
                    [_vi("x", ["N", 4])], [_vi("y", ["N", 4])], [b])
    g = modelc.from_onnx(m, shape={"x": (3, 4)})
    g.verify()
    assert g.tensors["y"].shape == (3, 4)
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    expected = np.maximum(x + np.arange(4, dtype=np.float32), 0)
    np.testing.assert_array_equal(reference.run(g, {"x": x})["y"], expected)
    assert "Relu" in str(g)


def test_missing_shape_names_the_input():
    m = onnx_model([helper.make_node("Relu", ["x"], ["y"])], [_vi("x", ["N", 4])], [_vi("y", ["N", 4])])
    with pytest.raises(ShapeError, match="'x'.*unknown dimensions"):
        modelc.from_onnx(m)


def test_wrong_rank_override():
    m = onnx_model([helper.make_node("Relu", ["x"], ["y"])], [_vi("x", ["N", 4])], [_vi("y", ["N", 4])])
    with pytest.raises(ShapeError, match="rank 3.*rank 2"):
        modelc.from_onnx(m, shape={"x": (1, 2, 4)})
    with pytest.raises(ShapeError, match="contradicts"):
        modelc.from_onnx(m, shape={"x": (1, 5)})
    with pytest.raises(ShapeError, match="inputs are"):
        modelc.from_onnx(m, shape={"nope": (1, 4)})


def test_unsupported_ops_are_listed_together():
    nodes = [helper.make_node("Relu", ["x"], ["a"]),
             helper.make_node("Det", ["a"], ["b"], name="det1"),
             helper.make_node("DeformConv", ["a"], ["c"], name="deform0"),
             helper.make_node("FusedConv", ["a"], ["y"], name="fc", domain="com.microsoft")]
    m = onnx_model(nodes, [_vi("x", [1, 4])], [_vi("y", [1, 4])])
    with pytest.raises(UnsupportedOpError) as ei:
        modelc.from_onnx(m, check=False)
    msg = str(ei.value)
    for op, name in [("Det", "det1"), ("DeformConv", "deform0"), ("com.microsoft.FusedConv", "fc")]:
        assert op in msg and name in msg


def test_malformed_and_missing_files(tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x08\x07this is not a protobuf\xff\xff\xff")
    with pytest.raises(ModelLoadError, match="bad.onnx"):
        modelc.from_onnx(str(bad))
    with pytest.raises(ModelLoadError, match="does not exist"):
        modelc.from_onnx(str(tmp_path / "missing.onnx"))


def test_old_zoo_style_initializers_as_inputs_and_constant_nodes():
    w = numpy_helper.from_array(np.full((4,), 2.0, np.float32), "w")
    nodes = [helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(
                 np.ones(4, np.float32))),
             helper.make_node("Mul", ["x", "w"], ["t"]),
             helper.make_node("Sum", ["t", "c", "x"], ["y"])]
    m = onnx_model(nodes, [_vi("x", [1, 4]), _vi("w", [4])], [_vi("y", [1, 4])], [w], opset=8,
                    ir_version=3)
    g = modelc.from_onnx(m)
    assert g.inputs == ["x"]            # an initializer listed as an input is a constant
    x = np.arange(4, dtype=np.float32)[None]
    np.testing.assert_allclose(reference.run(g, {"x": x})["y"], 3 * x + 1)


def test_feed_errors_name_the_problem():
    m = onnx_model([helper.make_node("Relu", ["x"], ["y"])], [_vi("x", [2, 4])], [_vi("y", [2, 4])])
    g = modelc.from_onnx(m)
    from modelc.errors import InputError
    with pytest.raises(InputError, match="shape"):
        reference.run(g, {"x": np.zeros((2, 5), np.float32)})
    with pytest.raises(InputError, match="dtype"):
        reference.run(g, {"x": np.zeros((2, 4), np.float64)})
    with pytest.raises(InputError, match="unknown"):
        reference.run(g, {"x": np.zeros((2, 4), np.float32), "z": 1})


def test_ir_verifier_catches_inconsistency():
    m = onnx_model([helper.make_node("Relu", ["x"], ["y"])], [_vi("x", [2, 4])], [_vi("y", [2, 4])])
    g = modelc.from_onnx(m)
    g.verify()
    g.outputs.append("ghost")
    with pytest.raises(modelc.ModelcError, match="ghost"):
        g.verify()


def test_graph_copy_and_replace_uses():
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Neg", ["a"], ["y"])]
    g = modelc.from_onnx(onnx_model(nodes, [_vi("x", [2])], [_vi("y", [2])]))
    h = g.copy()
    relu = h.producer("a")
    h.replace_uses("a", "x")
    h.remove_node(relu.name)
    h.verify()
    x = np.array([-1.0, 2.0], np.float32)
    np.testing.assert_array_equal(reference.run(h, {"x": x})["y"], -x)
    np.testing.assert_array_equal(reference.run(g, {"x": x})["y"], -np.maximum(x, 0))
