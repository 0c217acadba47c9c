"""The example models: valid ONNX, runnable, seeded, calibrated, cached, and imported faithfully."""
import collections
import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import models

CNNS = ["resnet18", "resnet34", "resnet50", "mobilenet_v2", "squeezenet1_1", "efficientnet_b0"]
INPUT_SHAPES = {**{name: (1, 3, 224, 224) for name in CNNS}, "transformer": (1, 128, 256)}
OUTPUT_SHAPES = {**{name: (1000,) for name in CNNS}, "transformer": (128, 256)}
# every op of torchvision's model as torch.onnx.export writes it in eval mode
OP_COUNTS = {
    # 1 stem + 16 bottlenecks x 3 + 4 downsamples; ReLU after stem, 2 per block inside, 1 after each Add
    "resnet50": {"Conv": 53, "BatchNormalization": 53, "Relu": 49, "Add": 16, "MaxPool": 1,
                 "GlobalAveragePool": 1, "Flatten": 1, "Gemm": 1},
    # stem + 8 fires x 3 + final conv, each with a ReLU (and no BatchNorm)
    "squeezenet1_1": {"Conv": 26, "Relu": 26, "Concat": 8, "MaxPool": 3, "GlobalAveragePool": 1, "Flatten": 1},
    # convs: stem, 16 blocks x (depthwise + 2 SE + project) + 15 expands, head; a SiLU (Sigmoid+Mul)
    # after stem, expands, depthwise and SE fc1 and head (49), SE gates Sigmoid+Mul (16); 9 residuals
    "efficientnet_b0": {"Conv": 81, "BatchNormalization": 49, "Sigmoid": 65, "Mul": 65, "Add": 9,
                        "GlobalAveragePool": 17, "Flatten": 1, "Gemm": 1},
}


@pytest.fixture(scope="module")
def built():
    """Each model built once for the whole module (calibration runs onnxruntime)."""
    return {}


def get(built, name) -> onnx.ModelProto:
    if name not in built:
        built[name] = models.build(name)
    return built[name]


def session(model: onnx.ModelProto) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    so.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def inputs(name, count, seed=1):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(INPUT_SHAPES[name]).astype(np.float32) for _ in range(count)]


@pytest.mark.parametrize("name", list(models.MODELS))
def test_valid_onnx_with_metadata(built, name):
    m = get(built, name)
    onnx.checker.check_model(m, full_check=True)
    assert m.producer_name == "modelc.models" and m.doc_string
    assert [i.name for i in m.graph.input] == ["input"] and [o.name for o in m.graph.output] == ["output"]
    assert len({n.name for n in m.graph.node}) == len(m.graph.node)


@pytest.mark.parametrize("name", CNNS)
def test_cnn_dynamic_batch_and_calibration(built, name):
    """Batch dim is symbolic; outputs are finite, of order one, and top-1 depends on the input."""
    dims = get(built, name).graph.input[0].type.tensor_type.shape.dim
    assert dims[0].dim_param == "N" and [d.dim_value for d in dims[1:]] == [3, 224, 224]
    x = np.concatenate(inputs(name, 4))
    y = session(get(built, name)).run(None, {"input": x})[0]
    assert y.shape == (4, 1000)
    assert np.isfinite(y).all()
    assert 0.2 < y.std() < 5 and np.abs(y).max() < 50
    assert len(set(y.argmax(axis=1).tolist())) >= 3, "top-1 barely depends on the input"


def test_transformer_outputs_vary(built):
    sess = session(get(built, "transformer"))
    ys = [sess.run(None, {"input": x})[0] for x in inputs("transformer", 3)]
    for y in ys:
        assert y.shape == (1, 128, 256) and np.isfinite(y).all()
        assert 0.5 < y.std() < 2  # LayerNorm output
    assert np.std(ys[0] - ys[1]) > 0.3, "output hardly depends on the input"
    assert np.std(ys[0][0, 0] - ys[0][0, 1]) > 0.3, "all positions give the same output"


@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v2", "squeezenet1_1", "transformer"])  # resnet34: same code
def test_seeded_and_deterministic(built, name):
    again = models.build(name).SerializeToString()
    assert again == get(built, name).SerializeToString()
    if name == "transformer":  # cheap enough to check that the seed matters
        assert models.build(name, seed=1).SerializeToString() != again


def test_params_and_macs(built):
    """torchvision's parameter counts; well-known MAC counts."""
    assert models.count_params(get(built, "resnet18")) == 11_689_512
    assert models.count_params(get(built, "resnet34")) == 21_797_672
    assert models.count_params(get(built, "mobilenet_v2")) == 3_504_872
    assert abs(models.count_macs(get(built, "resnet18")) / 1.814e9 - 1) < 0.01
    assert abs(models.count_macs(get(built, "mobilenet_v2")) / 300.8e6 - 1) < 0.01
    assert models.count_params(get(built, "resnet50")) == 25_557_032
    assert models.count_params(get(built, "squeezenet1_1")) == 1_235_496
    assert models.count_params(get(built, "efficientnet_b0")) == 5_288_548
    for name, gmacs in (("resnet50", 4.09), ("squeezenet1_1", 0.35), ("efficientnet_b0", 0.39)):
        assert round(models.count_macs(get(built, name)) / 1e9, 2) == gmacs, name  # torchvision's GFLOPS


def test_unknown_name_lists_models():
    with pytest.raises(ValueError, match="resnet18.*transformer"):
        models.build("resnet1000")
    with pytest.raises(ValueError, match="available"):
        models.cached_path("nope")


def test_cached_path(tmp_path, monkeypatch):
    monkeypatch.setenv("MODELC_CACHE_DIR", str(tmp_path))
    path = models.cached_path("transformer")
    assert os.path.dirname(path) == str(tmp_path / "models")
    assert models.builder_version() in os.path.basename(path)
    assert onnx.load(path).SerializeToString() == models.build("transformer").SerializeToString()
    mtime = os.stat(path).st_mtime_ns
    assert models.cached_path("transformer") == path and os.stat(path).st_mtime_ns == mtime
    assert os.listdir(tmp_path / "models") == [os.path.basename(path)]  # no temp files left


def test_save(tmp_path):
    out = models.save("transformer", tmp_path / "sub" / "t.onnx")
    onnx.checker.check_model(onnx.load(out))


@pytest.mark.parametrize("name", sorted(OP_COUNTS))
def test_op_counts_match_torchvision(built, name):
    assert collections.Counter(n.op_type for n in get(built, name).graph.node) == OP_COUNTS[name]


def _attrs(node) -> dict:
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def _convs(model):
    """(kernel, stride, depthwise) of every Conv, counted."""
    attrs = [_attrs(n) for n in model.graph.node if n.op_type == "Conv"]
    return collections.Counter((a["kernel_shape"][0], a["strides"][0], a["group"] > 1) for a in attrs)


def test_torchvision_details(built):
    """Where the strides are (ResNet-50 v1.5: on the 3x3), SqueezeNet's unpadded stem and ceil-mode
    pools, EfficientNet-B0's depthwise kernels."""
    assert _convs(get(built, "resnet50")) == {(7, 2, False): 1, (3, 2, False): 3, (1, 2, False): 3,
                                                (3, 1, False): 13, (1, 1, False): 33}
    sq = get(built, "squeezenet1_1")
    stem = sq.graph.node[0]
    assert stem.op_type == "Conv" and _attrs(stem)["pads"] == [0, 0, 0, 0] and len(stem.input) == 3
    assert [_attrs(n)["ceil_mode"] for n in sq.graph.node if n.op_type == "MaxPool"] == [1, 1, 1]
    assert len(sq.graph.initializer) == 52  # weight and bias of 26 convs: the calibration BatchNorms are gone
    eff = _convs(get(built, "efficientnet_b0"))
    assert eff[(3, 1, True)] + eff[(3, 2, True)] == 7 and eff[(5, 1, True)] + eff[(5, 2, True)] == 9
    assert eff[(3, 2, True)] + eff[(5, 2, True)] == 4


@pytest.mark.parametrize("name", list(models.MODELS))
def test_reference_matches_onnxruntime(built, tmp_path, name):
    """The frontend + numpy reference executor reproduce onnxruntime on every example model."""
    import modelc
    from modelc import reference

    path = str(tmp_path / f"{name}.onnx")
    onnx.save(get(built, name), path)
    graph = modelc.frontend.from_onnx(path, shape={"input": INPUT_SHAPES[name]})
    (x,) = inputs(name, 1, seed=7)
    expected = session(get(built, name)).run(None, {"input": x})[0]
    got = reference.run(graph, {"input": x})["output"]
    assert got.shape == expected.shape and got.dtype == expected.dtype
    err = np.abs(got - expected).max()
    assert err <= 1e-4 * np.abs(expected).max(), f"max abs error {err}"
    assert (got.argmax(axis=-1) == expected.argmax(axis=-1)).all()
