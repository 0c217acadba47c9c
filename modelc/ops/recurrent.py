"""RecurrentSteps: one direction of an RNN, GRU or LSTM layer over all its time steps, as one op.

frontend/recurrent.py writes a layer's input projection as one MatMul over the sequence (`xw`,
biases included) and, for the configurations PyTorch exports (default activations, no clip, no
peepholes, whole sequences), the steps as this op, so that one kernel runs the time loop
(kernels/recurrent.py) instead of two kernels per step. Other configurations are written out step
by step from ordinary ops, and this reference follows the same equations (ONNX's operator spec).

Inputs: xw [S, B, G*H] (the input projection plus W's bias and R's, except GRU's recurrent bias
of the new gate), rt [H, G*H] (R transposed; a GRU with linear_before_reset 0: its update and reset
rows only, [H, 2H]), h0 [B, H], c0 [B, H] (LSTM), rbh [H] (GRU: the new gate's recurrent bias),
rth [H, H] (GRU with linear_before_reset 0: the new gate's rows of R, transposed).
Outputs: y [S, B, H] (each step's state, in time order), the last state [B, H], and for an LSTM
the last cell state [B, H].
"""
from __future__ import annotations

import numpy as np

from .registry import Kind, register

GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}


def _shapes(xw, rt, h0, c0=None, rbh=None, rth=None, kind="LSTM", reverse=0, linear_before_reset=0):
    if reverse not in (0, 1) or linear_before_reset not in (0, 1):
        raise ValueError(f"RecurrentSteps' reverse ({reverse!r}) and linear_before_reset ({linear_before_reset!r}) "
                         "are 0 or 1")
    if kind not in GATES or len(xw.shape) != 3 or len(h0.shape) != 2:
        raise ValueError(f"RecurrentSteps of kind {kind!r} takes xw [S, B, G*H] and h0 [B, H], "
                         f"not {list(xw.shape)} and {list(h0.shape)}")
    s, b, gh = xw.shape
    h = h0.shape[1]
    rows = 2 * h if kind == "GRU" and not linear_before_reset else gh
    if gh != GATES[kind] * h or tuple(rt.shape) != (h, rows) or h0.shape[0] != b or \
            (kind == "LSTM") != (c0 is not None) or (c0 is not None and tuple(c0.shape) != (b, h)) or \
            (rth is not None) != (kind == "GRU" and not linear_before_reset) or \
            (rth is not None and tuple(rth.shape) != (h, h)) or (rbh is not None and tuple(rbh.shape) != (h,)):
        raise ValueError(f"RecurrentSteps {kind}: inconsistent shapes xw {list(xw.shape)}, rt {list(rt.shape)}, "
                         f"h0 {list(h0.shape)}")
    out = [((s, b, h), xw.dtype), ((b, h), xw.dtype)]
    return out + [((b, h), xw.dtype)] if kind == "LSTM" else out


def _sigmoid(v):
    return 1 / (1 + np.exp(-v))


@register("RecurrentSteps", Kind.OPAQUE, infer=_shapes)
def recurrent_steps(xw, rt, h0, c0=None, rbh=None, rth=None, kind="LSTM", reverse=0, linear_before_reset=0):
    steps, _b, _gh = xw.shape
    hid = h0.shape[1]
    dt = xw.dtype
    h = h0.astype(dt)
    c = c0.astype(dt) if c0 is not None else None
    y = np.empty((steps, *h.shape), dt)
    with np.errstate(over="ignore"):
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
                if linear_before_reset:
                    n = np.tanh(x[:, 2 * hid:] + r * (g[:, 2 * hid:] + rb))
                else:
                    n = np.tanh(x[:, 2 * hid:] + (r * h) @ rth + rb)
                h = (1 - z) * n + z * h
            h = h.astype(dt, copy=False)
            y[t] = h
    return (y, h, c.astype(dt, copy=False)) if kind == "LSTM" else (y, h)
