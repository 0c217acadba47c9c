"""A quantized 1x1 conv (or a stem's 3x3 over an image's channels) on integer dot products fused
with the depthwise conv that reads it.

Quantized MobileNets and EfficientNets expand channels with a 1x1 QLinearConv and filter them with
a depthwise one. Unfused, the expand conv runs on dot products (conv2d_int8) and writes the
expanded tensor, float32 integers four times the bytes onnxruntime's uint8 ones take, for the
depthwise conv to read back: MobileNetV2's 16 -> 96 on 112x112 ran 0.24 ms and its depthwise conv
0.11, onnxruntime's 0.08 and 0.035 (AMD EPYC Zen 4). Fused with float32 FMAs for the expand conv
(expand_depthwise), it was slower still. Here each ring row of expand_depthwise is computed as
conv2d_int8 computes a tile: the row's pixels converted once to bytes (x - x_min) or int16, register
tiles of int32 vectors summed by dot products (int_dot.py) with weights packed as int8/int16, x_min
times each channel's weight sum added back (`corr`), then the expand conv's epilogue (requantize,
clip, center) into the ring. The depthwise conv, its sums exact integers in float32, is
expand_depthwise's.
"""
from __future__ import annotations

import numpy as np

from .. import target
from .codegen import shifted_start
from .conv2d_int8 import (MAX_PATCH, MAX_TAPS, convert_patch, dot_imports, dot_tile, in_bounds, int8_weights,
                          pixel_bytes, byte_zero, x_min)
from .expand_depthwise import ExpandDepthwise, Geometry, ring_stores, split, tile_channels
from .int_dot import dot_form
from .space import ConfigSpace
from .template import float_or_bytes_out, get, register
from .workload import BYTES, Workload


@register
class ExpandDepthwiseInt8(ExpandDepthwise):
    name = "expand_depthwise_int8"
    alternative_to = "expand_depthwise"
    priority = -1
    supersedes = True         # where it matches, the float32 expand loses (conv2d_int8's reasons)
    reads_bytes = True

    def matches(self, wl: Workload) -> bool:
        form = dot_form(target.current())
        if form is None or not super().matches(wl):
            return False
        pw_ = wl.ops[0]
        if not pw_.attr("exact", 0) or x_min(wl) is None:
            return False
        g = Geometry(wl, split(wl))
        if g.C * g.KH1 * g.KW1 > MAX_TAPS or g.K < form.lanes:
            return False
        # an expand: each item converts the input rows for its own channel tile, so with as many
        # output channels as input ones (ShuffleNetV2's branches) the conversions outweigh the dot
        # products, and the pairs ran slower fused than apart (quantized ShuffleNetV2 x1.0: 1.10-1.17x
        # the unfused module; MobileNetV2's and EfficientNet's expansions by 6: 0.86-0.90x; AMD EPYC
        # Zen 4). Blocks narrower than half a vector run the epilogues 4 lanes wide: apart too.
        if g.K < 2 * g.C or 2 * g.b < form.lanes:
            return False
        return bool(self.space(wl).valid_indices(limit=1))

    def types_ok(self, wl: Workload, d: int) -> bool:
        """Also an input read as bytes (`x_zero`), and an output cast to 8 bits at the end (the next
        quantized conv's input, passes/byte_inputs.py)."""
        pw_ = wl.ops[0]
        x = wl.spec(pw_.args[0])
        if byte_zero(wl) is not None:
            ok = x.dtype in BYTES
        else:
            ok = x.dtype == np.float32 and max(pw_.attrs.get("pads", [0])) <= x.layout[1]
        return ok and all(wl.spec(f"v{j}").dtype == np.float32 for j in range(len(wl.ops) - 1)) and \
            float_or_bytes_out(wl)

    def preferred(self, wl: Workload) -> bool:
        return get("conv2d_int8").preferred(wl)

    def space(self, wl: Workload) -> ConfigSpace:
        """expand_depthwise's, with whole int32 vectors of channels per item, where a converted row
        fits MAX_PATCH."""
        sp = super().space(wl)
        g = Geometry(wl, split(wl))
        tg = target.current()
        form = dot_form(tg)
        float_valid = sp.constraint
        patch = g.KH1 * ((g.W - 1) * g.s1w + g.KW1) * pixel_bytes(g.C, form)    # the rows a row reads

        def valid(cfg):
            ktw = cfg["tile_oc_blocks"] * g.b
            vec = ktw // form.lanes
            return ktw % form.lanes == 0 and float_valid(cfg) and patch <= MAX_PATCH and \
                cfg["tile_ow"] * vec + vec <= tg.vector_registers - 2
        sp.constraint = valid
        return sp

    def first_conv(self, wl: Workload, g: Geometry, cfg, X: str, xs: list, p: str):
        """Row r's first conv (a 1x1, or a stem's 3x3 over an image's channels) on dot products: its
        input rows converted once, for all the item's channels."""
        form = dot_form(target.current())
        lo = x_min(wl) if form.shifted else 0
        z = byte_zero(wl)
        V, PER, XT = form.lanes, form.per, form.x_dtype
        OWT, m = min(cfg["tile_ow"], g.W), cfg["tile_oc_blocks"]
        b, cb, KTW = g.b, g.cb, m * g.b
        CBI, KBN = g.C // cb, g.K // b
        KT = -(-KBN // m)
        CP = -(-g.C // PER) * PER
        CQ = CP // PER
        pw_ = wl.ops[0]
        bias1 = len(pw_.args) > 2 and bool(pw_.args[2])
        # the rows a row of the first conv reads (one for a 1x1), converted whole, once, before its
        # tiles read them (a shifted last tile reads pixels the tile before it converted)
        cols = (g.W - 1) * g.s1w + g.KW1
        body = [f"{p}buf = stack_empty({g.KH1 * cols * CP}, np.{XT})",
                f"{p}acc = stack_empty({OWT * KTW}, np.int32)",
                *convert_patch(form, X, lo, g.KH1, cols, CBI, cb, g.C, f"xn + ci * {xs[1]} + (r * {g.s1h} + kh1 + "
                               f"{g.hin - g.p1t}) * {xs[2]} + (c0 + {g.hin - g.p1l}) * {cb}", p, ("ci", "kh1", "c0"),
                               zero=z or 0, inside=in_bounds(f"r * {g.s1h} + kh1 - {g.p1t}", f"c0 - {g.p1l}",
                                                             g.XH, g.XW)
                               if z is not None and (g.p1t or g.p1l or g.KH1 > 1 or g.KW1 > 1) else None),
                f"{p}for t in range({-(-g.W // OWT)}):",
                f"{p}    w0 = {shifted_start(f't * {OWT}', g.W, OWT)}"]
        zero, dots, store = dot_tile(form, OWT, KTW // V, lambda q: f"np.uintp({q * g.s1w * CP}) + co", KTW,
                                     p + "    ", p + "            ")
        taps = g.KH1 * g.KW1 * CQ
        body += zero + [f"{p}    for tap in range({g.KH1 * g.KW1}):",
                        f"{p}        kh1 = tap // {g.KW1}",
                        f"{p}        kw1 = tap % {g.KW1}",
                        f"{p}        for cq in range({CQ}):",
                        f"{p}            co = np.uintp((kh1 * {cols} + w0 * {g.s1w} + kw1) * {CP} + cq * {PER})",
                        f"{p}            wo = np.uintp((kt * {taps} + tap * {CQ} + cq) * {KTW * PER})"] + dots + store
        # j runs over block mb's lanes: channel (kb0 + mb) b + j, as the ring's
        k = "np.uintp((kb0 + {mb}) * " + str(b) + ") + np.uintp(j)"

        def value(q, mb):
            ch = k.format(mb=mb)
            v = f"np.float32(acc[{q * KTW + mb * b} + j] + corr[{ch}])"
            return f"({v} + bias1[{ch}])" if bias1 else v
        body += ring_stores(wl, g, OWT, m, value, p + "    ")
        w1_arg = int(pw_.args[1][1:])
        b1_arg = int(pw_.args[2][1:]) if bias1 else None

        def pack(consts):
            w = int8_weights(consts[w1_arg], self.name)                           # [K, C, KH1, KW1]
            wi = np.zeros((g.K, CP, g.KH1, g.KW1), form.w_dtype)
            wi[:, :g.C] = w
            packed = wi[tile_channels(KBN, m, b)].reshape(KT, KTW, CQ, PER, g.KH1, g.KW1)
            packed = packed.transpose(0, 4, 5, 2, 1, 3)                            # [KT, KH1, KW1, CQ, KTW, PER]
            res = {"w": np.ascontiguousarray(packed).reshape(-1),
                   "corr": (lo * w.astype(np.int64).sum(axis=(1, 2, 3))).astype(np.int32)}
            if bias1:
                res["bias1"] = np.ascontiguousarray(np.asarray(consts[b1_arg], np.float32).reshape(-1))
            return res
        args = ["w", "corr"] + (["bias1"] if bias1 else [])
        return body, args, [np.dtype(form.w_dtype), np.int32] + [np.float32] * bias1, pack

    def imports(self) -> list:
        return dot_imports(dot_form(target.current()))
