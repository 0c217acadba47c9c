"""DFT, STFT and MelWeightMatrix (frontend/convert_signal.py): products with constant matrices, against
numpy's float64 FFT of the same float32 inputs and against onnxruntime. The bound: a float32 product
of n terms rounds by at most about n epsilons of the output's scale."""
import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import modelc
from modelc.errors import ModelcError

EPS = float(np.finfo(np.float32).eps)
RNG = np.random.default_rng(0)


def _model(node, feeds, inits=(), opset=20):
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info(k, TensorProto.FLOAT, v.shape)
                                        for k, v in feeds.items()],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 9
    return m


def _close(got, want, n):
    assert got.shape == want.shape and got.dtype == np.float32, (got.shape, want.shape, got.dtype)
    scale = float(np.abs(want).max())
    assert np.abs(got - want).max() <= 4 * n * EPS * scale


def _complex(x):
    return x[..., 0] + 1j * x[..., 1] if x.shape[-1] == 2 else x[..., 0]


def _pack(z):
    return np.stack([z.real, z.imag], -1)


def _i64(name, v):
    return numpy_helper.from_array(np.asarray(v, np.int64), name)


@pytest.mark.parametrize("shape,axis,length,onesided", [
    ((2, 16, 3, 1), 1, 12, 1), ((2, 16, 3, 1), 1, 21, 0), ((3, 5, 10, 2), -2, 7, 0), ((3, 10, 4, 2), 1, None, 1)])
def test_dft_forward(shape, axis, length, onesided):
    x = RNG.standard_normal(shape).astype(np.float32)
    inits = [_i64("axis", axis)] + ([_i64("n", length)] if length else [])
    node = helper.make_node("DFT", ["x", "n" if length else "", "axis"], ["y"], onesided=onesided)
    got = modelc.compile(_model(node, {"x": x}, inits)).run({"x": x})["y"]
    n = length or shape[axis]
    want = np.fft.fft(_complex(x.astype(np.float64)), n=n, axis=axis % len(shape))
    if onesided:
        want = np.take(want, np.arange(n // 2 + 1), axis=axis % len(shape))
    _close(got, _pack(want), n)


@pytest.mark.parametrize("opset", [17, 20])
def test_dft_inverse_complex_and_onesided(opset):
    x = RNG.standard_normal((2, 12, 4, 2)).astype(np.float32)
    axis_in = [] if opset == 17 else [_i64("axis", 1)]
    attrs = {"axis": 1} if opset == 17 else {}
    node = helper.make_node("DFT", ["x", "", "axis"][:1 + 2 * (opset == 20)], ["y"], inverse=1, **attrs)
    got = modelc.compile(_model(node, {"x": x}, axis_in, opset)).run({"x": x})["y"]
    _close(got, _pack(np.fft.ifft(_complex(x.astype(np.float64)), axis=1)), 12)
    # the inverse of a one-sided spectrum (irfft), even and odd lengths: real outputs
    for n in (None, 9):
        ins = ["x", "n" if n else "", "axis"][:1 + 2 * (opset == 20)] if opset == 20 else ["x"] + (["n"] if n else [])
        inits = axis_in + ([_i64("n", n)] if n else [])
        node = helper.make_node("DFT", ins, ["y"], inverse=1, onesided=1, **attrs)
        got = modelc.compile(_model(node, {"x": x}, inits, opset)).run({"x": x})["y"]
        want = np.fft.irfft(_complex(x.astype(np.float64)), n=n, axis=1)[..., None]
        _close(got, want, n or 22)


def test_stft_against_onnxruntime():
    """Frames of 16 samples every 7 under a Hann window, one-sided (the default)."""
    x = RNG.standard_normal((2, 100, 1)).astype(np.float32)
    inits = [_i64("step", 7), _i64("length", 16)]
    feeds = {"x": x, "w": (0.5 - 0.5 * np.cos(2 * np.pi * np.arange(16) / 16)).astype(np.float32)}
    node = helper.make_node("STFT", ["x", "step", "w", "length"], ["y"])
    m = _model(node, feeds, inits, 17)
    mod = modelc.compile(m)
    assert not mod.fallbacks
    got = mod.run(feeds)["y"]
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    assert got.shape == want.shape == (2, 13, 9, 2)
    _close(got, want, 16)


def test_mel_weight_matrix_is_folded_to_onnxruntimes_values():
    inits = [numpy_helper.from_array(np.asarray(v, np.int64 if k < 3 else np.float32), n)
             for k, (n, v) in enumerate([("bins", 8), ("n", 64), ("rate", 16000), ("lo", 0.0), ("hi", 8000.0)])]
    node = helper.make_node("MelWeightMatrix", ["bins", "n", "rate", "lo", "hi"], ["y"])
    g = helper.make_graph([node], "g", [], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    got = modelc.compile(m).run({})["y"]
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {})[0]
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


def test_dft_length_read_at_run_time_is_refused_naming_it():
    x = RNG.standard_normal((1, 8, 1)).astype(np.float32)
    node = helper.make_node("DFT", ["x", "n"], ["y"], axis=1)
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape),
                                        helper.make_tensor_value_info("n", TensorProto.INT64, [])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(ModelcError, match=r"dft_length 'n' must be a constant scalar"):
        modelc.compile(m)
    huge = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
                             [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [_i64("n", 10 ** 12)])
    with pytest.raises(ModelcError, match=r"a DFT of length 1000000000000 over 8 samples needs a 8 x 1000000000000"):
        modelc.from_onnx(helper.make_model(huge, opset_imports=[helper.make_opsetid("", 17)]), check=False)
