"""The geometry of a workload's convolution, as every conv template reads it.

One description for the direct (conv2d), Winograd, depthwise and generic templates, so that they
agree on what a stride, a pad or a block is; the 2-d names (H, OW, KH, cb ...) read the last two
spatial axes and the layouts of the input and the output.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..ops.window import conv_transpose_geometry
from .workload import Workload


@dataclass(frozen=True)
class ConvGeometry:
    N: int
    C: int                       # input channels
    K: int                       # output channels
    group: int
    Cg: int                      # input channels per group
    Kg: int                      # output channels per group
    spatial_in: tuple            # input spatial dims
    spatial_out: tuple
    kernel: tuple
    strides: tuple
    dilations: tuple
    pads: tuple                  # pads at the start of each spatial axis
    transpose: bool              # ConvTranspose
    dtype: np.dtype
    in_layout: tuple | None      # (block, halo) of a channel-blocked input, else None
    out_layout: tuple | None

    @property
    def nd(self) -> int:
        return len(self.spatial_in)

    H = property(lambda self: self.spatial_in[-2])
    W = property(lambda self: self.spatial_in[-1])
    OH = property(lambda self: self.spatial_out[-2])
    OW = property(lambda self: self.spatial_out[-1])
    KH = property(lambda self: self.kernel[-2])
    KW = property(lambda self: self.kernel[-1])
    cb = property(lambda self: self.in_layout[0], doc="the input's channel block")
    hin = property(lambda self: self.in_layout[1], doc="the input's halo")
    KB = property(lambda self: self.out_layout[0], doc="the output's channel block")
    hout = property(lambda self: self.out_layout[1], doc="the output's halo")


def _ints(attrs, name, n, default) -> tuple:
    v = attrs.get(name)
    return tuple(int(a) for a in v) if v is not None and len(v) else (default,) * n


def conv_geometry(wl: Workload) -> ConvGeometry:
    """The geometry of `wl`'s anchor (Conv or ConvTranspose); raises what the transposed
    convolution's shape rule raises for attributes it cannot take."""
    conv = wl.anchor
    x, w = wl.spec(conv.args[0]), wl.spec(conv.args[1])
    out = wl.spec(f"v{conv.index}")
    nd = len(x.shape) - 2
    a = conv.attrs
    transpose = conv.op == "ConvTranspose"
    group = int(a.get("group", 1))
    st = _ints(a, "strides", nd, 1)
    dil = _ints(a, "dilations", nd, 1)
    if transpose:
        geo = conv_transpose_geometry(x.shape, w.shape, a.get("auto_pad", "NOTSET"), list(dil),
                                      a.get("kernel_shape"), a.get("output_padding"),
                                      a.get("output_shape"), a.get("pads"), list(st))
        begin = tuple(int(b) for b in geo.begin)
        cg, kg = x.shape[1] // group, w.shape[1]
    else:
        begin = _ints(a, "pads", 2 * nd, 0)[:nd]
        cg, kg = w.shape[1], w.shape[0] // group
    out_layout = wl.outputs[0].layout if wl.outputs else None
    return ConvGeometry(N=x.shape[0], C=x.shape[1], K=out.shape[1], group=group, Cg=cg, Kg=kg,
                        spatial_in=tuple(x.shape[2:]), spatial_out=tuple(out.shape[2:]),
                        kernel=tuple(w.shape[2:]), strides=st, dilations=dil, pads=begin,
                        transpose=transpose, dtype=x.dtype, in_layout=x.layout, out_layout=out_layout)


def tap_range(size: int, k: int, s: int, d: int, p: int, first: int, last: int) -> tuple[int, int]:
    """The filter taps [lo, hi) of one axis (k taps, stride s, dilation d, begin pad p) that read
    the input (size) for some output position in [first, last]; empty when hi <= lo."""
    return max(0, -((last * s - p) // d)), min(k, (size - 1 + p - first * s) // d + 1)
