"""Tensor expressions: declare what to compute, as with `tvm.te`; modelc derives the loops.

    A = te.placeholder((N, L), name="A")
    k = te.reduce_axis((0, L), name="k")
    C = te.compute((N, M), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")

Names are for printing and error messages only: generated kernels name everything themselves.
"""
from __future__ import annotations

from .dag import ComputeDAG
from .expr import DeclarationError, Expr, Var, call, cast, if_then_else, wrap
from .tensor import Tensor, compute, placeholder, reduce_axis, reduction

__all__ = ["ComputeDAG", "DeclarationError", "Expr", "Tensor", "Var", "placeholder", "compute", "reduce_axis",
           "sum", "max", "min", "if_then_else", "exp", "log", "sqrt", "tanh", "erf", "sigmoid", "abs",
           "fmod", "cast", "const", "all", "any", "call"]


def sum(expr, axis):               # noqa: A001  (TVM's name)
    return reduction("sum", expr, axis)


def max(expr, b=None, axis=None):  # noqa: A001
    """te.max(expr, axis=k) reduces; te.max(a, b) is the larger of two values."""
    return reduction("max", expr, axis) if axis is not None else call("max", expr, _second("max", b))


def min(expr, b=None, axis=None):  # noqa: A001
    return reduction("min", expr, axis) if axis is not None else call("min", expr, _second("min", b))


def _second(fn, b):
    if b is None:
        from .expr import fail
        fail(f"te.{fn} takes axis= (a reduction) or a second value (the {fn} of two)")
    return b


def exp(x):
    return call("exp", x)


def log(x):
    return call("log", x)


def sqrt(x):
    return call("sqrt", x)


def tanh(x):
    return call("tanh", x)


def erf(x):
    return call("erf", x)


def sigmoid(x):
    return call("sigmoid", x)


def abs(x):                        # noqa: A001
    return call("abs", x)


def fmod(x, y):
    """C's remainder of floats (the dividend's sign), as TVM's te.fmod and ONNX's Mod with fmod=1."""
    return call("fmod", x, y)


def const(value, dtype="float32"):
    from .expr import Const
    return Const(value, dtype)


def all(*conds):                   # noqa: A001
    """The conjunction of conditions (Python's `and` cannot be overloaded)."""
    out = wrap(conds[0])
    for c in conds[1:]:
        out = out & c
    return out


def any(*conds):                   # noqa: A001
    out = wrap(conds[0])
    for c in conds[1:]:
        out = out | c
    return out
