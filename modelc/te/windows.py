"""te lowerings of the sliding-window anchors: 2-d convolution (dense and depthwise) and pooling.

Like lowerings.py's (the same Value protocol), each declares one reduction stage over the window,
in the blocked order of the group's output where it can (the store then fuses with it), and reads
padding through the input's halo where it is wide enough, else behind a bounds guard.
"""
from __future__ import annotations

import numpy as np

from . import expr as E
from .lowerings import Split, Unsupported, Value, _c, _is_float, flat
from .tensor import compute, reduce_axis, reduction


def _conv(b, op, wl):
    """Convolution of any spatial rank (1-d, 2-d, 3-d), any groups, stride, dilation and padding,
    bias; constant weights are re-laid out for a blocked output, others read where they are. A
    ScaledConv reads its input times a per-channel gate s[N, C, 1, 1]."""
    if len(op.args) < 2 or op.attr("auto_pad", "NOTSET") not in ("NOTSET", b"", ""):
        raise Unsupported("Conv form")
    x = b.value(op.args[0])
    nd = len(x.shape) - 2
    gate = b.value(op.args[3]) if op.op == "ScaledConv" and len(op.args) > 3 else None
    if op.op == "ScaledConv" and (gate is None or gate.shape != (x.shape[0], x.shape[1], 1, 1)
                                  or gate.dtype != x.dtype):
        raise Unsupported("ScaledConv gate")
    w = wl.spec(op.args[1])
    if nd < 1 or len(w.shape) != nd + 2 or not _is_float(x.dtype) or np.dtype(w.dtype).name != x.dtype:
        raise Unsupported("Conv rank or dtype")
    n, C, *size = x.shape
    K, Cg, *ks = w.shape
    G = int(op.attr("group", 1))
    strides = list(op.attr("strides", [1] * nd))
    dil = list(op.attr("dilations", [1] * nd))
    pads = list(op.attr("pads", [0] * 2 * nd))
    if G < 1 or C != G * Cg or K % G or len(strides) != nd or len(dil) != nd or len(pads) != 2 * nd:
        raise Unsupported("Conv attributes")
    depthwise = G > 1 and Cg == 1 and K == C
    Kg = K // G
    out_shape = tuple(wl.spec(f"v{op.index}").shape)
    blk = b.blocked_anchor(out_shape) if nd == 2 else None
    xin = wl.inputs[int(op.args[0][1:])] if op.args[0].startswith("i") else None
    halo = xin.layout[1] if nd == 2 and xin is not None and xin.layout else 0
    guard = halo < max(pads)
    bi = xin.layout[0] if nd == 2 and G == 1 and xin is not None and xin.layout else 1

    def tap(nn, ci, outs, kk):
        pos = [o * s + k * d - p for o, k, s, d, p in zip(outs, kk, strides, dil, pads)]
        v = x.at([nn, ci, *pos])
        if gate is not None:
            v = v * gate.at([nn, ci, 0, 0])
        if not guard:
            return v
        cond = None
        for q, d in zip(pos, size):
            c = (q >= 0) & (q < d)
            cond = c if cond is None else cond & c
        return E.if_then_else(cond, v, _c(0, x.dtype))

    kk = [reduce_axis((0, k), ("ky", "kx")[d] if nd == 2 else f"k{d}") for d, k in enumerate(ks)]
    wk = int(op.args[1][1:]) if op.args[1].startswith("i") and wl.inputs[int(op.args[1][1:])].const else None
    packed = blk and wk is not None
    if packed:
        wv = np.dtype(w.dtype).name
        Wp = b._placeholder((K // blk, *ks, blk), wv, f"te_w{wk}", lambda consts: _pack_depthwise(consts[wk], blk)) \
            if depthwise else \
            b._placeholder((K // blk, Cg, *ks, blk), wv, f"te_w{wk}", lambda consts: _pack_conv(consts[wk], blk))
    else:
        Wv = b.value(op.args[1])

    def weight(c, rc):
        if packed:
            return Wp[(c.blk, *kk, c.lane)] if depthwise else Wp[(c.blk, rc, *kk, c.lane)]
        return Wv.at([c, rc, *kk])

    def body(nn, c, outs):
        if depthwise:
            return reduction("sum", tap(nn, c, outs, kk) * weight(c, 0), tuple(kk))
        if bi > 1 and C % bi == 0:
            rco, rci = reduce_axis((0, C // bi), "rco"), reduce_axis((0, bi), "rci")
            return reduction("sum", tap(nn, Split(rco, rci, bi), outs, kk) * weight(c, rco * bi + rci),
                             (rco, *kk, rci))
        rc = reduce_axis((0, Cg), "rc")
        ci = rc if G == 1 else flat(c) // Kg * Cg + rc
        return reduction("sum", tap(nn, ci, outs, kk) * weight(c, rc), (rc, *kk))
    if blk:
        OH, OW = out_shape[2:]
        stage = compute((n, K // blk, OH, OW, blk),
                        lambda q0, q1, q2, q3, q4: body(q0, Split(q1, q4, blk), [q2, q3]), name="conv")
    else:
        stage = compute(out_shape, lambda q0, q1, *qs: body(q0, q1, list(qs)), name="conv")
    bias = b.value(op.args[2]) if len(op.args) > 2 and op.args[2] else None
    if bias is not None and (bias.shape != (K,) or bias.dtype != x.dtype):
        raise Unsupported("Conv bias")

    def at(idx):
        nn, c, *outs = idx
        if blk:
            if not (isinstance(c, Split) and c.b == blk):
                c = flat(c)
                c = Split(c // blk, c % blk, blk)
            v = stage[nn, c.blk, outs[0], outs[1], c.lane]
        else:
            v = stage[(nn, flat(c), *outs)]
        return v if bias is None else v + bias.at([c])
    return Value(out_shape, x.dtype, at)


def _pack_conv(w, b):
    K, Cg, KH, KW = w.shape
    return np.ascontiguousarray(w.reshape(K // b, b, Cg, KH, KW).transpose(0, 2, 3, 4, 1))


def _pack_depthwise(w, b):
    K, _, KH, KW = w.shape
    return np.ascontiguousarray(w.reshape(K // b, b, KH, KW).transpose(0, 2, 3, 1))


def _pool(b, op, wl):
    """2-d MaxPool (without indices) and AveragePool, any stride, dilation and padding (windows past
    the input read -inf or are not counted), and GlobalAveragePool / GlobalMaxPool."""
    x = b.value(op.args[0])
    if len(x.shape) != 4 or not _is_float(x.dtype) or op.attr("auto_pad", "NOTSET") not in ("NOTSET", b"", ""):
        raise Unsupported(f"{op.op} form")
    n, C, H, W = x.shape
    is_max = op.op in ("MaxPool", "GlobalMaxPool")
    if op.op.startswith("Global"):
        KH, KW, sy, sx, dy, dx, pt, pl = H, W, 1, 1, 1, 1, 0, 0
    else:
        if len(op.attr("kernel_shape", [])) != 2:
            raise Unsupported(f"{op.op} rank")
        KH, KW = op.attr("kernel_shape")
        sy, sx = op.attr("strides", [1, 1])
        dy, dx = op.attr("dilations", [1, 1])
        pt, pl, pb, pr = op.attr("pads", [0, 0, 0, 0])
    out_shape = tuple(wl.spec(f"v{op.index}").shape)
    OH, OW = out_shape[2:]
    guard_y = pt > 0 or (OH - 1) * sy + (KH - 1) * dy - pt >= H
    guard_x = pl > 0 or (OW - 1) * sx + (KW - 1) * dx - pl >= W
    ky, kx = reduce_axis((0, KH), "ky"), reduce_axis((0, KW), "kx")
    dt = x.dtype
    empty = _c(-np.inf if is_max else 0, dt)

    def body(nn, c, y, xx):
        iy, ix = y * sy + ky * dy - pt, xx * sx + kx * dx - pl
        inside = [t for t, on in (((iy >= 0) & (iy < H), guard_y), ((ix >= 0) & (ix < W), guard_x)) if on]
        v = x.at([nn, c, iy, ix])
        if inside:
            v = E.if_then_else(inside[0] & inside[1] if len(inside) == 2 else inside[0], v, empty)
        return reduction("max" if is_max else "sum", v, (ky, kx))
    blk = b.blocked_anchor(out_shape)
    if blk:
        stage = compute((n, C // blk, OH, OW, blk), lambda q0, q1, q2, q3, q4: body(q0, Split(q1, q4, blk), q2, q3),
                        name="pool")
    else:
        stage = compute(out_shape, body, name="pool")
    include_pad = int(op.attr("count_include_pad", 0))

    def count(y, xx):
        """Taps of the window at (y, xx) inside the input (or the padded input, count_include_pad)."""
        hi_y, hi_x = (H + pb, W + pr) if include_pad else (H, W)
        lo_y, lo_x = (-pt, -pl) if include_pad else (0, 0)
        y0, x0 = y * sy - pt, xx * sx - pl
        ny = _taps(y0, dy, KH, lo_y, hi_y) if guard_y else E.Const(KH, E.INDEX)
        nx = _taps(x0, dx, KW, lo_x, hi_x) if guard_x else E.Const(KW, E.INDEX)
        return E.cast(dt, ny * nx)

    def at(idx):
        nn, c, y, xx = idx
        if blk:
            if not (isinstance(c, Split) and c.b == blk):
                c = Split(flat(c) // blk, flat(c) % blk, blk)
            v = stage[nn, c.blk, y, xx, c.lane]
        else:
            v = stage[nn, flat(c), y, xx]
        if is_max:
            return v
        if op.op == "GlobalAveragePool" or not (guard_y or guard_x):
            return v / _c(KH * KW, dt)
        return v / count(y, xx)
    return Value(out_shape, dt, at)


def _taps(start, step: int, k: int, lo: int, hi: int):
    """How many of start + t * step (t < k) lie in [lo, hi): a window's taps inside the input."""
    first = E.call("max", (lo - start + step - 1) // step, E.Const(0, E.INDEX))
    last = E.call("min", (hi - 1 - start) // step, E.Const(k - 1, E.INDEX))
    return E.call("max", last - first + 1, E.Const(0, E.INDEX))


LOWER = {"Conv": _conv, "ScaledConv": _conv,
         **{k: _pool for k in ("MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool")}}
