"""Scalar source expressions for elementwise ops, shared by every template's fused epilogue.

Each op maps to a fixed expression over its operands' expressions; nothing from the model but
numbers reaches the source. Literals are typed (`np.float32(0.5)`) because a bare Python float
would promote float32 arithmetic to float64 inside numba and halve the vector width. Helpers an
expression calls (fast_sigmoid32, pow_exact, ...) are defined in the kernel module by
intrinsics.helpers.
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
         arg_dtypes: list | None = None, fast_erf: bool = True) -> str:
    """Expression of `op` applied to operand expressions `args` (result of dtype `dtype`).

    `consts` maps an operand position to its constant value when the operand is a literal
    scalar, so ops can specialise (x ** 2 -> x * x, Clip bounds). `arg_dtypes`, where the caller
    knows them, are the operands' dtypes (Pow's exponent may differ from its base). `fast_erf`
    computes erf (Erf, exact Gelu) by the float32 polynomial `fast_erf` (intrinsics.FAST_ERF),
    which vectorises where math.erf is a scalar call (a GELU's erf in an elementwise kernel took
    4.6 ns an element); it is float32's precision, so other dtypes call math.erf.
    """
    consts = consts or {}
    dt = np.dtype(dtype)
    a = args[0] if args else None
    L = lambda x: _f(dt, x)  # noqa: E731
    erf = "fast_erf" if fast_erf and dt == np.float32 else "math.erf"   # (fast_erf is float32's)
    adt0 = np.dtype((arg_dtypes or [None])[0] or dt)
    unary = {
        "Relu": lambda: f"max({a}, {L(0)})",
        "Neg": lambda: _int(f"(-{a})", dt),
        "Abs": lambda: _int(f"abs({a})", dt),
        "Exp": lambda: f"math.exp({a})",
        "Log": lambda: f"math.log({a})",
        "Sqrt": lambda: f"math.sqrt({a})",
        "Tanh": lambda: f"math.tanh({a})",
        "Erf": lambda: f"{erf}({a})",
        "Sin": lambda: f"math.sin({a})",
        "Cos": lambda: f"math.cos({a})",
        "Tan": lambda: f"math.tan({a})",
        "Asin": lambda: f"math.asin({a})",
        "Acos": lambda: f"math.acos({a})",
        "Atan": lambda: f"math.atan({a})",
        "Sinh": lambda: f"math.sinh({a})",
        "Cosh": lambda: f"math.cosh({a})",
        "Asinh": lambda: f"math.asinh({a})",
        "Acosh": lambda: f"math.acosh({a})",
        "Atanh": lambda: f"math.atanh({a})",
        "Floor": lambda: f"np.floor({a})",
        "Ceil": lambda: f"np.ceil({a})",
        "Round": lambda: f"np.rint({a})" if dt.kind == "f" else a,     # half to even
        # numba's np.sign reads an unsigned value as signed (sign(200) of a uint8 gave 255)
        "Sign": lambda: (f"{ctor(dt)}({a} > {L(0)})" if dt.kind == "u" else _int(f"np.sign({a})", dt)),
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
                         f"({L(0.5)} * {a} * ({L(1)} + {erf}({a} * {L(1 / math.sqrt(2))})))"),
        "LeakyRelu": lambda: f"({a} if {a} >= {L(0)} else {a} * {L(attrs.get('alpha', 0.01))})",
        "Elu": lambda: f"({a} if {a} > {L(0)} else {L(attrs.get('alpha', 1.0))} * math.expm1({a}))",
        "Selu": lambda: (f"({L(attrs.get('gamma', 1.05070102214813232421875))} * ({a} if {a} > {L(0)} else "
                         f"{L(attrs.get('alpha', 1.67326319217681884765625))} * math.expm1({a})))"),
        "HardSigmoid": lambda: (f"min(max({L(attrs.get('alpha', 0.2))} * {a} + {L(attrs.get('beta', 0.5))}, "
                                f"{L(0)}), {L(1)})"),
        "HardSwish": lambda: f"({a} * min(max({a} * {L(1 / 6)} + {L(0.5)}, {L(0)}), {L(1)}))",
        "Mish": lambda: f"({a} * math.tanh(max({a}, {L(0)}) + math.log1p(math.exp(-abs({a})))))",
        "Celu": lambda: (f"({a} if {a} > {L(0)} else "
                         f"{L(attrs.get('alpha', 1.0))} * math.expm1({a} / {L(attrs.get('alpha', 1.0))}))"),
        "ThresholdedRelu": lambda: f"({a} if {a} > {L(attrs.get('alpha', 1.0))} else {L(0)})",
        "Shrink": lambda: _shrink(a, dt, attrs.get("lambd", 0.5), attrs.get("bias", 0.0)),
        "Identity": lambda: a,
        "Dropout": lambda: a,
        "Not": lambda: f"(not {a})",
        "BitwiseNot": lambda: _int(f"(~{a})", dt),
        "IsNaN": lambda: _float_class(a, adt0, "nan"),
        "IsInf": lambda: _float_class(a, adt0, "inf" if attrs.get("detect_positive", 1) and
                                      attrs.get("detect_negative", 1) else
                                      "+inf" if attrs.get("detect_positive", 1) else
                                      "-inf" if attrs.get("detect_negative", 1) else "none"),
    }
    if op in unary:
        return unary[op]()
    if op == "Clip":
        # floats through llvm.maximum/minimum (NaN in, NaN out, as numba's max() and onnxruntime):
        # numba's min(max()) is a pair of selects that the SLP vectoriser leaves scalar in a
        # conv's epilogue (MobileNetV2's ReLU6 layers)
        mx, mn = ("fmaximum", "fminimum") if dt.kind == "f" else ("max", "min")
        out = a
        if len(args) > 1 and args[1]:
            out = f"{mx}({out}, {args[1]})"
        if len(args) > 2 and args[2]:
            out = f"{mn}({out}, {args[2]})"
        return out
    if op in ("Cast", "CastLike"):
        return f"{ctor(dt)}({a})"
    if op in ("Sum", "Add"):
        return _int("(" + " + ".join(args) + ")", dt)
    if op == "Mean":
        return f"(({' + '.join(args)}) * {L(1 / len(args))})"
    if op == "Max":
        return f"max({', '.join(args)})" if len(args) > 1 else a
    if op == "Min":
        return f"min({', '.join(args)})" if len(args) > 1 else a
    binary = {"Sub": "-", "Mul": "*", "Div": "/"}
    if op in binary:
        if op == "Div" and dt.kind == "u":
            return f"{ctor(dt)}({args[0]} // {args[1]})"
        if op == "Div" and dt.kind == "i":
            # exact (a float division loses int64 digits beyond 2^53), truncated toward zero
            return f"{ctor(dt)}(div_int({args[0]}, {args[1]}))"
        if op == "Div" and dt.kind == "f":
            return f"fdiv({args[0]}, {args[1]})"       # rounded once (intrinsics.fdiv says why)
        if op == "Mul" and dt.kind == "f" and attrs.get("exact"):
            return f"fmul({args[0]}, {args[1]})"       # a quantized op's (intrinsics.fmul)
        return _int(f"({args[0]} {binary[op]} {args[1]})", dt)
    if op == "MulAdd":
        if dt.kind == "f":
            return f"ffma({args[0]}, {args[1]}, {args[2]})"     # rounded once (intrinsics.ffma)
        return _int(f"({args[0]} * {args[1]} + {args[2]})", dt)
    if op == "Pow":
        return _pow(a, args[1], dt, consts.get(1), (arg_dtypes or [None, None])[1])
    if op == "PRelu":
        return f"({a} if {a} >= {L(0)} else {a} * {args[1]})"
    cmp = {"Equal": "==", "Greater": ">", "Less": "<", "GreaterOrEqual": ">=", "LessOrEqual": "<="}
    if op in cmp:
        return f"({args[0]} {cmp[op]} {args[1]})"
    if op in ("And", "Or"):
        return f"({args[0]} {op.lower()} {args[1]})"
    if op == "Xor":
        return f"(bool({args[0]}) != bool({args[1]}))"
    bitwise = {"BitwiseAnd": "&", "BitwiseOr": "|", "BitwiseXor": "^"}
    if op in bitwise:
        return _int(f"({args[0]} {bitwise[op]} {args[1]})", dt)
    if op == "Mod":
        return _mod(args[0], args[1], dt, attrs.get("fmod", 0))
    if op == "BitShift":
        return _bitshift(args[0], args[1], dt, attrs.get("direction", "LEFT"))
    if op == "Where":
        return f"({args[1]} if {args[0]} else {args[2]})"
    raise ModelcError(f"no elementwise kernel expression for op {op}")


def _int(expr: str, dt: np.dtype) -> str:
    """Integer results cast back to their type: numba computes int8/int16/int32 arithmetic in
    int64, so without the cast a value would not wrap (-(-128) stays 128 for the next op)."""
    return f"{ctor(dt)}({expr})" if dt.kind in "iu" else expr


def _shrink(a: str, dt: np.dtype, lambd, bias) -> str:
    """ONNX Shrink; on integers the bounds and bias are float (the reference's promotion), and
    the result is truncated back to the integer type."""
    if dt.kind == "f":
        L = lambda v: lit(v, dt)  # noqa: E731
        return f"({a} + {L(bias)} if {a} < {L(-lambd)} else ({a} - {L(bias)} if {a} > {L(lambd)} else {L(0)}))"
    F = lambda v: lit(v, np.float64)  # noqa: E731
    return (f"({ctor(dt)}({a} + {F(bias)}) if {a} < {F(-lambd)} else "
            f"({ctor(dt)}({a} - {F(bias)}) if {a} > {F(lambd)} else {lit(0, dt)}))")


def _float_class(a: str, adt: np.dtype, what: str) -> str:
    """IsNaN / IsInf as a test of the IEEE bits through an integer view: the kernels' fast-math
    flags do not include nnan/ninf, but a value out of a `nnan` maxnum (the reductions') may be
    assumed not NaN, and a bit test cannot be folded away on such an assumption."""
    if adt.kind != "f" or what == "none":
        return "False"
    bits = 32 if adt == np.float32 else 64
    it = np.dtype(f"int{bits}")
    inf = int(np.array(np.inf, adt).view(it))
    ninf = int(np.array(-np.inf, adt).view(it))
    mask = (1 << (bits - 1)) - 1
    b = f"float_bits({a})"
    if what == "nan":
        return f"(({b} & {lit(mask, it)}) > {lit(inf, it)})"
    if what == "inf":
        return f"(({b} & {lit(mask, it)}) == {lit(inf, it)})"
    return f"({b} == {lit(inf if what == '+inf' else ninf, it)})"


def _mod(a: str, b: str, dt: np.dtype, fmod) -> str:
    """ONNX Mod. fmod=0: the remainder has the divisor's sign (Python's and numpy's mod; for
    floats numba's `%` is exactly numpy's); fmod=1: C's fmod, the dividend's sign. Float
    remainders go through helpers compiled without fast-math (signed zeros, inf operands).
    An integer divisor of 0 gives 0, as numpy does (numba's `%` under error_model='numpy')."""
    if dt.kind == "f":
        return f"{'fmod_exact' if fmod else 'mod_exact'}({a}, {b})"
    if fmod and dt.kind == "i":
        return f"{ctor(dt)}(fmod_int({a}, {b}))"
    return f"{ctor(dt)}({a} % {b})"


def _bitshift(a: str, b: str, dt: np.dtype, direction: str) -> str:
    """ONNX BitShift (opset 28 semantics): a shift by a negative amount or by the type's width
    or more gives 0, or -1 for a right shift of a negative signed value (LLVM's shifts would be
    poison there)."""
    if dt.kind not in "iu":
        raise ModelcError(f"BitShift of {dt.name} values has no kernel expression")
    width = dt.itemsize * 8
    zero = lit(0, dt)
    ok = f"{zero} <= {b} < {lit(width, dt)}" if dt.kind == "i" else f"{b} < {lit(width, dt)}"
    if direction == "LEFT":
        return f"({ctor(dt)}({a} << {b}) if {ok} else {zero})"
    spill = f"({lit(-1, dt)} if {a} < {zero} else {zero})" if dt.kind == "i" else zero
    return f"({ctor(dt)}({a} >> {b}) if {ok} else {spill})"


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
             "Sum", "Add", "Mean", "Max", "Min", "Sub", "Mul", "Div", "Pow", "PRelu", "Equal", "MulAdd",
             "Greater", "Less", "GreaterOrEqual", "LessOrEqual", "And", "Or", "Where",
             "Tan", "Asin", "Acos", "Atan", "Sinh", "Cosh", "Asinh", "Acosh", "Atanh", "Round",
             "Celu", "ThresholdedRelu", "Shrink", "IsNaN", "IsInf", "CastLike", "Xor", "Mod",
             "BitShift", "BitwiseAnd", "BitwiseOr", "BitwiseXor", "BitwiseNot"}
