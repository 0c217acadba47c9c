"""A fixed-size array on the stack, for register tiles (accumulators) inside kernels.

`np.zeros` inside a parallel loop goes through numba's runtime allocator and LLVM cannot keep
the tile in registers; an `alloca` of a literal size can be promoted to registers. Use as
`acc = carray(stack_empty(128, np.float32), 128)` (`template.source` keeps just the pointer when the
body only indexes it); the memory lives until the function returns, so it must never escape.
"""
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic


@intrinsic
def stack_empty(typingctx, size, dtype):
    if not isinstance(size, types.IntegerLiteral):
        return None
    n = size.literal_value
    elem = dtype.dtype

    def codegen(context, builder, sig, args):
        return cgutils.alloca_once(builder, context.get_data_type(elem), size=n)

    return types.CPointer(elem)(size, dtype), codegen
