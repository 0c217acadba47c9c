"""Integer dot products for quantized kernels, as numba intrinsics for generated kernels.

A quantized convolution sums products of 8-bit integers. As float32 FMAs (how modelc computed them
first) that is 16 products per 512-bit instruction (8 per 256-bit one). x86 has two exact integer
forms with more:
- VNNI's `vpdpbusd` (AVX-512 VNNI: Ice Lake and later Xeons, Zen 4; AVX-VNNI: Alder Lake and later)
  multiplies unsigned bytes by signed bytes and adds each four into an int32 lane: 4x float32's
  products per instruction. The input is stored as x - x_min (0..255), and x_min times each output's
  weight sum is added back.
- `vpmaddwd` (every AVX2 CPU, AVX-512 BW) multiplies int16 pairs and adds each two into an int32
  lane: 2x float32's. The centered input (-255..255) and the weights are stored as int16.
Both keep every partial sum exact in int32, as onnxruntime's are (float32's only below 2^24).

numba has neither vector types nor these instructions, so a kernel holds its accumulators in a
numba type whose LLVM value is a vector (`I32Vector`: an SSA value LLVM keeps in a register, as it
cannot keep an array in memory) and updates them through `dot_u8s8` / `dot_s16`. `DotForm` says
which a target has; a kernel calls only that one (LLVM aborts on an instruction the target lacks).
Measured on AMD EPYC (Zen 4), one thread: a 6-pixel x 64-channel register tile of `vpdpbusd` ran a
3136 x 256 x 256 product at 271 GOP/s, where float32 FMAs reach about 75 GFLOP/s on that CPU.
"""
from __future__ import annotations

from dataclasses import dataclass

from llvmlite import ir as llir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic, models, register_model

_I32 = llir.IntType(32)
_I16 = llir.IntType(16)
_VPDPBUSD = {16: "llvm.x86.avx512.vpdpbusd.512", 8: "llvm.x86.avx512.vpdpbusd.256"}
_VPMADDWD = {16: "llvm.x86.avx512.pmaddw.d.512", 8: "llvm.x86.avx2.pmadd.wd"}


@dataclass(frozen=True)
class DotForm:
    """How a target's quantized kernels multiply: `lanes` int32 accumulators per vector, each
    adding `per` products per instruction of the input (stored as `x_dtype`) and the weights
    (`w_dtype`), by the intrinsic `call`; `shifted`: the input is stored as x - x_min."""
    lanes: int
    per: int
    x_dtype: str
    w_dtype: str
    call: str
    shifted: bool


def dot_form(tg) -> DotForm | None:
    """The target's integer dot product (Target.int8_dot_lanes / int16_dot_lanes), or None."""
    if tg.int8_dot_lanes:
        return DotForm(tg.int8_dot_lanes, 4, "uint8", "int8", "dot_u8s8", True)
    if tg.int16_dot_lanes:
        return DotForm(tg.int16_dot_lanes, 2, "int16", "int16", "dot_s16", False)
    return None


class I32Vector(types.Type):
    """`lanes` int32 accumulators in one vector register."""

    def __init__(self, lanes: int):
        self.lanes = lanes
        super().__init__(name=f"i32x{lanes}")


VECTORS = {n: I32Vector(n) for n in (8, 16)}


@register_model(I32Vector)
class _VectorModel(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, llir.VectorType(_I32, fe_type.lanes))


def _address(context, builder, ty, value, offset, pointee):
    """A pointer to element `offset` of an array or pointer argument, as `pointee`*."""
    if isinstance(ty, types.Array):
        value = context.make_array(ty)(context, builder, value).data
    return builder.bitcast(builder.gep(value, [offset]), pointee.as_pointer())


def _memory(ty, dtype) -> bool:
    return isinstance(ty, (types.Array, types.CPointer)) and ty.dtype == dtype


def _operands(context, builder, sig, args, lanes):
    """The broadcast 32-bit word at x[x_at] and the vector of weight words at w[w_at]."""
    acc, xv, xo, wv, wo = args
    vt = llir.VectorType(_I32, lanes)
    word = builder.load(_address(context, builder, sig.args[1], xv, xo, _I32), align=1)
    spread = builder.insert_element(llir.Constant(vt, None), word, llir.Constant(_I32, 0))
    spread = builder.shuffle_vector(spread, llir.Constant(vt, None), llir.Constant(vt, [0] * lanes))
    weights = builder.load(_address(context, builder, sig.args[3], wv, wo, vt), align=1)
    return acc, spread, weights, vt


@intrinsic
def dot_zero(typingctx, lanes):
    """A vector of `lanes` (a literal: 8 or 16) zero accumulators."""
    if not isinstance(lanes, types.IntegerLiteral) or lanes.literal_value not in VECTORS:
        return None
    vt = VECTORS[lanes.literal_value]

    def codegen(context, builder, sig, args):
        return llir.Constant(llir.VectorType(_I32, vt.lanes), [0] * vt.lanes)

    return vt(lanes), codegen


@intrinsic
def dot_u8s8(typingctx, acc, x, x_at, w, w_at):
    """acc[j] + sum over i < 4 of x[x_at + i] * w[w_at + 4 j + i]: the bytes x[x_at:x_at+4]
    (unsigned) against each lane's four weights (signed), one `vpdpbusd`."""
    if not isinstance(acc, I32Vector) or not _memory(x, types.uint8) or not _memory(w, types.int8):
        return None
    lanes = acc.lanes

    def codegen(context, builder, sig, args):
        a, spread, weights, vt = _operands(context, builder, sig, args, lanes)
        fn = cgutils.get_or_insert_function(builder.module, llir.FunctionType(vt, [vt, vt, vt]), _VPDPBUSD[lanes])
        return builder.call(fn, [a, spread, weights])

    return acc(acc, x, types.uintp, w, types.uintp), codegen


@intrinsic
def dot_s16(typingctx, acc, x, x_at, w, w_at):
    """acc[j] + x[x_at] * w[w_at + 2 j] + x[x_at + 1] * w[w_at + 2 j + 1] (int16), one `vpmaddwd`
    and an add."""
    if not isinstance(acc, I32Vector) or not _memory(x, types.int16) or not _memory(w, types.int16):
        return None
    lanes = acc.lanes

    def codegen(context, builder, sig, args):
        a, spread, weights, vt = _operands(context, builder, sig, args, lanes)
        ht = llir.VectorType(_I16, 2 * lanes)
        fn = cgutils.get_or_insert_function(builder.module, llir.FunctionType(vt, [ht, ht]), _VPMADDWD[lanes])
        return builder.add(a, builder.call(fn, [builder.bitcast(spread, ht), builder.bitcast(weights, ht)]))

    return acc(acc, x, types.uintp, w, types.uintp), codegen


@intrinsic
def dot_store(typingctx, acc, out, at):
    """Store the accumulators to out[at:at + lanes] (int32)."""
    if not isinstance(acc, I32Vector) or not _memory(out, types.int32):
        return None

    def codegen(context, builder, sig, args):
        a, ov, oo = args
        vt = llir.VectorType(_I32, sig.args[0].lanes)
        builder.store(a, _address(context, builder, sig.args[1], ov, oo, vt), align=4)
        return context.get_dummy_value()

    return types.none(acc, out, types.uintp), codegen
