"""Neural-network ops: convolutions, pools, normalizations, softmax.

Convolutions and pools share one geometry helper (`_geometry`) so that the shape rule and the
reference always agree. The references are vectorised (windows are strided views of the padded
input, reduced by one matmul per group or by numpy reductions), because the reference executor
runs whole models in tests. Computation happens in float32 (float64 for float64 inputs) and
results are cast back to the input dtype, as ONNX declares.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from ..errors import ShapeError
from .registry import Kind, norm_axis, register


def _axis(axis, rank: int) -> int:
    """norm_axis, raising ValueError so that the registry's message names the node."""
    try:
        return norm_axis(axis, rank)
    except ShapeError as e:
        raise ValueError(str(e)) from None


AUTO_PADS = ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID")


# ---- geometry shared by convolutions and pools -----------------------------------------------

@dataclass
class Geometry:
    """Per spatial axis: kernel, strides, dilations, begin/end pads, output size."""
    kernel: tuple
    strides: tuple
    dilations: tuple
    begin: tuple
    end: tuple
    out: tuple

    @property
    def extent(self):
        """The dilated kernel size per axis."""
        return tuple((k - 1) * d + 1 for k, d in zip(self.kernel, self.dilations))


def _ints(v, n, default, name):
    if v is None or len(v) == 0:
        return (default,) * n
    v = tuple(int(a) for a in v)
    if len(v) != n:
        raise ValueError(f"{name} has {len(v)} values, expected {n}")
    return v


def _geometry(in_sp, kernel, strides=None, dilations=None, pads=None, auto_pad="NOTSET",
              ceil_mode=0) -> Geometry:
    """Output sizes and pads of a sliding-window op (ONNX/PyTorch semantics).

    In ceil mode the last window may hang over the end pad but must start inside the input or
    the begin pad; the overhang is padding that is never counted.
    """
    nd = len(in_sp)
    kernel = _ints(kernel, nd, 1, "kernel_shape")
    strides = _ints(strides, nd, 1, "strides")
    dilations = _ints(dilations, nd, 1, "dilations")
    if auto_pad not in AUTO_PADS:
        raise ValueError(f"auto_pad={auto_pad!r} is not one of {AUTO_PADS}")
    if pads is not None and len(pads) and auto_pad == "NOTSET":
        pads = tuple(int(p) for p in pads)
        if len(pads) != 2 * nd:
            raise ValueError(f"pads has {len(pads)} values, expected {2 * nd}")
    else:
        pads = (0,) * (2 * nd)
    begin, end, out = [], [], []
    for i in range(nd):
        n, k, s, d = in_sp[i], kernel[i], strides[i], dilations[i]
        if min(k, s, d) < 1:
            raise ValueError(f"kernel {kernel}, strides {strides} and dilations {dilations} "
                             "must be positive")
        ext = (k - 1) * d + 1
        if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            o = -(-n // s)
            total = max(0, (o - 1) * s + ext - n)
            b = total // 2 if auto_pad == "SAME_UPPER" else total - total // 2
            e = total - b
        else:
            b, e = pads[i], pads[i + nd]
            span = n + b + e - ext
            if span < 0:
                raise ValueError(f"kernel extent {ext} exceeds the padded input size {n + b + e} "
                                 f"on spatial axis {i}")
            if ceil_mode:
                o = -(-span // s) + 1
                if (o - 1) * s >= n + b:
                    o -= 1
            else:
                o = span // s + 1
        begin.append(b)
        end.append(e)
        out.append(o)
    return Geometry(kernel, strides, dilations, tuple(begin), tuple(end), tuple(out))


def _compute_dtype(dtype):
    return np.float64 if np.dtype(dtype) == np.float64 else np.float32


def _pad(x, geo: Geometry, value):
    """Pad the spatial axes so that every window of `geo` lies inside (ceil-mode overhang too)."""
    widths = [(0, 0)] * (x.ndim - len(geo.out))
    for i, n in enumerate(x.shape[x.ndim - len(geo.out):]):
        need = (geo.out[i] - 1) * geo.strides[i] + geo.extent[i]
        widths.append((geo.begin[i], max(geo.end[i], need - n - geo.begin[i])))
    if not any(w != (0, 0) for w in widths):
        return x
    return np.pad(x, widths, constant_values=value)


def _windows(xp, geo: Geometry):
    """View of shape (*lead, *out, *kernel) over the trailing spatial axes of padded `xp`."""
    nd = len(geo.out)
    lead = xp.ndim - nd
    v = sliding_window_view(xp, geo.extent, axis=tuple(range(lead, xp.ndim)))
    idx = ((slice(None),) * lead
           + tuple(slice(0, (o - 1) * s + 1, s) for o, s in zip(geo.out, geo.strides))
           + tuple(slice(None, None, d) for d in geo.dilations))
    return v[idx]


def _check_rank(x, what, min_rank=3):
    if len(x.shape) < min_rank:
        raise ValueError(f"{what} input must have rank >= {min_rank} (N, C, spatial...), "
                         f"got shape {list(x.shape)}")


# ---- Conv ------------------------------------------------------------------------------------

def _conv_geometry(xs, ws, auto_pad, dilations, kernel_shape, pads, strides):
    kernel = tuple(ws[2:])
    if kernel_shape is not None and len(kernel_shape) and tuple(kernel_shape) != kernel:
        raise ValueError(f"kernel_shape {list(kernel_shape)} disagrees with the weight shape "
                         f"{list(ws)}")
    return _geometry(tuple(xs[2:]), kernel, strides, dilations, pads, auto_pad)


def _conv_infer(x, w, b=None, *, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None,
                pads=None, strides=None):
    _check_rank(x, "Conv")
    if len(w.shape) != len(x.shape):
        raise ValueError(f"weight shape {list(w.shape)} must have the rank of the input "
                         f"{list(x.shape)}")
    c, m = x.shape[1], w.shape[0]
    if group < 1 or c % group or m % group or w.shape[1] * group != c:
        raise ValueError(f"input channels {c}, weight {list(w.shape)} and group={group} disagree")
    if b is not None and tuple(b.shape) != (m,):
        raise ValueError(f"bias shape {list(b.shape)} must be [{m}]")
    geo = _conv_geometry(x.shape, w.shape, auto_pad, dilations, kernel_shape, pads, strides)
    return (x.shape[0], m, *geo.out), x.dtype


@register("Conv", Kind.OUT_ELEMWISE_FUSABLE, infer=_conv_infer)
def conv(x, w, b=None, *, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None,
         pads=None, strides=None):
    geo = _conv_geometry(x.shape, w.shape, auto_pad, dilations, kernel_shape, pads, strides)
    ct = _compute_dtype(x.dtype)
    n, c = x.shape[:2]
    m, nd = w.shape[0], len(geo.out)
    cg, mg = c // group, m // group
    xp = _pad(x.astype(ct, copy=False), geo, 0)
    win = _windows(xp.reshape(n, group, cg, *xp.shape[2:]), geo)   # (N, g, Cg, *out, *k)
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


# ---- ConvTranspose ---------------------------------------------------------------------------

def _convt_geometry(xs, ws, auto_pad, dilations, kernel_shape, output_padding,
                    output_shape, pads, strides):
    """Kernel, strides, dilations, begin pads and output size of a transposed convolution."""
    in_sp = tuple(xs[2:])
    nd = len(in_sp)
    kernel = tuple(ws[2:])
    if kernel_shape is not None and len(kernel_shape) and tuple(kernel_shape) != kernel:
        raise ValueError(f"kernel_shape {list(kernel_shape)} disagrees with the weight shape "
                         f"{list(ws)}")
    strides = _ints(strides, nd, 1, "strides")
    dilations = _ints(dilations, nd, 1, "dilations")
    opad = _ints(output_padding, nd, 0, "output_padding")
    if auto_pad not in AUTO_PADS:
        raise ValueError(f"auto_pad={auto_pad!r} is not one of {AUTO_PADS}")
    full = tuple(s * (n - 1) + op + (k - 1) * d + 1
                 for n, k, s, d, op in zip(in_sp, kernel, strides, dilations, opad))
    if output_shape is not None and len(output_shape):
        out = tuple(int(o) for o in output_shape)[-nd:]
    elif auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        # in * stride, except that padding cannot be negative (as onnxruntime and ONNX's shape
        # inference have it): a kernel smaller than the stride gives the full output instead
        out = tuple(min(n * s, f) for n, s, f in zip(in_sp, strides, full))
    else:
        out = None
    if out is not None:
        totals = [f - o for f, o in zip(full, out)]
        # a larger output than the full one is zero-extended at the end
        begin = tuple(0 if t < 0 else t // 2 if auto_pad == "SAME_UPPER" else t - t // 2
                      for t in totals)
    else:
        p = _ints(pads if auto_pad == "NOTSET" else None, 2 * nd, 0, "pads")
        begin = p[:nd]
        out = tuple(f - p[i] - p[i + nd] for i, f in enumerate(full))
    if min(out) < 1:
        raise ValueError(f"output spatial shape {list(out)} is empty")
    return Geometry(kernel, strides, dilations, begin, (), out)


def _convt_infer(x, w, b=None, *, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None,
                 output_padding=None, output_shape=None, pads=None, strides=None):
    _check_rank(x, "ConvTranspose")
    if len(w.shape) != len(x.shape):
        raise ValueError(f"weight shape {list(w.shape)} must have the rank of the input "
                         f"{list(x.shape)}")
    c = x.shape[1]
    if group < 1 or c % group or w.shape[0] != c:
        raise ValueError(f"input channels {c}, weight {list(w.shape)} and group={group} disagree")
    m = w.shape[1] * group
    if b is not None and tuple(b.shape) != (m,):
        raise ValueError(f"bias shape {list(b.shape)} must be [{m}]")
    geo = _convt_geometry(x.shape, w.shape, auto_pad, dilations, kernel_shape,
                          output_padding, output_shape, pads, strides)
    return (x.shape[0], m, *geo.out), x.dtype


@register("ConvTranspose", Kind.OUT_ELEMWISE_FUSABLE, infer=_convt_infer)
def conv_transpose(x, w, b=None, *, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None,
                   output_padding=None, output_shape=None, pads=None, strides=None):
    geo = _convt_geometry(x.shape, w.shape, auto_pad, dilations, kernel_shape,
                          output_padding, output_shape, pads, strides)
    ct = _compute_dtype(x.dtype)
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


# ---- pools -----------------------------------------------------------------------------------

def _pool_infer_shape(x, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode):
    _check_rank(x, "pool")
    if kernel_shape is None or len(kernel_shape) != len(x.shape) - 2:
        raise ValueError(f"kernel_shape {kernel_shape} must have one value per spatial axis of "
                         f"input {list(x.shape)}")
    return _geometry(tuple(x.shape[2:]), kernel_shape, strides, dilations, pads, auto_pad,
                     ceil_mode)


def _lowest(dtype):
    dtype = np.dtype(dtype)
    return -np.inf if dtype.kind == "f" else np.iinfo(dtype).min


def _maxpool_infer(x, *, auto_pad="NOTSET", ceil_mode=0, dilations=None, kernel_shape=None,
                   pads=None, storage_order=0, strides=None):
    geo = _pool_infer_shape(x, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode)
    shape = (*x.shape[:2], *geo.out)
    return [(shape, x.dtype), (shape, np.int64)]


@register("MaxPool", Kind.OUT_ELEMWISE_FUSABLE, infer=_maxpool_infer)
def max_pool(x, *, auto_pad="NOTSET", ceil_mode=0, dilations=None, kernel_shape=None, pads=None,
             storage_order=0, strides=None):
    geo = _geometry(tuple(x.shape[2:]), kernel_shape, strides, dilations, pads, auto_pad, ceil_mode)
    nd = len(geo.out)
    win = _windows(_pad(x, geo, _lowest(x.dtype)), geo)
    taps = list(itertools.product(*(range(k) for k in geo.kernel)))
    y = win[(Ellipsis, *taps[0])].copy()
    for tap in taps[1:]:
        np.maximum(y, win[(Ellipsis, *tap)], out=y)
    # the first tap (row-major) holding the max: walk the taps backwards, the last write wins
    best = np.zeros(y.shape, np.int16 if len(taps) < 2 ** 15 else np.int64)
    for t in range(len(taps) - 1, -1, -1):
        np.copyto(best, t, where=win[(Ellipsis, *taps[t])] == y)
    taps = np.unravel_index(best, geo.kernel)
    n, c = x.shape[:2]
    spatial = x.shape[2:]
    index = np.zeros(best.shape, np.int64)
    order = range(nd) if storage_order == 0 else reversed(range(nd))
    for i in order:
        o = np.arange(geo.out[i]).reshape((-1,) + (1,) * (nd - 1 - i))
        coord = o * geo.strides[i] - geo.begin[i] + taps[i] * geo.dilations[i]
        index = index * spatial[i] + coord
    plane = int(np.prod(spatial))
    index = index + (np.arange(n * c, dtype=np.int64) * plane).reshape(n, c, *(1,) * nd)
    return y, index


def _avgpool_infer(x, *, auto_pad="NOTSET", ceil_mode=0, count_include_pad=0, dilations=None,
                   kernel_shape=None, pads=None, strides=None):
    geo = _pool_infer_shape(x, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode)
    return (*x.shape[:2], *geo.out), x.dtype


def _window_counts(spatial, geo: Geometry, include_pad: bool):
    """How many elements each window averages: real pixels, or pixels plus pads (no overhang)."""
    if include_pad:
        mask = np.ones(tuple(n + b + e for n, b, e in zip(spatial, geo.begin, geo.end)))
        shifted = Geometry(geo.kernel, geo.strides, geo.dilations, (0,) * len(spatial),
                           (0,) * len(spatial), geo.out)
        return _windows(_pad(mask, shifted, 0), shifted).sum(axis=tuple(range(-len(spatial), 0)))
    mask = np.ones(spatial)
    return _windows(_pad(mask, geo, 0), geo).sum(axis=tuple(range(-len(spatial), 0)))


@register("AveragePool", Kind.OUT_ELEMWISE_FUSABLE, infer=_avgpool_infer)
def average_pool(x, *, auto_pad="NOTSET", ceil_mode=0, count_include_pad=0, dilations=None,
                 kernel_shape=None, pads=None, strides=None):
    geo = _geometry(tuple(x.shape[2:]), kernel_shape, strides, dilations, pads, auto_pad, ceil_mode)
    nd = len(geo.out)
    ct = _compute_dtype(x.dtype)
    win = _windows(_pad(x.astype(ct, copy=False), geo, 0), geo)
    total = win.sum(axis=tuple(range(-nd, 0)))
    counts = _window_counts(x.shape[2:], geo, bool(count_include_pad))
    return (total / counts.astype(ct)).astype(x.dtype)


def _lppool_infer(x, *, auto_pad="NOTSET", ceil_mode=0, dilations=None, kernel_shape=None, p=2,
                  pads=None, strides=None):
    geo = _pool_infer_shape(x, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode)
    return (*x.shape[:2], *geo.out), x.dtype


@register("LpPool", Kind.OUT_ELEMWISE_FUSABLE, infer=_lppool_infer)
def lp_pool(x, *, auto_pad="NOTSET", ceil_mode=0, dilations=None, kernel_shape=None, p=2,
            pads=None, strides=None):
    geo = _geometry(tuple(x.shape[2:]), kernel_shape, strides, dilations, pads, auto_pad, ceil_mode)
    nd = len(geo.out)
    win = _windows(_pad(np.abs(x.astype(np.float64)), geo, 0), geo)
    y = (win ** p).sum(axis=tuple(range(-nd, 0))) ** (1.0 / p)
    return y.astype(x.dtype)


def _global_infer(x):
    _check_rank(x, "global pool")
    return (*x.shape[:2], *(1,) * (len(x.shape) - 2)), x.dtype


@register("GlobalAveragePool", Kind.OUT_ELEMWISE_FUSABLE, infer=_global_infer)
def global_average_pool(x):
    axes = tuple(range(2, x.ndim))
    return x.mean(axis=axes, keepdims=True, dtype=np.float64).astype(x.dtype)


@register("GlobalMaxPool", Kind.OUT_ELEMWISE_FUSABLE, infer=_global_infer)
def global_max_pool(x):
    return x.max(axis=tuple(range(2, x.ndim)), keepdims=True)


@register("GlobalLpPool", Kind.OUT_ELEMWISE_FUSABLE, infer=_global_infer)
def global_lp_pool(x, *, p=2):
    v = np.abs(x.astype(np.float64)) ** p
    return (v.sum(axis=tuple(range(2, x.ndim)), keepdims=True) ** (1.0 / p)).astype(x.dtype)


# ---- normalizations --------------------------------------------------------------------------

def _channel_params(x, *params):
    """Per-channel parameters reshaped to broadcast against (N, C, spatial...)."""
    shape = (-1,) + (1,) * (x.ndim - 2)
    return [p.astype(np.float64).reshape(shape) for p in params]


def _batchnorm_infer(x, scale, b, mean, var, *, epsilon=1e-5, momentum=0.9, training_mode=0):
    if training_mode:
        raise ValueError("training_mode=1 is not supported (inference only)")
    if len(x.shape) < 2:
        raise ValueError(f"input must have rank >= 2, got {list(x.shape)}")
    c = x.shape[1]
    for name, t in (("scale", scale), ("B", b), ("mean", mean), ("var", var)):
        if tuple(t.shape) != (c,):
            raise ValueError(f"{name} has shape {list(t.shape)}, expected [{c}]")
    return x.shape, x.dtype


@register("BatchNormalization", Kind.BROADCAST, infer=_batchnorm_infer)
def batch_normalization(x, scale, b, mean, var, *, epsilon=1e-5, momentum=0.9, training_mode=0):
    s, bb, m, v = _channel_params(x, scale, b, mean, var)
    k = s / np.sqrt(v + epsilon)
    ct = _compute_dtype(x.dtype)
    return (x.astype(ct) * k.astype(ct) + (bb - m * k).astype(ct)).astype(x.dtype)


def _instnorm_infer(x, scale, b, *, epsilon=1e-5):
    _check_rank(x, "InstanceNormalization")
    c = x.shape[1]
    if tuple(scale.shape) != (c,) or tuple(b.shape) != (c,):
        raise ValueError(f"scale {list(scale.shape)} and B {list(b.shape)} must be [{c}]")
    return x.shape, x.dtype


@register("InstanceNormalization", Kind.OPAQUE, infer=_instnorm_infer)
def instance_normalization(x, scale, b, *, epsilon=1e-5):
    axes = tuple(range(2, x.ndim))
    v = x.astype(np.float64)
    mean = v.mean(axis=axes, keepdims=True)
    var = ((v - mean) ** 2).mean(axis=axes, keepdims=True)
    s, bb = _channel_params(x, scale, b)
    return ((v - mean) / np.sqrt(var + epsilon) * s + bb).astype(x.dtype)


def _layernorm_infer(x, scale, b=None, *, axis=-1, epsilon=1e-5, stash_type=1):
    a = _axis(axis, len(x.shape))
    norm = tuple(x.shape[a:])
    for name, t in (("scale", scale), ("B", b)):
        if t is not None and (len(t.shape) > len(norm) or any(
                d not in (1, n) for d, n in zip(t.shape[::-1], norm[::-1]))):
            raise ValueError(f"{name} {list(t.shape)} does not broadcast to the normalized shape "
                             f"{list(norm)} (axis {axis})")
    stat = (*x.shape[:a], *(1,) * (len(x.shape) - a))
    return [(x.shape, x.dtype), (stat, np.float32), (stat, np.float32)]


@register("LayerNormalization", Kind.OPAQUE, infer=_layernorm_infer)
def layer_normalization(x, scale, b=None, *, axis=-1, epsilon=1e-5, stash_type=1):
    a = _axis(axis, x.ndim)
    axes = tuple(range(a, x.ndim))
    ct = _compute_dtype(x.dtype)
    v = x.astype(ct)
    mean = v.mean(axis=axes, keepdims=True)
    d = v - mean
    inv = 1 / np.sqrt((d * d).mean(axis=axes, keepdims=True) + ct(epsilon))
    y = d * inv * scale.astype(ct)
    if b is not None:
        y = y + b.astype(ct)
    return y.astype(x.dtype), mean.astype(np.float32), inv.astype(np.float32)


def _groupnorm_infer(x, scale, b, *, epsilon=1e-5, num_groups, stash_type=1):
    if len(x.shape) < 2:
        raise ValueError(f"input must have rank >= 2, got {list(x.shape)}")
    c = x.shape[1]
    if num_groups < 1 or c % num_groups:
        raise ValueError(f"{c} channels do not split into num_groups={num_groups}")
    if tuple(scale.shape) != (c,) or tuple(b.shape) != (c,):
        raise ValueError(f"scale {list(scale.shape)} and bias {list(b.shape)} must be [{c}]")
    return x.shape, x.dtype


@register("GroupNormalization", Kind.OPAQUE, infer=_groupnorm_infer)
def group_normalization(x, scale, b, *, epsilon=1e-5, num_groups, stash_type=1):
    n, c = x.shape[:2]
    v = x.astype(np.float64).reshape(n, num_groups, -1)
    mean = v.mean(axis=-1, keepdims=True)
    var = ((v - mean) ** 2).mean(axis=-1, keepdims=True)
    y = ((v - mean) / np.sqrt(var + epsilon)).reshape(x.shape)
    s, bb = _channel_params(x, scale, b)
    return (y * s + bb).astype(x.dtype)


def _same_infer(x, *rest, **attrs):
    return x.shape, x.dtype


@register("LRN", Kind.OPAQUE, infer=_same_infer)
def lrn(x, *, size, alpha=1e-4, beta=0.75, bias=1.0):
    sq = x.astype(np.float64) ** 2
    lo, hi = (size - 1) // 2, size - 1 - (size - 1) // 2
    widths = [(0, 0), (lo, hi)] + [(0, 0)] * (x.ndim - 2)
    sums = sliding_window_view(np.pad(sq, widths), size, axis=1).sum(axis=-1)
    return (x / (bias + alpha / size * sums) ** beta).astype(x.dtype)


@register("LpNormalization", Kind.OPAQUE, infer=_same_infer)
def lp_normalization(x, *, axis=-1, p=2):
    a = _axis(axis, x.ndim)
    v = x.astype(np.float64)
    if p == 1:
        norm = np.abs(v).sum(axis=a, keepdims=True)
    elif p == 2:
        norm = np.sqrt((v * v).sum(axis=a, keepdims=True))
    else:
        raise ValueError(f"p={p} must be 1 or 2")
    with np.errstate(divide="ignore", invalid="ignore"):
        y = np.where(norm == 0, 0, v / norm)
    return y.astype(x.dtype)


# ---- softmax family (opset 13: one axis) -----------------------------------------------------

def _axis_infer(x, *, axis=-1):
    _axis(axis, len(x.shape))
    return x.shape, x.dtype


def _softmax_dtype(dtype):
    """float16 is computed op by op in float16, as ONNX's reference does (its expected outputs
    differ from a float32 computation by an ulp, beyond the conformance tolerance)."""
    return np.float16 if dtype == np.float16 else _compute_dtype(dtype)


@register("Softmax", Kind.OPAQUE, infer=_axis_infer)
def softmax(x, *, axis=-1):
    v = x.astype(_softmax_dtype(x.dtype))
    e = np.exp(v - v.max(axis=axis, keepdims=True))
    return (e / e.sum(axis=axis, keepdims=True)).astype(x.dtype)


@register("LogSoftmax", Kind.OPAQUE, infer=_axis_infer)
def log_softmax(x, *, axis=-1):
    v = x.astype(_softmax_dtype(x.dtype))
    d = v - v.max(axis=axis, keepdims=True)
    return (d - np.log(np.exp(d).sum(axis=axis, keepdims=True))).astype(x.dtype)


@register("Hardmax", Kind.OPAQUE, infer=_axis_infer)
def hardmax(x, *, axis=-1):
    a = _axis(axis, x.ndim)
    first = np.expand_dims(np.argmax(x, axis=a), a)
    y = np.zeros_like(x)
    np.put_along_axis(y, first, 1, axis=a)
    return y
