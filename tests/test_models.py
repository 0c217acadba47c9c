"""The example models: valid ONNX, runnable, seeded, calibrated, cached, and imported faithfully."""
import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import models

CNNS = ["resnet18", "resnet34", "mobilenet_v2"]
INPUT_SHAPES = {"resnet18": (1, 3, 224, 224), "resnet34": (1, 3, 224, 224),
                "mobilenet_v2": (1, 3, 224, 224), "transformer": (1, 128, 256)}
OUTPUT_SHAPES = {"resnet18": (1000,), "resnet34": (1000,), "mobilenet_v2": (1000,), "transformer": (128, 256)}


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


@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v2", "transformer"])  # resnet34: same code
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
