"""A quantized Dense (x[..., K] @ w[K, N]) on integer dot products (int_dot.py: VNNI's, else
AVX2's int16 pairs), for the products quantized models import (QLinearMatMul, QGemm, MatMulInteger,
MatMulIntegerToFloat with constant weights): conv2d_int8's method on a GEMM.

Each parallel item converts MR rows of x once (to bytes x - x_min, or to int16) and runs them
against a group of column tiles of weights packed as [N/NT, KQ, NT, per]; with VNNI x_min times
each column's weight sum (`corr`) is added back to the exact int32 sums before the bias and the
epilogue (requantization, activation ...), as Dense's.
"""
from __future__ import annotations

import math

import numpy as np

from .. import target
from .codegen import ParallelItem, unravel_index
from .conv2d_int8 import MAX_PATCH, MAX_TAPS, dot_imports, dot_tile, int8_weights, pixel_bytes, x_min
from .int_dot import dot_form
from .space import ConfigSpace
from .template import Kernel, Template, epilogue, epilogue_inputs, get, register, source
from .workload import Workload

MR_CANDIDATES = [1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14]


@register
class DenseInt8(Template):
    name = "dense_int8"
    alternative_to = "dense"
    priority = -1
    supersedes = True

    @staticmethod
    def _dims(wl: Workload):
        x, w = wl.spec(wl.anchor.args[0]), wl.spec(wl.anchor.args[1])
        return math.prod(x.shape[:-1]), w.shape[0], w.shape[1], x

    def matches(self, wl: Workload) -> bool:
        form = dot_form(target.current())
        if wl.anchor.op != "Dense" or form is None or x_min(wl) is None or not wl.anchor.attr("exact", 0) \
                or "y_strides" in wl.anchor.attrs:
            return False
        if not get(self.alternative_to).matches(wl):
            return False
        M, K, N, _ = self._dims(wl)
        return N >= form.lanes and K <= MAX_TAPS and pixel_bytes(K, form) <= MAX_PATCH

    def preferred(self, wl: Workload) -> bool:
        """As conv2d_int8's: two or four times float32's products per instruction, exactly."""
        return True

    def space(self, wl: Workload) -> ConfigSpace:
        M, K, N, _ = self._dims(wl)
        tg = target.current()
        form = dot_form(tg)
        lanes = form.lanes
        kp = pixel_bytes(K, form)
        sp = ConfigSpace()
        sp.define_knob("tile_m", [r for r in MR_CANDIDATES if r <= M] or [M])
        sp.define_knob("tile_n_vectors", [v for v in (1, 2, 3, 4) if v == 1 or v * lanes <= N])
        most = -(-N // lanes)
        sp.define_knob("tiles_per_item", sorted({t for t in (1, 2, 4, 8, most) if t <= most}))

        def valid(cfg):
            mr, v = cfg["tile_m"], cfg["tile_n_vectors"]
            if mr * kp > MAX_PATCH or cfg["tiles_per_item"] > -(-N // (v * lanes)):
                return False
            return mr * v + v <= tg.vector_registers - 2
        sp.constraint = valid
        return sp

    def default_config(self, wl: Workload, space: ConfigSpace):
        """The tile with the most accumulators that fits and wastes little, every column tile of
        an item's rows in the item unless that leaves fewer items than a few per thread."""
        M, K, N, _ = self._dims(wl)
        tg = target.current()
        lanes = dot_form(tg).lanes
        best = None
        for cfg in (space.get(i) for i in space.valid_indices()):
            mr, v = cfg["tile_m"], cfg["tile_n_vectors"]
            tiles = -(-N // (v * lanes))
            waste = (tiles * v * lanes - N) / N + (-(-M // mr) * mr - M) / M
            items = -(-M // mr) * -(-tiles // cfg["tiles_per_item"])
            score = (waste > 0.15, items < 4 * tg.threads and M > mr, -mr * v, -cfg["tiles_per_item"], waste)
            if best is None or score < best[0]:
                best = (score, cfg)
        return best[1] if best else space.get(0)

    def build(self, wl: Workload, cfg) -> Kernel:
        M, K, N, x = self._dims(wl)
        form = dot_form(target.current())
        lo = x_min(wl) if form.shifted else 0
        V, PER, XT = form.lanes, form.per, form.x_dtype
        MR, m, G = cfg["tile_m"], cfg["tile_n_vectors"], cfg["tiles_per_item"]
        NT = m * V
        NTL = -(-N // NT)
        NG = -(-NTL // G)
        MT = -(-M // MR)
        KP = -(-K // PER) * PER
        KQ = KP // PER
        a = wl.anchor
        x_arg, w_arg = int(a.args[0][1:]), int(a.args[1][1:])
        b_arg = int(a.args[2][1:]) if len(a.args) > 2 and a.args[2] else None
        X = f"in{x_arg}"
        item = ParallelItem()
        body = [item.loop(MT * NG),
                *item.last("mt", MT, "og"),
                f"    m0 = min(mt * {MR}, {M - MR})",
                f"    buf = carray(stack_empty({MR * KP}, np.{XT}), {MR * KP})",
                f"    acc = carray(stack_empty({MR * NT}, np.int32), {MR * NT})",
                f"    for r in range({MR}):",
                f"        xo = np.uintp((m0 + r) * {K})",
                f"        bo = np.uintp(r * {KP})",
                f"        for k in range({K}):",
                f"            buf[bo + np.uintp(k)] = np.{XT}(np.int32({X}[xo + np.uintp(k)]) - np.int32({lo}))"]
        if KP > K:
            body += [f"        for k in range({K}, {KP}):", f"            buf[bo + np.uintp(k)] = np.{XT}(0)"]
        body += [f"    for nt in range(og * {G}, min({NTL}, og * {G} + {G})):",
                 f"        n0 = nt * {NT}",
                 f"        nv = min({NT}, {N} - n0)"]
        zero, dots, store = dot_tile(form, MR, m, lambda r: f"xo + np.uintp({r * KP})", NT, " " * 8, " " * 12)
        body += zero
        body += [f"        wb = np.uintp(nt * {KQ * NT * PER})",
                 f"        for kq in range({KQ}):",
                 f"            xo = np.uintp(kq * {PER})",
                 f"            wo = wb + np.uintp(kq * {NT * PER})"] + dots + store
        # bias, epilogue and store of the rows this item owns (a shifted last tile's first rows
        # are the tile before it's)
        out = wl.outputs[0]
        body += [f"        for r in range({MR}):",
                 "            m = m0 + r"]
        if M % MR:
            body += [f"            if m < mt * {MR}:", "                continue"]
        rl, ridx = unravel_index("m", tuple(x.shape[:-1]), "r")
        body += [f"            {ln}" for ln in rl]
        body += [f"            ob = np.uintp(m * {N} + n0)",
                 "            for j in range(nv):"]
        v = f"np.float32(acc[r * {NT} + j] + corr[n0 + j])"
        if b_arg is not None:
            v = f"({v} + bias[n0 + j])"
        el, final = epilogue(wl, wl.epilogue, v, list(ridx) + ["n0 + j"], out.shape, out.dtype,
                             f"v{a.index}", fast_erf=True)
        body += [f"                {ln}" for ln in el]
        body.append(f"                out0[ob + np.uintp(j)] = {final}")

        def pack(consts):
            w = int8_weights(consts[w_arg], "dense_int8")                       # [K, N]
            wp = np.zeros((KP, NTL * NT), form.w_dtype)
            wp[:K, :N] = w
            packed = wp.reshape(KQ, PER, NTL, NT).transpose(2, 0, 3, 1)         # [NTL, KQ, NT, per]
            corr = lo * w.astype(np.int64).sum(axis=0)
            res = {"w": np.ascontiguousarray(packed).reshape(-1), "corr": corr.astype(np.int32)}
            if b_arg is not None:
                res["bias"] = np.ascontiguousarray(np.asarray(consts[b_arg], np.float32).reshape(-1))
            return res

        args = ["out0", X, "w", "corr"] + (["bias"] if b_arg is not None else [])
        args += [f"in{k}" for k in epilogue_inputs(wl.epilogue) if k != x_arg]
        dtypes = [out.dtype, np.float32, np.dtype(form.w_dtype), np.int32] + \
            ([np.float32] if b_arg is not None else []) + \
            [wl.inputs[int(s[2:])].dtype for s in args[4 + (b_arg is not None):]]
        return Kernel(source(args, dtypes, body, extra=dot_imports(form)), args, pack)
