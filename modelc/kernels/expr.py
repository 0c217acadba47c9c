"""Scalar source expressions for elementwise ops, shared by every template's fused epilogue.

Each op maps to a fixed expression over its operands' expressions; nothing from the model but
numbers reaches the source. Literals are typed (`np.float32(0.5)`) because a bare Python float
would promote float32 arithmetic to float64 inside numba and halve the vector width.
"""
from __future__ import annotations

import math

import numpy as np

from ..errors import ModelcError

_NP = {"float32": "np.float32", "float64": "np.float64", "int64": "np.int64", "int32": "np.int32",
       "int8": "np.int8", "uint8": "np.uint8", "bool": "np.bool_",
       "int16": "np.int16", "uint16": "np.uint16", "uint32": "np.uint32", "uint64": "np.uint64"}


def ctor(dtype) -> str:
    name = np.dtype(dtype).name
    if name not in _NP:
        raise ModelcError(f"no kernel support for dtype {name}")
    return _NP[name]


def lit(value, dtype) -> str:
    """A typed literal; only numbers ever reach generated source."""
    dt = np.dtype(dtype)
    v = np.asarray(value, dt).reshape(())
    if dt.kind == "b":
        return "True" if bool(v) else "False"
    if dt.kind == "f":
        f = float(v)
        if math.isnan(f):
            return f"{ctor(dt)}(np.nan)"
        if math.isinf(f):
            return f"{ctor(dt)}({'-' if f < 0 else ''}np.inf)"
        return f"{ctor(dt)}({f!r})"
    return f"{ctor(dt)}({int(v)})"


def _f(dtype, x):
    return lit(x, dtype)


def emit(op: str, args: list, attrs: dict, dtype, consts: dict | None = None,
         arg_dtypes: list | None = None) -> str:
    """Expression of `op` applied to operand expressions `args` (result of dtype `dtype`).

    `consts` maps an operand position to its constant value when the operand is a literal
    scalar, so ops can specialise (x ** 2 -> x * x, Clip bounds). `arg_dtypes`, where the caller
    knows them, are the operands' dtypes (Pow's exponent may differ from its base).
    """
    consts = consts or {}
    dt = np.dtype(dtype)
    a = args[0] if args else None
    L = lambda x: _f(dt, x)  # noqa: E731
    unary = {
        "Relu": lambda: f"max({a}, {L(0)})",
        "Neg": lambda: f"(-{a})",
        "Abs": lambda: f"abs({a})",
        "Exp": lambda: f"math.exp({a})",
        "Log": lambda: f"math.log({a})",
        "Sqrt": lambda: f"math.sqrt({a})",
        "Tanh": lambda: f"math.tanh({a})",
        "Erf": lambda: f"math.erf({a})",
        "Sin": lambda: f"math.sin({a})",
        "Cos": lambda: f"math.cos({a})",
        "Floor": lambda: f"np.floor({a})",
        "Ceil": lambda: f"np.ceil({a})",
        "Sign": lambda: f"np.sign({a})",
        "Reciprocal": lambda: f"({L(1)} / {a})",
        "Sigmoid": lambda: (f"fast_sigmoid32({a})" if dt == np.float32 else
                            f"({L(1)} / ({L(1)} + math.exp(-{a})))"),
        "Swish": lambda: (f"({a} * fast_sigmoid32({L(attrs.get('alpha', 1.0))} * {a}))" if dt == np.float32
                          else f"({a} / ({L(1)} + math.exp(-{L(attrs.get('alpha', 1.0))} * {a})))"),
        "Softplus": lambda: f"(max({a}, {L(0)}) + math.log1p(math.exp(-abs({a}))))",
        "Softsign": lambda: f"({a} / ({L(1)} + abs({a})))",
        "Gelu": lambda: (f"({L(0.5)} * {a} * ({L(1)} + math.tanh({L(math.sqrt(2 / math.pi))} * "
                         f"({a} + {L(0.044715)} * {a} * {a} * {a}))))"
                         if attrs.get("approximate", "none") == "tanh" else
                         f"({L(0.5)} * {a} * ({L(1)} + math.erf({a} * {L(1 / math.sqrt(2))})))"),
        "LeakyRelu": lambda: f"({a} if {a} >= {L(0)} else {a} * {L(attrs.get('alpha', 0.01))})",
        "Elu": lambda: f"({a} if {a} > {L(0)} else {L(attrs.get('alpha', 1.0))} * math.expm1({a}))",
        "Selu": lambda: (f"({L(attrs.get('gamma', 1.05070102214813232421875))} * ({a} if {a} > {L(0)} else "
                         f"{L(attrs.get('alpha', 1.67326319217681884765625))} * math.expm1({a})))"),
        "HardSigmoid": lambda: (f"min(max({L(attrs.get('alpha', 0.2))} * {a} + {L(attrs.get('beta', 0.5))}, "
                                f"{L(0)}), {L(1)})"),
        "HardSwish": lambda: f"({a} * min(max({a} * {L(1 / 6)} + {L(0.5)}, {L(0)}), {L(1)}))",
        "Mish": lambda: f"({a} * math.tanh(max({a}, {L(0)}) + math.log1p(math.exp(-abs({a})))))",
        "Identity": lambda: a,
        "Dropout": lambda: a,
        "Not": lambda: f"(not {a})",
    }
    if op in unary:
        return unary[op]()
    if op == "Clip":
        out = a
        if len(args) > 1 and args[1]:
            out = f"max({out}, {args[1]})"
        if len(args) > 2 and args[2]:
            out = f"min({out}, {args[2]})"
        return out
    if op == "Cast":
        return f"{ctor(dt)}({a})"
    if op in ("Sum", "Add"):
        return "(" + " + ".join(args) + ")"
    if op == "Mean":
        return f"(({' + '.join(args)}) * {L(1 / len(args))})"
    if op == "Max":
        return f"max({', '.join(args)})" if len(args) > 1 else a
    if op == "Min":
        return f"min({', '.join(args)})" if len(args) > 1 else a
    binary = {"Sub": "-", "Mul": "*", "Div": "/"}
    if op in binary:
        if op == "Div" and dt.kind in "iu":
            return f"{ctor(dt)}(int({args[0]} / {args[1]}))"
        return f"({args[0]} {binary[op]} {args[1]})"
    if op == "Pow":
        return _pow(a, args[1], dt, consts.get(1), (arg_dtypes or [None, None])[1])
    if op == "PRelu":
        return f"({a} if {a} >= {L(0)} else {a} * {args[1]})"
    cmp = {"Equal": "==", "Greater": ">", "Less": "<", "GreaterOrEqual": ">=", "LessOrEqual": "<="}
    if op in cmp:
        return f"({args[0]} {cmp[op]} {args[1]})"
    if op in ("And", "Or"):
        return f"({args[0]} {op.lower()} {args[1]})"
    if op == "Where":
        return f"({args[1]} if {args[0]} else {args[2]})"
    raise ModelcError(f"no elementwise kernel expression for op {op}")


def _pow(a: str, b: str, dt: np.dtype, e, edt) -> str:
    """ONNX Pow (the result has the base's type) as code numba lowers on any CPU.

    With fast-math (`afn`), LLVM rewrites pow(x, (float)n) for an integer n of 32 bits or less
    into `llvm.powi`, which calls compiler-rt's `__powisf2` / `__powidf2`; numba does not link
    them and LLVM aborts the process ("Symbol not found"). So pow goes through `pow_exact`
    (POW_EXACT: compiled without fast-math) with the exponent cast to the base's float type; an
    integer base with an integer exponent uses numba's exact int64 power.
    """
    if e is not None and dt.kind == "f" and float(e) == 2.0:
        return f"({a} * {a})"
    if e is not None and dt.kind == "f" and float(e) == 0.5:
        return f"math.sqrt({a})"
    if dt.kind == "f":
        return f"pow_exact({a}, {ctor(dt)}({b}))"
    if edt is None and e is not None:
        edt = e.dtype
    if edt is not None and np.dtype(edt).kind in "iub":
        # a negative exponent: 1 / a ** -b truncated (numpy's float path, then the cast)
        return (f"({ctor(dt)}(np.int64({a}) ** np.int64({b})) if np.int64({b}) >= 0 else "
                f"{ctor(dt)}(np.float64(1.0) / pow_exact(np.float64({a}), np.float64(-np.int64({b})))))")
    return f"{ctor(dt)}(pow_exact(np.float64({a}), np.float64({b})))"


SUPPORTED = {"Relu", "Neg", "Abs", "Exp", "Log", "Sqrt", "Tanh", "Erf", "Sin", "Cos", "Floor", "Ceil",
             "Sign", "Reciprocal", "Sigmoid", "Softplus", "Softsign", "Gelu", "LeakyRelu", "Elu",
             "Selu", "HardSigmoid", "HardSwish", "Swish", "Mish", "Identity", "Dropout", "Not", "Clip", "Cast",
             "Sum", "Add", "Mean", "Max", "Min", "Sub", "Mul", "Div", "Pow", "PRelu", "Equal",
             "Greater", "Less", "GreaterOrEqual", "LessOrEqual", "And", "Or", "Where"}


# The fast-math flags of every generated kernel: LLVM's `fast` less `nnan` and `ninf`. Those two let
# LLVM assume that no value is NaN or infinite, and attention masks are -inf: with them, a masked
# Pad + Add kernel folded its -inf padding away and an ONNX attention case returned wrong values
# (max error 0.2). Reassociation and contraction, which vectorising reductions and FMAs need, stay.
FASTMATH = "{'afn', 'arcp', 'contract', 'nsz', 'reassoc'}"


# numba has no vector exp here (no SVML): a scalar math.exp per element kept SiLU and sigmoid
# kernels at ~0.5 G elements/s. This one (Cephes' range reduction and polynomial, as the softmax
# kernels use; relative error ~1e-7) is inlined and vectorises; generated kernels that call it
# get its definition from `template.source`.
FAST_SIGMOID = [
    "from modelc.kernels.reduce import f32_from_bits",
    "",
    f"@numba.njit(fastmath={FASTMATH}, inline='always')",
    "def fast_sigmoid32(x):",
    "    d = min(max(-x, np.float32(-87.0)), np.float32(87.0))",
    "    t = np.floor(d * np.float32(1.4426950408889634) + np.float32(0.5))",
    "    r = d - t * np.float32(0.693359375) + t * np.float32(2.12194440e-4)",
    "    p = np.float32(1.9875691500e-4) * r + np.float32(1.3981999507e-3)",
    "    p = p * r + np.float32(8.3334519073e-3)",
    "    p = p * r + np.float32(4.1665795894e-2)",
    "    p = p * r + np.float32(1.6666665459e-1)",
    "    p = p * r + np.float32(5.0000001201e-1)",
    "    e = (p * r * r + r + np.float32(1.0)) * f32_from_bits(np.int32(t * np.float32(8388608.0) + np.float32(1065353216.0)))",
    "    return np.float32(1.0) / (np.float32(1.0) + e)",
]


# Pow without fast-math (see `_pow`): LLVM keeps the call to libm's pow, which numba links.
POW_EXACT = [
    "",
    "@numba.njit(fastmath=False)",
    "def pow_exact(x, y):",
    "    return x ** y",
]
