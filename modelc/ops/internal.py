"""Ops that exist only inside modelc: canonical forms the passes rewrite ONNX patterns into."""
from __future__ import annotations

import numpy as np

from .registry import Kind, register


def _dense_shape(x, w, b=None):
    return x.shape[:-1] + (w.shape[1],), x.dtype


@register("Dense", Kind.OUT_ELEMWISE_FUSABLE, infer=_dense_shape)
def dense(x, w, b=None):
    """y = x @ w + b with a constant w[K, N]: what MatMul/Gemm with weights and a bias become."""
    y = np.matmul(x, w)
    if b is not None:
        y = y + b
    return y.astype(x.dtype, copy=False)
