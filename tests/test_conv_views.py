"""3-d and 1-d convolutions run as 2-d ones over views (passes/conv_views.py)."""
import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import modelc
from modelc import passes
from modelc import target
from modelc.target import Target
from workloads import onnx_model

AVX2 = Target.from_features("znver3", "+avx,+avx2,+fma,+sse4.1,+sse4.2", threads=2)
AVX512 = Target.from_features("sapphirerapids", "+avx,+avx2,+fma,+avx512f,+avx512bw,+avx512vl", threads=2)

# (input shape, weight shape, attrs, becomes 2-d)
CASES = [
    ((1, 16, 6, 5, 7), (32, 16, 3, 1, 1), {"pads": [1, 0, 0, 1, 0, 0]}, True),                  # R(2+1)D's
    ((2, 16, 9, 4, 6), (16, 16, 3, 1, 1), {"strides": [2, 1, 1], "pads": [2, 0, 0, 1, 0, 0],
                                           "dilations": [2, 1, 1]}, True),
    ((1, 32, 4, 6, 5), (16, 32, 1, 1, 1), {}, True),                                           # pointwise
    ((2, 16, 3, 9, 8), (32, 8, 1, 3, 3), {"strides": [1, 2, 2], "pads": [0, 1, 1, 0, 0, 1], "group": 2}, True),
    ((1, 3, 4, 12, 11), (16, 3, 1, 5, 3), {"pads": [0, 2, 1, 0, 2, 1], "dilations": [1, 1, 2]}, True),   # a stem
    ((1, 16, 4, 6, 6), (16, 16, 3, 3, 3), {"pads": [1] * 6}, True),                            # a 3-d window
    ((1, 3, 7, 12, 11), (16, 3, 3, 5, 5), {"strides": [2, 2, 2], "pads": [1, 2, 2, 2, 1, 2],
                                           "dilations": [2, 1, 1]}, True),                     # R3D's stem
    ((1, 3, 8, 12, 12), (16, 3, 2, 4, 4), {"strides": [2, 4, 4]}, True),                       # Swin3D's
    ((1, 16, 4, 6, 6), (16, 8, 3, 3, 3), {"pads": [1] * 6, "group": 2}, False),                # grouped
    ((1, 16, 4, 6, 6), (16, 16, 1, 3, 3), {"pads": [1, 1, 1, 0, 1, 1]}, True),                 # padded frames
    ((1, 16, 4, 6, 6), (16, 16, 1, 1, 1), {"strides": [1, 2, 2]}, True),                       # strided pixels
    ((1, 16, 4, 6, 6), (16, 16, 1, 1, 1), {"strides": [2, 2, 2]}, True),                       # and frames
    ((1, 16, 4, 6, 6), (16, 16, 3, 1, 1), {"pads": [1, 1, 0, 1, 1, 0]}, True),                 # padded rows
    ((1, 32, 40), (16, 32, 3), {"pads": [2, 1], "dilations": [2], "strides": [2]}, True),  # 1-d: a TCN's
    ((2, 16, 40), (32, 16, 5), {"pads": [2, 2]}, True),
    ((1, 32, 40), (32, 1, 7), {"pads": [3, 3], "group": 32}, False),                          # depthwise 1-d
    ((1, 1, 60), (16, 1, 10), {"strides": [5]}, False),                                        # wav2vec's stem
    ((1, 45, 4, 6, 6), (16, 45, 3, 1, 1), {"pads": [1, 0, 0, 1, 0, 0]}, False),                # 45 channels
]


def _model(xs, ws, attrs):
    rng = np.random.default_rng(0)
    w = (rng.standard_normal(ws) / np.sqrt(np.prod(ws[1:]))).astype(np.float32)
    b = rng.standard_normal(ws[0]).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], **attrs), helper.make_node("Relu", ["c"], ["y"])]
    return onnx_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, xs)],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                      [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])


@pytest.mark.parametrize("xs,ws,attrs,two_d", CASES, ids=[str(k) for k in range(len(CASES))])
def test_a_3d_conv_over_frames_or_pointwise_is_a_2d_conv(xs, ws, attrs, two_d):
    """Temporal (kt x 1 x 1) and pointwise convs over [N, C, D, H * W], 1 x kh x kw ones over the
    frames as images, the rest over frames stacked as channels, and 1-d ones over [N, C, 1, L], with
    the AVX-512 target's blocks (16 channels, or 8)."""
    m = _model(xs, ws, attrs)
    with target.use(AVX512):
        g = passes.optimize(modelc.from_onnx(m), fuse_ops=False, verify=True)
        ranks = [len(g.tensors[n.inputs[0]].shape) for n in g.topo() if n.op_type == "Conv"]
        assert ranks == [4 if two_d else len(xs)]
    mod = modelc.compile(m)             # for the machine it runs on
    x = np.random.default_rng(1).standard_normal(xs).astype(np.float32)
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got = mod.run({"x": x})["y"]
    assert not mod.fallbacks and got.shape == want.shape
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()


def test_channels_in_half_vectors_follow_the_target():
    """24 channels are 3 blocks of 8 on AVX2 and 3 half vectors on AVX-512; 20 are 5 half vectors on
    AVX2, blocks of a quarter vector on AVX-512; 45, blocks of one float."""
    for tg, cases in ((AVX512, ((24, True), (20, False), (45, False))), (AVX2, ((24, True), (20, True), (45, False)))):
        for c, two_d in cases:
            m = _model((1, c, 4, 5, 5), (16, c, 3, 1, 1), {"pads": [1, 0, 0, 1, 0, 0]})
            with target.use(tg):
                g = passes.optimize(modelc.from_onnx(m), fuse_ops=False)
            ranks = [len(g.tensors[n.inputs[0]].shape) for n in g.topo() if n.op_type == "Conv"]
            assert ranks == [4 if two_d else 5], (tg.llvm_cpu, c)
