"""Launching kernels: each kernel is a serial function over a range of its parallel loop's items,
and one small parallel driver per argument count splits that range across the threads.

Why: `njit(parallel=True)` runs numba's parfor passes and compiles a gufunc for every kernel,
which made a parallel kernel 2-4x slower to compile than the same loop written serially
(shared/PERFORMANCE.md; measured again on ResNet-18's convolutions: 4.6-5.5 s against 2.0 s).
Tuning is compile-bound, so kernels are now `cfunc`s `kernel(p0, n0, p1, n1, ..., lo, hi)` (a data
pointer and an element count per array, then the items [lo, hi) to compute), and the driver -
compiled once per argument count and cached on disk like any kernel - calls them through their
address, one contiguous chunk per thread, as numba's own static schedule would. The arrays arrive
as real function arguments, not pointers read from a table: LLVM then knows that they cannot alias
the kernel's stack tile, and keeps the tile in registers (read from a table, the same conv ran 3x
slower: its accumulators went to memory behind a runtime alias check).
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.core.compiler import Compiler
from numba.extending import intrinsic


class NoAliasCompiler(Compiler):
    """numba's pipeline with the kernel's pointer arguments marked `noalias`, as numba marks the
    arrays of the gufuncs it makes from parallel loops. Without it LLVM had to assume that an
    output may overlap an input: the epilogue loops of the dense kernels stayed scalar and the
    transformer's dense layers ran 3x slower. Modules never give a kernel an output buffer that
    overlaps another of its arrays (`BoundKernel` checks).
    """

    def define_pipelines(self):
        self.state.flags.noalias = True
        return super().define_pipelines()


@intrinsic
def call_chunk(typingctx, addr, table, nargs, lo, hi):
    """Call the cfunc at `addr` with `nargs` 64-bit words from `table`, then `lo` and `hi`.

    Pointers and intp counts travel in the same 64-bit integer registers, so the words are passed
    as i64 and the cfunc reads the pointers it declared.
    """
    if not isinstance(nargs, types.IntegerLiteral) or not isinstance(table, types.Array):
        return None
    n = nargs.literal_value

    def codegen(context, builder, sig, args):
        a, t, _, low, high = args
        data = context.make_array(sig.args[1])(context, builder, t).data
        _emit_call(builder, a, data, ir.Constant(ir.IntType(64), 0), n, low, high)
        return context.get_dummy_value()

    return types.void(types.intp, table, nargs, types.intp, types.intp), codegen


def _emit_call(builder, addr, data, first, n: int, low, high):
    """Call the function at `addr` with words data[first:first+n] (as i64), then low and high."""
    i64 = ir.IntType(64)
    words = [builder.load(builder.gep(data, [builder.add(first, ir.Constant(i64, k))])) for k in range(n)]
    fnty = ir.FunctionType(ir.VoidType(), [i64] * (n + 2))
    builder.call(builder.inttoptr(addr, fnty.as_pointer()), words + [low, high])


def driver_source(nwords: int) -> str:
    """The driver for kernels taking `nwords` words: chunk c of `nchunks` gets items
    [c*n//nchunks, (c+1)*n//nchunks); one chunk is called directly, without starting threads."""
    return "\n".join([
        "import numba",
        "from numba import prange",
        "from modelc.kernels.launch import call_chunk",
        "",
        "@numba.njit('void(intp, intp[::1], intp, intp)', parallel=True, cache=True, nogil=True)",
        "def drive(addr, table, n, nchunks):",
        "    if nchunks <= 1:",
        f"        call_chunk(addr, table, {nwords}, 0, n)",
        "    else:",
        "        for c in prange(nchunks):",
        f"            call_chunk(addr, table, {nwords}, c * n // nchunks, (c + 1) * n // nchunks)",
        ""])


class CompiledKernel:
    """A compiled kernel: call it with its argument arrays, or `bind` them once for repeated runs."""

    def __init__(self, cfunc, n_items: int, parallel: bool, dtypes: tuple, outputs: tuple, drive):
        self.cfunc = cfunc
        self.address = cfunc.address
        self.n_items = n_items
        self.parallel = parallel
        self.dtypes = tuple(np.dtype(d) for d in dtypes)
        self.nargs = len(self.dtypes)
        self.outputs = tuple(outputs)            # positions of the arrays the kernel writes
        self._drive = drive

    def bind(self, arrays, nchunks: int | None = None) -> "BoundKernel":
        return BoundKernel(self, arrays, nchunks)

    def __call__(self, *arrays):
        self.bind(arrays)()


class BoundKernel:
    """A kernel with its arrays fixed: calling it runs the kernel with no per-call preparation.

    It holds the arrays, so their memory stays valid for as long as the kernel can be called.
    """

    def __init__(self, kernel: CompiledKernel, arrays, nchunks: int | None = None):
        import numba
        arrays = tuple(arrays)
        if len(arrays) != kernel.nargs:
            raise TypeError(f"kernel takes {kernel.nargs} arrays, got {len(arrays)}")
        for k, (a, dt) in enumerate(zip(arrays, kernel.dtypes)):
            if not (isinstance(a, np.ndarray) and a.flags.c_contiguous and a.flags.writeable
                    and a.dtype == dt):
                raise TypeError(f"kernel argument {k} must be a writable C-contiguous {dt} array, "
                                f"got {type(a).__name__} {getattr(a, 'dtype', '')}")
        for k in kernel.outputs:
            if any(np.may_share_memory(arrays[k], a) for j, a in enumerate(arrays) if j != k):
                raise ValueError(f"kernel output {k} overlaps another of its arrays")
        self.arrays = arrays
        self.table = np.array([v for a in arrays for v in (a.ctypes.data, a.size)], np.intp)
        if nchunks is None:
            # one chunk per thread, as numba's static schedule; the thread count is read here, as
            # onnxruntime fixes its threads when a session is made (`numba.set_num_threads`
            # before `compile` or `bind`)
            nchunks = numba.get_num_threads() if kernel.parallel else 1
        self.nchunks = max(1, min(nchunks, kernel.n_items))
        self.kernel = kernel
        self._args = (kernel.address, self.table, kernel.n_items, self.nchunks)
        self._drive = kernel._drive

    def __call__(self):
        self._drive(*self._args)


MAX_WORDS = 64          # kernels of at most 32 arrays run inside a sequence; larger ones alone


@intrinsic
def call_chunk_words(typingctx, addr, table, start, nwords, lo, hi):
    """Like `call_chunk`, for a word count known only at run time: a switch over the even counts
    up to MAX_WORDS, each case a call of that arity (a count out of range calls nothing)."""
    if not isinstance(table, types.Array):
        return None

    def codegen(context, builder, sig, args):
        a, t, first, nw, low, high = args
        i64 = ir.IntType(64)
        data = context.make_array(sig.args[1])(context, builder, t).data
        end = builder.append_basic_block("sequence.call.end")
        switch = builder.switch(nw, end)
        for n in range(2, MAX_WORDS + 1, 2):
            block = builder.append_basic_block(f"sequence.call.{n}")
            switch.add_case(ir.Constant(i64, n), block)
            builder.position_at_end(block)
            _emit_call(builder, a, data, first, n, low, high)
            builder.branch(end)
        builder.position_at_end(end)
        return context.get_dummy_value()

    return types.void(types.intp, table, types.intp, types.intp, types.intp, types.intp), codegen


def sequence_source(stamped: bool = False) -> str:
    """The native loop that runs a module's kernels in order. `stamped`: the same loop reading the
    cycle counter before the first kernel and after each, so a module's kernels are timed where they
    run, between their real neighbours, with no Python call between them (Module.profile)."""
    return "\n".join([
        "import numba",
        "from numba import prange",
        "from modelc.kernels.launch import call_chunk_words" + (", cycle_counter" if stamped else ""),
        "",
        "@numba.njit('void(intp[::1], intp[::1], intp[::1], intp[::1], intp[::1], intp[::1]"
        + (", int64[::1]" if stamped else "") + ")',",
        "            parallel=True, cache=True, nogil=True)",
        "def run_sequence(addrs, words, starts, nwords, items, chunks" + (", stamps" if stamped else "") + "):",
        *(["    stamps[0] = cycle_counter()"] if stamped else []),
        "    for k in range(addrs.size):",
        "        n = items[k]",
        "        nc = chunks[k]",
        "        if nc <= 1:",
        "            call_chunk_words(addrs[k], words, starts[k], nwords[k], 0, n)",
        "        else:",
        "            for c in prange(nc):",
        "                call_chunk_words(addrs[k], words, starts[k], nwords[k], c * n // nc, (c + 1) * n // nc)",
        *(["        stamps[k + 1] = cycle_counter()", "",
           "@numba.njit('int64()', cache=True, nogil=True)",
           "def counter():",
           "    return cycle_counter()"] if stamped else []),
        ""])


@intrinsic
def cycle_counter(typingctx):
    """The CPU's time-stamp counter (`rdtsc` on x86; 0 where LLVM has no counter)."""
    def codegen(context, builder, sig, args):
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.IntType(64), []),
                                            "llvm.readcyclecounter")
        return builder.call(fn, [])

    return types.int64(), codegen


class Sequence:
    """Bound kernels run one after another by one native call: a module's run then costs one
    Python call per stretch of generated kernels, not one per kernel (each of which also had to
    type-check its arguments)."""

    def __init__(self, calls: list, run_sequence):
        self.calls = list(calls)            # BoundKernels; they keep the arrays alive
        self.addrs = np.array([c.kernel.address for c in calls], np.intp)
        self.nwords = np.array([c.table.size for c in calls], np.intp)
        self.starts = np.concatenate([[0], np.cumsum(self.nwords)[:-1]]).astype(np.intp)
        self.words = np.concatenate([c.table for c in calls]).astype(np.intp)
        self.items = np.array([c.kernel.n_items for c in calls], np.intp)
        self.chunks = np.array([c.nchunks for c in calls], np.intp)
        self._args = (self.addrs, self.words, self.starts, self.nwords, self.items, self.chunks)
        self._run = run_sequence

    def __call__(self):
        self._run(*self._args)

    def stamped(self, run_profiled) -> np.ndarray:
        """Run once through `run_profiled` (`sequence_source(stamped=True)`); the counter's ticks each
        kernel took, in order."""
        stamps = np.zeros(len(self.calls) + 1, np.int64)
        run_profiled(*self._args, stamps)
        return np.diff(stamps)
