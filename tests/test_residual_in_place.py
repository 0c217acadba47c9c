"""A conv's or dense layer's output takes the buffer of the residual its epilogue adds, where that is
the residual's last use (runtime/plan.py `in_place_inputs`): each residual element is read right
before that element of the output is stored, once. Not where the residual is read later, is the
kernel's own input, is a model output or has another shape; every model matches onnxruntime, also
from several threads at once."""
from __future__ import annotations

import threading

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import modelc
from workloads import onnx_model

F = TensorProto.FLOAT


def _w(name, shape, rng):
    return numpy_helper.from_array((rng.standard_normal(shape) * 0.2).astype(np.float32), name)


def _model(nodes, x_shape, outputs, inits):
    vi = helper.make_tensor_value_info
    return onnx_model(nodes, [vi("x", F, list(x_shape))], [vi(n, F, None) for n in outputs], inits,
                      opset=13, ir_version=8)


def _conv(x, w, y, pads=0):
    return helper.make_node("Conv", [x, w], [y], pads=[pads] * 4)


def bottleneck(reuse=False, own_input=False, output=False):
    """conv 3x3 -> a; a -> 1x1 -> 1x1 (+ a) -> relu -> y -> 1x1 -> z: ResNet's bottleneck. `reuse`: a is
    read once more after the add; `own_input`: the add's residual is the last conv's own input;
    `output`: y, the add's result, is also a model output (read back through a layout transform)."""
    rng = np.random.default_rng(int(reuse) + 2 * int(own_input) + 4 * int(output))
    inits = [_w("w0", (32, 16, 3, 3), rng), _w("w1", (16, 32, 1, 1), rng), _w("w2", (32, 16, 1, 1), rng),
             _w("w3", (32, 32, 1, 1), rng)]
    nodes = [_conv("x", "w0", "a0", 1), helper.make_node("Relu", ["a0"], ["a"]),
             _conv("a", "w1", "b0"), helper.make_node("Relu", ["b0"], ["b"])]
    if own_input:
        inits.append(_w("w4", (32, 32, 1, 1), rng))
        nodes += [_conv("b", "w2", "c"), _conv("c", "w4", "d"), helper.make_node("Add", ["d", "c"], ["s"])]
    else:
        nodes += [_conv("b", "w2", "c"), helper.make_node("Add", ["c", "a"], ["s"])]
    nodes += [helper.make_node("Relu", ["s"], ["y"]), _conv("y", "w3", "z0")]
    nodes.append(helper.make_node("Add", ["z0", "a"], ["z"]) if reuse else helper.make_node("Relu", ["z0"], ["z"]))
    return _model(nodes, (1, 16, 10, 12), ["z", "y"] if output else ["z"], inits)


def mlp(output=False):
    """h = relu(x W0); y = (h W1) W2 + h; z = y W3: the transformer's residual around its FFN (`output`:
    y is also a model output, kept in a buffer of its own)."""
    rng = np.random.default_rng(7)
    inits = [_w(f"w{i}", (24, 24), rng) for i in range(4)]
    mm = [helper.make_node("MatMul", ["x", "w0"], ["h0"]), helper.make_node("Relu", ["h0"], ["h"]),
          helper.make_node("MatMul", ["h", "w1"], ["g"]), helper.make_node("MatMul", ["g", "w2"], ["f"]),
          helper.make_node("Add", ["f", "h"], ["y"]), helper.make_node("MatMul", ["y", "w3"], ["z"])]
    return _model(mm, (6, 24), ["z", "y"] if output else ["z"], inits)


CASES = {"bottleneck": (bottleneck(), 1), "read_again": (bottleneck(reuse=True), 1),
         "own_input": (bottleneck(own_input=True), 0), "mlp": (mlp(), 1), "model_output": (mlp(output=True), 0),
         "blocked_output": (bottleneck(output=True), 1)}


def _check(mod, model, x):
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    got = mod.run({"x": x})
    got = list(got.values()) if isinstance(got, dict) else got
    for g, w in zip(got, want):
        assert np.abs(g - w).max() <= 1e-5 * max(1.0, float(np.abs(w).max()))


@pytest.mark.parametrize("case", list(CASES))
def test_outputs_take_their_residuals_buffer_where_it_is_its_last_use(case):
    model, n = CASES[case]
    mod = modelc.compile(model)
    assert len(mod.plan.in_place) == n, mod.plan.in_place
    for out, res in mod.plan.in_place.items():
        assert mod.plan.tensor_buffer[out] == mod.plan.tensor_buffer[res]
    x = np.random.default_rng(3).standard_normal(tuple(mod.input_specs[0]["shape"])).astype(np.float32)
    _check(mod, model, x)
    if case == "read_again":        # a is read after the first add: the second add takes its buffer
        assert list(mod.plan.in_place.values()) == ["a"] and "y" not in mod.plan.in_place


def test_residuals_in_place_from_several_threads():
    model = bottleneck()
    mod = modelc.compile(model)
    rng = np.random.default_rng(5)
    xs = [rng.standard_normal((1, 16, 10, 12)).astype(np.float32) for _ in range(4)]
    errors = []

    def work(x):
        try:
            for _ in range(5):
                _check(mod, model, x)
        except AssertionError as e:
            errors.append(e)
    threads = [threading.Thread(target=work, args=(x,)) for x in xs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


def _workload(kind):
    from workloads import conv2d_wl, dense_wl
    if kind == "conv2d":        # 7 columns in tiles of 4 and 3 blocks in tiles of 2: shifted last tiles
        return conv2d_wl(C=16, H=6, W=7, K=48, k=1, s=1, p=0, hin=0, hout=0, residual=True), \
            {"tile_ow": 4, "tile_oc_blocks": 2}
    return dense_wl((13, 40), 24, epi=("res", "Relu")), {"tile_m": 4}     # 13 rows in tiles of 4


@pytest.mark.parametrize("kind", ["conv2d", "dense"])
def test_a_kernel_shares_an_array_with_its_output_only_where_told_and_only_whole(kind):
    """`BoundKernel` refuses an output overlapping another array, unless that array is marked shared
    and is the output's very array; then the residual is added in place, the results those of separate
    arrays, bit for bit, with shifted last tiles (which store only what the tile before did not)."""
    from modelc.kernels import cache, template, testing
    from modelc.kernels.layout import from_physical
    from modelc.kernels.workload import Workload
    wl, values = _workload(kind)
    wl = Workload(wl) if isinstance(wl, dict) else wl
    tpl = template.select(wl)
    assert tpl.stores_in_place
    sp = tpl.space(wl)
    cfg = sp.from_values(dict(tpl.default_config(wl, sp).values, **values))
    assert sp.is_valid(cfg)
    kernel = tpl.build(wl, cfg)
    fn = cache.load(kernel.source)
    inputs = wl.random_inputs(0)
    want = testing.run(wl, tpl, cfg, inputs)[0][0]
    args, _ = testing.bind(wl, kernel, inputs)
    res = next(j for j, a in enumerate(kernel.args)
               if a.startswith("in") and a != "in0" and inputs[int(a[2:])].shape == tuple(wl.outputs[0].shape))
    args[0][...] = args[res]                    # the output's buffer holds the residual
    shared = list(args)
    shared[res] = args[0]
    with pytest.raises(ValueError, match="overlaps"):
        fn.bind(shared)
    with pytest.raises(ValueError, match="overlaps"):      # a part of the residual's array: refused
        fn.bind([args[0].reshape(-1)[16:]] + shared[1:], shared=[res])
    fn.bind(shared, shared=[res])()
    assert np.array_equal(from_physical(args[0], wl.outputs[0].shape, wl.outputs[0].layout), want)
