"""Evict arrays from the CPU caches before a timed run, as TVM's `enable_cpu_cache_flush` does.

Why: a kernel timed in a loop finds its weights in cache on every call after the first, but in a
module each layer's weights were pushed out by every other layer since the last inference. On
2-core EPYC the isolated timings of ResNet-18's and MobileNetV2's kernels summed to 1.3 ms less
than the module took, and configs that won by a few percent when warm made the tuned modules
0.97x of the untuned ones. So the runner flushes a kernel's constant arrays (packed weights,
bias), its output buffer and any second activation before each timed call; only the activation
the previous kernel has just written stays warm (worker.cold_arrays).
"""
from __future__ import annotations

import numba
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

LINE = 64


@intrinsic
def _clflush(typingctx, arr, offset):
    """`clflush` of the cache line holding byte `offset` of `arr`'s data."""
    if not isinstance(arr, types.Array):
        return None

    def codegen(context, builder, sig, args):
        a, off = args
        i8p = ir.IntType(8).as_pointer()
        data = builder.bitcast(context.make_array(sig.args[0])(context, builder, a).data, i8p)
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), [i8p]),
                                            "llvm.x86.sse2.clflush")
        builder.call(fn, [builder.gep(data, [off])])
        return context.get_dummy_value()

    return types.void(arr, types.intp), codegen


@numba.njit(cache=True, nogil=True)
def flush(a):
    """Write back and evict every cache line of `a` (a C-contiguous array)."""
    nbytes = a.size * a.itemsize
    for off in range(0, nbytes, LINE):
        _clflush(a, off)


def supported() -> bool:
    """clflush is an x86 instruction; elsewhere timings stay warm."""
    import platform
    return platform.machine().lower() in ("x86_64", "amd64", "i686", "x86")
