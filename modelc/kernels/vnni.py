"""Integer dot products on x86's VNNI (`vpdpbusd`), as numba intrinsics for generated kernels.

A quantized convolution sums products of 8-bit integers. As float32 FMAs (how modelc computed them
first) that is 16 products per 512-bit instruction; `vpdpbusd` multiplies 64 unsigned bytes by 64
signed bytes and adds each four into 16 int32 lanes, exactly. numba has neither vector types nor
this instruction, so a kernel holds its accumulators in a numba type whose LLVM value is a
vector (`I32Vector`: an SSA value LLVM keeps in a register, as it cannot keep an array in
memory) and updates them through `dot_u8s8`. A kernel may call these only where the target has the
instruction (`Target.has_vnni`): elsewhere the CPU would stop the process on it.

LLVM selects the 256-bit form for AVX-VNNI CPUs (VEX) and AVX512-VL ones (EVEX) from one intrinsic.
Measured on AMD EPYC (Zen 4), one thread: a 6-pixel x 64-channel register tile of this loop ran a
3136 x 256 x 256 product at 271 GOP/s, where float32 FMAs reach about 75 GFLOP/s on that CPU.
"""
from __future__ import annotations

from llvmlite import ir as llir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic, models, register_model

_I32 = llir.IntType(32)
_INTRINSIC = {16: "llvm.x86.avx512.vpdpbusd.512", 8: "llvm.x86.avx512.vpdpbusd.256"}


class I32Vector(types.Type):
    """`lanes` int32 accumulators in one vector register."""

    def __init__(self, lanes: int):
        self.lanes = lanes
        super().__init__(name=f"i32x{lanes}")


VECTORS = {n: I32Vector(n) for n in _INTRINSIC}


@register_model(I32Vector)
class _VectorModel(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, llir.VectorType(_I32, fe_type.lanes))


def _address(context, builder, ty, value, offset, pointee):
    """A pointer to element `offset` of an array or pointer argument, as `pointee`*."""
    if isinstance(ty, types.Array):
        value = context.make_array(ty)(context, builder, value).data
    return builder.bitcast(builder.gep(value, [offset]), pointee.as_pointer())


def _memory(ty) -> bool:
    return isinstance(ty, (types.Array, types.CPointer))


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
    (unsigned) against each of the lanes' four weights (signed), one `vpdpbusd`."""
    if not isinstance(acc, I32Vector) or not (_memory(x) and x.dtype == types.uint8) or \
            not (_memory(w) and w.dtype == types.int8):
        return None
    lanes = acc.lanes

    def codegen(context, builder, sig, args):
        a, xv, xo, wv, wo = args
        vt = llir.VectorType(_I32, lanes)
        word = builder.load(_address(context, builder, sig.args[1], xv, xo, _I32), align=1)
        spread = builder.insert_element(llir.Constant(vt, None), word, llir.Constant(_I32, 0))
        spread = builder.shuffle_vector(spread, llir.Constant(vt, None), llir.Constant(vt, [0] * lanes))
        weights = builder.load(_address(context, builder, sig.args[3], wv, wo, vt), align=1)
        fn = cgutils.get_or_insert_function(builder.module, llir.FunctionType(vt, [vt, vt, vt]),
                                            _INTRINSIC[lanes])
        return builder.call(fn, [a, spread, weights])

    return acc(acc, x, types.uintp, w, types.uintp), codegen


@intrinsic
def dot_store(typingctx, acc, out, at):
    """Store the accumulators to out[at:at + lanes] (int32)."""
    if not isinstance(acc, I32Vector) or not (_memory(out) and out.dtype == types.int32):
        return None

    def codegen(context, builder, sig, args):
        a, ov, oo = args
        vt = llir.VectorType(_I32, sig.args[0].lanes)
        builder.store(a, _address(context, builder, sig.args[1], ov, oo, vt), align=4)
        return context.get_dummy_value()

    return types.none(acc, out, types.uintp), codegen
