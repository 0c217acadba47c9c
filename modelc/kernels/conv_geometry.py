"""The geometry of a workload's convolution, as every conv template reads it.

One description for the direct (conv2d), Winograd, depthwise and generic templates, so that they
agree on what a stride, a pad or a block is; the 2-d names (H, OW, KH, cb ...) read the last two
spatial axes and the layouts of the input and the output.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

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


def _axes(g):
    return ((g.H, g.OH, g.KH, g.strides[0], g.dilations[0], g.pads[0]),
            (g.W, g.OW, g.KW, g.strides[1], g.dilations[1], g.pads[1]))


def _live(size, k, s, d, p, first, last) -> int:
    """How many filter taps of one axis read the input for some output in [first, last]."""
    lo, hi = tap_range(size, k, s, d, p, first, last)
    return max(hi - lo, 0)


def padding_share(g) -> float:
    """The share of (output pixel, filter tap) products that read the zero halo: a dilated conv
    on a small map (DeepLabV3's ASPP, taps 12 apart on 14x14: 83%) multiplies mostly zeros."""
    live = 1.0
    for size, out, k, s, d, p in _axes(g):
        live *= sum(_live(size, k, s, d, p, o, o) for o in range(out)) / (out * k)
    return 1.0 - live


def computed_taps(g, tile_oh: int, tile_ow: int) -> int:
    """(output pixel, tap) products that tiles skipping dead taps compute (shifted last tiles)."""
    work = 1
    for (size, out, k, s, d, p), t in zip(_axes(g), (tile_oh, tile_ow)):
        starts = [min(i * t, out - t) for i in range(-(-out // t))]
        work *= sum(t * _live(size, k, s, d, p, a, a + t - 1) for a in starts)
    return work


def flattened(g: ConvGeometry) -> ConvGeometry | None:
    """A pointwise conv (1x1, stride 1, no padding) over an input without a halo, as one row of
    OH x OW pixels: its pixels are contiguous in the blocked layout, so a register tile runs on across
    the rows' ends and, where it does not divide a row, wastes at most one tile over the whole map
    rather than one a row (None for any other conv, and for a map of one row already)."""
    if (g.nd != 2 or g.transpose or g.in_layout is None or g.hin or g.OH == 1 or set(g.kernel) != {1}
            or set(g.strides) != {1} or any(g.pads) or g.spatial_in != g.spatial_out):
        return None
    return replace(g, spatial_in=(1, g.H * g.W), spatial_out=(1, g.OH * g.OW))
