"""`Module.run` reads a C-contiguous input where the caller keeps it (as onnxruntime binds a CPU
tensor) and copies any other; either way the outputs are the same and the caller's array is
never written."""
import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import modelc


def _model(identity_output: bool = False):
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((16, 8, 3, 3)).astype(np.float32) * 0.2, "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["y"])]
    outs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 8, 8])]
    if identity_output:                       # an output that is the input itself
        nodes.append(helper.make_node("Identity", ["x"], ["same"]))
        outs.append(helper.make_tensor_value_info("same", TensorProto.FLOAT, [1, 8, 8, 8]))
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 8, 8])],
                          outs, [w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def _want(model, x):
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, {"x": np.ascontiguousarray(x)})))


def _close(got: dict, want: dict):
    for k, w in want.items():
        assert np.abs(got[k] - w).max() <= 1e-5 * max(np.abs(w).max(), 1e-30), k


def _misaligned(x):
    raw = np.zeros(x.nbytes + 1, np.uint8)
    y = raw[1:].view(np.uint8)
    y[:] = x.view(np.uint8).reshape(-1)
    out = np.frombuffer(y, np.float32).reshape(x.shape)
    assert not out.flags.aligned
    return out


def test_a_contiguous_input_is_read_in_place_and_never_written():
    model = _model()
    mod = modelc.compile(model)
    x = np.random.default_rng(1).standard_normal((1, 8, 8, 8)).astype(np.float32)
    keep = x.copy()
    _close(mod.run({"x": x}), _want(model, x))
    assert np.array_equal(x, keep)
    ctx = mod._free[0]
    assert ctx.slots[0], "the input reaches a kernel through its argument words"
    assert not ctx.inputs[0].any(), "the module's own input buffer was never filled: the kernel read x"
    ro = keep.copy()
    ro.setflags(write=False)                  # read-only memory is fine: nothing writes an input
    _close(mod.run({"x": ro}), _want(model, keep))


def test_inputs_that_cannot_be_bound_are_copied_and_the_next_bound_one_is_read():
    model = _model()
    mod = modelc.compile(model)
    rng = np.random.default_rng(2)
    xs = [rng.standard_normal((1, 8, 8, 8)).astype(np.float32) for _ in range(4)]
    feeds = [xs[0], np.asfortranarray(xs[1]), xs[2], _misaligned(xs[3]), xs[0]]
    assert not feeds[1].flags.c_contiguous
    for x in feeds:
        _close(mod.run({"x": x}), _want(model, x))


def test_an_input_that_is_also_an_output_is_copied():
    model = _model(identity_output=True)
    mod = modelc.compile(model)
    assert mod._free[0].slots[0] is None
    x = np.random.default_rng(3).standard_normal((1, 8, 8, 8)).astype(np.float32)
    got = mod.run({"x": x})
    _close(got, _want(model, x))
    assert np.array_equal(got["same"], x) and not np.shares_memory(got["same"], x)


@pytest.mark.parametrize("stamped", [False, True])
def test_profiles_time_the_given_input(stamped):
    """`stamped_runs` copies its feeds into the buffers (a profile runs kernels one at a time,
    after the call that bound them), so the kernels it times read that input."""
    model = _model()
    mod = modelc.compile(model)
    x = np.random.default_rng(4).standard_normal((1, 8, 8, 8)).astype(np.float32)
    prof = mod.stamped_runs(2, feeds={"x": x}) if stamped else mod.profile(2, feeds={"x": x})
    assert len(prof) >= 1
    assert np.array_equal(mod._free[0].inputs[0].reshape(x.shape), x)


def test_no_kernel_keeps_the_address_of_a_callers_array_after_run():
    """The caller may free its array once `run` returns: a profile without feeds afterwards must
    read the module's own buffer, not that memory."""
    mod = modelc.compile(_model())
    x = np.random.default_rng(5).standard_normal((1, 8, 8, 8)).astype(np.float32)
    mod.run({"x": x})
    ctx = mod._free[0]
    words = {int(w[k]) for w, k in ctx.slots[0]}
    assert words == {ctx.inputs[0].ctypes.data}


def test_outputs_belong_to_the_caller():
    """Each output is a fresh C-contiguous array in logical order (the blocked conv output's
    halo and lanes undone), not a view of the module's buffers: the next run leaves it alone. An
    output the compiler folded to a constant comes back as well, in the model's output order."""
    rng = np.random.default_rng(2)
    w = numpy_helper.from_array(rng.standard_normal((16, 8, 3, 3)).astype(np.float32) * 0.2, "w")
    k = numpy_helper.from_array(np.arange(6, dtype=np.float32).reshape(2, 3), "k")
    nodes = [helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1]),
             helper.make_node("Identity", ["k"], ["const_out"]),
             helper.make_node("Relu", ["y"], ["r"])]
    outs = [helper.make_tensor_value_info("const_out", TensorProto.FLOAT, [2, 3]),
            helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 8, 8]),
            helper.make_tensor_value_info("r", TensorProto.FLOAT, [1, 16, 8, 8])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 8, 8])],
                          outs, [w, k])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    mod = modelc.compile(model)
    x1, x2 = (rng.standard_normal((1, 8, 8, 8)).astype(np.float32) for _ in range(2))
    first = mod.run({"x": x1})
    assert list(first) == ["const_out", "y", "r"]
    kept = {n: a.copy() for n, a in first.items()}
    second = mod.run({"x": x2})
    _close(first, _want(model, x1))
    _close(second, _want(model, x2))
    ctx = mod._free[0]
    for name, a in first.items():
        assert np.array_equal(a, kept[name]), name
        assert a.flags.c_contiguous and a.flags.writeable and a.shape == kept[name].shape
        assert not any(np.may_share_memory(a, b) for b in ctx.buffers), name
        assert not np.may_share_memory(a, second[name]), name
