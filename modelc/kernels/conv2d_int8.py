"""A quantized convolution on integer dot products (x86 VNNI's, else AVX2's int16 pairs), for the
convs quantized models import.

QLinearConv, ConvInteger and fused QDQ convs are imported as float32 Convs of integers (`exact`),
so every pass and epilogue applies; the importer also notes the least value the centered input can
take (`x_min`: the integer type's minimum less the zero point) when the centered weights fit int8.
Such a conv's sums are then exactly integer dot products (int_dot.py): with VNNI this kernel
converts each tile's input patch once to unsigned bytes (x - x_min, so the zero halo that is the
padding becomes -x_min), multiplies them by the weights packed as int8 at compile time, and adds
back x_min times each output channel's weight sum (`corr`, packed too); without, the patch and the
weights are int16 and `vpmaddwd` multiplies them (corr is zero). The int32 sums are exact, as
onnxruntime's are, where float32 ones are exact only below 2^24.

Input [N, C/cb, H+2h, W+2h, cb] float32, or the bytes q of a conv of q - x_zero (passes/byte_inputs.py:
copied into the patch, whose padding is then written there, not read from a halo); weights [tiles, KH,
KW, CQ, KT, per] (the `per` consecutive input channels of one output channel a 32-bit lane
multiplies); output [N, K/KB, OH+2h', OW+2h', KB] (float32, or bytes: the epilogue's last cast). One
parallel item is (image, group of output-channel tiles, output rows, output columns): its patch is
converted once and read by every tile of the group. The register tile is TOH x OWT pixels by
m vectors of output channels (`int_dot.I32Vector`); the epilogue (bias, requantization, activation,
residual add) runs on it as conv2d's does.
"""
from __future__ import annotations

import numpy as np

from .. import target
from ..errors import ModelcError
from .codegen import ParallelItem, shifted_start
from .conv2d import OWT_CANDIDATES, blocked_conv, tile_stores
from .conv_geometry import conv_geometry
from .int_dot import dot_form
from .space import ConfigSpace
from .template import Kernel, Template, epilogue_inputs, get, register, source
from .workload import BYTES, Workload

MAX_PATCH = 64 << 10          # bytes of a tile's converted input patch (on the stack)
MAX_TAPS = 65536              # C x KH x KW: 255 * 128 * this stays below 2^31 (int32 sums)


def x_min(wl: Workload):
    """The anchor's least centered input value, if the importer noted one (validated: it reaches
    generated source), else None."""
    ranges = wl.integer_inputs()
    x = wl.anchor.args[0]
    return wl.anchor.attrs["x_min"] if x.startswith("i") and int(x[1:]) in ranges else None


def int8_weights(w, what: str) -> np.ndarray:
    """Constant weights that hold int8 integers, as int8 (the importer promised them)."""
    w = np.asarray(w, np.float32)
    if w.size and not (np.all(w == np.round(w)) and w.min() >= -128 and w.max() <= 127):
        raise ModelcError(f"{what}: the weights are not int8 integers (range {w.min()} .. {w.max()})")
    return w.astype(np.int8)


def dot_tile(form, rows: int, m: int, x_at, width: int, ind: str, inner: str) -> tuple[list, list, list]:
    """Source of a register tile of `rows` x m vectors of int32 accumulators (`form`'s): their
    zeroing (at `ind`), one dot product each per reduction step (at `inner`; row p reads the patch
    at x_at(p), vector v the weights at wo + v lanes), and their store to acc[p * width + v * lanes]
    (at `ind`)."""
    V, accs = form.lanes, [[f"a{p}_{v}" for v in range(m)] for p in range(rows)]
    zero = [f"{ind}{a} = dot_zero({V})" for row in accs for a in row]
    dots = [f"{inner}{accs[p][v]} = {form.call}({accs[p][v]}, buf, {x_at(p)}, w, wo + np.uintp({v * V * form.per}))"
            for p in range(rows) for v in range(m)]
    store = [f"{ind}dot_store({accs[p][v]}, acc, np.uintp({p * width + v * V}))" for p in range(rows) for v in range(m)]
    return zero, dots, store


def pixel_bytes(channels: int, form) -> int:
    """Bytes of one pixel's (or row's) `channels` in a patch: whole lanes of `form.per` values."""
    return -(-channels // form.per) * form.per * np.dtype(form.x_dtype).itemsize


def dot_conv_fits(form, C: int, K: int, KH: int, KW: int, dilations, KB: int) -> bool:
    """The shapes conv2d_int8 takes: a vector of output channels at least, int32 sums that cannot
    overflow, a patch of one output pixel that fits MAX_PATCH, output blocks that tile its vectors."""
    patch = ((KH - 1) * dilations[0] + 1) * ((KW - 1) * dilations[1] + 1) * pixel_bytes(C, form)
    return K >= form.lanes and C * KH * KW <= MAX_TAPS and patch <= MAX_PATCH and \
        (form.lanes % KB == 0 or KB % form.lanes == 0)


def convert_patch(form, X: str, lo: int, rows: int, cols: int, blocks: int, cb: int, channels: int,
                  x_at: str, ind: str, names=("cb", "r", "cc"), zero: int = 0, inside: str | None = None) -> list:
    """Source converting a patch of rows x cols pixels of `X` (blocks of cb channels) into `buf`,
    channels innermost, as x - lo in `form`'s type: buf[(r cols + c) CP + b cb + j]. `x_at` is the
    offset in X of block b's first channel at patch pixel (r, c), in the loop variables `names`.
    An input read as bytes holds x + `zero`; its padding (where the condition `inside` is false)
    is written here, as x = 0, where a float32 input's halo holds it."""
    b, r, c = names
    CP, XT = -(-channels // form.per) * form.per, form.x_dtype
    at = [f"xo = np.uintp({x_at})", f"bo = np.uintp(({r} * {cols} + {c}) * {CP} + {b} * {cb})"]
    copy = [f"for j in range({cb}):",
            f"    buf[bo + np.uintp(j)] = np.{XT}(np.int32({X}[xo + np.uintp(j)]) - np.int32({lo + zero}))"]
    if inside is None:
        copy = at + copy
    else:
        copy = [at[1], f"if {inside}:", *("    " + ln for ln in [at[0]] + copy), "else:",
                f"    for j in range({cb}):", f"        buf[bo + np.uintp(j)] = np.{XT}({-lo})"]
    body = [f"{ind}for {b} in range({blocks}):",
            f"{ind}    for {r} in range({rows}):",
            f"{ind}        for {c} in range({cols}):",
            *(f"{ind}            {ln}" for ln in copy)]
    if CP > channels:               # channels past C meet zero weights: any value, but a defined one
        body += [f"{ind}for q in range({rows * cols}):",
                 f"{ind}    for j in range({channels}, {CP}):",
                 f"{ind}        buf[np.uintp(q * {CP} + j)] = np.{XT}(0)"]
    return body


def byte_zero(wl: Workload) -> int | None:
    """x_zero of a conv that reads its input as bytes (the conv of q - x_zero: passes/byte_inputs.py),
    else None."""
    return wl.anchor.attrs.get("x_zero")


def in_bounds(row: str, col: str, h: int, w: int) -> str:
    """The condition that input pixel (row, col) lies inside an h x w image (not in its padding)."""
    return f"np.uintp({row}) < {h} and np.uintp({col}) < {w}"


def dot_imports(form) -> list:
    return [f"from modelc.kernels.int_dot import dot_store, {form.call}, dot_zero"]


@register
class Conv2dInt8(Template):
    name = "conv2d_int8"
    alternative_to = "conv2d"
    priority = -1             # the first alternative an untuned module considers (`preferred`)
    supersedes = True         # tuning measures no float32 conv for these workloads
    reads_bytes = True

    def matches(self, wl: Workload) -> bool:
        a = wl.anchor
        form = dot_form(target.current())
        if a.op != "Conv" or form is None or x_min(wl) is None or not a.attr("exact", 0):
            return False
        if not (blocked_conv(wl) and wl.spec(a.args[0]).dtype in BYTES if byte_zero(wl) is not None
                else get(self.alternative_to).matches(wl)):
            return False
        g = conv_geometry(wl)
        return dot_conv_fits(form, g.C, g.K, g.KH, g.KW, g.dilations, g.KB)

    def preferred(self, wl: Workload) -> bool:
        """Two (int16) or four (VNNI) times the products per instruction of float32's FMAs, exactly:
        always (ResNet-18's 3x3 convs on VNNI ran 2.5-4x faster than conv2d's and Winograd's
        defaults, AMD EPYC Zen 4)."""
        return True

    def space(self, wl: Workload) -> ConfigSpace:
        g = conv_geometry(wl)
        tg = target.current()
        form = dot_form(tg)
        lanes = form.lanes
        cp = pixel_bytes(g.C, form)
        sp = ConfigSpace()
        sp.define_knob("tile_ow", [t for t in OWT_CANDIDATES if t <= g.OW] or [g.OW])
        sp.define_knob("tile_oc_vectors", [m for m in (1, 2, 3, 4) if m * lanes <= g.K and (m * lanes) % g.KB == 0])
        sp.define_knob("tile_oh", [r for r in (1, 2, 4) if r <= g.OH])
        tiles = [-(-g.K // (m * lanes)) for m in sp.knobs[1].values]
        sp.define_knob("tiles_per_item", sorted({t for t in (1, 2, 4, 8, max(tiles)) if t <= max(tiles)}))

        def valid(cfg):
            m, owt, toh = cfg["tile_oc_vectors"], cfg["tile_ow"], cfg["tile_oh"]
            rows = (toh - 1) * g.strides[0] + (g.KH - 1) * g.dilations[0] + 1
            cols = (owt - 1) * g.strides[1] + (g.KW - 1) * g.dilations[1] + 1
            if rows * cols * cp > MAX_PATCH or cfg["tiles_per_item"] > -(-g.K // (m * lanes)):
                return False
            # accumulators and the m weight vectors (the input word is broadcast from memory)
            return owt * toh * m + m <= tg.vector_registers - 2
        sp.constraint = valid
        return sp

    def default_config(self, wl: Workload, space: ConfigSpace):
        """The register tile with the most accumulators that fits (products per weight load), of
        as many channel vectors as divide the output channels evenly, and each item running every
        channel tile over its patch unless that leaves fewer items than a few per thread."""
        g = conv_geometry(wl)
        tg = target.current()
        lanes = dot_form(tg).lanes
        best = None
        for cfg in (space.get(i) for i in space.valid_indices()):
            m, owt, toh = cfg["tile_oc_vectors"], cfg["tile_ow"], cfg["tile_oh"]
            tiles = -(-g.K // (m * lanes))
            waste = (tiles * m * lanes - g.K) / g.K + (-(-g.OW // owt) * owt - g.OW) / g.OW + \
                (-(-g.OH // toh) * toh - g.OH) / g.OH
            items = g.N * -(-g.OH // toh) * -(-g.OW // owt) * -(-tiles // cfg["tiles_per_item"])
            score = (waste > 0.15, items < 4 * tg.threads, -owt * toh * m - (m > 1),
                     -cfg["tiles_per_item"], waste)
            if best is None or score < best[0]:
                best = (score, cfg)
        return best[1] if best else space.get(0)

    def build(self, wl: Workload, cfg) -> Kernel:
        g = conv_geometry(wl)
        conv = wl.anchor
        form = dot_form(target.current())
        lo = x_min(wl) if form.shifted else 0
        z = byte_zero(wl)
        V, PER, XT = form.lanes, form.per, form.x_dtype
        OWT, m, TOH, G = cfg["tile_ow"], cfg["tile_oc_vectors"], cfg["tile_oh"], cfg["tiles_per_item"]
        KB, cb = g.KB, g.cb
        KT = m * V
        TB = KT // KB                   # output blocks per tile
        KBLK = g.K // KB
        KO = -(-g.K // KT)              # tiles; the last starts at block KBLK - TB
        NG = -(-KO // G)
        CBLK = g.C // cb
        CP = -(-g.C // PER) * PER
        CQ = CP // PER
        OH, OW, KH, KW = g.OH, g.OW, g.KH, g.KW
        sh, sw = g.strides
        dh, dw = g.dilations
        ph, pw = g.pads
        hin = g.hin
        NT, NR = -(-OW // OWT), -(-OH // TOH)
        PR = (TOH - 1) * sh + (KH - 1) * dh + 1
        PC = (OWT - 1) * sw + (KW - 1) * dw + 1
        P = TOH * OWT
        xs = (g.N, CBLK, g.H + 2 * hin, g.W + 2 * hin, cb)
        x_n, x_c, x_h = xs[1] * xs[2] * xs[3] * cb, xs[2] * xs[3] * cb, xs[3] * cb
        x_arg = int(conv.args[0][1:])
        X = f"in{x_arg}"
        has_bias = len(conv.args) > 2 and bool(conv.args[2])

        item = ParallelItem()
        body = [item.loop(g.N * NG * NR * NT),
                *item.take("t", NT),
                *item.take("rt", NR),
                *item.last("og", NG, "n"),
                f"    oh0 = {shifted_start(f'rt * {TOH}', OH, TOH)}",
                f"    ow0 = {shifted_start(f't * {OWT}', OW, OWT)}",
                f"    buf = carray(stack_empty({PR * PC * CP}, np.{XT}), {PR * PC * CP})",
                f"    acc = carray(stack_empty({P * KT}, np.int32), {P * KT})",
                # the patch as x - x_min (bytes) or x (int16), channels innermost (`per` a lane)
                *convert_patch(form, X, lo, PR, PC, CBLK, cb, g.C, f"n * {x_n} + cb * {x_c} + (oh0 * {sh} + r + "
                               f"{hin - ph}) * {x_h} + (ow0 * {sw} + cc + {hin - pw}) * {cb}", "    ", zero=z or 0,
                               inside=in_bounds(f"oh0 * {sh} + r - {ph}", f"ow0 * {sw} + cc - {pw}", g.H, g.W)
                               if z is not None and max(g.pads) else None)]
        body += [f"    for ko in range(og * {G}, min({KO}, og * {G} + {G})):",
                 f"        ko0 = {shifted_start(f'ko * {TB}', KBLK, TB)}"]
        zero, dots, store = dot_tile(form, P, m, lambda p: f"xb{p} + co", KT, " " * 8, " " * 20)
        body += zero
        body += [f"        for kh in range({KH}):",
                 f"            for kw in range({KW}):"]
        for rr in range(TOH):
            for r in range(OWT):
                body.append(f"                xb{rr * OWT + r} = np.uintp((({rr * sh} + kh * {dh}) * {PC} + "
                            f"{r * sw} + kw * {dw}) * {CP})")
        body += [f"                wb = np.uintp(((ko * {KH} + kh) * {KW} + kw) * {CQ * KT * PER})",
                 f"                for cq in range({CQ}):",
                 f"                    co = np.uintp(cq * {PER})",
                 f"                    wo = wb + np.uintp(cq * {KT * PER})"] + dots + store

        # epilogue and store, as conv2d's (tile_stores): channel k = (ko0 + blk) * KB + jj
        def value(rr, r, blk, cblk):
            k = f"np.uintp(({cblk}) * {KB} + jj)"
            v = f"np.float32(acc[{(rr * OWT + r) * KT + blk * KB} + jj] + corr[{k}])"
            return f"({v} + bias[{k}])" if has_bias else v
        body += tile_stores(wl, g, TOH, OWT, TB, value, "        ")

        w_arg = int(conv.args[1][1:])
        b_arg = int(conv.args[2][1:]) if has_bias else None
        first = [min(t * TB, KBLK - TB) * KB for t in range(KO)]      # each tile's first channel

        def pack(consts):
            w = int8_weights(consts[w_arg], "conv2d_int8")            # [K, C, KH, KW]
            wi = np.zeros((g.K, CP, KH, KW), form.w_dtype)
            wi[:, :g.C] = w
            tiles = wi[np.array([f + j for f in first for j in range(KT)])]          # [KO*KT, CP, KH, KW]
            packed = tiles.reshape(KO, KT, CQ, PER, KH, KW).transpose(0, 4, 5, 2, 1, 3)
            corr = lo * w.astype(np.int64).sum(axis=(1, 2, 3))
            res = {"w": np.ascontiguousarray(packed).reshape(-1), "corr": corr.astype(np.int32)}
            if b_arg is not None:
                res["bias"] = np.ascontiguousarray(np.asarray(consts[b_arg], np.float32).reshape(-1))
            return res

        args = ["out0", X, "w", "corr"] + (["bias"] if has_bias else [])
        args += [f"in{k}" for k in epilogue_inputs(wl.epilogue) if k != x_arg]
        dtypes = [wl.outputs[0].dtype, wl.spec(conv.args[0]).dtype, np.dtype(form.w_dtype), np.int32] + \
            ([np.float32] if has_bias else []) + [wl.inputs[int(a[2:])].dtype for a in args[4 + has_bias:]]
        return Kernel(source(args, dtypes, body, extra=dot_imports(form)), args, pack)
