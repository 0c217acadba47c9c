"""Data-movement ops with generated kernels (no numpy fallback), against onnxruntime: Trilu,
OneHot, EyeLike, GatherElements, GatherND, DepthToSpace, SpaceToDepth, Pad reflect/edge/wrap
(injective template), ScatterElements/ScatterND (scatter template), ReverseSequence (a GatherElements)
and MaxUnpool and Col2Im (ScatterElements)."""
import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import modelc
from modelc.errors import ModelcError

_TP = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.int64): TensorProto.INT64,
       np.dtype(np.int32): TensorProto.INT32, np.dtype(np.bool_): TensorProto.BOOL,
       np.dtype(np.uint8): TensorProto.UINT8}
_RNG = np.random.default_rng(0)


def _c(name, v, dt=np.int64):
    return numpy_helper.from_array(np.asarray(v, dt), name)


def _model(nodes, feeds, inits=(), out_type=TensorProto.FLOAT, opset=18):
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(k, _TP[v.dtype], v.shape)
                                       for k, v in feeds.items()],
                          [helper.make_tensor_value_info("y", out_type, None)], list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def _check(nodes, feeds, inits=(), out_type=TensorProto.FLOAT, against="ort", rtol=0.0):
    m = _model(nodes, feeds, inits, out_type)
    mod = modelc.compile(m)
    assert not mod.fallbacks, mod.fallbacks
    got = np.asarray(mod.run(feeds)["y"])
    if against == "ort":
        want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    else:
        want = modelc.reference.run(modelc.from_onnx(m), feeds)["y"]
    assert got.dtype == want.dtype and got.shape == want.shape
    if rtol:     # interpolation weights: the order of float32 roundings differs
        np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol)
    else:        # data movement: bit for bit
        np.testing.assert_array_equal(got, want)
    return mod


def _x(*shape):
    return _RNG.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("upper", [0, 1])
@pytest.mark.parametrize("k", [None, -1, 2, 9])
def test_trilu(upper, k):
    feeds = {"x": _x(2, 4, 5)}
    inits = [] if k is None else [_c("k", k)]
    _check([helper.make_node("Trilu", ["x"] + (["k"] if k is not None else []), ["y"], upper=upper)],
           feeds, inits)


def test_trilu_runtime_k_then_relu():
    feeds = {"x": _x(3, 6), "k": np.array(-1, np.int64)}
    _check([helper.make_node("Trilu", ["x", "k"], ["t"], upper=1),
            helper.make_node("Relu", ["t"], ["y"])], feeds)


@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_onehot(axis):
    feeds = {"i": np.array([[0, 3, -1], [7, -5, 2]], np.int64), "v": np.array([-2.0, 5.0], np.float32)}
    _check([helper.make_node("OneHot", ["i", "d", "v"], ["y"], axis=axis)], feeds, [_c("d", [5])])


@pytest.mark.parametrize("k", [0, 1, -2])
def test_eyelike(k):
    feeds = {"x": _x(4, 6)}
    _check([helper.make_node("EyeLike", ["x"], ["e"], k=k, dtype=TensorProto.INT32),
            helper.make_node("Cast", ["e"], ["y"], to=TensorProto.FLOAT)], feeds)


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_gather_elements_runtime_negative_indices(axis):
    x = _x(3, 4, 5)
    n = x.shape[axis]
    idx = _RNG.integers(-n, n, (3, 4, 2) if axis == -1 else (2, 4, 5) if axis == 0 else (3, 2, 5))
    _check([helper.make_node("GatherElements", ["x", "i"], ["y"], axis=axis)], {"x": x, "i": idx})


def test_gather_elements_chain_constant_indices():
    """GatherElements inside an injective chain (ONNX's expanded functions have such groups)."""
    x = _x(4, 6)
    _check([helper.make_node("Neg", ["x"], ["n"]),
            helper.make_node("GatherElements", ["n", "i"], ["g"], axis=1),
            helper.make_node("Mul", ["g", "x2"], ["y"])],
           {"x": x, "x2": _x(4, 3)}, [_c("i", [[0, 5, -1], [2, 2, 3], [-6, 1, 0], [4, 3, 2]])])


@pytest.mark.parametrize("batch_dims", [0, 1])
def test_gather_nd(batch_dims):
    x = _x(3, 4, 5)
    idx = _RNG.integers(-3, 3, (3, 2, 2)) if batch_dims else _RNG.integers(-3, 3, (2, 3, 2))
    _check([helper.make_node("GatherND", ["x", "i"], ["y"], batch_dims=batch_dims)], {"x": x, "i": idx})


def test_gather_elements_out_of_range_runtime_index_is_clipped():
    """onnxruntime refuses it; the kernel never reads outside the buffer (clipped, as Gather)."""
    x = _x(2, 3)
    m = _model([helper.make_node("GatherElements", ["x", "i"], ["y"], axis=1)],
               {"x": x, "i": np.zeros((2, 2), np.int64)})
    mod = modelc.compile(m)
    assert not mod.fallbacks
    got = mod.run({"x": x, "i": np.array([[100, -100], [2, 0]], np.int64)})["y"]
    np.testing.assert_array_equal(got, [[x[0, 2], x[0, 0]], [x[1, 2], x[1, 0]]])


@pytest.mark.parametrize("op,mode", [("DepthToSpace", "DCR"), ("DepthToSpace", "CRD"), ("SpaceToDepth", None)])
def test_depth_space(op, mode):
    x = _x(2, 8, 2, 3) if op == "DepthToSpace" else _x(2, 3, 4, 6)
    attrs = {"blocksize": 2} | ({"mode": mode} if mode else {})
    _check([helper.make_node(op, ["x"], ["y"], **attrs)], {"x": x})


@pytest.mark.parametrize("mode", ["reflect", "edge", "wrap"])
@pytest.mark.parametrize("pads,axes", [([1, 2, 0, 2, 1, 3], None), ([0, -1, 2, 1], [0, 2])])
def test_pad_modes(mode, pads, axes):
    inits = [_c("p", pads)] + ([_c("a", axes)] if axes else [])
    ins = ["x", "p"] + (["", "a"] if axes else [])
    _check([helper.make_node("Pad", ins, ["y"], mode=mode)], {"x": _x(3, 4, 5)}, inits)


def test_pad_wrap_wider_than_input():
    _check([helper.make_node("Pad", ["x", "p"], ["y"], mode="wrap")], {"x": _x(2, 3)}, [_c("p", [0, 4, 0, 7])])


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
def test_scatter_elements_duplicates(reduction):
    x = _x(3, 5)
    idx = np.array([[1, 1, -1], [0, 4, 0], [2, 2, 2]], np.int64)
    feeds = {"x": x, "i": idx, "u": _x(3, 3)}
    against = "reference" if reduction == "none" else "ort"    # duplicates: ONNX leaves 'none' open
    _check([helper.make_node("ScatterElements", ["x", "i", "u"], ["y"], axis=1, reduction=reduction)],
           feeds, against=against)


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
def test_scatter_nd(reduction):
    x = _x(4, 3, 2)
    idx = np.array([[[1], [-1]], [[0], [1]]], np.int64) if reduction != "none" else \
        np.array([[[1], [-1]], [[0], [2]]], np.int64)
    feeds = {"x": x, "i": idx, "u": _x(2, 2, 3, 2)}
    _check([helper.make_node("ScatterND", ["x", "i", "u"], ["y"], reduction=reduction)], feeds)


def test_scatter_nd_full_index_int64_data():
    x = np.arange(24, dtype=np.int64).reshape(2, 3, 4)
    feeds = {"x": x, "u": np.array([-1, -2, -3], np.int64)}
    _check([helper.make_node("ScatterND", ["x", "i", "u"], ["y"])], feeds,
           [_c("i", [[0, 1, 2], [1, -1, 0], [1, 0, 3]])], out_type=TensorProto.INT64)


def test_scatter_constant_index_out_of_range_is_refused():
    m = _model([helper.make_node("ScatterElements", ["x", "i", "u"], ["y"], axis=0)],
               {"x": _x(2, 3), "u": _x(1, 3)}, [_c("i", [[0, 2, 0]])])
    with pytest.raises(ModelcError, match="out of range"):
        modelc.compile(m)


def test_pad_constant_value_runtime_input():
    feeds = {"x": _x(2, 3), "v": np.array(2.5, np.float32)}
    _check([helper.make_node("Pad", ["x", "p", "v"], ["y"])], feeds, [_c("p", [1, 0, 0, 2])])


@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_resize_tf_crop_and_resize_constant_roi(mode):
    inits = [_c("roi", [0, 0, 0.4, 0.6, 1, 1, 1.2, 0.7], np.float32), _c("sz", [1, 1, 3, 3])]
    _check([helper.make_node("Resize", ["x", "roi", "", "sz"], ["y"], mode=mode,
                             coordinate_transformation_mode="tf_crop_and_resize", extrapolation_value=10.0)],
           {"x": _x(1, 1, 4, 4)}, inits, rtol=1e-6 if mode == "linear" else 0.0)


@pytest.mark.parametrize("op,ishape,ushape", [("ScatterElements", (1, 4), (1, 4)),
                                              ("ScatterElements", (1, 2), (1, 3)),
                                              ("ScatterND", (2, 1), (2, 2))])
def test_scatter_shapes_that_do_not_fit_are_refused(op, ishape, ushape):
    """Mismatched updates would be read (or data written) beyond their buffers: refused at import."""
    m = _model([helper.make_node(op, ["x", "i", "u"], ["y"])],
               {"x": _x(2, 3), "i": np.zeros(ishape, np.int64), "u": _x(*ushape)})
    with pytest.raises(ModelcError, match="updates"):
        modelc.compile(m)


def test_gather_elements_indices_shorter_than_data():
    x = _x(4, 5)
    _check([helper.make_node("GatherElements", ["x", "i"], ["y"], axis=1)],
           {"x": x, "i": _RNG.integers(-5, 5, (2, 7))})


@pytest.mark.parametrize("node", [
    helper.make_node("DepthToSpace", ["c"], ["y"], blocksize=2, mode="CRD"),
    helper.make_node("SpaceToDepth", ["c"], ["y"], blocksize=2),
    helper.make_node("Pad", ["c", "p"], ["y"], mode="reflect"),
    helper.make_node("Trilu", ["c"], ["y"], upper=0),
    helper.make_node("GatherElements", ["c", "gi"], ["y"], axis=1),
], ids=lambda n: n.op_type)
def test_after_channel_blocked_conv(node):
    """The conv's output is channel-blocked: these kernels read it through its layout."""
    w = _RNG.standard_normal((16, 3, 3, 3)).astype(np.float32) * 0.3
    inits = [numpy_helper.from_array(w, "w"), _c("p", [0, 0, 1, 2, 0, 0, 2, 1]),
             _c("gi", _RNG.integers(-16, 16, (1, 5, 4, 4)))]
    _check([helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), node], {"x": _x(1, 3, 4, 4)},
           inits, rtol=1e-5)


@pytest.mark.parametrize("mode", ["linear", "cubic"])
def test_resize_uint8_interpolates_rounds_and_saturates(mode):
    """Integers interpolate in float64, round half to even and saturate (cubic overshoots 255), as
    modelc's reference and ONNX's (onnx.reference) do; onnxruntime truncates toward zero instead
    (and has no uint8 cubic), so the kernel is checked against the reference, which the fallback
    ran before."""
    x = np.array([[[[0, 255, 0, 255], [255, 0, 255, 0], [10, 20, 30, 250], [1, 2, 3, 4]]]], np.uint8)
    m = _model([helper.make_node("Resize", ["x", "", "s"], ["y"], mode=mode)], {"x": x},
               [_c("s", [1, 1, 1.5, 2], np.float32)], out_type=TensorProto.UINT8)
    mod = modelc.compile(m)
    assert not mod.fallbacks
    want = modelc.reference.run(modelc.from_onnx(m), {"x": x})["y"]
    np.testing.assert_array_equal(mod.run({"x": x})["y"], want)


@pytest.mark.parametrize("op,x,i,u", [("GatherElements", (2, 0), (2, 1), None), ("GatherND", (0, 3), (2, 1), None),
                                      ("ScatterElements", (2, 0), (2, 1), (2, 1)),
                                      ("ScatterND", (0, 3), (2, 1), (2, 3))])
def test_indexing_an_empty_axis_is_refused(op, x, i, u):
    """A clipped index has nowhere to go in an axis of size 0."""
    feeds = {"x": _x(*x), "i": np.zeros(i, np.int64)} | ({"u": _x(*u)} if u else {})
    attrs = {"axis": 1} if op.endswith("Elements") else {}
    m = _model([helper.make_node(op, list(feeds), ["y"], **attrs)], feeds)
    with pytest.raises(ModelcError, match="size 0"):
        modelc.compile(m)


def test_pad_reflect_of_a_cropped_away_axis_is_not_a_kernel():
    """Cropped to nothing, then padded: no kernel folds into an empty axis (the reference says why)."""
    m = _model([helper.make_node("Pad", ["x", "p"], ["y"], mode="edge")], {"x": _x(2, 3)},
               [_c("p", [0, -3, 0, 1])])
    with pytest.raises(ModelcError):
        modelc.compile(m).run({"x": _x(2, 3)})


# ---- GridSample ---------------------------------------------------------------------------------

def _grid(*shape):
    """Coordinates reaching past the image on every side (-1.4 .. 1.4), and the exact corners."""
    g = _RNG.uniform(-1.4, 1.4, shape).astype(np.float32)
    g.reshape(-1, shape[-1])[:4] = [[-1] * shape[-1], [1] * shape[-1], [-1.4] * shape[-1], [0] * shape[-1]]
    return g


@pytest.mark.parametrize("mode,padding,align", [
    ("linear", "zeros", 0), ("linear", "border", 1), ("linear", "reflection", 0), ("linear", "reflection", 1),
    ("nearest", "zeros", 1), ("nearest", "border", 0), ("nearest", "reflection", 0),
    ("cubic", "zeros", 0), ("cubic", "border", 1), ("cubic", "reflection", 1)])
def test_grid_sample(mode, padding, align):
    """Every mode and padding against onnxruntime, the grid past the borders, fused with a ReLU."""
    n = helper.make_node("GridSample", ["x", "g"], ["s"], mode=mode, padding_mode=padding, align_corners=align)
    m = _model([n, helper.make_node("Relu", ["s"], ["y"])], {"x": _x(2, 3, 5, 7), "g": _grid(2, 4, 6, 2)}, opset=20)
    feeds = {"x": _x(2, 3, 5, 7), "g": _grid(2, 4, 6, 2)}
    mod = modelc.compile(m)
    assert not mod.fallbacks, mod.fallbacks
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    np.testing.assert_allclose(mod.run(feeds)["y"], want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def test_grid_sample_16_bilinear_and_a_volume():
    """GridSample-16's mode names (PyTorch's export) against onnxruntime, and a 3-d image
    (GridSample-20) against ONNX's reference; modelc's own reference agrees."""
    from onnx.reference import ReferenceEvaluator
    m16 = _model([helper.make_node("GridSample", ["x", "g"], ["y"], mode="bilinear", align_corners=1)],
                 {"x": _x(1, 2, 6, 6), "g": _grid(1, 3, 3, 2)}, opset=16)
    m3d = _model([helper.make_node("GridSample", ["x", "g"], ["y"], mode="linear", padding_mode="reflection")],
                 {"x": _x(1, 2, 4, 5, 6), "g": _grid(1, 2, 3, 4, 3)}, opset=20)
    for m in (m16, m3d):
        feeds = {"x": _x(*[d.dim_value for d in m.graph.input[0].type.tensor_type.shape.dim]),
                 "g": _grid(*[d.dim_value for d in m.graph.input[1].type.tensor_type.shape.dim])}
        want = (ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
                if m is m16 else ReferenceEvaluator(m).run(None, feeds)[0])
        mod = modelc.compile(m)
        assert not mod.fallbacks
        np.testing.assert_allclose(mod.run(feeds)["y"], want, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(modelc.reference.run(modelc.from_onnx(m), feeds)["y"], want, rtol=1e-5, atol=1e-6)


def test_grid_sample_nan_grid_reads_inside_the_image():
    """A NaN coordinate is no index: the kernel clamps every read (here it must not crash)."""
    g = _grid(1, 2, 2, 2)
    g[0, 0, 0, 0] = np.nan
    m = _model([helper.make_node("GridSample", ["x", "g"], ["y"], padding_mode="border")],
               {"x": _x(1, 1, 3, 3), "g": g}, opset=20)
    out = modelc.compile(m).run({"x": _x(1, 1, 3, 3), "g": g})["y"]
    assert out.shape == (1, 1, 2, 2) and np.isfinite(out.reshape(-1)[1:]).all()


def test_grid_sample_grid_that_does_not_fit_is_refused():
    m = _model([helper.make_node("GridSample", ["x", "g"], ["y"])], {"x": _x(1, 2, 4, 4), "g": _grid(1, 3, 3, 3)},
               opset=20)
    with pytest.raises(ModelcError, match="grid"):
        modelc.compile(m)
    m = _model([helper.make_node("GridSample", ["x", "g"], ["y"], mode="linear")],
               {"x": _x(1, 2, 4, 4), "g": _grid(1, 3, 3, 2)}, opset=16)
    with pytest.raises(ModelcError, match="no mode 'linear'"):
        modelc.compile(m)


@pytest.mark.parametrize("shape,batch_axis,time_axis,lens,const", [
    ((5, 3, 4), 1, 0, [5, 2, 1], True), ((3, 6, 2, 2), 0, 1, [6, 0, 4], False)])
def test_reverse_sequence(shape, batch_axis, time_axis, lens, const):
    """Each batch entry's first lens[b] steps reversed, the lengths a constant or an input."""
    feeds = {"x": _x(*shape)}
    inits = [_c("lens", lens)] if const else []
    if not const:
        feeds["lens"] = np.asarray(lens, np.int64)
    mod = _check([helper.make_node("ReverseSequence", ["x", "lens"], ["y"], batch_axis=batch_axis,
                                   time_axis=time_axis)], feeds, inits)
    if not const:                     # lengths past the steps read clipped indices: no stray reads
        got = mod.run({**feeds, "lens": np.asarray([100] * len(lens), np.int64)})["y"]
        assert np.isin(got, feeds["x"]).all()


def test_reverse_sequence_refuses_constant_lengths_past_the_steps():
    with pytest.raises(ModelcError, match=r"ReverseSequence.*sequence_lens \[6, 1, 2\] must lie in \[0, 5\]"):
        modelc.compile(_model([helper.make_node("ReverseSequence", ["x", "lens"], ["y"], batch_axis=1, time_axis=0)],
                              {"x": _x(5, 3, 4)}, [_c("lens", [6, 1, 2])]))


@pytest.mark.parametrize("shape,kernel,strides,pads", [((2, 2, 5, 5), [3, 3], [2, 2], [1, 1, 1, 1]),
                                                        ((1, 4, 9), [3], [3], [0, 0])])
def test_max_unpool_of_max_pools_indices(shape, kernel, strides, pads):
    """MaxPool's values and indices unpooled: each value back where the pool found it, zeros elsewhere."""
    x = _x(*shape)
    pool = helper.make_node("MaxPool", ["x"], ["p", "i"], kernel_shape=kernel, strides=strides, pads=pads)
    unpool = helper.make_node("MaxUnpool", ["p", "i"], ["y"], kernel_shape=kernel, strides=strides, pads=pads)
    _check([pool, unpool], {"x": x})


def test_max_unpool_to_another_shape_is_refused_naming_it():
    """With an output_shape other than the unpooled one, onnxruntime reads the indices in that shape's
    layout and ONNX's reference in the unpooled one's: refused, not guessed."""
    nodes = [helper.make_node("MaxPool", ["x"], ["p", "i"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("MaxUnpool", ["p", "i", "s"], ["y"], kernel_shape=[2, 2], strides=[2, 2])]
    with pytest.raises(ModelcError, match=r"MaxUnpool\(output_shape other than the unpooled shape\)"):
        modelc.compile(_model(nodes, {"x": _x(1, 1, 5, 5)}, [_c("s", [1, 1, 5, 5])]))


@pytest.mark.parametrize("image,block,attrs", [([5, 6], [2, 3], {}),
                                               ([9, 7], [2, 2], {"dilations": [2, 1], "strides": [1, 2],
                                                                 "pads": [0, 1, 1, 0]})])
def test_col2im_adds_each_block_where_it_was_taken(image, block, attrs):
    """torch.nn.Fold's op: overlapping blocks summed, those in the padding dropped."""
    s, d = attrs.get("strides", [1, 1]), attrs.get("dilations", [1, 1])
    p = attrs.get("pads", [0, 0, 0, 0])
    blocks = [(image[i] + p[i] + p[2 + i] - d[i] * (block[i] - 1) - 1) // s[i] + 1 for i in range(2)]
    x = _x(2, 3 * block[0] * block[1], blocks[0] * blocks[1])
    node = helper.make_node("Col2Im", ["x", "img", "blk"], ["y"], **attrs)
    mod = _check([node], {"x": x}, [_c("img", image), _c("blk", block)], rtol=1e-6)
    assert mod.run({"x": x})["y"].shape == (2, 3, *image)
