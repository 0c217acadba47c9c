"""RecurrentSteps: an RNN, GRU or LSTM layer's time loop, every direction, as one op.

frontend/recurrent.py writes a layer's input projection as one MatMul over the sequence (`xw`,
biases included) and its steps as this op, so that one kernel runs the time loop with its
directions side by side (kernels/recurrent.py) instead of two kernels per step. This reference
follows ONNX's equations for every option the layers have: activations with their alpha and beta,
clip, coupled input and forget gates, peepholes and sequence lengths.

Inputs: xw [S, B, D, G*H] (the input projection plus W's bias and R's, except GRU's recurrent bias
of the new gate), rt [D, H, G*H] (R transposed; a GRU with linear_before_reset 0: its update and
reset rows only, [D, H, 2H]), h0 [D, B, H], c0 [D, B, H] (LSTM), rbh [D, H] (GRU: the new gate's
recurrent bias), rth [D, H, H] (GRU with linear_before_reset 0: the new gate's rows, transposed),
lens [B] (int32 sequence lengths, clamped to [0, S]), p [D, 3H] (LSTM peepholes: i, o, f).
Attributes beyond kind, direction and linear_before_reset appear only where they differ from the
default: activations (lower-case names, per direction), activation_alpha and activation_beta (one
number per activation), clip, input_forget.
Outputs, as ONNX's: Y [S, D, B, H], the last states [D, B, H] and, for an LSTM, the last cell
states [D, B, H]. Direction 1 of a bidirectional layer, and a reverse one, runs from each entry's
last step; steps past an entry's length output zeros, and an entry of no steps ends in zero states
(as onnxruntime's).
"""
from __future__ import annotations

import math

import numpy as np

from .registry import Kind, register

GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
N_ACTIVATIONS = {"RNN": 1, "GRU": 2, "LSTM": 3}
DIRECTIONS = ("forward", "reverse", "bidirectional")
DEFAULT_ACTIVATIONS = {"RNN": ["tanh"], "GRU": ["sigmoid", "tanh"], "LSTM": ["sigmoid", "tanh", "tanh"]}
# activation -> default (alpha, beta), None where it takes none (ONNX's RNN activation list)
ACTIVATIONS = {"relu": None, "tanh": None, "sigmoid": None, "softsign": None, "softplus": None,
               "leakyrelu": (0.01, None), "thresholdedrelu": (1.0, None), "elu": (1.0, None),
               "hardsigmoid": (0.2, 0.5), "scaledtanh": (1.0, 1.0), "affine": (1.0, 0.0)}
# those that are ONNX ops of their own (ScaledTanh and Affine are not any more)
ACTIVATION_OPS = {"relu": "Relu", "tanh": "Tanh", "sigmoid": "Sigmoid", "softsign": "Softsign", "softplus": "Softplus",
                  "leakyrelu": "LeakyRelu", "thresholdedrelu": "ThresholdedRelu", "elu": "Elu",
                  "hardsigmoid": "HardSigmoid"}


def apply(name: str, v, alpha: float, beta: float):
    """Activation `name` of ONNX's recurrent layers on array `v`."""
    t = v.dtype.type
    a, b = t(alpha), t(beta)
    return {"relu": lambda: np.maximum(v, t(0)), "tanh": lambda: np.tanh(v),
            "sigmoid": lambda: t(1) / (t(1) + np.exp(-v)), "softsign": lambda: v / (t(1) + np.abs(v)),
            "softplus": lambda: np.logaddexp(t(0), v), "leakyrelu": lambda: np.where(v >= 0, v, v * a),
            "thresholdedrelu": lambda: np.where(v > a, v, t(0)), "elu": lambda: np.where(v > 0, v, a * np.expm1(v)),
            "hardsigmoid": lambda: np.clip(a * v + b, t(0), t(1)), "scaledtanh": lambda: a * np.tanh(b * v),
            "affine": lambda: a * v + b}[name]().astype(v.dtype, copy=False)


def activations(kind: str, dirs: int, attrs: dict) -> list:
    """[(name, alpha, beta)] * n per direction, from the op's attributes (checked)."""
    n = N_ACTIVATIONS[kind] * dirs
    names = attrs.get("activations", DEFAULT_ACTIVATIONS[kind] * dirs)
    alphas = attrs.get("activation_alpha", [0.0] * n)
    betas = attrs.get("activation_beta", [0.0] * n)
    if not all(isinstance(v, list) and len(v) == n for v in (names, alphas, betas)) or \
            not all(a in ACTIVATIONS for a in names) or \
            not all(isinstance(x, (int, float)) and math.isfinite(x) for x in alphas + betas):
        raise ValueError(f"RecurrentSteps {kind} over {dirs} direction(s) takes {n} activations of "
                         f"{', '.join(ACTIVATIONS)} with {n} finite alphas and betas, not {names}, {alphas}, {betas}")
    acts = [(a, float(x), float(y)) for a, x, y in zip(names, alphas, betas)]
    return [acts[d * N_ACTIVATIONS[kind]:(d + 1) * N_ACTIVATIONS[kind]] for d in range(dirs)]


def options(kind: str, attrs: dict) -> tuple:
    """(clip or None, input_forget), checked."""
    clip, forget = attrs.get("clip"), attrs.get("input_forget", 0)
    if clip is not None and not (isinstance(clip, (int, float)) and math.isfinite(clip) and clip > 0):
        raise ValueError(f"RecurrentSteps' clip ({clip!r}) is a positive finite number")
    if forget not in (0, 1) or (forget and kind != "LSTM"):
        raise ValueError(f"RecurrentSteps' input_forget ({forget!r}) is 0, or 1 for an LSTM")
    return (None if clip is None else float(clip)), int(forget)


def _shapes(xw, rt, h0, c0=None, rbh=None, rth=None, lens=None, p=None, kind="LSTM", direction="forward",
            linear_before_reset=0, **attrs):
    if direction not in DIRECTIONS or linear_before_reset not in (0, 1):
        raise ValueError(f"RecurrentSteps' direction ({direction!r}) is one of {', '.join(DIRECTIONS)} and its "
                         f"linear_before_reset ({linear_before_reset!r}) 0 or 1")
    if kind not in GATES or len(xw.shape) != 4 or len(h0.shape) != 3:
        raise ValueError(f"RecurrentSteps of kind {kind!r} takes xw [S, B, D, G*H] and h0 [D, B, H], "
                         f"not {list(xw.shape)} and {list(h0.shape)}")
    if set(attrs) - {"activations", "activation_alpha", "activation_beta", "clip", "input_forget"}:
        raise ValueError(f"RecurrentSteps takes no attributes {sorted(attrs)}")
    s, b, d, gh = xw.shape
    h = h0.shape[2]
    activations(kind, d, attrs)
    options(kind, attrs)
    rows = 2 * h if kind == "GRU" and not linear_before_reset else gh
    if d != (2 if direction == "bidirectional" else 1) or gh != GATES[kind] * h or \
            tuple(rt.shape) != (d, h, rows) or tuple(h0.shape) != (d, b, h) or \
            (kind == "LSTM") != (c0 is not None) or (c0 is not None and tuple(c0.shape) != (d, b, h)) or \
            (rth is not None) != (kind == "GRU" and not linear_before_reset) or \
            (rth is not None and tuple(rth.shape) != (d, h, h)) or (rbh is not None and tuple(rbh.shape) != (d, h)) or \
            (lens is not None and (tuple(lens.shape) != (b,) or np.dtype(lens.dtype) != np.int32)) or \
            (p is not None and (kind != "LSTM" or tuple(p.shape) != (d, 3 * h))):
        raise ValueError(f"RecurrentSteps {kind} {direction}: inconsistent shapes xw {list(xw.shape)}, "
                         f"rt {list(rt.shape)}, h0 {list(h0.shape)}")
    out = [((s, d, b, h), xw.dtype), ((d, b, h), xw.dtype)]
    return out + [((d, b, h), xw.dtype)] if kind == "LSTM" else out


def _steps(xw, rt, h, c, rbh, rth, p, lens, kind, reverse, lbr, acts, clip, forget):
    """One direction: xw [S, B, G*H], rt [H, .], h, c [B, H]; returns (y [S, B, H], h, c)."""
    steps, hid, dt = xw.shape[0], h.shape[1], xw.dtype
    f = [lambda v, a=a: apply(a[0], v if clip is None else np.clip(v, -clip, clip), a[1], a[2]) for a in acts]
    y = np.zeros((steps, *h.shape), dt)
    n = np.full(h.shape[0], steps) if lens is None else np.clip(lens.astype(np.int64), 0, steps)
    for s in range(steps):
        live = (s < n)[:, None]
        t = np.where(n - 1 - s >= 0, n - 1 - s, 0) if reverse else np.full(h.shape[0], s)
        x, g = xw[t, np.arange(h.shape[0])], h @ rt
        c_new = c
        if kind == "RNN":
            h_new = f[0](x + g)
        elif kind == "LSTM":
            a = x + g
            ai, ao, af, ac = (a[:, k * hid:(k + 1) * hid] for k in range(4))
            pi, po, pf = (np.zeros(hid, dt),) * 3 if p is None else (p[:hid], p[hid:2 * hid], p[2 * hid:])
            i = f[0](ai + pi * c)
            fg = (1 - i) if forget else f[0](af + pf * c)
            c_new = fg * c + i * f[1](ac)
            h_new = f[0](ao + po * c_new) * apply(acts[2][0], c_new, *acts[2][1:])     # (not clipped)
        else:
            z, r = f[0](x[:, :hid] + g[:, :hid]), f[0](x[:, hid:2 * hid] + g[:, hid:2 * hid])
            rb = rbh if rbh is not None else 0
            hh = r * (g[:, 2 * hid:] + rb) if lbr else (r * h) @ rth + rb
            h_new = (1 - z) * f[1](x[:, 2 * hid:] + hh) + z * h
        h = np.where(live, h_new, h).astype(dt, copy=False)
        c = None if c is None else np.where(live, c_new, c).astype(dt, copy=False)
        for e in np.flatnonzero(live[:, 0]):
            y[t[e], e] = h[e]
    h = np.where((n > 0)[:, None], h, 0).astype(dt)     # an entry of no steps ends in zero states
    return y, h, None if c is None else np.where((n > 0)[:, None], c, 0).astype(dt)


@register("RecurrentSteps", Kind.OPAQUE, infer=_shapes)
def recurrent_steps(xw, rt, h0, c0=None, rbh=None, rth=None, lens=None, p=None, kind="LSTM", direction="forward",
                    linear_before_reset=0, **attrs):
    res = []
    dirs = xw.shape[2]
    acts = activations(kind, dirs, attrs)
    clip, forget = options(kind, attrs)
    with np.errstate(over="ignore"):
        for d in range(dirs):
            c = None if c0 is None else c0[d].astype(xw.dtype)
            res.append(_steps(xw[:, :, d], rt[d], h0[d].astype(xw.dtype), c, None if rbh is None else rbh[d],
                              None if rth is None else rth[d], None if p is None else p[d], lens, kind,
                              direction == "reverse" or d == 1, linear_before_reset, acts[d], clip, forget))
    y = np.stack([r[0] for r in res], axis=1)
    h = np.stack([r[1] for r in res])
    return (y, h, np.stack([r[2] for r in res])) if kind == "LSTM" else (y, h)
