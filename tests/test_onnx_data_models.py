"""Every model file under the onnx package's backend/test/data folders whose ops modelc supports.

Stored models (PyTorch-converted layers, old-opset operator tests) are compared with their stored
outputs; the 'light' ONNX-zoo models (opset 9: BatchNormalization with separate inputs, Sum,
ConstantOfShape-made weights) are compared with onnxruntime on a seeded input.
"""
import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from modelc import conformance, frontend, reference

DIRS = conformance.data_model_dirs()
LIGHT = conformance.light_models()


@pytest.mark.parametrize("path", DIRS, ids=[os.path.relpath(p, os.path.dirname(os.path.dirname(p)))
                                            for p in DIRS])
def test_stored_model(path):
    r = conformance.run_model_dir(path)
    if r.status == conformance.NOT_RUN:
        pytest.skip(r.reason)
    assert r.status == conformance.PASSED, r.reason


@pytest.mark.parametrize("path", LIGHT, ids=[os.path.basename(p) for p in LIGHT])
def test_light_zoo_model_matches_onnxruntime(path):
    model = onnx.load(path)
    missing = conformance._unsupported_ops(model)
    if missing:
        pytest.skip(f"unsupported op: {', '.join(missing)}")
    graph = frontend.from_onnx(model)
    rng = np.random.default_rng(0)
    feeds = {n: rng.standard_normal(graph.tensors[n].shape).astype(graph.tensors[n].dtype)
             for n in graph.inputs}
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    expected = sess.run(None, feeds)
    got = reference.run(graph, feeds)
    for name, exp in zip(graph.outputs, expected):
        scale = max(float(np.abs(exp).max()), 1e-30)
        err = float(np.abs(got[name] - exp).max())
        assert err <= 1e-4 * scale, f"{name}: max abs error {err:.3g} vs output scale {scale:.3g}"
