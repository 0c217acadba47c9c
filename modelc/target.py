"""The target: one description of the CPU that kernels are generated and tuned for.

Register tiles, channel blocks, parallel thresholds, the cost model's cache features and the
tuning records' target all follow from these few numbers, so that a default chosen on an
AVX-512 machine (32 registers of 16 float32) is not carried to an AVX2 one (16 registers of 8),
where the same tiles spill (docs/performance.md: untuned modules shaped for one ran 1.6-3.4x
slower than onnxruntime on the other). `Target.host()` reads the running machine; a target can
also be described by hand (`Target.from_features`) to generate, test or reason about kernels for
another CPU, and `use(target)` makes it the one templates see.

Nothing here imports numba: `prefer_wide_vectors` must run before numba starts.
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
import os
import platform
import sys
from dataclasses import asdict, dataclass, replace

# Vector FMA pipes and their latency in cycles, by LLVM CPU name prefix: how many independent
# accumulators keep the pipes busy (pipes x latency). Unknown CPUs get (2, 4), which every x86
# core of the last decade meets or exceeds.
_FMA = {"znver1": (2, 5), "znver": (2, 4), "skylake": (2, 4), "cascadelake": (2, 4),
        "icelake": (2, 4), "sapphirerapids": (2, 4), "emeraldrapids": (2, 4),
        "graniterapids": (2, 4), "haswell": (2, 5), "broadwell": (2, 5)}
_DEFAULT_FMA = (2, 4)
# LLVM CPU name prefixes whose FMA pipes are narrower than their vectors: Zen 4 runs each 512-bit
# FMA on both of its 256-bit pipes, so it issues one a cycle where Intel's AVX-512 cores issue two
_HALF_WIDTH_FMA = {"znver4": 256}
# Bytes one core reads a cycle from beyond its L2, by LLVM CPU name prefix: AMD's Zen cores read
# their L3 at 32 bytes a cycle; Intel's server cores reach theirs over a mesh, and a 2-core Xeon
# (Sapphire Rapids class) streamed Winograd's weights at about 8 (winograd.stream_share). Others: 16.
_BEYOND_L2 = {"znver": 32, "sapphirerapids": 8, "emeraldrapids": 8, "graniterapids": 8,
              "icelake-server": 8, "skylake-avx512": 8, "cascadelake": 8, "cooperlake": 8}
_DEFAULT_BEYOND_L2 = 16
# Cache sizes when the OS does not say (bytes): a small modern core.
_DEFAULT_CACHES = (32 << 10, 1 << 20, 32 << 20)
RESERVED_REGISTERS = 4      # vector registers a register tile leaves for operands and broadcasts
ISA_PREFIXES = ("avx", "fma", "sse4", "amx", "neon", "sve")


def _by_prefix(table: dict, llvm_cpu: str, default):
    """The value of the first of `table`'s LLVM CPU name prefixes that `llvm_cpu` starts with."""
    return next((v for k, v in table.items() if llvm_cpu.startswith(k)), default)


# Intel's x86 cores with AMX are its server cores since Sapphire Rapids. Under a hypervisor that
# reports another model number, LLVM names them after a client core, whose rows in the tables above
# do not fit them: a 2-core KVM Xeon with AMX, AVX512-FP16, 2 MiB of L2 a core and a 480 MiB L3
# (model 167) read "rocketlake", whose cores reach their L3 over a ring, not a mesh.
_AMX_CORES = ("sapphirerapids", "emeraldrapids", "graniterapids", "diamondrapids")


def _core(llvm_cpu: str, isa) -> str:
    """The name the tables are read by: LLVM's, unless its features show a core LLVM misnamed."""
    if "amx-tile" in isa and not llvm_cpu.startswith(_AMX_CORES):
        return _AMX_CORES[0]
    return llvm_cpu


@dataclass(frozen=True)
class Target:
    cpu: str                    # the model name the OS reports ("AMD EPYC", "Intel Xeon ...")
    llvm_cpu: str               # LLVM's name for the microarchitecture (znver4, sapphirerapids)
    isa: tuple                  # vector ISA features kernels are compiled with, sorted
    vector_bits: int            # width of the vectors LLVM is asked to use
    vector_registers: int       # architectural vector registers (32 with AVX-512, 16 with AVX2)
    fma_pipes: int              # vector FMAs issued per cycle
    fma_latency: int            # cycles before an FMA's result can be used
    fma_bits: int               # width of one FMA pipe (256 on Zen 4 under 512-bit vectors)
    l1d_bytes: int              # per core
    l2_bytes: int               # per core
    l3_bytes: int               # shared
    threads: int                # worker threads a kernel runs on

    # ---- what templates derive from it -----------------------------------------------------
    def lanes(self, itemsize: int = 4) -> int:
        """Elements of `itemsize` bytes in one vector (float32: 16 with AVX-512, 8 with AVX2)."""
        return max(1, self.vector_bits // (8 * itemsize))

    @property
    def max_tile_vectors(self) -> int:
        """Accumulator vectors a register tile may hold without spilling."""
        return self.vector_registers - RESERVED_REGISTERS

    @property
    def vector_fmas_per_cycle(self) -> float:
        """FMAs of whole vectors one core issues a cycle: 2 on Intel's AVX-512 cores and on AVX2
        machines, 1 on AMD Zen 4 (each 512-bit FMA takes both of its 256-bit pipes)."""
        return self.fma_pipes * min(self.vector_bits, self.fma_bits) / self.vector_bits

    @property
    def beyond_l2_bytes_per_cycle(self) -> int:
        """What one core streams a cycle from its last-level cache or memory (`_BEYOND_L2`)."""
        return _by_prefix(_BEYOND_L2, _core(self.llvm_cpu, self.isa), _DEFAULT_BEYOND_L2)

    def fma_slots(self, n: int) -> int:
        """FMA issue slots of one multiply-add over `n` float32 lanes: LLVM vectorises a loop of n at
        the widest of a vector, half or quarter of one that divides n (24 channels on AVX-512: three
        256-bit FMAs), and a vector wider than an FMA pipe takes a slot per pipe width (Zen 4)."""
        width = next((w for w in (self.lanes(4), self.lanes(4) // 2, self.lanes(4) // 4) if w and n % w == 0), 1)
        return -(-n // width) * max(1, width * 32 // self.fma_bits)

    @property
    def flops_per_cycle(self) -> int:
        """float32 FLOPs one core completes a cycle at its FMA peak: 64 on Intel's AVX-512 server
        cores, 32 on AMD Zen 4 and on AVX2 machines."""
        return int(2 * self.vector_fmas_per_cycle * self.lanes(4))

    @property
    def accumulators_in_flight(self) -> int:
        """Independent accumulators that keep the FMA pipes busy (fewer leave them idle)."""
        return self.fma_pipes * self.fma_latency

    def tile_fits(self, pixels: int, vectors: int, operands: int = 0) -> bool:
        """Whether a register tile of `pixels` x `vectors` accumulators (a broadcast input times
        `vectors` weight vectors per pixel) fits the registers: its accumulators, its weight vectors
        twice over (LLVM loads the next input channel's while the FMAs of this one run) and, without
        AVX-512's broadcast operand, the broadcast input. On AVX2 the tiles past 16 all spilled, 2-3x
        slower (conv2d's 8 x 1 accumulators with 4 weight vectors: 48 stack accesses in the loop;
        conv_generic's 6 x 2: 1.7x), and no conv2d task's best on AVX-512 (115 of five models)
        needed more than 30 of 32. `operands`: other vectors the loop keeps (a scale's broadcast)."""
        acc = pixels * vectors
        return acc <= self.max_tile_vectors and \
            acc + 2 * vectors + operands + (0 if self.broadcast_in_fma else 1) <= self.vector_registers

    @staticmethod
    def hoisted_registers(rows: int, vectors: int) -> int:
        """Vector registers a tile keeps where LLVM hoists each of its rows' (pixels') broadcast inputs
        above the FMAs and streams the weight (B) vectors through one register: accumulators + a
        register a row + one (AVX2, from the assembly: conv2d's 5 pixels x 2 vectors and 3 x 4, the
        GEMM's 3 x 32, compile without a spill; 6 x 2, 4 x 3, 6 x 16 and 4 x 24 spilled)."""
        return rows * vectors + rows + 1

    @property
    def broadcast_in_fma(self) -> bool:
        """Whether an FMA reads a broadcast scalar straight from memory (AVX-512's embedded
        broadcast). Elsewhere (AVX2) each broadcast is an instruction of its own on the load ports,
        so a register tile wants two vectors of outputs per broadcast input, or the loads bound it."""
        return "avx512f" in self.isa

    def broadcasts_by_pixel(self, pixels: int, vectors: int) -> bool:
        """Whether a register tile's source loads each pixel's broadcast input right before that
        pixel's FMAs, rather than every pixel's first. From the usual order LLVM hoists every
        broadcast above the FMAs (one with two uses is not folded into them), so a tile needs its
        accumulators + pixels + weight vectors in registers, and past the registers it spilled:
        Xeon (Sapphire Rapids class), 1x1 convs 512 -> 128 on 28x28 and 256 -> 64 on 56x56 in tiles
        of 14 pixels x 2 vectors ran 0.81-0.90 of the 7 x 2 default's time pixel by pixel and
        1.66x spilled. Only with the FMA's broadcast operand: on AVX2, where each broadcast takes a
        register anyway, pixel-by-pixel source still spilled and ran 0.82-3.2x the usual order."""
        return self.broadcast_in_fma and pixels * vectors + pixels + vectors > self.vector_registers

    @property
    def vectors_per_broadcast(self) -> int:
        """Output vectors a register tile wants per broadcast input: two where a broadcast is an
        instruction of its own (AVX2), or where two vector FMAs issue a cycle and a broadcast
        operand on every one of them would take as many loads (Intel's AVX-512 cores); one where a
        core issues one FMA of its vectors a cycle (AMD Zen 4's 512-bit FMAs)."""
        return 2 if not self.broadcast_in_fma or self.vector_fmas_per_cycle >= 2 else 1

    @property
    def converts_half(self) -> bool:
        """Whether float16 converts to and from float32 in one instruction (x86's F16C, which came
        before AVX2 on Intel and AMD alike; AArch64): generated kernels then take float16 tensors
        (intrinsics.h2f). Elsewhere LLVM would call compiler-rt helpers numba does not link."""
        return any(f in self.isa for f in ("avx2", "avx512f", "neon")) or self.llvm_cpu.startswith(
            ("apple", "cortex", "neoverse"))

    @property
    def int8_dot_lanes(self) -> int:
        """int32 lanes of one 8-bit dot product instruction (VNNI's `vpdpbusd`, kernels/int_dot.py):
        16 with AVX-512 VNNI on 512-bit vectors, 8 on 256-bit ones (AVX512-VL, or AVX-VNNI without
        AVX-512), 0 without VNNI."""
        if "avx512vnni" in self.isa and self.vector_bits >= 512:
            return 16
        if "avx512vnni" in self.isa and "avx512vl" in self.isa or "avxvnni" in self.isa:
            return 8
        return 0

    @property
    def int16_dot_lanes(self) -> int:
        """int32 lanes of one int16 pair product instruction (`vpmaddwd`, kernels/int_dot.py), the
        quantized kernels' form without VNNI: 16 with AVX-512 BW on 512-bit vectors, 8 with AVX2."""
        if "avx512bw" in self.isa and self.vector_bits >= 512:
            return 16
        return 8 if "avx2" in self.isa else 0

    # ---- records ------------------------------------------------------------------------------
    def record(self) -> dict:
        """What a measurement depends on, as tuning records store it (and match it)."""
        return {"cpu": self.cpu, "llvm_cpu": self.llvm_cpu, "isa": list(self.isa), "threads": self.threads}

    def describe(self) -> str:
        return (f"{self.cpu} ({self.llvm_cpu}): {self.vector_bits}-bit vectors x {self.vector_registers} "
                f"registers, {self.fma_pipes} FMA pipes of {self.fma_bits} bits, L1d {self.l1d_bytes >> 10} KiB, "
                f"L2 {self.l2_bytes >> 10} KiB, L3 {self.l3_bytes >> 20} MiB, {self.threads} threads")

    def to_json(self) -> dict:
        return {**asdict(self), "isa": list(self.isa)}

    # ---- construction -------------------------------------------------------------------------
    @classmethod
    def from_features(cls, llvm_cpu: str, features: str, *, cpu: str | None = None, threads: int = 1,
                      caches: tuple | None = None) -> "Target":
        """A target from LLVM's CPU name and feature string ("+avx2,+fma,-avx512f,..."), as
        numba compiles for it; cache sizes (l1d, l2, l3 bytes) default to a small modern core."""
        on = {f[1:] for f in features.split(",") if f.startswith("+")}
        isa = tuple(sorted(f for f in on if f.startswith(ISA_PREFIXES)))
        if "avx512f" in on:
            bits, regs = (256 if "prefer-256-bit" in on else 512), 32
        elif "avx" in on:
            bits, regs = 256, 16
        elif "neon" in on or llvm_cpu.startswith(("apple", "cortex", "neoverse")):
            bits, regs = 128, 32
        else:
            bits, regs = 128, 16
        pipes, latency = _by_prefix(_FMA, _core(llvm_cpu, isa), _DEFAULT_FMA)
        fma_bits = _by_prefix(_HALF_WIDTH_FMA, _core(llvm_cpu, isa), bits)
        l1, l2, l3 = caches or _DEFAULT_CACHES
        return cls(cpu=cpu or llvm_cpu, llvm_cpu=llvm_cpu, isa=isa, vector_bits=bits, vector_registers=regs,
                   fma_pipes=pipes, fma_latency=latency, fma_bits=fma_bits, l1d_bytes=int(l1),
                   l2_bytes=int(l2), l3_bytes=int(l3), threads=int(threads))

    @classmethod
    def host(cls, threads: int | None = None) -> "Target":
        """The running machine, with numba's thread count (or `threads`)."""
        t = _host()
        if threads is None:
            import numba
            threads = numba.get_num_threads()
        return replace(t, threads=int(threads))


@functools.lru_cache(maxsize=None)
def _host() -> Target:
    import llvmlite.binding as llvm
    name = os.environ.get("NUMBA_CPU_NAME") or llvm.get_host_cpu_name()
    features = os.environ.get("NUMBA_CPU_FEATURES") or llvm.get_host_cpu_features().flatten()
    return Target.from_features(name, features, cpu=cpu_model(), threads=1, caches=cache_sizes())


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cache_sizes() -> tuple:
    """(L1 data, L2, L3) bytes of CPU 0, from sysfs, else sysconf, else the defaults."""
    found = {}
    base = "/sys/devices/system/cpu/cpu0/cache"
    try:
        for entry in sorted(os.listdir(base)):
            if not entry.startswith("index"):
                continue
            d = os.path.join(base, entry)
            with open(os.path.join(d, "level")) as f:
                level = int(f.read())
            with open(os.path.join(d, "type")) as f:
                kind = f.read().strip()
            with open(os.path.join(d, "size")) as f:
                size = _bytes(f.read().strip())
            if kind != "Instruction" and size:
                found.setdefault(level, size)
    except (OSError, ValueError):
        pass
    for level, name in ((1, "SC_LEVEL1_DCACHE_SIZE"), (2, "SC_LEVEL2_CACHE_SIZE"), (3, "SC_LEVEL3_CACHE_SIZE")):
        if level not in found:
            try:
                v = os.sysconf(name)
            except (ValueError, OSError, AttributeError):
                v = 0
            if v and v > 0:
                found[level] = v
    return tuple(found.get(k, d) for k, d in zip((1, 2, 3), _DEFAULT_CACHES))


def _bytes(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    if text and text[-1].upper() in units:
        return int(text[:-1]) * units[text[-1].upper()]
    return int(text)


# ---- the target templates see --------------------------------------------------------------------

_current: contextvars.ContextVar = contextvars.ContextVar("modelc_target", default=None)


def current() -> Target:
    """The target kernels are generated for: the one `use` set, else the running machine."""
    return _current.get() or Target.host()


@contextlib.contextmanager
def use(target: Target):
    """Generate kernels (defaults, tiles, blocks) for `target` inside this block."""
    token = _current.set(target)
    try:
        yield target
    finally:
        _current.reset(token)


def prefer_wide_vectors():
    """Start numba the way generated kernels need it; must run before numba is imported, and a
    user's own NUMBA_CPU_FEATURES / NUMBA_SLP_VECTORIZE are respected.

    - 512-bit vectors on AVX-512 machines (LLVM otherwise prefers 256-bit vectors there;
      docs/performance.md: the same convolution went from 114 to 157-197 GFLOP/s).
    - LLVM's SLP vectoriser, which numba leaves off since LLVM 11-14 miscompiled with it (numba
      PR 8852): a kernel's epilogue stores its register tile as rows of a few vectors whose
      loops LLVM unrolls before its loop vectoriser runs, so without SLP every bias add,
      activation and store of the tile ran one float at a time. A 1x1 conv 16 -> 96 on 112x112
      (MobileNetV2's widest) took 0.49 ms, 0.25 ms with SLP (onnxruntime 0.36 ms), AMD EPYC Zen 4.
      Every candidate is still checked against the reference when it is measured.
    - No colours in numba's error messages: typing formats one for every overload template that
      does not match and throws it away, and colouring them was 10% of a kernel's compile
      (kernels/numba_pipeline.py).
    """
    if "numba" in sys.modules:
        return
    os.environ.setdefault("NUMBA_SLP_VECTORIZE", "1")
    os.environ.setdefault("NUMBA_DISABLE_ERROR_MESSAGE_HIGHLIGHTING", "1")
    if "NUMBA_CPU_FEATURES" in os.environ:
        return
    try:
        import llvmlite.binding as llvm
        features = llvm.get_host_cpu_features().flatten()
    except Exception:
        return
    if "+avx512f" in features.split(","):
        os.environ["NUMBA_CPU_FEATURES"] = features + ",-prefer-256-bit"
