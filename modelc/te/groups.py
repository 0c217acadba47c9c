"""te declarations of the model's fused groups: the template-free space for ONNX workloads.

A fused group (kernels/workload.py: an anchor op and its elementwise epilogue, over tensors in
their physical layouts) is declared here as one te computation, so the sketch rules derive its
schedule space and codegen.py writes its kernel, as for a user's declaration. It serves twice
(te/template.py): as the kernel of groups no hand-written template takes, which would otherwise
run on the numpy fallback, and as a further algorithm beside the conv, depthwise, dense and
batch-matmul templates, chosen only when its tuning record is faster (as Winograd is).

The declaration is over the buffers the module really has: a blocked NCHW[b]c activation is a
placeholder of its physical shape (its zero halo is a conv's padding, read without a guard), a
blocked result is computed in blocked order and stored inside its halo (`KernelPlan.store`), and a
conv's weights are re-laid out once at build time (Ansor's layout rewrite of constant
placeholders) so the output channels a vector computes are contiguous. Channel indices travel as
`Split(block, lane, b)` so no division or modulo reaches the innermost loops. The ops' lowerings
are in lowerings.py.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..kernels.layout import physical_shape
from ..kernels.workload import Workload
from . import expr as E
from .dag import ComputeDAG
from .expr import DeclarationError
from .lower import KernelPlan, plan as plan_of
from . import windows
from .lowerings import LOWER as _OPS
from .lowerings import Split, Unsupported, Value, flat, read
from .moves import MOVES
from .tensor import compute, placeholder

__all__ = ["Declared", "Unsupported", "declare"]

LOWER = {**_OPS, **MOVES, **windows.LOWER}   # every op a group's declaration may hold


@dataclass
class Declared:
    plan: KernelPlan
    args: list                  # what each kernel argument is bound to ("out0", "in2", "te_p0" ...)
    packs: dict                 # packed argument name -> fn(consts: {input index: array}) -> array


def declare(wl: Workload) -> Declared:
    """The group as one te kernel, or Unsupported."""
    if len(wl.outputs) != 1:
        raise Unsupported("several outputs")
    for t in (*wl.inputs, *wl.outputs, *wl.params.values()):
        if np.dtype(t.dtype).name not in E.DTYPES:
            raise Unsupported(f"dtype {np.dtype(t.dtype).name}")
    try:
        return _Builder(wl).build()
    except DeclarationError as e:   # a form te refuses (a rank-0 stage ...): not a user's error here
        raise Unsupported(str(e)) from None


class _Builder:
    def __init__(self, wl: Workload):
        self.wl = wl
        self.tensors, self.binds, self.packs = [], [], {}
        self.values = {}
        out = wl.outputs[0]
        self.out_layout = out.layout if out.layout and len(out.shape) == 4 else None

    # ---- operands -----------------------------------------------------------------------------
    def _placeholder(self, shape, dtype, bind, pack=None):
        t = placeholder(tuple(shape) or (1,), name=bind, dtype=np.dtype(dtype).name)
        self.tensors.append(t)
        self.binds.append(bind)
        if pack is not None:
            self.packs[bind] = pack
        return t

    def value(self, ref: str) -> Value:
        if ref in self.values:
            return self.values[ref]
        if not ref:
            raise Unsupported("a missing optional operand")
        if ref.startswith("i"):
            v = self._input(int(ref[1:]))
        elif ref.startswith("p"):
            v = self._param(ref)
        else:
            raise Unsupported(f"value {ref} before its op")
        self.values[ref] = v
        return v

    def _input(self, k: int) -> Value:
        t = self.wl.inputs[k]
        dt = np.dtype(t.dtype).name
        if t.layout and len(t.shape) == 4:
            b, h = t.layout
            P = self._placeholder(physical_shape(t.shape, t.layout), dt, f"in{k}")

            def at(idx):
                n, c, y, x = idx
                if isinstance(c, Split) and c.b == b:
                    blk, lane = c.blk, c.lane
                else:
                    c = flat(c)
                    blk, lane = c // b, c % b
                return P[n, blk, y + h if h else y, x + h if h else x, lane]
            return Value(tuple(t.shape), dt, at)
        return self._plain(t.shape, dt, f"in{k}")

    def _param(self, ref: str) -> Value:
        v = self.wl.params[ref]
        dt = np.dtype(v.dtype).name
        if v.size == 1:
            c = E.Const(v.reshape(-1)[0].item(), dt)
            return Value(tuple(v.shape), dt, lambda idx: c)
        flat_v = np.ascontiguousarray(v).reshape(-1)
        return self._plain(v.shape, dt, f"te_{ref}", lambda consts: flat_v)

    def _plain(self, shape, dt, bind, pack=None) -> Value:
        """A row-major operand: a placeholder of its own shape."""
        P = self._placeholder(shape, dt, bind, pack)
        return Value(tuple(shape), dt, lambda idx: read(P, shape, idx))

    def const_input(self, ref: str) -> int:
        """The index of the constant workload input `ref` (a conv's weights, re-laid out at build)."""
        if not ref.startswith("i") or not self.wl.inputs[int(ref[1:])].const:
            raise Unsupported(f"operand {ref} is not a constant input")
        return int(ref[1:])

    # ---- the group --------------------------------------------------------------------------
    def build(self) -> Declared:
        wl = self.wl
        for op in wl.ops:
            fn = LOWER.get(op.op)
            if fn is None:
                raise Unsupported(f"op {op.op}")
            self.values[f"v{op.index}"] = fn(self, op, wl)
        val = self.values.get(wl.output_values[0])
        if val is None:
            raise Unsupported("an output that is not a value of the ops")
        out = wl.outputs[0]
        odt = np.dtype(out.dtype).name
        if tuple(val.shape) != tuple(out.shape):
            raise Unsupported("output shape")

        def cast(e):
            return e if e.dtype == odt else E.cast(odt, e)
        store = None
        if self.out_layout:
            b, h = self.out_layout
            n, c, hh, ww = out.shape
            shape = (n, c // b, hh, ww, b)
            res = compute(shape, lambda q0, q1, q2, q3, q4: cast(val.at([q0, Split(q1, q4, b), q2, q3])), name="out")
            if h:
                store = (physical_shape(out.shape, self.out_layout), (0, 0, h, h, 0))
        elif out.shape:
            res = compute(tuple(out.shape), lambda *ax: cast(val.at(list(ax))), name="out")
        else:
            res = compute((1,), lambda q0: cast(val.at([q0])), name="out")
        dag = ComputeDAG([*self.tensors, res])
        plans = plan_of(dag)
        if len(plans) != 1:
            raise Unsupported(f"{len(plans)} kernels")
        p = plans[0]
        p.store = store
        binds = {id(t): b for t, b in zip(self.tensors, self.binds)}
        return Declared(p, ["out0", *(binds[id(t)] for t in p.reads)],
                        {binds[id(t)]: self.packs[binds[id(t)]] for t in p.reads if binds[id(t)] in self.packs})

    def blocked_anchor(self, shape) -> int | None:
        """The block of the output's layout when a reduction of `shape` should be computed in it
        (its result is the group's, through elementwise ops): then it fuses with the store."""
        if self.out_layout and tuple(shape) == tuple(self.wl.outputs[0].shape):
            b = self.out_layout[0]
            return b if shape[1] % b == 0 else None
        return None
