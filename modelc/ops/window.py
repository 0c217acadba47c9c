"""Sliding-window geometry shared by convolutions and pools, and by their kernel templates.

`window_geometry` (pools, Conv), `conv_geometry` and `conv_transpose_geometry` turn an op's
attributes into one `Geometry` (kernel, strides, dilations, pads and output size per spatial axis),
so that the shape rule, the numpy reference and the generated kernels agree on every output size
and pad. `pad_for_windows` and `windows` give the references their vectorised form: windows are
strided views of the padded input.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view


AUTO_PADS = ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID")


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


def window_geometry(in_sp, kernel, strides=None, dilations=None, pads=None, auto_pad="NOTSET",
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
        if min(pads) < 0:
            raise ValueError(f"pads {list(pads)} must not be negative")     # (as onnxruntime rejects them)
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


def conv_geometry(xs, ws, auto_pad, dilations, kernel_shape, pads, strides):
    """A Conv's geometry from its input and weight shapes (the kernel is the weight's)."""
    kernel = tuple(ws[2:])
    if kernel_shape is not None and len(kernel_shape) and tuple(kernel_shape) != kernel:
        raise ValueError(f"kernel_shape {list(kernel_shape)} disagrees with the weight shape "
                         f"{list(ws)}")
    return window_geometry(tuple(xs[2:]), kernel, strides, dilations, pads, auto_pad)


def conv_transpose_geometry(xs, ws, auto_pad, dilations, kernel_shape, output_padding,
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


def pad_for_windows(x, geo: Geometry, value):
    """Pad the spatial axes so that every window of `geo` lies inside (ceil-mode overhang too)."""
    widths = [(0, 0)] * (x.ndim - len(geo.out))
    for i, n in enumerate(x.shape[x.ndim - len(geo.out):]):
        need = (geo.out[i] - 1) * geo.strides[i] + geo.extent[i]
        widths.append((geo.begin[i], max(geo.end[i], need - n - geo.begin[i])))
    if not any(w != (0, 0) for w in widths):
        return x
    return np.pad(x, widths, constant_values=value)


def windows(xp, geo: Geometry):
    """View of shape (*lead, *out, *kernel) over the trailing spatial axes of padded `xp`."""
    nd = len(geo.out)
    lead = xp.ndim - nd
    v = sliding_window_view(xp, geo.extent, axis=tuple(range(lead, xp.ndim)))
    idx = ((slice(None),) * lead
           + tuple(slice(0, (o - 1) * s + 1, s) for o, s in zip(geo.out, geo.strides))
           + tuple(slice(None, None, d) for d in geo.dilations))
    return v[idx]


def check_spatial_rank(x, what, min_rank=3):
    """Windowed ops need (N, C, spatial...) inputs."""
    if len(x.shape) < min_rank:
        raise ValueError(f"{what} input must have rank >= {min_rank} (N, C, spatial...), "
                         f"got shape {list(x.shape)}")
