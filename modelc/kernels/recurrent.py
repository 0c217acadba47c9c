"""RecurrentSteps (ops/recurrent.py): an RNN, GRU or LSTM layer's whole time loop in one kernel.

Written out step by step, a layer ran a GEMV kernel and a gate kernel per step, and each kernel in
a module costs its threads a hand-off (about 2 us on 2 cores): a GRU of 96 units over 100 steps ran
4.4 us a step against onnxruntime's 2.5. Here one parallel item per direction and batch entry
keeps its state on the stack and runs every step (a bidirectional layer's two directions run side
by side on two threads): the state's projection (h @ R^T, an axpy over rows of R^T, `k_unroll`
rows per pass over the gates, so each gate is loaded and stored once per k_unroll rows), then the
gates, elementwise, written in place. R^T (at most a few MiB) stays in the core's caches from step
to step. The sigmoid is modelc's (expr.emit), tanh a polynomial that vectorises (within 2.5 ulp of
float64's), the equations ops/recurrent.py's, every option of them: each direction's activations
(expr.emit's, with their alpha and beta), clip, coupled gates, peepholes and sequence lengths (an
item runs its entry's steps, clamped to the sequence, and zeroes the outputs past them).
"""
from __future__ import annotations

import numpy as np

from ..ops.recurrent import ACTIVATION_OPS, activations, options
from .expr import emit, lit
from .intrinsics import calls_polynomial
from .space import ConfigSpace
from .template import Kernel, Template, output_positions, parallel_loop, register, source
from .workload import Workload

MAX_STACK_FLOATS = 64 << 10     # state, cell and gates of one item on a thread's stack (256 KB)


def _kind(wl: Workload):
    a = wl.anchor
    return a.attrs.get("kind"), a.attrs.get("direction", "forward"), int(a.attrs.get("linear_before_reset", 0))


@register
class RecurrentSteps(Template):
    name = "recurrent_steps"

    def matches(self, wl: Workload) -> bool:
        a = wl.anchor
        if a.op != "RecurrentSteps" or len(wl.ops) != 1 or wl.epilogue or output_positions(wl, 3) is None:
            return False
        refs = [r for r in a.args if r]
        # (small constants reach a workload as params: sequence lengths of up to 64 entries, a state
        # of one unit; the kernel writes them out as tuples)
        if not all(r.startswith("i") or (r.startswith("p") and wl.params[r].size <= 64) for r in refs):
            return False
        lens = a.args[6] if len(a.args) > 6 else ""
        specs = [wl.spec(r) for r in refs if r != lens] + list(wl.outputs)
        if any(t.dtype != np.float32 or t.layout is not None for t in specs) or \
                (lens and wl.spec(lens).dtype != np.int32):
            return False
        kind, direction, _lbr = _kind(wl)
        s, _b, _d, gh = wl.spec(a.args[0]).shape
        hid = wl.spec(a.args[2]).shape[2]
        return kind in ("RNN", "GRU", "LSTM") and direction in ("forward", "reverse", "bidirectional") and \
            s >= 1 and 5 * hid + gh <= MAX_STACK_FLOATS

    def space(self, wl: Workload) -> ConfigSpace:
        sp = ConfigSpace()
        hid = wl.spec(wl.anchor.args[2]).shape[2]
        sp.define_knob("k_unroll", [k for k in (1, 2, 4, 8) if k <= hid])
        return sp

    def default_config(self, wl: Workload, space: ConfigSpace):
        return space.get(0)

    def build(self, wl: Workload, cfg) -> Kernel:
        a = wl.anchor
        kind, direction, lbr = _kind(wl)
        S, B, D, GH = wl.spec(a.args[0]).shape
        H = wl.spec(a.args[2]).shape[2]
        GW = wl.spec(a.args[1]).shape[2]            # gates R^T projects to (a GRU's 2H without lbr)
        U = cfg["k_unroll"]
        arg = {k: f"in{int(r[1:])}" if r.startswith("i") else f"par{k}" for k, r in enumerate(a.args) if r}
        consts = [f"par{k} = ({', '.join(lit(v, wl.params[r].dtype) for v in wl.params[r].reshape(-1))},)"
                  for k, r in enumerate(a.args) if r.startswith("p")]
        XW, RT, H0 = arg[0], arg[1], arg[2]
        f32 = "np.float32"
        acts = activations(kind, D, a.attrs)
        clip, forget = options(kind, a.attrs)

        def L(v):
            return lit(v, np.float32)

        def gate(var, expr, k, d, out=None):
            """`out` = the direction's k-th activation of `var` = `expr`, clipped when asked."""
            lines = [f"{var} = {expr}"] + ([f"{var} = min(max({var}, {L(-clip)}), {L(clip)})"] if clip else [])
            return lines + [f"{out or 'g' + var[1:]} = {activation(acts[d][k], var)}"]

        def activation(spec, v):             # (v is a name: emit repeats its operand)
            name, alpha, beta = spec
            if name == "tanh":               # (math.tanh is a scalar call: intrinsics.FAST_TANH)
                return f"fast_tanh32({v})"
            if name == "scaledtanh":
                return f"({L(alpha)} * fast_tanh32({L(beta)} * {v}))"
            if name == "affine":
                return f"({L(alpha)} * {v} + {L(beta)})"
            return emit(ACTIVATION_OPS[name], [v], {"alpha": alpha, "beta": beta}, np.float32)

        def gemv(dst, vec, mat, width, ind):
            """dst[:width] = vec[:H] @ mat[H, width], U rows of mat per pass over dst."""
            lines = [f"{ind}for j in range({width}):", f"{ind}    {dst}[j] = {f32}(0.0)"]
            full = H - H % U
            if full:
                lines += [f"{ind}for k in range(0, {full}, {U}):",
                          *[f"{ind}    v{u} = {vec}[k + {u}]" for u in range(U)],
                          f"{ind}    row = np.uintp(d * {H * width} + k * {width})",
                          f"{ind}    for j in range({width}):",
                          f"{ind}        {dst}[j] += " + " + ".join(
                              f"{mat}[row + np.uintp({u * width}) + np.uintp(j)] * v{u}" for u in range(U))]
            if H % U:
                lines += [f"{ind}for k in range({full}, {H}):",
                          f"{ind}    vk = {vec}[k]",
                          f"{ind}    row = np.uintp(d * {H * width} + k * {width})",
                          f"{ind}    for j in range({width}):",
                          f"{ind}        {dst}[j] += {mat}[row + np.uintp(j)] * vk"]
            return lines

        def x(k):                                 # gate k's input projection at unit j
            return f"{XW}[xb + np.uintp({k * H}) + np.uintp(j)]"

        def peep(k, cell):                        # an LSTM's peephole k (i, o, f) times the cell
            return f" + {arg[7]}[np.uintp(d * {3 * H} + {k * H}) + np.uintp(j)] * {cell}" if 7 in arg else ""
        rb = f" + {arg[4]}[np.uintp(d * {H}) + np.uintp(j)]" if 4 in arg else ""

        def cell(d):
            """One step's gates after h @ R^T (in g), for direction d's activations."""
            if kind == "RNN":
                return ["for j in range(%d):" % H, *_in(gate("a0", f"{x(0)} + g[j]", 0, d, "h[j]"))]
            if kind == "LSTM":
                return [f"for j in range({H}):", *_in(
                    gate("ai", f"{x(0)} + g[j]{peep(0, 'c[j]')}", 0, d) +
                    (["gf = " + f32 + "(1.0) - gi"] if forget else
                     gate("af", f"{x(2)} + g[j + {2 * H}]{peep(2, 'c[j]')}", 0, d)) +
                    gate("ac", f"{x(3)} + g[j + {3 * H}]", 1, d) +
                    ["cn = gf * c[j] + gi * gc", "c[j] = cn"] +
                    gate("ao", f"{x(1)} + g[j + {H}]{peep(1, 'cn')}", 0, d) +
                    [f"h[j] = go * {activation(acts[d][2], 'cn')}"])]      # (the cell is not clipped)
            if lbr:
                return [f"for j in range({H}):", *_in(
                    gate("az", f"{x(0)} + g[j]", 0, d) + gate("ar", f"{x(1)} + g[j + {H}]", 0, d) +
                    gate("an", f"{x(2)} + gr * (g[j + {2 * H}]{rb})", 1, d) +
                    [f"h[j] = ({f32}(1.0) - gz) * gn + gz * h[j]"])]
            # the new gate's product reads r * h: a second GEMV
            return ([f"for j in range({H}):", *_in(
                        gate("az", f"{x(0)} + g[j]", 0, d, "z[j]") + gate("ar", f"{x(1)} + g[j + {H}]", 0, d) +
                        ["g[j] = gr * h[j]"])] +
                    gemv("gh", "g", arg[5], H, "") +
                    [f"for j in range({H}):", *_in(
                        gate("an", f"{x(2)} + gh[j]{rb}", 1, d) +
                        [f"h[j] = ({f32}(1.0) - z[j]) * gn + z[j] * h[j]"])])

        # item = (direction, batch entry); direction 1 of a bidirectional layer, or a reverse layer,
        # runs from the entry's last step (its length's, where lengths are given)
        rev = {"forward": "0", "reverse": "1", "bidirectional": "d"}[direction]
        n = f"min(max(np.intp({arg[6]}[b]), 0), {S})" if 6 in arg else str(S)
        pos = output_positions(wl, 3)       # (0 Y, 1 the last state, 2 the last cell)
        body = [*consts, parallel_loop("it", D * B),
                f"    d = it // {B}",
                f"    b = it % {B}",
                f"    st = np.uintp(it * {H})",             # the item's state in h0, c0, Y_h, Y_c
                f"    n = {n}",
                # the state, the gates' projection, an LSTM's cell, a GRU's update gate and r * h's
                *[f"    {name} = stack_empty({k}, np.float32)" for name, k in
                  (("h", H), ("g", GW), ("c", H if kind == "LSTM" else 0), ("z", H if kind == "GRU" and not lbr else 0),
                   ("gh", H if kind == "GRU" and not lbr else 0)) if k],
                f"    for j in range({H}):",
                f"        h[j] = {H0}[st + np.uintp(j)]",
                *([f"        c[j] = {arg[3]}[st + np.uintp(j)]"] if kind == "LSTM" else []),
                "    for s in range(n):",
                f"        t = s + {rev} * (n - 1 - 2 * s)",
                f"        xb = np.uintp(((t * {B} + b) * {D} + d) * {GH})"]
        body += gemv("g", "h", RT, GW, " " * 8)
        if D == 2 and acts[0] != acts[1]:      # each direction's activations
            body += ["        if d == 0:", *_in(cell(0), 12), "        else:", *_in(cell(1), 12)]
        else:
            body += _in(cell(0), 8)
        y = f"out{pos.index(0)}[np.uintp(((t * {D} + d) * {B} + b) * {H}) + np.uintp(j)]" if 0 in pos else ""
        if y:
            body += [f"        for j in range({H}):", f"            {y} = h[j]"]
        if 6 in arg:                       # steps past the entry's length output zeros, and
            if y:                          # an entry of no steps ends in zero states
                body += [f"    for t in range(n, {S}):", f"        for j in range({H}):",
                         f"            {y} = {f32}(0.0)"]
            body += ["    if n == 0:", f"        for j in range({H}):", f"            h[j] = {f32}(0.0)",
                     *([f"            c[j] = {f32}(0.0)"] if kind == "LSTM" else [])]
        for p, src in ((1, "h"), (2, "c")):
            if p in pos:
                body += [f"    for j in range({H}):",
                         f"        out{pos.index(p)}[st + np.uintp(j)] = {src}[j]"]
        ins = [k for k in sorted(arg) if arg[k].startswith("in")]
        args = [f"out{k}" for k in range(len(pos))] + [arg[k] for k in ins]
        dtypes = [np.float32] * len(pos) + [np.int32 if k == 6 else np.float32 for k in ins]
        # in order unless a gate calls the sigmoid polynomial (conv2d's reasons)
        return Kernel(source(args, dtypes, body, reassoc=calls_polynomial(body)), args, None)


def _in(lines: list, by: int = 4) -> list:
    return [" " * by + ln for ln in lines]
