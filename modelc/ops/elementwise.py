"""Elementwise and broadcasting ops: activations, arithmetic, comparisons, logic.

Results keep ONNX's output dtypes: numpy would promote (float32 ** int64 -> float64, int / int ->
float), so every arithmetic result is cast back to the dtype ONNX declares.
"""
from __future__ import annotations

import math

import numpy as np

from .registry import Kind, broadcast_shape, register


def _same(x, *rest, **attrs):
    return x.shape, x.dtype


def _bcast(*ins, **attrs):
    ins = [t for t in ins if t is not None]
    return broadcast_shape(*(t.shape for t in ins), where="broadcast"), ins[0].dtype


def _bcast_bool(*ins, **attrs):
    return broadcast_shape(*(t.shape for t in ins), where="broadcast"), np.dtype(bool)


def _unary(name, fn):
    @register(name, Kind.ELEMWISE, infer=_same)
    def ref(x, **attrs):
        return np.asarray(fn(x, **attrs)).astype(x.dtype, copy=False)
    return ref


_erf = np.frompyfunc(math.erf, 1, 1)


def erf(x):
    """Exact erf (numpy has none); the reference path is not the hot path."""
    return _erf(np.asarray(x, dtype=np.float64)).astype(np.float64)


def _sigmoid(x):
    x = np.asarray(x, dtype=np.float64)
    return np.where(x >= 0, 1 / (1 + np.exp(-np.abs(x))), np.exp(-np.abs(x)) / (1 + np.exp(-np.abs(x))))


_unary("Relu", lambda x: np.maximum(x, 0))
_unary("Sigmoid", _sigmoid)
_unary("Tanh", np.tanh)
_unary("Exp", np.exp)
_unary("Log", np.log)
_unary("Sqrt", np.sqrt)
_unary("Neg", np.negative)
_unary("Abs", np.abs)
_unary("Reciprocal", lambda x: np.float64(1) / x if x.dtype.kind == "f" else 1 // x)
_unary("Floor", np.floor)
_unary("Ceil", np.ceil)
_unary("Round", np.round)          # numpy rounds half to even, as ONNX specifies
_unary("Sign", np.sign)
_unary("Erf", erf)
_unary("Sin", np.sin)
_unary("Cos", np.cos)
_unary("Tan", np.tan)
_unary("Asin", np.arcsin)
_unary("Acos", np.arccos)
_unary("Atan", np.arctan)
_unary("Sinh", np.sinh)
_unary("Cosh", np.cosh)
_unary("Asinh", np.arcsinh)
_unary("Acosh", np.arccosh)
_unary("Atanh", np.arctanh)
_unary("Softsign", lambda x: x / (1 + np.abs(x)))
_unary("Softplus", lambda x: np.logaddexp(0, np.asarray(x, np.float64)))
_unary("Mish", lambda x: x * np.tanh(np.logaddexp(0, np.asarray(x, np.float64))))
_unary("LeakyRelu", lambda x, alpha=0.01: np.where(x >= 0, x, x * np.float64(alpha)))
_unary("Elu", lambda x, alpha=1.0: np.where(x > 0, x, alpha * np.expm1(np.asarray(x, np.float64))))
_unary("Celu", lambda x, alpha=1.0: np.maximum(0, x) + np.minimum(
    0, alpha * np.expm1(np.asarray(x, np.float64) / alpha)))
_unary("Selu", lambda x, alpha=1.67326319217681884765625, gamma=1.05070102214813232421875:
       gamma * np.where(x > 0, x, alpha * np.expm1(np.asarray(x, np.float64))))
_unary("ThresholdedRelu", lambda x, alpha=1.0: np.where(x > alpha, x, 0))
_unary("HardSigmoid", lambda x, alpha=0.2, beta=0.5:
       np.clip(np.float64(alpha) * x + np.float64(beta), 0, 1))
_unary("HardSwish", lambda x: x * np.clip(x / np.float64(6) + np.float64(0.5), 0, 1))
_unary("Swish", lambda x, alpha=1.0: np.asarray(x, np.float64) / (
    1 + np.exp(-np.float64(alpha) * np.asarray(x, np.float64))))      # SiLU at alpha = 1
_unary("Shrink", lambda x, bias=0.0, lambd=0.5:
       np.where(x < -lambd, x + bias, np.where(x > lambd, x - bias, 0)))


@register("Gelu", Kind.ELEMWISE, infer=_same)
def gelu(x, *, approximate="none"):
    v = np.asarray(x, np.float64)
    if approximate == "tanh":
        y = 0.5 * v * (1 + np.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v ** 3)))
    else:
        y = 0.5 * v * (1 + erf(v / math.sqrt(2)))
    return y.astype(x.dtype)


@register("Clip", Kind.ELEMWISE, infer=_same)
def clip(x, min=None, max=None):
    y = x
    if min is not None:
        y = np.maximum(y, min.astype(x.dtype))
    if max is not None:
        y = np.minimum(y, max.astype(x.dtype))
    return np.asarray(y, dtype=x.dtype)


@register("PRelu", Kind.BROADCAST, infer=_bcast)
def prelu(x, slope):
    return np.where(x >= 0, x, x * slope).astype(x.dtype)


def _binary(name, fn, kind=Kind.BROADCAST):
    @register(name, kind, infer=_bcast)
    def ref(a, b, exact=0):
        """(`exact`, which quantized ops set on a Mul, asks kernels for IEEE's single rounding,
        which numpy always does)"""
        return np.asarray(fn(a, b)).astype(a.dtype, copy=False)
    return ref


def _div(a, b):
    if a.dtype.kind in "iu":
        # ONNX integer Div truncates toward zero, like C; in integers (a / b in float64 loses the
        # low digits of int64 values beyond 2^53); a zero divisor gives 0, as numpy's //
        with np.errstate(divide="ignore", over="ignore"):
            q = np.floor_divide(a, b)
            if a.dtype.kind == "i":
                q = q + ((np.remainder(a, b) != 0) & ((a < 0) != (b < 0)))
        return q
    return a / b


def _pow(a, b):
    if a.dtype.kind == "f":
        return np.power(a.astype(np.float64), b.astype(np.float64))
    return np.power(a, b.astype(a.dtype))


_binary("Add", np.add)
_binary("Sub", np.subtract)
_binary("Mul", np.multiply)
_binary("Div", _div)
_binary("Pow", _pow)


@register("BitShift", Kind.BROADCAST, infer=_bcast)
def bitshift(a, b, *, direction):
    return (np.left_shift(a, b) if direction == "LEFT" else np.right_shift(a, b)).astype(a.dtype)


_binary("BitwiseAnd", np.bitwise_and)
_binary("BitwiseOr", np.bitwise_or)
_binary("BitwiseXor", np.bitwise_xor)
_unary("BitwiseNot", np.invert)


@register("Mod", Kind.BROADCAST, infer=_bcast)
def mod(a, b, *, fmod=0):
    with np.errstate(divide="ignore", invalid="ignore"):
        return (np.fmod(a, b) if fmod else np.mod(a, b)).astype(a.dtype)


def _variadic(name, fn):
    @register(name, Kind.BROADCAST, infer=_bcast)
    def ref(*xs):
        out = xs[0]
        for x in xs[1:]:
            out = fn(out, x)
        return np.asarray(out).astype(xs[0].dtype, copy=False)
    return ref


_variadic("Sum", np.add)
_variadic("Max", np.maximum)
_variadic("Min", np.minimum)


@register("Mean", Kind.BROADCAST, infer=_bcast)
def mean(*xs):
    out = xs[0].astype(np.float64)
    for x in xs[1:]:
        out = out + x
    return (out / len(xs)).astype(xs[0].dtype)


def _compare(name, fn):
    @register(name, Kind.BROADCAST, infer=_bcast_bool)
    def ref(a, b):
        return np.asarray(fn(a, b))
    return ref


_compare("Equal", np.equal)
_compare("Greater", np.greater)
_compare("Less", np.less)
_compare("GreaterOrEqual", np.greater_equal)
_compare("LessOrEqual", np.less_equal)
_compare("And", np.logical_and)
_compare("Or", np.logical_or)
_compare("Xor", np.logical_xor)


@register("Not", Kind.ELEMWISE, infer=_same)
def not_(x):
    return np.logical_not(x)


@register("IsNaN", Kind.ELEMWISE, infer=lambda x: (x.shape, np.dtype(bool)))
def isnan(x):
    return np.isnan(x)


@register("IsInf", Kind.ELEMWISE, infer=lambda x, **a: (x.shape, np.dtype(bool)))
def isinf(x, *, detect_negative=1, detect_positive=1):
    return (np.isneginf(x) & bool(detect_negative)) | (np.isposinf(x) & bool(detect_positive))


@register("Where", Kind.BROADCAST,
          infer=lambda c, x, y: (broadcast_shape(c.shape, x.shape, y.shape, where="Where"), x.dtype))
def where(cond, x, y):
    return np.where(cond, x, y).astype(x.dtype)
