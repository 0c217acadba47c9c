"""The default schedule: which stages become kernels, and what each kernel computes.

Stages without a reduction that are not outputs are inlined into their readers (TVM's and Ansor's
always-inline of injective stages: they are recomputed where read, which for padding and elementwise
chains costs less than a pass over memory). A remaining output stage that only reads a reduction
stage at its own indices, where nothing else reads that reduction, is fused into it as the
reduction's epilogue (matmul + C: one kernel, no temporary). Every other stage is its own kernel
over its own buffer; kernels run one after another, since launch.py spreads the items of one kernel
body over the threads with no barrier between its loops.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .expr import Expr, Read, Reduce, substitute, walk
from .tensor import ComputeOp, Tensor


class Acc(Expr):
    """The reduction's accumulated value, inside a fused epilogue."""
    __slots__ = ("dtype",)

    def __init__(self, dtype):
        self.dtype = dtype

    def __str__(self):
        return "acc"


@dataclass
class KernelPlan:
    tensor: Tensor                    # the buffer the kernel writes
    name: str                         # the stages it computes, for messages
    axis: list                        # spatial Vars of the loop nest
    reduce: Reduce | None             # the reduction (source inlined), or None
    value: Expr                       # what is stored: an expression of the axes (and Acc)
    reads: list = field(default_factory=list)     # tensors read, in argument order
    store: tuple | None = None        # (buffer shape, origin): the result stored inside a larger
                                      # buffer (a blocked activation's halo), else its own shape


def plan(dag) -> list[KernelPlan]:
    outputs = {id(t) for t in dag.outputs}
    computes = [t for t in dag.ops if isinstance(t.op, ComputeOp)]
    inlined = {id(t): t for t in computes if id(t) not in outputs and not isinstance(t.op.body, Reduce)}

    def inline(e: Expr) -> Expr:
        def fn(n):
            if isinstance(n, Read) and id(n.tensor) in inlined:
                op = n.tensor.op
                env = {id(a): inline(ix) for a, ix in zip(op.axis, n.indices)}
                return inline(substitute(op.body, lambda m: env.get(id(m))))
            return None
        return substitute(e, fn)

    kernels = [t for t in computes if id(t) not in inlined]
    bodies = {id(t): inline(t.op.body) for t in kernels}
    readers = {}
    for t in kernels:
        for n in walk(bodies[id(t)]):
            if isinstance(n, Read):
                readers.setdefault(id(n.tensor), set()).add(id(t))
    fused = {}                                     # id(reduction) -> its consumer
    for t in kernels:
        body = bodies[id(t)]
        if isinstance(body, Reduce):
            continue
        reads = [n for n in walk(body) if isinstance(n, Read)]
        for r in {id(n.tensor): n.tensor for n in reads}.values():
            if (isinstance(bodies.get(id(r)), Reduce) and id(r) not in outputs and id(r) not in fused
                    and readers.get(id(r)) == {id(t)} and tuple(r.shape) == tuple(t.shape)
                    and all(len(n.indices) == len(t.op.axis) and all(ix is a for ix, a in zip(n.indices, t.op.axis))
                            for n in reads if n.tensor is r)):
                fused[id(r)] = t
                break
    plans = []
    into = {id(c): r for r, c in ((next(k for k in kernels if id(k) == rid), c) for rid, c in fused.items())}
    for t in kernels:
        if id(t) in fused:
            continue                    # computed where its consumer is: after all the consumer reads
        op, body = t.op, bodies[id(t)]
        if id(t) in into:
            r = into[id(t)]
            env = {id(a): b for a, b in zip(r.op.axis, op.axis)}
            red = substitute(bodies[id(r)], lambda m: env.get(id(m)))
            acc = Acc(red.dtype)
            value = substitute(body, lambda m: acc if isinstance(m, Read) and m.tensor is r else None)
            plans.append(KernelPlan(t, f"{r.op.name} + {op.name}", list(op.axis), red, value))
        elif isinstance(body, Reduce):
            plans.append(KernelPlan(t, op.name, list(op.axis), body, Acc(body.dtype)))
        else:
            plans.append(KernelPlan(t, op.name, list(op.axis), None, body))
    for p in plans:
        seen = {}
        for e in ([p.reduce] if p.reduce is not None else []) + [p.value]:
            for n in walk(e):
                if isinstance(n, Read):
                    seen.setdefault(id(n.tensor), n.tensor)
        p.reads = list(seen.values())
    return plans
