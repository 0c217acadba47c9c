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

import platform
import sys

import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

_X86 = platform.machine().lower() in ("x86_64", "amd64", "i686", "x86")


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
        "from modelc.kernels.launch import call_chunk, flush_denormals, restore_csr",
        "",
        "@numba.njit('void(intp, intp[::1], intp, intp, int32[::1])', parallel=True, cache=True, nogil=True)",
        "def drive(addr, table, n, nchunks, mode):",
        "    if nchunks <= 1:",
        "        csr = flush_denormals(mode[0])",
        f"        call_chunk(addr, table, {nwords}, 0, n)",
        "        restore_csr(csr)",
        "    else:",
        "        for c in prange(nchunks):",
        "            csr = flush_denormals(mode[0])",
        f"            call_chunk(addr, table, {nwords}, c * n // nchunks, (c + 1) * n // nchunks)",
        "            restore_csr(csr)",
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

    def bind(self, arrays, nchunks: int | None = None, shared=()) -> "BoundKernel":
        return BoundKernel(self, arrays, nchunks, shared)

    def __call__(self, *arrays):
        self.bind(arrays)()


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.ctypes.data == b.ctypes.data and a.nbytes == b.nbytes


class BoundKernel:
    """A kernel with its arrays fixed: calling it runs the kernel with no per-call preparation.

    It holds the arrays, so their memory stays valid for as long as the kernel can be called.
    """

    def __init__(self, kernel: CompiledKernel, arrays, nchunks: int | None = None, shared=()):
        import numba
        arrays = tuple(arrays)
        if len(arrays) != kernel.nargs:
            raise TypeError(f"kernel takes {kernel.nargs} arrays, got {len(arrays)}")
        for k, (a, dt) in enumerate(zip(arrays, kernel.dtypes)):
            if not (isinstance(a, np.ndarray) and a.flags.c_contiguous and a.flags.writeable
                    and a.dtype == dt):
                raise TypeError(f"kernel argument {k} must be a writable C-contiguous {dt} array, "
                                f"got {type(a).__name__} {getattr(a, 'dtype', '')}")
        # `shared`: inputs that may be an output's very array, where the kernel reads each of their
        # elements only right before storing that element of the output (`Template.stores_in_place`)
        for k in kernel.outputs:
            if any(np.may_share_memory(arrays[k], a) and not (j in shared and _same(a, arrays[k]))
                   for j, a in enumerate(arrays) if j != k):
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
        self._args = (kernel.address, self.table, kernel.n_items, self.nchunks, DENORMALS)
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


# a waiting thread spins this many times (`pause`, some microseconds in all) before it gives its
# core away at each further check: when more threads than cores run (several callers at once),
# the chunk it waits for may belong to a thread that is not running
SPINS = 2000
SEQUENCE_SPLIT = 4      # chunks per thread of a parallel kernel in a sequence


def sequence_source(stamped: bool = False) -> str:
    """The native loop that runs a module's kernels in order, in one parallel region.

    Each of the team's threads walks the kernel list: it claims its own chunks of the current
    kernel (an atomic exchange of each chunk's flag), then any chunk still unclaimed, runs what it
    claimed, and waits (spinning) until every chunk of that kernel is done before it goes on to
    the next. Own chunks first keep a thread on the data it wrote in the kernel before; a parallel
    kernel has SEQUENCE_SPLIT chunks per thread, so that a thread whose core is slow (a VM's core
    shared with another guest) leaves the last of its share to the others rather than keep them
    waiting, and they take it from the back. One fork
    and join per run instead of one per kernel: numba's OpenMP region cost 1.5-2.7 us to open and
    close, 0.1 ms over MobileNetV2's 56 kernels.
    A thread only waits for chunks that a running thread has claimed, so the loop cannot deadlock
    whatever the threading layer does with the team (a team of one runs every chunk itself).
    `stamped`: the first thread also reads the cycle counter before the first kernel and after
    each, so kernels are timed where they run, between their real neighbours (Module.profile)."""
    return "\n".join([
        "import numba",
        "from numba import prange",
        "from modelc.kernels.launch import call_chunk_words, atomic_add, atomic_load, atomic_xchg, cpu_relax,"
        " yield_cpu, flush_denormals, restore_csr"
        + (", cycle_counter" if stamped else ""),
        "",
        "@numba.njit('void(intp[::1], intp[::1], intp[::1], intp[::1], intp[::1], intp[::1], int64[::1], intp, intp,"
        " int32[::1]"
        + (", int64[::1]" if stamped else "") + ")',",
        "            parallel=True, cache=True, nogil=True)",
        "def run_sequence(addrs, words, starts, nwords, items, chunks, claims, slot, nthreads, mode"
        + (", stamps" if stamped else "") + "):",
        "    if nthreads <= 1:",          # every kernel serial: no parallel region at all
        *(["        stamps[0] = cycle_counter()"] if stamped else []),
        "        csr = flush_denormals(mode[0])",
        "        for k in range(addrs.size):",
        "            for c in range(chunks[k]):",
        "                call_chunk_words(addrs[k], words, starts[k], nwords[k], c * items[k] // chunks[k],",
        "                                 (c + 1) * items[k] // chunks[k])",
        *(["            stamps[k + 1] = cycle_counter()"] if stamped else []),
        "        restore_csr(csr)",
        "        return",
        "    for q in range(claims.size):",   # (a loop: `claims[:] = 0` would be a parallel region of its own)
        "        claims[q] = 0",
        "    for t in prange(nthreads):",
        # stamped: the first kernel starts when the first thread of the team does, not when the region
        # was asked for (a thread that waited for a core charged its wait to the first kernel)
        *(["        if atomic_xchg(stamps, addrs.size + 1, 1) == 0:",
           "            stamps[0] = cycle_counter()"] if stamped else []),
        "        csr = flush_denormals(mode[0])",
        "        for k in range(addrs.size):",
        "            n = items[k]",
        "            nc = chunks[k]",
        "            base = k * slot",
        "            lo = t * nc // nthreads",  # its own chunks first, in order (as a static schedule),
        "            mine = (t + 1) * nc // nthreads - lo",
        "            for j in range(nc):",      # then the others' still unclaimed, from the back of the
        "                c = lo + j if j < mine else (lo - 1 - (j - mine)) % nc",   # thread's before it
        "                if atomic_xchg(claims, base + 1 + c, 1) == 0:",
        "                    call_chunk_words(addrs[k], words, starts[k], nwords[k], c * n // nc, (c + 1) * n // nc)",
        # stamped: a kernel ends with its last chunk, on whichever thread ran it; not when thread 0 (perhaps
        # descheduled while the others ran its chunks and the next kernel's) sees that it ended
        *(["                    if atomic_add(claims, base, 1) == nc - 1:",
           "                        stamps[k + 1] = cycle_counter()"] if stamped else
          ["                    atomic_add(claims, base, 1)"]),
        "            spins = 0",
        "            while atomic_load(claims, base) < nc:",
        "                spins += 1",
        f"                if spins < {SPINS}:",
        "                    cpu_relax()",
        "                else:",
        "                    yield_cpu()",
        "        restore_csr(csr)",
        *(["",
           "@numba.njit('int64()', cache=True, nogil=True)",
           "def counter():",
           "    return cycle_counter()"] if stamped else []),
        ""])


def _slot(context, builder, sig, args):
    ary = context.make_array(sig.args[0])(context, builder, args[0])
    return builder.gep(ary.data, [args[1]])


def _atomic_rmw(op: str, doc: str):
    """An intrinsic f(arr, index, value) doing LLVM's atomic `op` on an int64 arr[index] (sequentially
    consistent) and returning the value before it."""
    def fn(typingctx, arr, index, value):
        if not (isinstance(arr, types.Array) and arr.dtype == types.int64):
            return None

        def codegen(context, builder, sig, args):
            return builder.atomic_rmw(op, _slot(context, builder, sig, args), args[2], "seq_cst")

        return types.int64(arr, types.intp, types.int64), codegen

    fn.__doc__ = doc
    return intrinsic(fn)


atomic_add = _atomic_rmw("add", "arr[index] += value as one atomic step; the value before it.")
atomic_xchg = _atomic_rmw("xchg", "Store value at arr[index] as one atomic step; the value before it.")


@intrinsic
def atomic_load(typingctx, arr, index):
    """arr[index], read with acquire ordering (what the thread that counted it wrote before is visible)."""
    if not (isinstance(arr, types.Array) and arr.dtype == types.int64):
        return None

    def codegen(context, builder, sig, args):
        return builder.load_atomic(_slot(context, builder, sig, args), "acquire", 8)

    return types.int64(arr, types.intp), codegen


@intrinsic
def cpu_relax(typingctx):
    """x86's `pause` in a spin loop: the waiting thread yields its core's issue slots to a sibling
    hyperthread (on another machine, nothing)."""
    def codegen(context, builder, sig, args):
        _pause(builder)
        return context.get_dummy_value()

    return types.void(), codegen


def _pause(builder):
    if _X86:
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), []),
                                            "llvm.x86.sse2.pause")
        builder.call(fn, [])


@intrinsic
def cycle_counter(typingctx):
    """The CPU's time-stamp counter (`rdtsc` on x86; 0 where LLVM has no counter)."""
    def codegen(context, builder, sig, args):
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.IntType(64), []),
                                            "llvm.readcyclecounter")
        return builder.call(fn, [])

    return types.int64(), codegen


# MXCSR's flush-to-zero (results below float32's smallest normal are 0) and denormals-are-zero (such
# inputs read as 0): x86 multiplies a denormal through a microcode assist of ~100 cycles. Swin's
# shifted-window attention masks scores with -100, its softmax leaves exp(-100) ~ 4e-44 in half a
# row, and the product with V ran 24x the unmasked block's time (4.2 against 0.18 ms; numpy's matmul
# 92x; Intel Xeon, Emerald Rapids). Kernels run with both set unless `set_flush_denormal(False)`,
# and each thread's own MXCSR is restored after, so the caller's numpy keeps IEEE underflow.
# TensorFlow flushes by default too; onnxruntime (`session.set_denormal_as_zero`) and OpenVINO
# (`CPU_DENORMALS_OPTIMIZATION`) on request. What it changes lies below 1.2e-38 in magnitude.
FLUSH_DENORMALS = 0x8040
DENORMALS = np.array([FLUSH_DENORMALS], np.int32)      # the bits set while kernels run (read each run)


def set_flush_denormal(on: bool) -> None:
    """Whether kernels flush denormals to zero (the default) or compute them as IEEE 754 says,
    from the next run of any module on."""
    DENORMALS[0] = FLUSH_DENORMALS if on else 0


def _mxcsr(builder, name: str, slot):
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), [ir.IntType(8).as_pointer()]),
                                        f"llvm.x86.sse.{name}")
    builder.call(fn, [builder.bitcast(slot, ir.IntType(8).as_pointer())])


@intrinsic
def flush_denormals(typingctx, bits):
    """Set `bits` (FLUSH_DENORMALS or 0) in the calling thread's MXCSR; the value before it (0 and
    nothing done on a CPU without MXCSR)."""
    def codegen(context, builder, sig, args):
        i32 = ir.IntType(32)
        if not _X86:
            return ir.Constant(i32, 0)
        slot = cgutils.alloca_once(builder, i32)
        _mxcsr(builder, "stmxcsr", slot)
        old = builder.load(slot)
        builder.store(builder.or_(old, args[0]), slot)
        _mxcsr(builder, "ldmxcsr", slot)
        return old

    return types.int32(types.int32), codegen


@intrinsic
def restore_csr(typingctx, old):
    """Load `old` (flush_denormals' result) back into the calling thread's MXCSR."""
    def codegen(context, builder, sig, args):
        if _X86:
            slot = cgutils.alloca_once(builder, ir.IntType(32))
            builder.store(args[0], slot)
            _mxcsr(builder, "ldmxcsr", slot)
        return context.get_dummy_value()

    return types.void(types.int32), codegen


_LINUX_X86_64 = sys.platform.startswith("linux") and platform.machine().lower() in ("x86_64", "amd64")
if _LINUX_X86_64:
    import llvmlite.binding
    llvmlite.binding.initialize_native_asmparser()     # numba does not: inline assembly needs it


@intrinsic
def yield_cpu(typingctx):
    """sched_yield(2): the calling thread steps back so that another runnable one gets its core
    (Linux x86-64, where it is system call 24; elsewhere a `pause`)."""
    def codegen(context, builder, sig, args):
        if _LINUX_X86_64:
            i64 = ir.IntType(64)
            asm = ir.InlineAsm(ir.FunctionType(i64, [i64]), "syscall", "={rax},{rax},~{rcx},~{r11},~{memory}",
                               side_effect=True)
            builder.call(asm, [ir.Constant(i64, 24)])
        else:
            _pause(builder)
        return context.get_dummy_value()

    return types.void(), codegen


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
        # the team: as many threads as the widest kernel has chunks bound (one, if all run serially);
        # each parallel kernel split into SEQUENCE_SPLIT chunks a thread
        self.nthreads = max((c.nchunks for c in calls), default=1)
        self.chunks = np.array([min(c.kernel.n_items, c.nchunks * SEQUENCE_SPLIT) if c.nchunks > 1 else 1
                                for c in calls], np.intp)
        # per kernel: chunks done, then a claim flag per chunk, on cache lines of their own
        self.slot = -(-(int(self.chunks.max(initial=1)) + 1) // 8) * 8
        self.claims = np.zeros(len(calls) * self.slot, np.int64)     # zeroed by each run
        self._args = (self.addrs, self.words, self.starts, self.nwords, self.items, self.chunks,
                      self.claims, self.slot, self.nthreads, DENORMALS)
        self._run = run_sequence

    def __call__(self):
        self._run(*self._args)

    def stamped(self, run_profiled) -> np.ndarray:
        """Run once through `run_profiled` (`sequence_source(stamped=True)`); the counter's ticks each
        kernel took, in order."""
        stamps = np.zeros(len(self.calls) + 2, np.int64)     # and a flag: the team's first thread began
        run_profiled(*self._args, stamps)
        return np.diff(stamps[:-1])
