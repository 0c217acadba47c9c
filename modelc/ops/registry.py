"""The operator registry: for each op its fusion pattern kind, shape rule and numpy reference.

Ops are registered in their canonical form, which is the newest ONNX form (parameters such as axes,
pads or split sizes are inputs, not attributes). The frontend's converters rewrite older opsets into
this form, so everything after the frontend sees a single version of each op.

A reference implementation is `ref(*inputs, **attrs)`; omitted optional inputs arrive as None and it
returns one array or a tuple of arrays. A shape rule is `infer(*inputs, **attrs)` over `ir.Tensor`s
(shape, dtype and, when known, value) and returns one `(shape, dtype[, value])` tuple, or a
*list* of them for an op with several outputs. Ops without
an explicit rule are inferred by running the reference on placeholder inputs (as `jax.eval_shape`
would): fine for cheap data-movement ops, never used for the heavy ones, which all have rules.
"""
from __future__ import annotations

import enum
import os
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..errors import DynamicError, ModelcError, ShapeError
from ..ir import Node, Tensor


class Kind(enum.IntEnum):
    """TVM's operator pattern kinds; fusion reads these."""
    ELEMWISE = 0
    BROADCAST = 1
    INJECTIVE = 2
    REDUCTION = 3
    OUT_ELEMWISE_FUSABLE = 4
    OPAQUE = 8


@dataclass
class OpDef:
    name: str
    kind: Kind
    ref: Callable
    infer: Callable | None = None
    # indices of inputs whose *values* (not just shapes) decide the output shape
    param_inputs: tuple = ()


REGISTRY: dict[str, OpDef] = {}

# outputs of at most this many elements are evaluated during shape inference when all inputs are
# known, so that shape computations (Shape -> Gather -> Concat -> Reshape) resolve at import
KNOWN_VALUE_LIMIT = 4096


def register(name: str | list, kind: Kind, infer: Callable | None = None, param_inputs=()):
    """Decorator: register `fn` as the reference implementation of op(s) `name`."""
    names = [name] if isinstance(name, str) else list(name)

    def deco(fn):
        for n in names:
            if n in REGISTRY:
                raise RuntimeError(f"op {n} registered twice")
            REGISTRY[n] = OpDef(n, kind, fn, infer, tuple(param_inputs))
        return fn

    return deco


def get(op_type: str) -> OpDef:
    try:
        return REGISTRY[op_type]
    except KeyError:
        raise ModelcError(f"no operator {op_type!r} in the registry") from None


def supported_ops() -> list[str]:
    return sorted(REGISTRY)


_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _reason(e: Exception) -> str:
    """An exception as a message: a ValueError that modelc's own checks raised is their text; a
    foreign one (numpy's, or a bug) keeps its type, which says where to look."""
    tb = e.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    own = tb is not None and os.path.abspath(tb.tb_frame.f_code.co_filename).startswith(_PACKAGE)
    ours = type(e) is ValueError or (isinstance(e, ValueError) and type(e).__module__.startswith("modelc"))
    return str(e) if own and ours else f"{type(e).__name__}: {e}"


def evaluate(node: Node, inputs: list) -> list[np.ndarray]:
    """Run the reference implementation of one node; errors name the node."""
    op = get(node.op_type)
    try:
        out = op.ref(*inputs, **node.attrs)
    except ModelcError:
        raise
    except Exception as e:  # a numpy failure here is a bad model or a bug: say which node
        raise ModelcError(f"{node.where()} failed in the reference executor: {_reason(e)}") from e
    outs = list(out) if isinstance(out, (tuple, list)) else [out]
    return [np.asarray(o) for o in outs]


def infer(node: Node, ins: list[Tensor | None]) -> list[Tensor]:
    """Output tensors (shape, dtype, and value when cheaply known) of `node` given its inputs."""
    op = get(node.op_type)
    known = all(t is None or t.value is not None for t in ins)
    outs: list[Tensor] = []
    try:
        if op.infer is not None:
            res = op.infer(*ins, **node.attrs)
            res = res if isinstance(res, list) else [res]   # a list for several outputs
            for name, r in zip(node.outputs, res):
                shape, dtype = r[0], r[1]
                value = r[2] if len(r) > 2 else None
                outs.append(Tensor(name, tuple(int(d) for d in shape), np.dtype(dtype), value))
            if known and all(o.size <= KNOWN_VALUE_LIMIT for o in outs):
                vals = evaluate(node, [None if t is None else t.value for t in ins])
                for o, v in zip(outs, vals):
                    o.value = v
        else:
            for i in op.param_inputs:
                if i < len(ins) and ins[i] is not None and ins[i].value is None:
                    raise DynamicError(
                        f"{node.where()}: input {i} ({ins[i].name!r}) decides the output shape and "
                        "must be a constant (or computable from shapes), but it depends on the "
                        "model's inputs")
            vals = evaluate(node, [None if t is None else
                                   (t.value if t.value is not None else np.zeros(t.shape, t.dtype))
                                   for t in ins])
            for name, v in zip(node.outputs, vals):
                outs.append(Tensor(name, tuple(v.shape), v.dtype,
                                   v if known and v.size <= KNOWN_VALUE_LIMIT else None))
    except ShapeError as e:
        if node.where() in str(e):
            raise
        kind = DynamicError if isinstance(e, DynamicError) else ShapeError
        raise kind(f"{node.where()}: {e}") from e      # a rule's message, with the node
    except ModelcError:
        raise
    except Exception as e:
        shapes = ", ".join("-" if t is None else f"{t.name}{list(t.shape)}" for t in ins)
        raise ShapeError(f"{node.where()}: cannot infer output shapes from inputs ({shapes}): "
                         f"{_reason(e)}") from e
    return outs


# ---- helpers shared by the op modules ------------------------------------------------------------

def broadcast_shape(*shapes, where: str = "") -> tuple:
    try:
        return tuple(np.broadcast_shapes(*[tuple(s) for s in shapes]))
    except ValueError:
        raise ShapeError(f"{where}: shapes {' and '.join(str(list(s)) for s in shapes)} "
                         "do not broadcast") from None


def norm_axis(axis: int, rank: int) -> int:
    a = int(axis)
    if not -rank <= a < max(rank, 1):
        raise ShapeError(f"axis {axis} is out of range for rank {rank}")
    return a + rank if a < 0 else a
