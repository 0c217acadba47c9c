"""modelc compare: the table's fields, JSON/Markdown output, and the exit status."""
import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from modelc.cli import main
from modelc.runtime.module import Module


@pytest.fixture(scope="module")
def small_model(tmp_path_factory):
    d = tmp_path_factory.mktemp("cmp")
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array((rng.standard_normal((16, 8, 3, 3)) * 0.2).astype(np.float32), "w")
    fc = numpy_helper.from_array((rng.standard_normal((16, 10)) * 0.2).astype(np.float32), "fc")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("GlobalAveragePool", ["r"], ["g"]),
             helper.make_node("Flatten", ["g"], ["f"]),
             helper.make_node("MatMul", ["f", "fc"], ["y"])]
    g = helper.make_graph(nodes, "small", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 16, 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])], [w, fc])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    path = str(d / "small.onnx")
    onnx.save(m, path)
    return path, d


def test_compare_tunes_and_reports(small_model, capsys):
    path, d = small_model
    log, out_json, out_md = str(d / "s.jsonl"), str(d / "s.json"), str(d / "s.md")
    status = main(["compare", path, "--trials", "4", "--log", log, "--inputs", "3", "--rounds", "20",
                   "--json", out_json, "--markdown", out_md, "-q"])
    text = capsys.readouterr().out
    assert status == 0, text
    assert "PASS" in text and "onnxruntime" in text and "modelc (tuned)" in text
    res = json.load(open(out_json))
    names = [r["runtime"] for r in res["rows"]]
    assert names == ["onnxruntime", "modelc (untuned)", "modelc (tuned)"]
    for r in res["rows"][1:]:
        assert {"median_ms", "p10_ms", "p90_ms", "speedup_vs_onnxruntime", "speedup_vs_untuned",
                "max_abs_err", "max_rel_err", "top1_agree"} <= set(r)
        assert r["top1_agree"] == 3 and r["max_rel_err"] <= 1e-4
    assert "| runtime |" in open(out_md).read()


def test_compare_fails_on_a_wrong_module(small_model, capsys, monkeypatch):
    path, _ = small_model
    real_run = Module.run

    def wrong(self, feeds):
        return {k: v + 1.0 for k, v in real_run(self, feeds).items()}

    monkeypatch.setattr(Module, "run", wrong)
    status = main(["compare", path, "--inputs", "2", "--rounds", "10", "-q"])
    assert status == 1
    assert "FAIL" in capsys.readouterr().out
