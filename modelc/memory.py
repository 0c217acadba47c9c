"""Memory checks made before allocating: a model or document that asks for more than the machine
has gets a modelc error naming the largest tensors, not numpy's raw MemoryError (or the kernel's
out-of-memory killer, since Linux over-commits and a lazy allocation can fail only when touched).
"""
from __future__ import annotations

import os

from .errors import ModelcError


class OutOfMemoryError(ModelcError):
    """A module (or a document describing one) needs more memory than this machine has."""


def available_bytes() -> int:
    """Memory a new allocation can count on: MemAvailable (Linux), else free physical pages, and
    never more than the process's address-space limit (ulimit -v) leaves."""
    return min(_physical_available(), _address_space_left())


def _address_space_left() -> int:
    try:
        import resource
        soft, _ = resource.getrlimit(resource.RLIMIT_AS)
        if soft == resource.RLIM_INFINITY:
            return 1 << 62
        with open("/proc/self/status") as f:
            used = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
        return max(0, soft - used)
    except (ImportError, OSError, ValueError, StopIteration):
        return 1 << 62


def _physical_available() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 1 << 62


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**28 else f"{n / 2**20:.1f} MiB"


def check(sizes: dict, what: str, extra_bytes: int = 0):
    """Refuse when the tensors of `sizes` ({name: bytes}) plus `extra_bytes` cannot fit in memory.

    `sizes` are the allocations about to be made; the message names the three largest.
    """
    total = sum(sizes.values()) + extra_bytes
    avail = available_bytes()
    if total <= avail:
        return
    top = sorted(sizes.items(), key=lambda kv: -kv[1])[:3]
    names = ", ".join(f"{n!r} ({_gib(b)})" for n, b in top)
    raise OutOfMemoryError(f"{what} needs {_gib(total)} but {_gib(avail)} of memory is available; "
                           f"the largest tensors: {names}")
