"""Task extraction: weights, FLOPs and keys that are stable across processes and models."""
import json
import subprocess
import sys

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import models
import modelc
from modelc.ops.cost import graph_macs
from modelc.passes.lower import lower
from modelc.extract import extract_tasks, tasks_from_graph


@pytest.fixture(scope="module")
def r18():
    graph = modelc.from_onnx(models.cached_path("resnet18"), shape={"input": (1, 3, 224, 224)})
    return graph, lower(graph)


def test_resnet18_weights_and_flops(r18):
    graph, fused = r18
    tasks = tasks_from_graph(fused)
    assert sum(t.weight for t in tasks) == len(fused)
    total = sum(t.weight * t.flops for t in tasks)
    assert abs(total - 2 * graph_macs(graph)) <= 0.01 * 2 * graph_macs(graph)
    assert len({t.key for t in tasks}) == len(tasks)
    convs = [t for t in tasks if t.template == "conv2d"]
    assert {t.desc for t in convs} >= {"conv2d_bias_relu 1x3x224x224 k64 7x7 s2 p3",
                                        "conv2d_bias_add_relu 1x64x56x56 k64 3x3 s1 p1"}
    assert all(t.tunable for t in convs)


def test_a_residual_after_a_downsample_is_indexed_like_the_output(r18):
    """The first block of a stage adds a downsample conv's output, the second the first block's:
    both residuals get the halo of the group's output, so the two conv + add + relu are one task."""
    by_desc: dict = {}
    for t in tasks_from_graph(r18[1]):
        by_desc.setdefault(t.desc, []).append(t)
    for stage in ("1x128x28x28 k128", "1x256x14x14 k256"):
        (t,) = by_desc[f"conv2d_bias_add_relu {stage} 3x3 s1 p1"]
        assert t.weight == 2


def test_extract_tasks_is_deterministic_across_processes():
    code = ("import json, models; from modelc.extract import extract_tasks; "
            "print(json.dumps([(t.key, t.weight) for t in "
            "extract_tasks(models.cached_path('resnet18'), shape={'input': (1, 3, 224, 224)})]))")
    runs = [subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
            for _ in range(2)]
    first, second = (json.loads(r.stdout.strip().splitlines()[-1]) for r in runs)
    assert first == second
    here = [(t.key, t.weight) for t in extract_tasks(models.cached_path("resnet18"),
                                                    shape={"input": (1, 3, 224, 224)})]
    assert [list(p) for p in here] == first


def test_resnet18_and_resnet34_share_keys_of_identical_layers(r18):
    t18 = {t.key: t for t in tasks_from_graph(r18[1])}
    t34 = {t.key: t for t in extract_tasks(models.cached_path("resnet34"), shape={"input": (1, 3, 224, 224)})}
    shared = set(t18) & set(t34)
    # every ResNet-18 layer shape also occurs in ResNet-34 (same stages, more blocks)
    assert shared == set(t18), [t18[k].desc for k in set(t18) - shared]
    for k in shared:
        assert t34[k].weight >= t18[k].weight


def _conv_model(explicit_defaults: bool, auto_pad: bool = False):
    w = numpy_helper.from_array(np.ones((8, 4, 3, 3), np.float32), "w")
    if auto_pad:
        attrs = {"auto_pad": "SAME_UPPER"}
    elif explicit_defaults:
        attrs = {"kernel_shape": [3, 3], "strides": [1, 1], "dilations": [1, 1], "pads": [1, 1, 1, 1],
                 "group": 1}
    else:
        attrs = {"pads": [1, 1, 1, 1]}
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], **attrs), helper.make_node("Relu", ["c"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 9, 9])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 9, 9])], [w])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])


def test_key_ignores_how_the_exporter_spelled_defaults():
    keys = {extract_tasks(_conv_model(e, a))[0].key for e, a in [(True, False), (False, False), (False, True)]}
    assert len(keys) == 1


def test_key_ignores_weight_values_and_names():
    m1, m2 = _conv_model(True), _conv_model(True)
    m2.graph.initializer[0].CopyFrom(numpy_helper.from_array(np.zeros((8, 4, 3, 3), np.float32), "w"))
    m2.graph.node[0].name = "some_other_name"
    assert extract_tasks(m1)[0].key == extract_tasks(m2)[0].key


def test_tasks_cli_table_and_json(capsys):
    from modelc.cli import main
    assert main(["tasks", "resnet18"]) == 0
    out = capsys.readouterr().out
    assert "conv2d_bias_add_relu 1x64x56x56 k64 3x3 s1 p1" in out and "GFLOPs" in out
    assert main(["tasks", "resnet18", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {"key", "desc", "weight", "flops", "template", "workload"} <= set(rows[0])
