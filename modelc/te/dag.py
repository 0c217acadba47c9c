"""ComputeDAG: a declaration's stages in topological order, printable and evaluable by numpy."""
from __future__ import annotations

import numpy as np

from ..errors import InputError
from .expr import DeclarationError, Reduce
from .tensor import ComputeOp, PlaceholderOp, Tensor

_SYMBOL = {"sum": "+=", "max": "max=", "min": "min="}


class ComputeDAG:
    """The computation of a workload's tensors: the placeholders among them are its inputs and the
    computes its outputs, each in the order given (the built function's argument order)."""

    def __init__(self, tensors):
        tensors = list(tensors)
        if not tensors or not all(isinstance(t, Tensor) for t in tensors):
            raise DeclarationError("a workload returns a list of te tensors (its inputs, then its outputs)")
        self.tensors = tensors
        self.inputs = [t for t in tensors if isinstance(t.op, PlaceholderOp)]
        self.outputs = [t for t in tensors if isinstance(t.op, ComputeOp)]
        if not self.outputs:
            raise DeclarationError("the workload's tensors include no te.compute stage to compute")
        self.ops = []                       # tensors, producers before consumers
        seen = set()

        def visit(t):
            if id(t) in seen:
                return
            seen.add(id(t))
            if isinstance(t.op, ComputeOp):
                for s in t.op.input_tensors:
                    visit(s)
            self.ops.append(t)
        for t in self.outputs + self.inputs:     # from the outputs, as TVM prints it
            visit(t)
        for t in self.ops:
            if isinstance(t.op, PlaceholderOp) and not any(t is i for i in self.inputs):
                raise DeclarationError(f"placeholder {t.name!r} is read but is not among the workload's "
                                       "tensors: return it too, as an input")

    def __str__(self):
        lines = []
        for t in self.ops:
            op = t.op
            if isinstance(op, PlaceholderOp):
                lines.append(f"{op.name} = PLACEHOLDER [{', '.join(map(str, op.shape))}]")
            else:
                sym = _SYMBOL[op.body.op] if isinstance(op.body, Reduce) else "="
                lines.append(f"{op.name}({', '.join(a.name for a in op.axis)}) {sym} {op.body}")
        return "\n".join(lines) + "\n"

    def __repr__(self):
        return str(self)

    def flop_count(self) -> int:
        """Arithmetic operations per evaluation (each node of each stage over its loop nest)."""
        from .expr import Binary, Call, walk
        total = 0
        for t in self.ops:
            if isinstance(t.op, ComputeOp):
                points = int(np.prod(t.shape)) * int(np.prod([a.hi - a.lo for a in t.op.reduce_axis] or [1]))
                ops = sum(isinstance(n, (Binary, Call, Reduce)) for n in walk(t.op.body))
                total += points * ops
        return total

    def check_inputs(self, arrays) -> list:
        """The input arrays as C-contiguous writable arrays of the declared shapes and dtypes."""
        if len(arrays) != len(self.inputs):
            raise InputError(f"expected {len(self.inputs)} input array(s) "
                             f"({', '.join(t.name for t in self.inputs)}), got {len(arrays)}")
        out = []
        for t, a in zip(self.inputs, arrays):
            a = np.asarray(a)
            if a.shape != tuple(t.shape) or a.dtype != np.dtype(t.dtype):
                raise InputError(f"input {t.name!r} must be {t.dtype} of shape {tuple(t.shape)}, "
                                 f"got {a.dtype} of shape {a.shape}")
            out.append(np.require(a, requirements=["C", "W"]))
        return out

    def evaluate(self, *arrays):
        """The outputs computed by numpy from the declaration alone (the reference for kernels)."""
        from .evaluate import evaluate
        values = evaluate(self, self.check_inputs(arrays))
        outs = [values[id(t)] for t in self.outputs]
        return outs[0] if len(outs) == 1 else tuple(outs)
