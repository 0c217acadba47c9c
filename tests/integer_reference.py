"""The integers a quantized model must give, for tests that compare modelc's exactly.

onnxruntime is the independent check where its 8-bit products are exact, but they are not on every
CPU. Without VNNI (`vpdpbusd`), MLAS's uint8 x int8 kernels multiply-add pairs of bytes into 16-bit
lanes with `pmaddubsw`, which saturates: two products of 255 * -128 sum to -65280, clipped to
-32768. Its QLinearConv, QLinearMatMul, QGemm, MatMulInteger, ... then return sums that are not the
exact ones. On an AMD EPYC (Zen 3: AVX2, no VNNI), the quantized network of test_byte_inputs.py
came out of onnxruntime different from the exact sums in 1665 of its 3072 outputs, by up to 231
steps, while modelc's outputs equal the reference executor's exactly. On CPUs with VNNI (Intel's
Xeons, where these tests were written) onnxruntime sums exactly and its integers are the spec's.

So the expected integers are onnxruntime's where it is exact (`ort_is_exact`), else modelc's numpy
reference executor's (modelc/reference.py: numpy, on the importer's ops of frontend/quantized.py,
whose sums of integers are exact and whose requantization is onnxruntime's; it runs onnxruntime's
com.microsoft ops too: QGemm, QLinearAdd, QLinearConcat, ...). uint8 x uint8 and int8 x int8
products take other MLAS kernels (no saturation): tests of those may still call onnxruntime.
"""
from __future__ import annotations

import os

import numpy as np
import onnx
import onnxruntime as ort

from modelc import reference
from modelc.frontend.onnx_import import from_onnx
from modelc.target import Target


def ort_is_exact() -> bool:
    """Whether onnxruntime's 8-bit products are exact sums here: the host has VNNI (an 8-bit dot
    product into int32 lanes), which MLAS uses instead of the saturating `pmaddubsw` pairs."""
    return Target.host().int8_dot_lanes > 0


def _proto(model) -> onnx.ModelProto:
    if isinstance(model, onnx.ModelProto):
        return model
    if isinstance(model, bytes):
        return onnx.load_from_string(model)
    return onnx.load(os.fspath(model))


def reference_outputs(model, feeds: dict) -> list[np.ndarray]:
    """The exact reference executor's outputs of `model` (a ModelProto, bytes or a path) for
    `feeds`, in the order of the graph's outputs."""
    proto = _proto(model)
    # check=False: onnx.checker's warning is the compile's to give, not the expected values'
    res = reference.run(from_onnx(proto, check=False), feeds)
    return [res[o.name] for o in proto.graph.output]


def onnxruntime_outputs(model, feeds: dict) -> list[np.ndarray]:
    """onnxruntime's (CPUExecutionProvider) outputs of `model` (a ModelProto, bytes or a path) for
    `feeds`, in the order of the graph's outputs, whatever the CPU."""
    sess = ort.InferenceSession(_proto(model).SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def integer_outputs(model, feeds: dict) -> list[np.ndarray]:
    """The outputs of `model` (a ModelProto, bytes or a path) for `feeds`, in the order of the
    graph's outputs: onnxruntime's where its 8-bit products are exact, else the exact reference
    executor's."""
    return onnxruntime_outputs(model, feeds) if ort_is_exact() else reference_outputs(model, feeds)
