"""Concats that copy nothing: the kernels producing a Concat's inputs write straight into its result
(runtime/plan.py `concat_parts`, the halo unified by passes/layout.py). Where it applies the Concat
runs no kernel; where it must not (two images, inputs in part blocks, an input that is a model
output or joins two Concats) the copy stays; every model matches onnxruntime, also run from
several threads at once."""
from __future__ import annotations

import threading

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import modelc

F = TensorProto.FLOAT


def _w(name, shape, rng):
    return numpy_helper.from_array((rng.standard_normal(shape) * 0.2).astype(np.float32), name)


def _model(nodes, x_shape, outputs, inits):
    vi = helper.make_tensor_value_info
    g = helper.make_graph(nodes, "g", [vi("x", F, list(x_shape))], [vi(n, F, None) for n in outputs], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    return m


def fire(n=1, ca=16, cb=16, next_kernel=3):
    """SqueezeNet's fire module: squeeze 1x1 -> expand 1x1 and 3x3 -> Concat -> the next conv."""
    rng = np.random.default_rng(ca + cb + next_kernel)
    inits = [_w("ws", (8, 16, 1, 1), rng), _w("wa", (ca, 8, 1, 1), rng), _w("wb", (cb, 8, 3, 3), rng),
             _w("wc", (24, ca + cb, next_kernel, next_kernel), rng)]
    p = next_kernel // 2
    nodes = [helper.make_node("Conv", ["x", "ws"], ["s0"]), helper.make_node("Relu", ["s0"], ["s"]),
             helper.make_node("Conv", ["s", "wa"], ["a0"]), helper.make_node("Relu", ["a0"], ["a"]),
             helper.make_node("Conv", ["s", "wb"], ["b0"], pads=[1] * 4), helper.make_node("Relu", ["b0"], ["b"]),
             helper.make_node("Concat", ["a", "b"], ["c"], axis=1),
             helper.make_node("Conv", ["c", "wc"], ["y"], pads=[p] * 4)]
    return _model(nodes, (n, 16, 9, 11), ["y"], inits)


def dense_net():
    """A dense block: x joins two Concats (the second also takes the first's output) and feeds a conv."""
    rng = np.random.default_rng(1)
    inits = [_w("w1", (16, 16, 3, 3), rng), _w("w2", (16, 32, 3, 3), rng), _w("w3", (16, 48, 1, 1), rng)]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["f1"], pads=[1] * 4),
             helper.make_node("Relu", ["x"], ["x1"]),
             helper.make_node("Concat", ["x1", "f1"], ["c1"], axis=1),
             helper.make_node("Conv", ["c1", "w2"], ["f2"], pads=[1] * 4),
             helper.make_node("Concat", ["c1", "f2"], ["c2"], axis=1),
             helper.make_node("Conv", ["c2", "w3"], ["y"])]
    return _model(nodes, (1, 16, 8, 8), ["y"], inits)


def output_part():
    """A branch that is also a model output (plain rows: written where the model's output is read)
    cannot live inside the Concat's result."""
    rng = np.random.default_rng(2)
    inits = [_w("wa", (12, 5), rng), _w("wb", (12, 7), rng), _w("wc", (12, 4), rng)]
    nodes = [helper.make_node("MatMul", ["x", "wa"], ["a"]), helper.make_node("MatMul", ["x", "wb"], ["b"]),
             helper.make_node("Concat", ["a", "b"], ["c"], axis=1), helper.make_node("MatMul", ["c", "wc"], ["y"])]
    return _model(nodes, (1, 12), ["y", "a"], inits)


def plain_rows():
    """Dense layers' outputs of one row joined along features: plain stretches of the result."""
    rng = np.random.default_rng(3)
    inits = [_w("wa", (12, 5), rng), _w("wb", (12, 7), rng), _w("wc", (12, 4), rng)]
    nodes = [helper.make_node("MatMul", ["x", "wa"], ["a"]), helper.make_node("Relu", ["a"], ["ar"]),
             helper.make_node("MatMul", ["x", "wb"], ["b"]),
             helper.make_node("Concat", ["ar", "b"], ["c"], axis=1), helper.make_node("MatMul", ["c", "wc"], ["y"])]
    return _model(nodes, (1, 12), ["y"], inits)


def viewed_part():
    """An input of an in-place Concat that is also reshaped (a view: no kernel) into a model output."""
    rng = np.random.default_rng(4)
    inits = [_w("wa", (12, 5), rng), _w("wb", (12, 7), rng), _w("wc", (12, 4), rng),
             numpy_helper.from_array(np.array([7], np.int64), "flat")]
    nodes = [helper.make_node("MatMul", ["x", "wa"], ["a"]), helper.make_node("MatMul", ["x", "wb"], ["b"]),
             helper.make_node("Reshape", ["b", "flat"], ["z"]),
             helper.make_node("Concat", ["a", "b"], ["c"], axis=1), helper.make_node("MatMul", ["c", "wc"], ["y"])]
    return _model(nodes, (1, 12), ["y", "z"], inits)


CASES = {"fire_3x3_next": (fire, True), "fire_1x1_next": (lambda: fire(next_kernel=1), True),
         "two_images": (lambda: fire(n=2), False), "part_blocks": (lambda: fire(ca=8, cb=12), False),
         "dense_block": (dense_net, True), "output_part": (output_part, False), "plain_rows": (plain_rows, True),
         "viewed_part": (viewed_part, True)}


def _concat_kernels(mod) -> int:
    return sum(name.startswith("concat") for name in mod.step_names)


@pytest.mark.parametrize("case", sorted(CASES))
def test_concat_inputs_written_in_place_match_onnxruntime(case):
    make, in_place = CASES[case]
    model = make()
    mod = modelc.compile(model.SerializeToString())
    assert not mod.fallbacks
    concats = sum(n.op_type == "Concat" for n in model.graph.node)
    if in_place:
        assert _concat_kernels(mod) < concats
    else:
        assert _concat_kernels(mod) == concats
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    x = np.random.default_rng(7).standard_normal(shape).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    for _ in range(2):                      # a second run: the buffers (and halos) as the first left them
        got = mod.run({"x": x})
        for o, w in zip(model.graph.output, want):
            assert np.abs(got[o.name] - w).max() <= 1e-5 * max(1.0, np.abs(w).max()), o.name


def test_in_place_concats_from_several_threads():
    model = dense_net()
    mod = modelc.compile(model.SerializeToString())
    xs = [np.random.default_rng(k).standard_normal((1, 16, 8, 8)).astype(np.float32) for k in range(4)]
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = [sess.run(None, {"x": x})[0] for x in xs]
    bad = []

    def work(k):
        for _ in range(20):
            if np.abs(mod(xs[k]) - want[k]).max() > 1e-5 * np.abs(want[k]).max():
                bad.append(k)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not bad


def test_the_plan_gives_each_part_its_stretch_of_the_result():
    from modelc.runtime.plan import plan_buffers
    tensors = {"a": ((1, 32, 4, 4), "float32", (16, 1)), "b": ((1, 16, 4, 4), "float32", (16, 1)),
               "c": ((1, 48, 4, 4), "float32", (16, 1)), "x": ((1, 16, 4, 4), "float32", None),
               "y": ((1, 8, 4, 4), "float32", None)}
    part = 1 * 2 * 6 * 6 * 16
    plan = plan_buffers([(["x"], ["a"], False), (["x"], ["b"], False), (["a", "b"], ["c"], False),
                         (["c"], ["y"], False)], tensors, ["x"], ["y"], {"a": ("c", 0), "b": ("c", part)})
    assert plan.tensor_buffer["a"] == plan.tensor_buffer["b"] == plan.tensor_buffer["c"]
    assert plan.tensor_offset == {"a": 0, "b": part}
    assert plan.buffers[plan.tensor_buffer["c"]][0] == 3 * 6 * 6 * 16
