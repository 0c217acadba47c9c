"""RecurrentSteps: an RNN, GRU or LSTM layer's time loop, every direction, as one op.

frontend/recurrent.py writes a layer's input projection as one MatMul over the sequence (`xw`,
biases included) and, for the configurations PyTorch exports (default activations, no clip, no
peepholes, whole sequences), the steps as this op, so that one kernel runs the time loop with its
directions side by side (kernels/recurrent.py) instead of two kernels per step. Other
configurations are written out step by step from ordinary ops; this reference follows the same
equations (ONNX's operator spec).

Inputs: xw [S, B, D, G*H] (the input projection plus W's bias and R's, except GRU's recurrent bias
of the new gate), rt [D, H, G*H] (R transposed; a GRU with linear_before_reset 0: its update and
reset rows only, [D, H, 2H]), h0 [D, B, H], c0 [D, B, H] (LSTM), rbh [D, H] (GRU: the new gate's
recurrent bias), rth [D, H, H] (GRU with linear_before_reset 0: the new gate's rows, transposed).
Outputs, as ONNX's: Y [S, D, B, H], the last states [D, B, H] and, for an LSTM, the last cell
states [D, B, H]. Direction 1 of a bidirectional layer, and a reverse one, runs from the last step.
"""
from __future__ import annotations

import numpy as np

from .registry import Kind, register

GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
DIRECTIONS = ("forward", "reverse", "bidirectional")


def _shapes(xw, rt, h0, c0=None, rbh=None, rth=None, kind="LSTM", direction="forward", linear_before_reset=0):
    if direction not in DIRECTIONS or linear_before_reset not in (0, 1):
        raise ValueError(f"RecurrentSteps' direction ({direction!r}) is one of {', '.join(DIRECTIONS)} and its "
                         f"linear_before_reset ({linear_before_reset!r}) 0 or 1")
    if kind not in GATES or len(xw.shape) != 4 or len(h0.shape) != 3:
        raise ValueError(f"RecurrentSteps of kind {kind!r} takes xw [S, B, D, G*H] and h0 [D, B, H], "
                         f"not {list(xw.shape)} and {list(h0.shape)}")
    s, b, d, gh = xw.shape
    h = h0.shape[2]
    rows = 2 * h if kind == "GRU" and not linear_before_reset else gh
    if d != (2 if direction == "bidirectional" else 1) or gh != GATES[kind] * h or \
            tuple(rt.shape) != (d, h, rows) or tuple(h0.shape) != (d, b, h) or \
            (kind == "LSTM") != (c0 is not None) or (c0 is not None and tuple(c0.shape) != (d, b, h)) or \
            (rth is not None) != (kind == "GRU" and not linear_before_reset) or \
            (rth is not None and tuple(rth.shape) != (d, h, h)) or (rbh is not None and tuple(rbh.shape) != (d, h)):
        raise ValueError(f"RecurrentSteps {kind} {direction}: inconsistent shapes xw {list(xw.shape)}, "
                         f"rt {list(rt.shape)}, h0 {list(h0.shape)}")
    out = [((s, d, b, h), xw.dtype), ((d, b, h), xw.dtype)]
    return out + [((d, b, h), xw.dtype)] if kind == "LSTM" else out


def _sigmoid(v):
    return 1 / (1 + np.exp(-v))


def _steps(xw, rt, h, c, rbh, rth, kind, reverse, lbr):
    """One direction: xw [S, B, G*H], rt [H, .], h, c [B, H]; returns (y [S, B, H], h, c)."""
    steps, hid, dt = xw.shape[0], h.shape[1], xw.dtype
    y = np.empty((steps, *h.shape), dt)
    for s in range(steps):
        t = steps - 1 - s if reverse else s
        x, g = xw[t], h @ rt
        if kind == "RNN":
            h = np.tanh(x + g)
        elif kind == "LSTM":
            a = x + g
            i, o, f, cc = (a[:, k * hid:(k + 1) * hid] for k in range(4))
            c = _sigmoid(f) * c + _sigmoid(i) * np.tanh(cc)
            h = _sigmoid(o) * np.tanh(c)
        else:
            z = _sigmoid(x[:, :hid] + g[:, :hid])
            r = _sigmoid(x[:, hid:2 * hid] + g[:, hid:2 * hid])
            rb = rbh if rbh is not None else 0
            if lbr:
                n = np.tanh(x[:, 2 * hid:] + r * (g[:, 2 * hid:] + rb))
            else:
                n = np.tanh(x[:, 2 * hid:] + (r * h) @ rth + rb)
            h = (1 - z) * n + z * h
        h = h.astype(dt, copy=False)
        c = c.astype(dt, copy=False) if c is not None else None
        y[t] = h
    return y, h, c


@register("RecurrentSteps", Kind.OPAQUE, infer=_shapes)
def recurrent_steps(xw, rt, h0, c0=None, rbh=None, rth=None, kind="LSTM", direction="forward",
                    linear_before_reset=0):
    res = []
    with np.errstate(over="ignore"):
        for d in range(xw.shape[2]):
            c = None if c0 is None else c0[d].astype(xw.dtype)
            res.append(_steps(xw[:, :, d], rt[d], h0[d].astype(xw.dtype), c, None if rbh is None else rbh[d],
                              None if rth is None else rth[d], kind, direction == "reverse" or d == 1,
                              linear_before_reset))
    y = np.stack([r[0] for r in res], axis=1)
    h = np.stack([r[1] for r in res])
    return (y, h, np.stack([r[2] for r in res])) if kind == "LSTM" else (y, h)
