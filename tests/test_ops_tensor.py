"""Data-movement, shape and indexing ops, and their old-opset forms, against onnxruntime.

Each test builds a small model with onnx.helper, imports it (parameters such as shapes, pads and
scales are initializers, as exporters write them) and compares the reference executor with
onnxruntime. Forms onnxruntime no longer runs (opset < 7 broadcasting, Reshape-1, Tile-1 ...)
are compared with numpy.
"""
import re

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from modelc import frontend, reference
from modelc.errors import ShapeError, UnsupportedOpError

INT64_MAX = np.iinfo(np.int64).max
rng = np.random.default_rng(0)


def randn(*shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


def make_model(nodes, inputs, inits=None, outputs=None, opset=21, dims=None):
    """`inputs`/`inits`: {name: array}; outputs default to the last node's outputs; `dims`
    overrides the declared shape of inputs (symbolic dims)."""
    nodes = nodes if isinstance(nodes, list) else [nodes]
    outputs = outputs or [o for o in nodes[-1].output if o]
    dims = dims or {}
    vis = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(x.dtype),
                                         dims.get(n, x.shape)) for n, x in inputs.items()]
    graph = helper.make_graph(nodes, "g", vis, [onnx.ValueInfoProto(name=o) for o in outputs],
                              [numpy_helper.from_array(np.asarray(v), n)
                               for n, v in (inits or {}).items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)


def run_modelc(model, inputs):
    graph = frontend.from_onnx(model, check=False)
    out = reference.run(graph, inputs)
    return [out[o.name] for o in model.graph.output]


def run_ort(model, inputs):
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, inputs)


def check(nodes, inputs, inits=None, opset=21, expected=None, rtol=1e-5, atol=1e-6):
    """Compare modelc's reference with onnxruntime (or with `expected` arrays)."""
    model = make_model(nodes, inputs, inits, opset=opset)
    got = run_modelc(model, inputs)
    want = expected if expected is not None else run_ort(model, inputs)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        w = np.asarray(w)
        assert g.dtype == w.dtype and g.shape == w.shape, (g.dtype, g.shape, w.dtype, w.shape)
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)
    return got


def i64(*v):
    return np.array(v, dtype=np.int64)


node = helper.make_node


# ---- canonical forms ----------------------------------------------------------------------------

@pytest.mark.parametrize("shape,allowzero", [((0, -1), 0), ((4, 0, 2), 0), ((-1,), 0), ((2, 12), 1)])
def test_reshape(shape, allowzero):
    check(node("Reshape", ["x", "s"], ["y"], allowzero=allowzero),
          {"x": randn(2, 3, 4)}, {"s": i64(*shape)})


def test_shape_ops_roundtrip():
    x = randn(2, 1, 3, 1)
    check([node("Squeeze", ["x", "a"], ["s"]), node("Unsqueeze", ["s", "b"], ["u"]),
           node("Transpose", ["u"], ["t"], perm=[3, 1, 0, 2]), node("Flatten", ["t"], ["y"], axis=-2),
           node("Squeeze", ["x"], ["z"])],
          {"x": x}, {"a": i64(-1, 1), "b": i64(0, -1)})
    model = make_model([node("Squeeze", ["x"], ["z"])], {"x": x})
    assert run_modelc(model, {"x": x})[0].shape == (2, 3)


def test_concat_split():
    x, y = randn(2, 3), randn(2, 5)
    check([node("Concat", ["x", "y"], ["c"], axis=-1),
           node("Split", ["c"], ["a", "b", "d"], axis=1, num_outputs=3)],
          {"x": x, "y": y}, opset=18)
    check(node("Split", ["x", "s"], ["a", "b"], axis=1), {"x": y}, {"s": i64(1, 4)})


@pytest.mark.parametrize("starts,ends,axes,steps", [
    ((1, 0), (INT64_MAX, -1), (0, 1), (1, 1)),
    ((-1, 10), (-INT64_MAX, -10), (0, 2), (-1, -2)),
    ((5,), (-7,), (-1,), (-1,)),
    ((-100,), (100,), (1,), (2,)),
])
def test_slice(starts, ends, axes, steps):
    check(node("Slice", ["x", "s", "e", "a", "t"], ["y"]), {"x": randn(4, 5, 6)},
          {"s": i64(*starts), "e": i64(*ends), "a": i64(*axes), "t": i64(*steps)})


def test_gathers():
    x = randn(5, 4, 3)
    check(node("Gather", ["x", "i"], ["y"], axis=1), {"x": x}, {"i": i64(-1, 0, 2, 2).reshape(2, 2)})
    check(node("GatherElements", ["x", "i"], ["y"], axis=2), {"x": x},
          {"i": rng.integers(-3, 3, (5, 4, 2))})
    check(node("GatherND", ["x", "i"], ["y"], batch_dims=1), {"x": x},
          {"i": rng.integers(0, 3, (5, 2, 2))})


def test_shape_size_constant_of_shape():
    x = randn(2, 3, 4, 5)
    check([node("Shape", ["x"], ["s"], start=1, end=-1), node("Size", ["x"], ["n"]),
           node("ConstantOfShape", ["s"], ["c"],
                value=numpy_helper.from_array(np.array([7], np.int32)))],
          {"x": x})
    check(node("ConstantOfShape", ["s"], ["c"]), {}, {"s": i64(2, 0, 3)})


def test_cast_castlike_identity_dropout():
    x = (randn(3, 4) * 100)
    check([node("Cast", ["x"], ["a"], to=TensorProto.INT32),
           node("Cast", ["a"], ["b"], to=TensorProto.FLOAT16),
           node("CastLike", ["b", "d"], ["c"]), node("Identity", ["c"], ["i"]),
           node("Dropout", ["i"], ["y", "m"])],
          {"x": x}, {"d": np.zeros(1, np.float64)})


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge", "wrap"])
def test_pad(mode):
    x = randn(1, 3, 4, 5)
    check(node("Pad", ["x", "p", "v"], ["y"], mode=mode), {"x": x},
          {"p": i64(0, 0, 2, 1, 0, 1, 3, 2), "v": np.array(1.5, np.float32)})
    check(node("Pad", ["x", "p", "", "a"], ["y"], mode=mode), {"x": x},
          {"p": i64(1, -1, 2, 0), "a": i64(-1, 2)})


def test_expand_tile_range():
    x = randn(3, 1)
    check(node("Expand", ["x", "s"], ["y"]), {"x": x}, {"s": i64(2, 1, 4)})
    check(node("Tile", ["x", "r"], ["y"]), {"x": x}, {"r": i64(2, 3)})
    check(node("Range", ["a", "b", "c"], ["y"]), {},
          {"a": np.array(1.5, np.float32), "b": np.array(-3, np.float32),
           "c": np.array(-0.7, np.float32)})
    check(node("Range", ["a", "b", "c"], ["y"]), {},
          {"a": np.array(10, np.int32), "b": np.array(2, np.int32), "c": np.array(-3, np.int32)})


@pytest.mark.parametrize("mode", ["DCR", "CRD"])
def test_depth_space(mode):
    x = randn(2, 8, 3, 2)
    check([node("DepthToSpace", ["x"], ["y"], blocksize=2, mode=mode),
           node("SpaceToDepth", ["y"], ["z"], blocksize=2)], {"x": x})


def test_trilu_onehot_eyelike():
    x = randn(2, 4, 5)
    check(node("Trilu", ["x", "k"], ["y"], upper=0), {"x": x}, {"k": i64(-1)})
    check(node("Trilu", ["x"], ["y"]), {"x": x})
    check(node("OneHot", ["i", "d", "v"], ["y"], axis=1), {"i": i64(0, -1, 2, 7).reshape(2, 2)},
          {"d": np.array(4, np.int64), "v": np.array([-1, 3], np.float32)})
    check(node("EyeLike", ["x"], ["y"], k=1, dtype=TensorProto.INT32), {"x": randn(3, 5)})


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
def test_scatters(reduction):
    x = randn(4, 5)
    check(node("ScatterElements", ["x", "i", "u"], ["y"], axis=1, reduction=reduction), {"x": x},
          {"i": i64(0, -1, 2, 2, 4, 1).reshape(2, 3), "u": randn(2, 3)}, opset=18)
    check(node("ScatterND", ["x", "i", "u"], ["y"], reduction=reduction), {"x": x},
          {"i": i64(1, 3, 2).reshape(3, 1), "u": randn(3, 5)}, opset=18)


def test_scatter_nd_into_an_empty_tensor():
    """Swin3D-T's shifted-window mask (the dynamo export) scatters rows of no elements: [14, 7, 0]."""
    check(node("ScatterND", ["x", "i", "u"], ["y"]), {"x": randn(14, 7, 0)},
          {"i": np.arange(7, dtype=np.int64).reshape(7, 1), "u": randn(7, 7, 0)}, opset=18)


@pytest.mark.parametrize("largest", [0, 1])
def test_topk_ties(largest):
    x = np.array([[3, 1, 3, 2, 1, 3], [0, 0, 5, 5, 1, 0]], np.float32)
    y = check(node("TopK", ["x", "k"], ["v", "i"], axis=-1, largest=largest), {"x": x},
              {"k": i64(4)})
    assert y[1].dtype == np.int64


# ---- Resize ----------------------------------------------------------------------------------------

RESIZE_CASES = [
    # (mode, coordinate transformation, nearest_mode, scales or sizes, extra attributes)
    ("nearest", "half_pixel", "round_prefer_floor", {"scales": [1, 1, 2.5, 1.5]}, {}),
    ("nearest", "asymmetric", "floor", {"scales": [1, 1, 0.6, 0.5]}, {}),
    ("nearest", "align_corners", "ceil", {"sizes": [1, 2, 7, 3]}, {}),
    ("nearest", "pytorch_half_pixel", "round_prefer_ceil", {"sizes": [1, 2, 1, 9]}, {}),
    ("linear", "half_pixel", "", {"scales": [1, 1, 2, 2]}, {}),
    ("linear", "pytorch_half_pixel", "", {"sizes": [1, 2, 3, 1]}, {}),
    ("linear", "align_corners", "", {"sizes": [1, 2, 9, 4]}, {}),
    ("linear", "asymmetric", "", {"scales": [1, 1, 0.5, 1.75]}, {}),
    ("linear", "half_pixel_symmetric", "", {"scales": [1, 1, 1.7, 0.6]}, {}),
    ("linear", "half_pixel", "", {"sizes": [1, 2, 3, 2]}, {"antialias": 1}),
    ("linear", "half_pixel", "", {"sizes": [5, 4]}, {"axes": [3, 2]}),
    ("linear", "tf_crop_and_resize", "", {"sizes": [1, 2, 4, 4]}, {"extrapolation_value": 9.0}),
    ("nearest", "half_pixel", "round_prefer_floor", {"sizes": [7, 7]},
     {"axes": [2, 3], "keep_aspect_ratio_policy": "not_larger"}),
    ("cubic", "half_pixel", "", {"scales": [1, 1, 1.5, 0.5]}, {}),
    ("cubic", "align_corners", "", {"sizes": [1, 2, 8, 8]}, {"exclude_outside": 1,
                                                           "cubic_coeff_a": -0.5}),
    ("cubic", "half_pixel", "", {"sizes": [1, 2, 3, 2]}, {"antialias": 1}),
]


@pytest.mark.parametrize("mode,ctm,nearest,size,extra", RESIZE_CASES)
def test_resize(mode, ctm, nearest, size, extra):
    x = randn(1, 2, 5, 4)
    inits = {"roi": np.array([0, 0, 0.2, -0.1, 1, 1, 0.9, 1.3], np.float32)
             if ctm == "tf_crop_and_resize" else np.zeros(0, np.float32)}
    ins = ["x", "roi"]
    if "scales" in size:
        inits["scales"] = np.array(size["scales"], np.float32)
        ins.append("scales")
    else:
        inits["sizes"] = i64(*size["sizes"])
        ins += ["", "sizes"]
    attrs = dict(mode=mode, coordinate_transformation_mode=ctm, **extra)
    if nearest:
        attrs["nearest_mode"] = nearest
    n = node("Resize", ins, ["y"], **attrs)
    expected = None
    if ctm == "tf_crop_and_resize":   # onnxruntime 1.31 ignores the roi of the last axis here
        expected = ReferenceEvaluator(make_model(n, {"x": x}, inits, opset=19)).run(None, {"x": x})
    check(n, {"x": x}, inits, opset=19, rtol=1e-4, atol=1e-5, expected=expected)


def test_resize_integer_nearest_is_exact():
    x = rng.integers(0, 255, (1, 1, 3, 4)).astype(np.uint8)
    check(node("Resize", ["x", "", "s"], ["y"], mode="nearest"), {"x": x},
          {"s": np.array([1, 1, 2, 3], np.float32)}, opset=19)


# ---- old opsets ---------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_upsample_opset9_and_7(mode):
    x = randn(1, 2, 3, 4)
    check(node("Upsample", ["x", "s"], ["y"], mode=mode), {"x": x},
          {"s": np.array([1, 1, 2, 3], np.float32)}, opset=9)
    check(node("Upsample", ["x"], ["y"], mode=mode, scales=[1.0, 1.0, 2.0, 1.5]), {"x": x}, opset=7)


@pytest.mark.parametrize("scales", [[1, 1, 2, 3], [1, 1, 0.6, 0.5], [1, 1, 2, 0.6]])
@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_resize_opset10(scales, mode):
    check(node("Resize", ["x", "s"], ["y"], mode=mode), {"x": randn(1, 2, 5, 5)},
          {"s": np.array(scales, np.float32)}, opset=10)


def test_resize_opset11_forms():
    """TorchScript's opset-11 pattern (empty roi and scales, then sizes) and Resize-11's
    tf_half_pixel_for_nn, which later opsets dropped."""
    x = randn(1, 2, 3, 4)
    empty = np.zeros(0, np.float32)
    check(node("Resize", ["x", "r", "s", "z"], ["y"], mode="linear",
               coordinate_transformation_mode="pytorch_half_pixel"),
          {"x": x}, {"r": empty, "s": empty, "z": i64(1, 2, 7, 5)}, opset=11)
    check(node("Resize", ["x", "r", "s"], ["y"], mode="nearest",
               coordinate_transformation_mode="tf_half_pixel_for_nn"),
          {"x": x}, {"r": empty, "s": np.array([1, 1, 2.5, 0.75], np.float32)}, opset=11)


def test_opset11_negative_axis_attributes():
    x = randn(2, 1, 6)
    check([node("Squeeze", ["x"], ["a"], axes=[-2]), node("Unsqueeze", ["a"], ["b"], axes=[-1]),
           node("Split", ["b"], ["c", "d"], axis=-2, split=[2, 4])], {"x": x}, opset=11)


def test_opset7_attribute_forms():
    x = randn(2, 3, 4)
    check([node("Slice", ["x"], ["a"], starts=[1, -3], ends=[100, -1], axes=[2, 1]),
           node("Unsqueeze", ["a"], ["b"], axes=[0, 3]), node("Squeeze", ["b"], ["c"], axes=[0]),
           node("Pad", ["c"], ["d"], pads=[0, 1, 0, 0, 0, 1, 0, 2], mode="constant", value=2.0),
           node("Split", ["d"], ["e", "f"], axis=3, split=[1, 4]),
           node("Split", ["d"], ["g", "h"], axis=0),
           node("Clip", ["h"], ["i"], min=-0.5, max=0.25),
           node("Dropout", ["i"], ["j"], ratio=0.3),
           node("TopK", ["j"], ["k", "l"], k=2, axis=-1)],
          {"x": x}, opset=7)
    check(node("Split", ["x"], ["a", "b", "c"], axis=1), {"x": x}, opset=13)


def test_opset_below_ort_forms_against_numpy():
    x, b = randn(2, 3, 4, 5), randn(3, 4)
    model_nodes = [node("Add", ["x", "b"], ["a"], broadcast=1, axis=1),
                   node("Mul", ["a", "c"], ["m"], broadcast=1),
                   node("Reshape", ["m"], ["r"], shape=[0, -1]),
                   node("Concat", ["r", "r"], ["y"]),
                   node("Tile", ["y", "t", "ax"], ["z"]),
                   node("Cast", ["z"], ["w"], to="DOUBLE")]
    c = randn(5)
    ref = np.concatenate([((x + b[:, :, None]) * c).reshape(2, -1)] * 2, axis=1)
    check(model_nodes, {"x": x}, {"b": b, "c": c, "t": i64(3), "ax": i64(0)}, opset=3,
          expected=[np.tile(ref, (3, 1)).astype(np.float64)])


def test_prelu_opset6_channel_slope():
    x, s = randn(2, 3, 4), np.array([0.1, 0.2, 0.3], np.float32)
    check(node("PRelu", ["x", "s"], ["y"]), {"x": x}, {"s": s}, opset=6,
          expected=[np.where(x >= 0, x, x * s[:, None])])


# ---- exporter patterns ----------------------------------------------------------------------------

def test_shape_gather_unsqueeze_concat_reshape_chain():
    """torch.onnx's `x.view(x.size(0), -1)` and friends; must resolve to static shapes."""
    nodes = [node("Shape", ["x"], ["s"]), node("Gather", ["s", "zero"], ["n"], axis=0),
             node("Unsqueeze", ["n", "ax"], ["n1"]), node("Concat", ["n1", "minus1"], ["shape"], axis=0),
             node("Reshape", ["x", "shape"], ["r"]),
             node("Shape", ["r"], ["rs"]), node("ConstantOfShape", ["rs"], ["ones"],
                                                value=numpy_helper.from_array(np.ones(1, np.float32))),
             node("Slice", ["r", "st", "en", "ax"], ["sl"]),
             node("Expand", ["sl", "rs"], ["e"]), node("Add", ["e", "ones"], ["y"])]
    model = make_model(nodes, {"x": randn(2, 3, 4)},
                       {"zero": np.array(0, np.int64), "ax": i64(0), "minus1": i64(-1),
                        "st": i64(-1), "en": i64(INT64_MAX)}, opset=17, dims={"x": ["N", 3, 4]})
    graph = frontend.from_onnx(model, shape={"x": (5, 3, 4)}, check=False)
    assert graph.tensors["shape"].shape == (2,) and graph.tensors["y"].shape == (5, 12)
    x = randn(5, 3, 4)
    got = reference.run(graph, {"x": x})["y"]
    np.testing.assert_allclose(got, run_ort(model, {"x": x})[0])


# ---- errors -----------------------------------------------------------------------------------------

def test_reshape_with_runtime_shape_runs_in_the_data_dependent_tail():
    model = make_model(node("Reshape", ["x", "s"], ["y"], name="reshape_me"),
                       {"x": randn(2, 3), "s": i64(3, 2)})
    graph = frontend.from_onnx(model, check=False)
    (where, why), = graph.tail.starts          # named, with the input that decides the shape
    assert where == "reshape_me" and re.search(r"'s'.*constant", why)
    x = randn(2, 3)
    for shape in ([3, 2], [6, 1], [-1, 3]):
        y = reference.run(graph, {"x": x, "s": np.array(shape, np.int64)})["y"]
        np.testing.assert_array_equal(y, x.reshape(shape))


def test_bad_reshape_names_the_node():
    model = make_model(node("Reshape", ["x", "s"], ["y"], name="r1"), {"x": randn(2, 3)},
                       {"s": i64(4, -1)})
    with pytest.raises(ShapeError, match="r1.*cannot reshape"):
        frontend.from_onnx(model, check=False)


def test_unsupported_forms_are_reported():
    x = randn(2, 3)
    with pytest.raises(UnsupportedOpError, match="Dropout\\(training_mode=1\\)"):
        frontend.from_onnx(make_model(node("Dropout", ["x", "r", "t"], ["y"]), {"x": x},
                                      {"r": np.array(0.5, np.float32), "t": np.array(True)}),
                           check=False)
    with pytest.raises(UnsupportedOpError, match="Cast\\(to=BFLOAT16\\)"):
        frontend.from_onnx(make_model(node("Cast", ["x"], ["y"], to=TensorProto.BFLOAT16),
                                      {"x": x}), check=False)
