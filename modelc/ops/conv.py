"""Conv and ConvTranspose references.

Vectorised because the reference executor runs whole models in tests: Conv is im2col over window
views and one matmul per group (a tap loop for depthwise); ConvTranspose multiplies every input
pixel by the kernel and scatter-adds the taps. Float32 arithmetic (float64 for float64 inputs), cast
back to the input dtype, as ONNX declares.
"""
from __future__ import annotations

import itertools

import numpy as np

from .params import compute_dtype
from .registry import Kind, register
from .window import check_spatial_rank, conv_geometry, conv_transpose_geometry, pad_for_windows, windows


def _conv_infer(x, w, b=None, *, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None,
                pads=None, strides=None, exact=0, x_min=None, x_zero=None):
    check_spatial_rank(x, "Conv")
    if x_zero is not None and (np.dtype(x.dtype) not in (np.dtype(np.uint8), np.dtype(np.int8)) or
                               not np.issubdtype(np.dtype(w.dtype), np.floating)):
        raise ValueError(f"an input read as bytes (x_zero) must be uint8 or int8 with float weights, "
                         f"not {np.dtype(x.dtype)} and {np.dtype(w.dtype)}")
    if len(w.shape) != len(x.shape):
        raise ValueError(f"weight shape {list(w.shape)} must have the rank of the input "
                         f"{list(x.shape)}")
    c, m = x.shape[1], w.shape[0]
    if group < 1 or c % group or m % group or w.shape[1] * group != c:
        raise ValueError(f"input channels {c}, weight {list(w.shape)} and group={group} disagree")
    if b is not None and tuple(b.shape) != (m,):
        raise ValueError(f"bias shape {list(b.shape)} must be [{m}]")
    geo = conv_geometry(x.shape, w.shape, auto_pad, dilations, kernel_shape, pads, strides)
    return (x.shape[0], m, *geo.out), (w.dtype if x_zero is not None else x.dtype)


@register("Conv", Kind.OUT_ELEMWISE_FUSABLE, infer=_conv_infer)
def conv(x, w, b=None, *, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None,
         pads=None, strides=None, exact=0, x_min=None, x_zero=None):
    """`exact` (modelc's, set by the quantized ops' import) asks for a sum of exact products:
    integer-valued inputs stay integers, so no Winograd; the reference's im2col sums them exactly.
    `x_min` (modelc's too) is the least value such an input takes where it and the weights are
    8-bit integers (the VNNI kernel's shift to unsigned bytes); the sum does not depend on it.
    `x_zero` (passes/byte_inputs.py): the input is 8-bit and the conv is of x - x_zero (padded
    with zeros of that), in the weights' float type."""
    if x_zero is not None:
        x = x.astype(w.dtype) - np.asarray(x_zero, w.dtype)
    geo = conv_geometry(x.shape, w.shape, auto_pad, dilations, kernel_shape, pads, strides)
    ct = compute_dtype(x.dtype)
    n, c = x.shape[:2]
    m, nd = w.shape[0], len(geo.out)
    cg, mg = c // group, m // group
    xp = pad_for_windows(x.astype(ct, copy=False), geo, 0)
    win = windows(xp.reshape(n, group, cg, *xp.shape[2:]), geo)   # (N, g, Cg, *out, *k)
    wg = w.astype(ct, copy=False).reshape(group, mg, cg, *geo.kernel)
    taps = int(np.prod(geo.kernel))
    if cg == 1 and mg <= 4 and taps <= 64:
        # depthwise: a multiply-add per kernel tap over whole feature maps
        y = np.zeros((n, group, mg, *geo.out), ct)
        for tap in itertools.product(*(range(k) for k in geo.kernel)):
            xt = win[(Ellipsis, *tap)]                               # (N, g, 1, *out)
            y += xt * wg[(slice(None), slice(None), 0, *tap)].reshape(group, mg, *(1,) * nd)
    else:
        # im2col per group, then one batched matmul
        perm = (0, 1, 2, *range(3 + nd, 3 + 2 * nd), *range(3, 3 + nd))
        cols = win.transpose(perm).reshape(n, group, cg * taps, int(np.prod(geo.out)))
        y = np.matmul(wg.reshape(group, mg, cg * taps), cols)        # (N, g, Mg, P)
    y = y.reshape(n, m, *geo.out)
    if b is not None:
        y += b.astype(ct).reshape(m, *(1,) * nd)
    return y.astype(x.dtype, copy=False)


def _convt_infer(x, w, b=None, *, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None,
                 output_padding=None, output_shape=None, pads=None, strides=None):
    check_spatial_rank(x, "ConvTranspose")
    if len(w.shape) != len(x.shape):
        raise ValueError(f"weight shape {list(w.shape)} must have the rank of the input "
                         f"{list(x.shape)}")
    c = x.shape[1]
    if group < 1 or c % group or w.shape[0] != c:
        raise ValueError(f"input channels {c}, weight {list(w.shape)} and group={group} disagree")
    m = w.shape[1] * group
    if b is not None and tuple(b.shape) != (m,):
        raise ValueError(f"bias shape {list(b.shape)} must be [{m}]")
    geo = conv_transpose_geometry(x.shape, w.shape, auto_pad, dilations, kernel_shape,
                                  output_padding, output_shape, pads, strides)
    return (x.shape[0], m, *geo.out), x.dtype


@register("ConvTranspose", Kind.OUT_ELEMWISE_FUSABLE, infer=_convt_infer)
def conv_transpose(x, w, b=None, *, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None,
                   output_padding=None, output_shape=None, pads=None, strides=None):
    geo = conv_transpose_geometry(x.shape, w.shape, auto_pad, dilations, kernel_shape,
                                  output_padding, output_shape, pads, strides)
    ct = compute_dtype(x.dtype)
    n, c = x.shape[:2]
    in_sp, nd = x.shape[2:], len(geo.out)
    cg, mg = c // group, w.shape[1]
    taps = int(np.prod(geo.kernel))
    # every input pixel times the kernel: (N, g, Mg * taps, P)
    wt = w.astype(ct, copy=False).reshape(group, cg, mg * taps).transpose(0, 2, 1)
    cols = np.matmul(wt, x.astype(ct, copy=False).reshape(n, group, cg, int(np.prod(in_sp))))
    cols = cols.reshape(n, group * mg, *geo.kernel, *in_sp)
    # scatter-add each tap into a buffer covering the full (uncropped) output
    shift = [max(0, -b) for b in geo.begin]
    size = [sh + max((i - 1) * s + (k - 1) * d + 1, b + o) for sh, i, s, k, d, b, o in
            zip(shift, in_sp, geo.strides, geo.kernel, geo.dilations, geo.begin, geo.out)]
    full = np.zeros((n, group * mg, *size), ct)
    for tap in itertools.product(*(range(k) for k in geo.kernel)):
        dst = tuple(slice(sh + t * d, sh + t * d + (i - 1) * s + 1, s) for sh, t, d, i, s in
                    zip(shift, tap, geo.dilations, in_sp, geo.strides))
        full[(slice(None), slice(None), *dst)] += cols[(slice(None), slice(None), *tap)]
    crop = tuple(slice(sh + b, sh + b + o) for sh, b, o in zip(shift, geo.begin, geo.out))
    y = full[(slice(None), slice(None), *crop)]
    if b is not None:
        y = y + b.astype(ct).reshape(-1, *(1,) * nd)
    return np.ascontiguousarray(y.astype(x.dtype, copy=False))
