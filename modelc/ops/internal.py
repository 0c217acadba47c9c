"""Ops that exist only inside modelc: canonical forms the passes rewrite ONNX patterns into."""
from __future__ import annotations

import numpy as np

from .registry import Kind, register

# the ops that are a 2-d/n-d convolution to layouts, fusion names and costs (ScaledConv: one whose
# input is multiplied by a per-channel gate)
CONVS = ("Conv", "ScaledConv")


def _dense_shape(x, w, b=None, *, exact=0, x_min=None):
    return x.shape[:-1] + (w.shape[1],), x.dtype


@register("Dense", Kind.OUT_ELEMWISE_FUSABLE, infer=_dense_shape)
def dense(x, w, b=None, *, exact=0, x_min=None):
    """y = x @ w + b with a constant w[K, N]: what MatMul/Gemm with weights and a bias become
    (`exact` and `x_min`: a quantized product's, as on Conv: ops/conv.py)."""
    y = np.matmul(x, w)
    if b is not None:
        y = y + b
    return y.astype(x.dtype, copy=False)


def _scaled_conv_shape(x, w, b=None, s=None, **attrs):
    from .conv import _conv_infer
    if s is None or len(x.shape) != 4 or tuple(s.shape) != (x.shape[0], x.shape[1], 1, 1):
        raise ValueError(f"ScaledConv's scale {None if s is None else list(s.shape)} must be "
                         f"[{x.shape[0]}, {x.shape[1]}, 1, 1] for an input {list(x.shape)}")
    return _conv_infer(x, w, b, **attrs)


@register("ScaledConv", Kind.OUT_ELEMWISE_FUSABLE, infer=_scaled_conv_shape)
def scaled_conv(x, w, b=None, s=None, **attrs):
    """Conv(x * s, w, b) with s[N, C, 1, 1] computed at run time: a squeeze-excitation's channel
    gate and the 1x1 convolution after it (passes/scale_conv.py). The reference multiplies first,
    as the two ONNX ops did."""
    from .conv import conv
    return conv((x * s).astype(x.dtype, copy=False), w, b, **attrs)


def _mul_add_shape(a, b, c):
    from .registry import broadcast_shape
    return broadcast_shape(a.shape, b.shape, c.shape, where="MulAdd"), a.dtype


@register("MulAdd", Kind.BROADCAST, infer=_mul_add_shape)
def mul_add(a, b, c):
    """a * b + c rounded once (a fused multiply-add), where a quantized op must give onnxruntime's
    value bit for bit (QLinearAdd is MLAS's two FMAs). The reference: the float32 product is exact
    in float64, and so is its sum with c but where the two are far apart in scale."""
    if a.dtype == np.float32:
        return (a.astype(np.float64) * b + c).astype(np.float32)
    return (a * b + c).astype(a.dtype, copy=False)
