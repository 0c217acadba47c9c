"""Tensors and their operations: placeholders (inputs) and computes (stages), as in `tvm.te`.

A compute is checked when it is declared, while its name is known: indices of the right number and of
integer type, reduce axes only inside their reduction, reductions only as a whole stage body, reads
provably in range unless guarded (bounds.py).
"""
from __future__ import annotations

import inspect

from .bounds import unproven_reads
from .expr import INDEX, Expr, Read, Reduce, Var, _stages, check_dtype, fail, walk, wrap

__all__ = ["Tensor", "PlaceholderOp", "ComputeOp", "placeholder", "compute", "reduce_axis"]


class PlaceholderOp:
    def __init__(self, name, shape, dtype):
        self.name, self.shape, self.dtype = name, shape, dtype


class ComputeOp:
    """A stage: `body` (an expression, or one Reduce) over the spatial `axis` of `shape`."""

    def __init__(self, name, shape, axis, body, attrs):
        self.name, self.shape, self.axis, self.body, self.attrs = name, shape, axis, body, attrs
        self.dtype = body.dtype

    @property
    def reduce_axis(self) -> tuple:
        return self.body.axes if isinstance(self.body, Reduce) else ()

    @property
    def input_tensors(self) -> list:
        """The tensors the body reads, in order of first appearance."""
        seen = {}
        for n in walk(self.body):
            if isinstance(n, Read):
                seen.setdefault(id(n.tensor), n.tensor)
        return list(seen.values())


class Tensor:
    def __init__(self, op):
        self.op = op

    name = property(lambda self: self.op.name)
    shape = property(lambda self: self.op.shape)
    dtype = property(lambda self: self.op.dtype)
    ndim = property(lambda self: len(self.op.shape))

    def __getitem__(self, indices) -> Read:
        if not isinstance(indices, tuple):
            indices = (indices,)
        if len(indices) != self.ndim:
            fail(f"tensor {self.name!r} has {self.ndim} dimension(s) {list(self.shape)}, "
                 f"indexed with {len(indices)}: {self.name}[{', '.join(map(str, indices))}]")
        out = []
        for d, ix in enumerate(indices):
            if isinstance(ix, Tensor):
                fail(f"index {d} of {self.name!r} is the tensor {ix.name!r}, not an element of it")
            ix = wrap(ix, INDEX)
            if ix.dtype not in ("int32", "int64"):
                fail(f"index {d} of {self.name!r} is {ix.dtype}, not an integer: {ix}")
            out.append(ix)
        return Read(self, out)

    def __hash__(self):
        return id(self)

    def __repr__(self):
        return f"Tensor({self.name!r}, shape={list(self.shape)}, dtype={self.dtype!r})"


def _shape(shape, what: str) -> tuple:
    if isinstance(shape, int):
        shape = (shape,)
    try:
        dims = tuple(shape)
    except TypeError:
        fail(f"the shape of {what} must be a tuple of positive integers, got {shape!r}")
    if not dims:
        fail(f"the shape of {what} is empty: a scalar is a tensor of shape (1,)")
    for d in dims:
        if isinstance(d, bool) or not isinstance(d, int) or d < 1:
            fail(f"the shape of {what} must be a tuple of positive integers, got {shape!r}")
    return dims


def placeholder(shape, name: str = "placeholder", dtype: str = "float32") -> Tensor:
    name = str(name)
    return Tensor(PlaceholderOp(name, _shape(shape, f"placeholder {name!r}"), check_dtype(dtype)))


def reduce_axis(dom, name: str = "rv") -> Var:
    try:
        lo, hi = dom
        ok = all(isinstance(x, int) and not isinstance(x, bool) for x in (lo, hi)) and lo < hi
    except (TypeError, ValueError):
        ok = False
    if not ok:
        fail(f"reduce_axis {name!r} needs a range (lo, hi) of integers with lo < hi, got {dom!r}")
    return Var(name, lo, hi, "reduce")


def compute(shape, fcompute, name: str = "compute", attrs: dict | None = None) -> Tensor:
    """A stage computing fcompute(i, j, ...) for every index of `shape`; the axes take the names of
    fcompute's parameters."""
    name = str(name)
    _stages.append(name)
    try:
        dims = _shape(shape, f"stage {name!r}")
        try:
            params = list(inspect.signature(fcompute).parameters.values())
        except (TypeError, ValueError):
            fail("fcompute must be a function of the output indices")
        if any(p.kind == p.VAR_POSITIONAL for p in params):
            names = [f"i{k}" for k in range(len(dims))]
        else:
            names = [p.name for p in params]
            if len(names) != len(dims):
                fail(f"fcompute takes {len(names)} index argument(s) for a shape of {len(dims)} "
                     f"dimension(s) {list(dims)}")
        axis = [Var(n, 0, e, "spatial") for n, e in zip(names, dims)]
        body = fcompute(*axis)
        if isinstance(body, Tensor):
            fail(f"fcompute returned the tensor {body.name!r}: index it")
        if isinstance(body, (list, tuple)):
            fail("fcompute returned several values: declare one stage per output")
        body = wrap(body)
        _check(body, axis)
        return Tensor(ComputeOp(name, dims, axis, body, dict(attrs or {})))
    finally:
        _stages.pop()


def _check(body: Expr, axis: list):
    reduce_axes = body.axes if isinstance(body, Reduce) else ()
    inner = body.source if isinstance(body, Reduce) else body
    for n in walk(inner):
        if isinstance(n, Reduce):
            fail(f"a reduction must be the whole body of a stage (as in TVM): {n.op}({n.source}) is "
                 "part of a larger expression; declare it as its own stage")
        if isinstance(n, Var) and n.kind == "reduce" and not any(n is a for a in reduce_axes):
            fail(f"reduce axis {n.name!r} is used outside a reduction over it (te.sum(..., axis={n.name}))")
        if isinstance(n, Var) and n.kind == "spatial" and not any(n is a for a in axis):
            fail(f"axis {n.name!r} belongs to another stage")
    for read, d, iv, guarded in unproven_reads(inner):
        if not guarded:
            dom = "cannot be bounded" if iv is None else f"ranges over [{iv[0]}, {iv[1]}]"
            fail(f"index {d} of {read} {dom}, outside [0, {read.tensor.shape[d] - 1}] of tensor "
                 f"{read.tensor.name!r} (guard it with te.if_then_else if it is padding)")


def reduction(op: str, expr, axis) -> Reduce:
    axes = tuple(axis) if isinstance(axis, (list, tuple)) else (axis,)
    if not axes or not all(isinstance(a, Var) and a.kind == "reduce" for a in axes):
        fail(f"{op}'s axis must be reduce axes made by te.reduce_axis, got {axis!r}")
    expr = wrap(expr)
    if expr.dtype == "bool":
        fail(f"{op} of conditions: cast them to a number first")
    return Reduce(op, expr, axes)
