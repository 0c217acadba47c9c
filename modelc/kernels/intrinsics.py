"""The helpers generated kernels call: LLVM intrinsics wrapped for numba, and the source of small
numba functions a kernel module defines for itself when its body calls them.

Both exist because a plain numba expression would not vectorise or would not compile: numba has
no vector exp or erf here (no SVML), its max() is a select that LLVM does not treat as a
reduction, and some libm calls must be compiled without fast-math (see each). Generated modules
import the intrinsics from this module (cache.py hashes it into every kernel's file name) and
get the text helpers from `helpers`, which `template.source` calls.
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir as llir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

# The fast-math flags of every generated kernel: LLVM's `fast` less `nnan` and `ninf`. Those two let
# LLVM assume that no value is NaN or infinite, and attention masks are -inf: with them, a masked
# Pad + Add kernel folded its -inf padding away and an ONNX attention case returned wrong values
# (max error 0.2). Reassociation and contraction, which vectorising reductions and FMAs need, stay.
FASTMATH = "{'afn', 'arcp', 'contract', 'nsz', 'reassoc'}"
# Without reassociation: for kernels whose only reductions run along scalar loops (a direct
# convolution's input channels), where LLVM, allowed to reorder sums, vectorised that loop instead
# of the output channels' one (conv2d.py says why).
FASTMATH_IN_ORDER = "{'afn', 'arcp', 'contract', 'nsz'}"


# ---- intrinsics (imported by generated modules) ---------------------------------------------------

# The module generated kernels import the intrinsics from: this one.
MODULE = __name__


def imports(*names: str) -> str:
    """The import line of a generated module that calls the intrinsics `names`."""
    return f"from {MODULE} import {', '.join(names)}"


@intrinsic
def f32_from_bits(typingctx, bits):
    """The float32 whose IEEE bits are the int32 `bits` (vectorisable: a bitcast)."""
    if bits != types.int32:
        return None

    def codegen(context, builder, sig, args):
        return builder.bitcast(args[0], llir.FloatType())

    return types.float32(types.int32), codegen


@intrinsic
def float_bits(typingctx, x):
    """The IEEE bits of a float32 (as int32) or float64 (as int64): a bitcast, which no fast-math
    assumption about NaN or infinity can fold (IsNaN / IsInf test these bits)."""
    if x == types.float32:
        sig, lt = types.int32(types.float32), llir.IntType(32)
    elif x == types.float64:
        sig, lt = types.int64(types.float64), llir.IntType(64)
    else:
        return None

    def codegen(context, builder, sig, args):
        return builder.bitcast(args[0], lt)

    return sig, codegen


@intrinsic
def prefetch(typingctx, base, index, level):
    """Ask for the cache line of base[index] (an array or a kernel's raw pointer) ahead of its
    loads, into the L1 (level 1: `prefetcht0`) or the L2 (2: `prefetcht1`): a hint, so an index
    past the end is harmless (no load happens)."""
    if not isinstance(base, (types.Array, types.CPointer)) or not isinstance(index, types.Integer) or \
            not isinstance(level, types.IntegerLiteral) or level.literal_value not in (1, 2):
        return None
    locality = 4 - level.literal_value

    def codegen(context, builder, sig, args):
        data = args[0] if isinstance(sig.args[0], types.CPointer) else \
            context.make_array(sig.args[0])(context, builder, args[0]).data
        i8p, i32 = llir.IntType(8).as_pointer(), llir.IntType(32)
        fn = cgutils.get_or_insert_function(builder.module, llir.FunctionType(llir.VoidType(), [i8p, i32, i32, i32]),
                                            "llvm.prefetch.p0i8")
        # (read, locality 3: into the L1 / 2: the L2, data cache)
        builder.call(fn, [builder.bitcast(builder.gep(data, [args[1]]), i8p), i32(0), i32(locality), i32(1)])
        return context.get_dummy_value()

    return types.none(base, index, level), codegen


# ---- float16 storage ------------------------------------------------------------------------------
# float16 tensors are uint16 bits in generated kernels and their values are computed in float32:
# numba has no CPU float16 type, and its own conversions call compiler-rt helpers it does not link.
# LLVM's fpext / fptrunc of `half` are single instructions (vcvtph2ps / vcvtps2ph) where the CPU
# converts half (x86 F16C, on every AVX2 CPU; AArch64), vectorised like any other, and fptrunc rounds
# to nearest even as numpy's astype(float16) does. Target.converts_half says where they are safe.

def _half(arg, ret, convert, doc: str):
    """An intrinsic f(x) of one numba type `arg` to `ret`, lowered by convert(builder, x)."""
    @intrinsic
    def fn(typingctx, x):
        if x != arg:
            return None

        def codegen(context, builder, sig, args):
            return convert(builder, args[0])

        return ret(arg), codegen
    fn.__doc__ = doc
    return fn


_HALF = llir.HalfType()
h2f = _half(types.uint16, types.float32, lambda b, x: b.fpext(b.bitcast(x, _HALF), llir.FloatType()),
            "The float32 value of the float16 whose bits are the uint16 `x`.")
f2h = _half(types.float32, types.uint16, lambda b, x: b.bitcast(b.fptrunc(x, _HALF), llir.IntType(16)),
            "The bits (uint16) of float32 `x` rounded to float16.")
r16 = _half(types.float32, types.float32, lambda b, x: b.fpext(b.fptrunc(x, _HALF), llir.FloatType()),
            "float32 `x` rounded to the nearest float16 value (an op's float16 result, kept in float32).")


def _minmax(name: str, nan: bool = False):
    @intrinsic
    def fn(typingctx, a, b):
        """llvm.maxnum/minnum with fast-math flags: unlike numba's max(), LLVM vectorises it as a
        reduction (numba's select-based max() stays scalar in reduction loops). With `nan`,
        llvm.maximum/minimum, which return NaN for a NaN operand as onnxruntime's Clip does."""
        if not (isinstance(a, types.Float) and a == b):
            return None

        def codegen(context, builder, sig, args):
            lt = args[0].type
            suffix = "f32" if lt == llir.FloatType() else "f64"
            f = cgutils.get_or_insert_function(builder.module, llir.FunctionType(lt, [lt, lt]),
                                               f"llvm.{name}.{suffix}")
            # `nnan` lets LLVM vectorise the reduction; never `ninf`: masked rows hold -inf
            flags = ("nsz", "arcp", "contract", "afn", "reassoc")
            return builder.call(f, args, fastmath=flags if nan else ("nnan",) + flags)

        return a(a, b), codegen
    return fn


def _rounded_once(name: str, build, doc: str):
    """An intrinsic a OP b of two equal float types whose instruction carries `nsz` alone: numba
    adds the kernel's fast-math flags only to instructions that have none, so LLVM may neither
    reassociate it, contract it into an FMA, nor replace a division by a reciprocal's multiply."""
    @intrinsic
    def fn(typingctx, a, b):
        if not (isinstance(a, types.Float) and a == b):
            return None

        def codegen(context, builder, sig, args):
            r = build(builder)(args[0], args[1])
            r.flags.append("nsz")
            return r

        return a(a, b), codegen
    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = doc
    return fn


fdiv = _rounded_once("fdiv", lambda b: b.fdiv, """a / b rounded once, as IEEE and onnxruntime divide: with
`arcp` LLVM multiplied by a reciprocal hoisted out of the loop, 1 ulp off, which moved a QuantizeLinear's
x / scale across a rounding tie (25 where onnxruntime gives 26; a float64 quotient does not help: LLVM
narrows it back to a float32 division).""")
fmul = _rounded_once("fmul", lambda b: b.fmul, """a * b rounded once, where a dequantize must give onnx-
runtime's value bit for bit: (q - zero_point) * scale, which LLVM with `reassoc` distributed into
q * scale - zero_point * scale and contracted into an FMA, 1 ulp off in most elements.""")


@intrinsic
def ffma(typingctx, a, b, c):
    """a * b + c rounded once: llvm.fma, which LLVM neither splits nor reassociates (MLAS's
    QLinearAdd is two of them; contracting a Mul and an Add is LLVM's choice, this is not)."""
    if not (isinstance(a, types.Float) and a == b == c):
        return None

    def codegen(context, builder, sig, args):
        lt = args[0].type
        f = cgutils.get_or_insert_function(builder.module, llir.FunctionType(lt, [lt, lt, lt]),
                                           f"llvm.fma.{'f32' if lt == llir.FloatType() else 'f64'}")
        return builder.call(f, args)

    return a(a, b, c), codegen


fmax = _minmax("maxnum")
fmin = _minmax("minnum")
# NaN-propagating: elementwise Clip in an epilogue, where numba's min(max()) stays scalar
fmaximum = _minmax("maximum", nan=True)
fminimum = _minmax("minimum", nan=True)


# ---- exp as a polynomial (float32) ----------------------------------------------------------------
# Cephes' expf: exp(d) = 2^t * e^r with t = round(d / ln 2) and r = d - t ln 2 (ln 2 in two parts
# for precision), e^r by a degree-6 polynomial, 2^t built from its IEEE bits by `f32_from_bits`.
# Relative error ~1e-7 for d in [-87, 87]; every step vectorises. The constants are kept as the
# text the kernels print them as.
_LOG2E = "1.4426950408889634"
_LN2 = ("0.693359375", "2.12194440e-4")
_POLY = ("1.9875691500e-4", "1.3981999507e-3", "8.3334519073e-3", "4.1665795894e-2",
         "1.6666665459e-1", "5.0000001201e-1")


def exp_polynomial(dst: str, d: str, t: str, r: str, p: str, number) -> list:
    """Lines setting `dst` = exp(`d`) for a float32 `d` already clamped to [-87, 87], with
    temporaries `t`, `r`, `p`; `number(text)` prints a constant given as decimal text."""
    F = number
    lines = [f"{t} = np.floor({d} * {F(_LOG2E)} + {F('0.5')})",
             f"{r} = {d} - {t} * {F(_LN2[0])} + {t} * {F(_LN2[1])}",
             f"{p} = {F(_POLY[0])} * {r} + {F(_POLY[1])}"]
    lines += [f"{p} = {p} * {r} + {F(c)}" for c in _POLY[2:]]
    return lines + [f"{dst} = ({p} * {r} * {r} + {r} + {F('1.0')}) * "
                    f"f32_from_bits(np.int32({t} * {F('8388608.0')} + {F('1065353216.0')}))"]


def exp_lines(dst: str, src: str, dtype, var: str) -> list:
    """Lines setting `dst` = exp(`src`) for `src` <= 0 (float32: the polynomial, which vectorises;
    a softmax's x - max is never positive). Temporaries are named `var` + d, t, r, p."""
    if np.dtype(dtype) != np.float32:
        return [f"{dst} = math.exp({src})"]
    F = lambda text: f"np.float32({float(np.float32(float(text)))!r})"  # noqa: E731  (as expr.lit prints)
    d, t, r, p = (f"{var}{s}" for s in "dtrp")
    return [f"{d} = fmax({src}, {F('-87.0')})", *exp_polynomial(dst, d, t, r, p, F)]


# ---- helpers defined in the kernel module that calls them -----------------------------------------

# A scalar math.exp per element kept SiLU and sigmoid kernels at ~0.5 G elements/s; this sigmoid
# (the exp polynomial) vectorises. It is inlined by LLVM, not by numba: numba's inline='always'
# copied and typed the body once per call (14 per row of a conv tile), and EfficientNet's 1x1 conv +
# SiLU compiled in 2.45 s instead of 1.6, to the same instructions (AMD EPYC Zen 4).
FAST_SIGMOID = [
    imports("f32_from_bits"),
    "",
    f"@numba.njit(fastmath={FASTMATH})",
    "def fast_sigmoid32(x):",
    "    d = min(max(-x, np.float32(-87.0)), np.float32(87.0))",
    *("    " + ln for ln in exp_polynomial("e", "d", "t", "r", "p", lambda text: f"np.float32({text})")),
    "    return np.float32(1.0) / (np.float32(1.0) + e)",
]

# math.tanh is a scalar library call too (numba here has no vector math library), and a recurrent
# layer's cell calls it once or twice per unit and step. Odd Taylor terms through x^11 below 0.3
# (the next term is 2e-9 of the value there), (1 - e) / (1 + e) with e = exp(-2|x|) (the sigmoid's
# exp polynomial) above, the sign restored; tanh(9) rounds to 1 in float32.
FAST_TANH = [
    imports("f32_from_bits"),
    "",
    f"@numba.njit(fastmath={FASTMATH})",
    "def fast_tanh32(x):",
    "    a = min(abs(x), np.float32(9.0))",
    "    d = np.float32(-2.0) * a",
    *("    " + ln for ln in exp_polynomial("e", "d", "t", "r", "p", lambda text: f"np.float32({text})")),
    "    big = (np.float32(1.0) - e) / (np.float32(1.0) + e)",
    "    q = a * a",
    "    small = a + a * q * (np.float32(-1 / 3) + q * (np.float32(2 / 15) + q * (np.float32(-17 / 315) + "
    "q * (np.float32(62 / 2835) + q * np.float32(-1382 / 155925)))))",
    "    v = small if a < np.float32(0.3) else big",
    "    return v if x >= np.float32(0.0) else -v",
]

# math.erf compiles to a scalar library call that keeps the epilogue loop from vectorising (the
# GELU dense of the transformer ran at 0.15x of the same kernel without it); this rational
# approximation (Eigen's / XLA's float32 erf, max abs error 3.3e-7 on [-6, 6]) vectorises.
# np.divide keeps numba from emitting a division-by-zero check (q <= -0.0142 anyway). Inlined by
# numba: left to LLVM, the call stayed and the transformer's GELU dense ran 0.33 -> 0.49 ms.
FAST_ERF = [
    f"@numba.njit(fastmath={FASTMATH}, inline='always')",
    "def fast_erf(x):",
    "    x = np.float32(4.0) if x >= np.float32(4.0) else x",      # (NaN stays NaN, as erf(NaN))
    "    x = np.float32(-4.0) if x <= np.float32(-4.0) else x",
    "    x2 = x * x",
    "    p = x2 * np.float32(-2.72614225801306e-10) + np.float32(2.77068142495902e-08)",
    "    p = x2 * p + np.float32(-2.10102402082508e-06)",
    "    p = x2 * p + np.float32(-5.69250639462346e-05)",
    "    p = x2 * p + np.float32(-7.34990630326855e-04)",
    "    p = x2 * p + np.float32(-2.95459980854025e-03)",
    "    p = x2 * p + np.float32(-1.60960333262415e-02)",
    "    q = x2 * np.float32(-1.45660718464996e-05) + np.float32(-2.13374055278905e-04)",
    "    q = x2 * q + np.float32(-1.68282697438203e-03)",
    "    q = x2 * q + np.float32(-7.37332916720468e-03)",
    "    q = x2 * q + np.float32(-1.42647390514189e-02)",
    "    return np.divide(x * p, q)",
    "",
]

# Pow without fast-math (expr.py's `_pow` says why): LLVM keeps the call to libm's pow, which numba
# links.
POW_EXACT = [
    "",
    "@numba.njit(fastmath=False)",
    "def pow_exact(x, y):",
    "    return x ** y",
]

# Remainders (expr.py's `_mod`), compiled without fast-math: `nsz` would lose the signed zeros
# numpy's and C's remainders define. Not inlined by numba (inline='always' would lower them with
# the kernel's flags); LLVM inlines them with their own instruction flags. error_model='numpy': a
# zero divisor gives NaN (floats) or 0 (integers) instead of raising inside a cfunc.
MOD_EXACT = [
    "",
    "@numba.njit(fastmath=False, error_model='numpy')",
    "def mod_exact(x, y):",
    "    return x % y",
]
FMOD_EXACT = [
    "",
    "@numba.njit(fastmath=False, error_model='numpy')",
    "def fmod_exact(x, y):",
    "    return np.fmod(x, y)",
]
# numba's np.fmod on integers rounds like `%` (fmod(-7, 2) gave 1): C's remainder from Python's
FMOD_INT = [
    "",
    "@numba.njit(error_model='numpy')",
    "def fmod_int(x, y):",
    "    r = x % y",
    "    if r != 0 and (r < 0) != (x < 0):",
    "        r -= y",
    "    return r",
]
# C's integer division (toward zero) from Python's floor division; a zero divisor gives 0
DIV_INT = [
    "",
    "@numba.njit(error_model='numpy')",
    "def div_int(x, y):",
    "    q = x // y",
    "    if (x % y != 0) and ((x < 0) != (y < 0)):",
    "        q += 1",
    "    return q",
]
FLOAT_BITS = [imports("float_bits")]

# helper name -> the lines defining it in a kernel module that calls it
HELPERS = {"fast_erf": FAST_ERF, "fast_sigmoid32": FAST_SIGMOID, "fast_tanh32": FAST_TANH, "pow_exact": POW_EXACT,
           "mod_exact": MOD_EXACT, "fmod_exact": FMOD_EXACT, "fmod_int": FMOD_INT, "div_int": DIV_INT,
           "float_bits": FLOAT_BITS, "fmaximum": [imports("fmaximum")], "fminimum": [imports("fminimum")],
           "fdiv": [imports("fdiv")], "fmul": [imports("fmul")], "ffma": [imports("ffma")],
           "h2f": [imports("h2f")], "f2h": [imports("f2h")], "r16": [imports("r16")],
           "prefetch": [imports("prefetch")]}


def calls_polynomial(body: list) -> bool:
    """Whether kernel lines call an approximation written as a polynomial (erf, the sigmoid's exp),
    whose vectorised form LLVM finds only when it may reassociate."""
    return any(f"{name}(" in ln for ln in body for name in ("fast_erf", "fast_sigmoid32", "fast_tanh32"))


def helpers(body: list, defined: list = ()) -> list:
    """The definitions of the helpers that the kernel lines `body` call, less those the lines
    `defined` (a template's own extra lines) already define."""
    out = []
    for name, lines in HELPERS.items():
        if any(f"{name}(" in ln for ln in body) and not any(_defines(ln, name) for ln in defined):
            out += lines
    return out


def _defines(line: str, name: str) -> bool:
    """Whether a kernel module's line defines `name` or imports it from this module."""
    head = f"from {MODULE} import "
    return f"def {name}(" in line or (line.startswith(head) and name in line[len(head):].replace(" ", "").split(","))
