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


def _record_turns(monkeypatch, turns):
    """Notes who runs when: modelc's profile ("modelc") and each peer's profiled runs (its class)."""
    from modelc import layers
    real_profile = Module.profile

    def profile(self, *a, **k):
        turns.append("modelc")
        return real_profile(self, *a, **k)
    monkeypatch.setattr(Module, "profile", profile)
    for cls in (layers.OnnxruntimeNodes, layers.OpenvinoNodes):
        def run(self, runs, real=cls.run, name=cls.__name__, **kw):
            turns.append(name)
            return real(self, runs, **kw)
        monkeypatch.setattr(cls, "run", run)


def test_per_layer_report_matches_every_onnxruntime_node(small_model, capsys, monkeypatch):
    from modelc.layers import ROUNDS
    path, d = small_model
    out_json = str(d / "layers.json")
    turns = []
    _record_turns(monkeypatch, turns)
    status = main(["compare", path, "--inputs", "1", "--rounds", "10", "--per-layer", "--json", out_json, "-q"])
    text = capsys.readouterr().out
    assert status == 0, text
    rep = json.load(open(out_json))["per_layer"]
    assert rep["module"] == "modelc (untuned)" and "per layer" in text
    by_desc = {r["desc"].split()[0]: r for r in rep["rows"]}
    assert "Conv" in by_desc["conv2d_relu"]["onnxruntime"]          # onnxruntime fuses the Relu into it
    assert any("GlobalAveragePool" in r["onnxruntime"] for r in rep["rows"])
    assert any("MatMul" in r["onnxruntime"] or "Gemm" in r["onnxruntime"] for r in rep["rows"])
    assert rep["unmatched"] == []
    assert abs(sum(r["onnxruntime_ms"] for r in rep["rows"]) - rep["onnxruntime_nodes_ms"]) < 1e-9
    kernels = [r for r in rep["rows"] if r["template"] != "(view)"]
    assert kernels and all(r["modelc_ms"] > 0 for r in kernels)
    # the whole runs beside the sums, so a profiler's own overhead is visible
    assert set(rep["latency_ms"]) == {"onnxruntime", "modelc (untuned)"} and "whole runs: modelc" in text
    # both timed at the same moments of a shared machine: in alternating rounds, not one after the other
    assert turns == ["modelc", "OnnxruntimeNodes"] * ROUNDS


def test_onnxruntime_nodes_are_timed_in_the_timed_runs_only(small_model):
    """The runs that open each turn (after another runtime's) warm up, and are left out; unnamed nodes
    (the Flatten and MatMul here, which onnxruntime times as `Flatten_3`, `MatMul_4`) are timed too."""
    from modelc.layers import OnnxruntimeNodes
    path, _ = small_model
    feeds = {"x": np.ones((1, 8, 16, 16), np.float32)}
    prof = OnnxruntimeNodes(path, feeds, 1)
    prof.run(3, warm=2)
    prof.run(2, warm=1)
    nodes = prof.nodes()
    assert nodes and all(n["runs"] == 5 for n in nodes), [(n["name"], n["runs"]) for n in nodes]


def test_onnxruntime_nodes_of_its_own_go_to_the_group_beside_them():
    from modelc.layers import match
    groups = [{"conv1", "c1_out"}, {"conv2", "c2_out"}]
    nodes = [{"name": "reorder_in", "op": "ReorderInput", "inputs": ["x"], "outputs": ["t0"]},
             {"name": "c1_out_nchwc", "op": "Conv", "inputs": ["t0"], "outputs": ["t1"]},      # named after an output
             {"name": "conv2", "op": "Conv", "inputs": ["t1"], "outputs": ["t2"]},             # kept its name
             {"name": "reorder_out", "op": "ReorderOutput", "inputs": ["t2"], "outputs": ["c2_out"]},
             {"name": "stray", "op": "Identity", "inputs": ["elsewhere"], "outputs": ["nowhere"]}]
    assert match(nodes, groups) == [0, 0, 1, 1, None]


def test_compare_against_openvino(small_model, capsys):
    pytest.importorskip("openvino")
    path, d = small_model
    out_json = str(d / "ov.json")
    status = main(["compare", path, "--inputs", "2", "--rounds", "10", "--against", "openvino",
                   "--json", out_json, "-q"])
    text = capsys.readouterr().out
    assert status == 0, text
    rows = {r["runtime"]: r for r in json.load(open(out_json))["rows"]}
    assert rows["openvino"]["max_rel_err"] <= 1e-4 and rows["openvino"]["top1_agree"] == 2
    assert "fastest peer" in text


def test_openvino_nodes_go_to_the_groups_of_the_onnx_nodes_they_cover():
    from modelc.layers import match
    groups = [{"conv1", "relu1", "c1_out"}, {"pool", "p_out"}]
    nodes = [{"name": "x_reorder", "op": "Reorder", "inputs": ["x"], "outputs": ["x_reorder"], "originals": []},
             {"name": "conv1/WithoutBiases", "op": "Convolution", "inputs": ["x_reorder"],
              "outputs": ["conv1/WithoutBiases"], "originals": ["conv1/WithoutBiases", "conv1", "relu1"]},
             {"name": "pool", "op": "Pooling", "inputs": ["conv1/WithoutBiases"], "outputs": ["pool"],
              "originals": ["pool"]}]
    assert match(nodes, groups) == [0, 0, 1]


def test_per_layer_report_against_openvino(small_model, capsys, monkeypatch):
    pytest.importorskip("openvino")
    from modelc.layers import ROUNDS
    path, d = small_model
    out_json = str(d / "layers_ov.json")
    turns = []
    _record_turns(monkeypatch, turns)
    status = main(["compare", path, "--inputs", "1", "--rounds", "10", "--per-layer", "--against", "openvino",
                   "--json", out_json, "-q"])
    text = capsys.readouterr().out
    assert status == 0, text
    rep = json.load(open(out_json))["per_layer"]
    conv = next(r for r in rep["rows"] if r["desc"].startswith("conv2d_relu"))
    assert any(op.startswith("Convolution") for op in conv["openvino"]) and conv["openvino_ms"] > 0
    placed = sum(r["openvino_ms"] for r in rep["rows"]) + sum(n["ms"] for n in rep["unmatched_openvino"])
    assert abs(placed - rep["openvino_nodes_ms"]) < 1e-9 and rep["openvino_nodes_ms"] > 0
    assert "openvino nodes" in text and "OpenVINO's nodes" in text
    assert turns == ["modelc", "OnnxruntimeNodes", "OpenvinoNodes"] * ROUNDS
