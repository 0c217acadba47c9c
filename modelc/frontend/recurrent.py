"""RNN, GRU and LSTM: the input projection as one MatMul, the time loop as one RecurrentSteps op.

A recurrent layer is a cell applied once per time step. Its input projection does not depend on
the previous step, so it is one MatMul over the whole sequence (as onnxruntime and TVM's importer
do). A float32 layer's steps, every direction and option (activations, clip, coupled gates,
peepholes, sequence lengths, which may be data), are one RecurrentSteps op (ops/recurrent.py), one
kernel. Other dtypes are written out over their (static) sequence length: each step adds the
hidden state's projection and applies the gates, ordinary elementwise ops that fuse into one kernel
per step; sequence lengths mask the steps past each batch entry's end (its state stops there, its
outputs are zeros) and, for the reverse direction, read each entry's sequence from its own last
element.
"""
from __future__ import annotations

import numpy as np

from ..errors import ModelcError
from ..ops.recurrent import ACTIVATION_OPS, ACTIVATIONS, DEFAULT_ACTIVATIONS, GATES, N_ACTIVATIONS
from .control_flow import MAX_UNROLLED_NODES
from .converters import converter

class _Cell:
    """Emits one direction's ops; `act(k, x)` applies the k-th activation of the direction."""

    def __init__(self, ctx, node, dtype):
        self.ctx, self.node, self.dtype, self.acts = ctx, node, dtype, None
        self.whole = False           # the steps as one RecurrentSteps op (recurrent() says when)
        self._consts = {}            # one constant per value, not one per step that reads it

    def c(self, value, hint):
        return self._const(np.asarray(value, self.dtype), hint)

    def ints(self, value):
        return self._const(np.array(value, np.int64), "i")

    def _const(self, v, hint):
        key = (v.dtype.str, v.shape, v.tobytes())
        if key not in self._consts:
            self._consts[key] = self.ctx.const(v, f"{self.node.name}_{hint}")
        return self._consts[key]

    def op(self, op_type, *inputs, **attrs):
        return self.ctx.emit(op_type, list(inputs), attrs=attrs)[0]

    def act(self, k, x):
        name, alpha, beta = self.acts[k]
        if name in ACTIVATION_OPS:        # (alpha and beta are None where the op takes none)
            return self.op(ACTIVATION_OPS[name], x, **{k: v for k, v in (("alpha", alpha), ("beta", beta))
                                                       if v is not None})
        if name == "scaledtanh":
            return self.op("Mul", self.op("Tanh", self.op("Mul", x, self.c(beta, "beta"))), self.c(alpha, "alpha"))
        return self.op("Add", self.op("Mul", x, self.c(alpha, "alpha")), self.c(beta, "beta"))   # affine


def _activations(node, n_per_dir: int, dirs: int) -> list:
    names = node.attrs.get("activations") or DEFAULT_ACTIVATIONS[node.op_type] * dirs
    names = [str(a) for a in names]
    if len(names) == n_per_dir and dirs == 2:
        names = names * 2
    if len(names) != n_per_dir * dirs:
        raise ModelcError(f"{node.where()} lists {len(names)} activations; a {node.op_type} with {dirs} "
                          f"direction(s) takes {n_per_dir * dirs}")
    alphas = list(node.attrs.get("activation_alpha", []))
    betas = list(node.attrs.get("activation_beta", []))
    out = []
    for a in names:
        key = a.lower()
        if key not in ACTIVATIONS:
            raise ModelcError(f"{node.where()}: activation {a!r} is not one ONNX defines for recurrent layers "
                              f"({', '.join(sorted(ACTIVATIONS))})")
        d = ACTIVATIONS[key] or (None, None)
        alpha = (alphas.pop(0) if alphas else d[0]) if d[0] is not None else None
        beta = (betas.pop(0) if betas else d[1]) if d[1] is not None else None
        out.append((key, alpha, beta))
    return [out[i * n_per_dir:(i + 1) * n_per_dir] for i in range(dirs)]


def _shape_of(ctx, node, name, want, what):
    if name and tuple(ctx.shape(name)) != tuple(want):
        raise ModelcError(f"{node.where()}: {what} {name!r} has shape {list(ctx.shape(name))}, expected {list(want)}")


@converter("RNN", since=1, away=True)
@converter("GRU", since=1, away=True)
@converter("LSTM", since=1, away=True)
def recurrent(ctx, node):
    op, a = node.op_type, node.attrs
    g = GATES[op]
    ins = list(node.inputs) + [""] * (8 - len(node.inputs))
    x, w, r, b, lens, h0 = ins[:6]
    c0, p = (ins[6], ins[7]) if op == "LSTM" else ("", "")
    direction = str(a.get("direction", "forward"))
    if direction not in ("forward", "reverse", "bidirectional"):
        raise ModelcError(f"{node.where()}: direction {direction!r} is not forward, reverse or bidirectional")
    dirs = 2 if direction == "bidirectional" else 1
    layout = int(a.get("layout", 0))
    if ctx.rank(x) != 3 or ctx.rank(w) != 3 or ctx.rank(r) != 3:
        raise ModelcError(f"{node.where()}: X, W and R must have rank 3, have "
                          f"{ctx.rank(x)}, {ctx.rank(w)}, {ctx.rank(r)}")
    hidden = int(a.get("hidden_size", ctx.shape(r)[-1]))
    if hidden < 1:
        raise ModelcError(f"{node.where()}: hidden_size {hidden} is not a positive number of units")
    cell = _Cell(ctx, node, ctx.dtype(x))
    if layout:
        x = cell.op("Transpose", x, perm=[1, 0, 2])
        h0 = h0 and cell.op("Transpose", h0, perm=[1, 0, 2])
        c0 = c0 and cell.op("Transpose", c0, perm=[1, 0, 2])
    steps, batch, width = ctx.shape(x)
    _shape_of(ctx, node, w, (dirs, g * hidden, width), "W")
    _shape_of(ctx, node, r, (dirs, g * hidden, hidden), "R")
    _shape_of(ctx, node, b, (dirs, 2 * g * hidden), "B")
    _shape_of(ctx, node, lens, (batch,), "sequence_lens")
    for t, what in ((h0, "initial_h"), (c0, "initial_c")):
        _shape_of(ctx, node, t, (dirs, batch, hidden), what)
    _shape_of(ctx, node, p, (dirs, 3 * hidden), "P")
    if steps == 0:
        raise ModelcError(f"{node.where()}: its input {node.inputs[0]!r} has no time steps")
    lv = ctx.value(lens)
    if lv is not None and not np.all((0 <= np.asarray(lv)) & (np.asarray(lv) <= steps)):
        raise ModelcError(f"{node.where()}: sequence_lens {np.asarray(lv).tolist()} must lie in [0, {steps}], "
                          "the input's steps")
    if lv is not None and np.all(np.asarray(lv) == steps):
        lens = ""                               # every sequence is whole: nothing to mask
    acts = _activations(node, N_ACTIVATIONS[op], dirs)
    # float32 layers run as one op, every direction side by side (ops/recurrent.py); others (float64,
    # float16) are written out step by step
    cell.whole = ctx.dtype(x) == np.float32
    if not cell.whole:
        ctx.unrolled += ({"RNN": 6, "GRU": 16, "LSTM": 22}[op] + (4 if lens else 0)) * steps * dirs
        if ctx.unrolled > MAX_UNROLLED_NODES:
            raise ModelcError(f"{node.where()}: written out over {steps} steps it would exceed "
                              f"{MAX_UNROLLED_NODES} nodes; modelc compiles static graphs")
    outs = list(node.outputs) + [""] * 3
    if cell.whole:
        y, states = _whole(ctx, node, cell, direction, x, w, r, b, h0, c0, hidden, dirs, lens, p, acts)
        if outs[0]:
            _emit_out(ctx, y, outs[0], [2, 0, 1, 3] if layout else None)
        for s, out in zip(states, (outs[1], outs[2] if op == "LSTM" else "")):
            if out:
                _emit_out(ctx, s, out, [1, 0, 2] if layout else None)
        return
    lens = lens and cell.op("Cast", lens, to=7)  # (int64, once: every step compares with it)
    ys, hs, cs = [], [], []
    for d in range(dirs):
        cell.acts = acts[d]
        reverse = direction == "reverse" or d == 1
        y, h, c = _direction(ctx, node, cell, d, reverse, x, w, r, b, lens, h0, c0, p, hidden)
        ys.append(y)
        hs.append(h)
        cs.append(c)
    axis1 = cell.ints([1])
    if outs[0]:
        y = cell.op("Concat", *[cell.op("Unsqueeze", y, axis1) for y in ys], axis=1)     # [S, D, B, H]
        _emit_out(ctx, y, outs[0], [2, 0, 1, 3] if layout else None)
    for states, out in ((hs, outs[1]), (cs, outs[2] if op == "LSTM" else "")):
        if out:
            s = cell.op("Concat", *[cell.op("Unsqueeze", h, cell.ints([0])) for h in states],
                        axis=0)                                                          # [D, B, H]
            _emit_out(ctx, s, out, [1, 0, 2] if layout else None)


def _whole(ctx, node, cell, direction, x, w, r, b, h0, c0, hidden, dirs, lens, p, acts):
    """Every direction's steps as one RecurrentSteps op (ops/recurrent.py), its directions run side
    by side; the input projection of all directions is one MatMul. Returns Y [S, D, B, H] and the
    last states [D, B, H]."""
    op, g = node.op_type, GATES[node.op_type]
    steps, batch, width = ctx.shape(x)
    i64 = cell.ints
    gh = g * hidden
    wt = cell.op("Transpose", cell.op("Reshape", w, i64([dirs * gh, width])), perm=[1, 0])   # [I, D gH]
    xw = cell.op("MatMul", x, wt)                                                        # [S, B, D gH]
    rb_h = ""
    if b:
        wb = cell.op("Slice", b, i64([0]), i64([gh]), i64([1]))
        rb = cell.op("Slice", b, i64([gh]), i64([2 * gh]), i64([1]))                    # [D, gH]
        if op == "GRU":     # the new gate's recurrent bias sits inside the reset gate's product
            rb_h = cell.op("Slice", rb, i64([2 * hidden]), i64([3 * hidden]), i64([1]))
            rb = cell.op("Concat", cell.op("Slice", rb, i64([0]), i64([2 * hidden]), i64([1])),
                         cell.c(np.zeros((dirs, hidden)), "zeros"), axis=1)
        xw = cell.op("Add", xw, cell.op("Reshape", cell.op("Add", wb, rb), i64([dirs * gh])))
    xw = cell.op("Reshape", xw, i64([steps, batch, dirs, gh]))
    lbr = int(node.attrs.get("linear_before_reset", 0)) if op == "GRU" else 0
    rth = ""
    if op == "GRU" and not lbr:
        rth = cell.op("Transpose", cell.op("Slice", r, i64([2 * hidden]), i64([gh]), i64([1])), perm=[0, 2, 1])
        r = cell.op("Slice", r, i64([0]), i64([2 * hidden]), i64([1]))
    rt = cell.op("Transpose", r, perm=[0, 2, 1])                                         # [D, H, gH]
    zeros = cell.c(np.zeros((dirs, batch, hidden)), "zeros")
    if lens and ctx.dtype(lens) != np.int32:
        lens = cell.op("Cast", lens, to=6)
    ins = [xw, rt, h0 or zeros, (c0 or zeros) if op == "LSTM" else "", rb_h, rth, lens or "", p or ""]
    attrs = {"kind": op, "direction": direction, "linear_before_reset": lbr}
    flat = [spec for d in acts for spec in d]
    if [n for n, _, _ in flat] != [n.lower() for n in DEFAULT_ACTIVATIONS[op]] * dirs:   # (only where not the
        attrs.update(activations=[n for n, _, _ in flat],                                # default: workload keys
                     activation_alpha=[float(a or 0) for _, a, _ in flat],                 # stay as they were)
                     activation_beta=[float(b or 0) for _, _, b in flat])
    if node.attrs.get("clip") is not None:
        attrs["clip"] = float(node.attrs["clip"])
    if op == "LSTM" and node.attrs.get("input_forget", 0):
        attrs["input_forget"] = 1
    outs = ctx.emit("RecurrentSteps", ins, attrs=attrs, n_outputs=3 if op == "LSTM" else 2)
    return outs[0], outs[1:]


def _emit_out(ctx, src, dst, perm):
    if perm:
        ctx.emit("Transpose", [src], [dst], {"perm": perm})
    else:
        ctx.alias(src, dst)


def _part(cell, t, d, k, size):
    """Row block k (of `size` rows) of direction d's weights `t`."""
    s = cell.op("Gather", t, cell.ints(d), axis=0)
    return cell.op("Slice", s, cell.ints([k * size]), cell.ints([(k + 1) * size]),
                   cell.ints([0]))


def _reverse_each(cell, seq, lens, steps, batch):
    """seq[S, B, ...] with each batch entry's first lens[b] steps reversed in place (ReverseSequence)."""
    ctx = cell.ctx
    pos = cell.ints(np.arange(steps).reshape(steps, 1))
    n = cell.op("Unsqueeze", lens, cell.ints([0]))                           # [1, B]
    flipped = cell.op("Sub", cell.op("Sub", n, cell.ints(1)), pos)
    idx = cell.op("Where", cell.op("Less", pos, n), flipped, cell.op("Expand", pos, cell.ints([steps, batch])))
    rank = ctx.rank(seq)
    idx = cell.op("Unsqueeze", idx, cell.ints(np.arange(2, rank)))
    idx = cell.op("Expand", idx, cell.ints(ctx.shape(seq)))
    return cell.op("GatherElements", seq, idx, axis=0)


def _direction(ctx, node, cell, d, reverse, x, w, r, b, lens, h0, c0, p, hidden):
    op, g = node.op_type, GATES[node.op_type]
    steps, batch, _ = ctx.shape(x)
    i64 = cell.ints
    wd = cell.op("Gather", w, i64(d), axis=0)                                         # [gH, I]
    xw = cell.op("MatMul", x, cell.op("Transpose", wd, perm=[1, 0]))                  # [S, B, gH]
    rb_h = None
    if b:
        bd = cell.op("Gather", b, i64(d), axis=0)
        wb = cell.op("Slice", bd, i64([0]), i64([g * hidden]), i64([0]))
        rb = cell.op("Slice", bd, i64([g * hidden]), i64([2 * g * hidden]), i64([0]))
        if op == "GRU":     # the new gate's recurrent bias sits inside the reset gate's product
            rb_h = cell.op("Slice", rb, i64([2 * hidden]), i64([3 * hidden]), i64([0]))
            rb = cell.op("Concat", cell.op("Slice", rb, i64([0]), i64([2 * hidden]), i64([0])),
                         cell.c(np.zeros(hidden), "zeros"), axis=0)
        xw = cell.op("Add", xw, cell.op("Add", wb, rb))
    if lens and reverse:
        xw = _reverse_each(cell, xw, lens, steps, batch)
    rt = cell.op("Transpose", cell.op("Gather", r, i64(d), axis=0), perm=[1, 0])     # [H, gH]
    zeros = cell.c(np.zeros((batch, hidden)), "zeros")
    h = cell.op("Gather", h0, i64(d), axis=0) if h0 else zeros
    c = cell.op("Gather", c0, i64(d), axis=0) if c0 else zeros
    if op == "GRU" and not node.attrs.get("linear_before_reset", 0):
        rt_h = cell.op("Transpose", _part(cell, r, d, 2, hidden), perm=[1, 0])
        rt = cell.op("Transpose", _part(cell, r, d, 0, 2 * hidden), perm=[1, 0])
    if p:
        pd = cell.op("Gather", p, i64(d), axis=0)
        pi, po, pf = (cell.op("Slice", pd, i64([k * hidden]), i64([(k + 1) * hidden]), i64([0])) for k in range(3))
    clip = node.attrs.get("clip")

    def gate(v):
        return cell.op("Clip", v, cell.c(-clip, "lo"), cell.c(clip, "hi")) if clip is not None else v

    def split(v, n):
        return ctx.emit("Split", [v, i64([hidden] * n)], attrs={"axis": 1}, n_outputs=n)

    order = range(steps - 1, -1, -1) if reverse and not lens else range(steps)
    ys = {}
    for t in order:
        xt = cell.op("Gather", xw, i64(t), axis=0)                                    # [B, gH]
        if op == "RNN":
            h_new = cell.act(0, gate(cell.op("Add", xt, cell.op("MatMul", h, rt))))
            c_new = None
        elif op == "LSTM":
            xi, xo, xf, xc = split(cell.op("Add", xt, cell.op("MatMul", h, rt)), 4)
            if p:
                xi, xf = cell.op("Add", xi, cell.op("Mul", pi, c)), cell.op("Add", xf, cell.op("Mul", pf, c))
            i_ = cell.act(0, gate(xi))
            f_ = cell.op("Sub", cell.c(1, "one"), i_) if node.attrs.get("input_forget", 0) else cell.act(0, gate(xf))
            c_new = cell.op("Add", cell.op("Mul", f_, c), cell.op("Mul", i_, cell.act(1, gate(xc))))
            if p:
                xo = cell.op("Add", xo, cell.op("Mul", po, c_new))
            h_new = cell.op("Mul", cell.act(0, gate(xo)), cell.act(2, c_new))
        else:
            xz, xr, xh = split(xt, 3)
            if node.attrs.get("linear_before_reset", 0):
                hz, hr, hh = split(cell.op("MatMul", h, rt), 3)
                if rb_h is not None:
                    hh = cell.op("Add", hh, rb_h)
                z, r_ = cell.act(0, gate(cell.op("Add", xz, hz))), cell.act(0, gate(cell.op("Add", xr, hr)))
                n_ = cell.act(1, gate(cell.op("Add", xh, cell.op("Mul", r_, hh))))
            else:
                hz, hr = split(cell.op("MatMul", h, rt), 2)
                z, r_ = cell.act(0, gate(cell.op("Add", xz, hz))), cell.act(0, gate(cell.op("Add", xr, hr)))
                hh = cell.op("MatMul", cell.op("Mul", r_, h), rt_h)
                if rb_h is not None:
                    hh = cell.op("Add", hh, rb_h)
                n_ = cell.act(1, gate(cell.op("Add", xh, hh)))
            h_new = cell.op("Add", cell.op("Mul", cell.op("Sub", cell.c(1, "one"), z), n_), cell.op("Mul", z, h))
            c_new = None
        if lens:
            live = cell.op("Unsqueeze", cell.op("Less", i64(t), lens), i64([1]))   # [B, 1]
            h = cell.op("Where", live, h_new, h)
            c = cell.op("Where", live, c_new, c) if c_new is not None else c
            ys[t] = cell.op("Where", live, h_new, zeros)
        else:
            h, c = h_new, (c_new if c_new is not None else c)
            ys[t] = h_new
    if lens:       # an entry of no steps ends in zero states, as onnxruntime's do (not its initial ones)
        some = cell.op("Unsqueeze", cell.op("Less", i64(0), lens), i64([1]))
        h, c = cell.op("Where", some, h, zeros), cell.op("Where", some, c, zeros)
    # [S*B, H] then [S, B, H]: each step's state is a contiguous part, which the concat can hold in place
    # (in concats of at most 256 parts: an injective kernel selects its part through an if/elif chain,
    # and Python's parser refuses chains past about a thousand)
    parts = [ys[t] for t in range(steps)]
    while len(parts) > 1:
        parts = [cell.op("Concat", *parts[k:k + 256], axis=0) if len(parts[k:k + 256]) > 1 else parts[k]
                 for k in range(0, len(parts), 256)]
    y = cell.op("Reshape", parts[0], i64([steps, batch, hidden]))
    if lens and reverse:
        y = _reverse_each(cell, y, lens, steps, batch)
    return y, h, c
