"""The kernel cache's files: their folder, their locks, and a bound on their size.

Every candidate a tuning run measures stays in the cache (its source and numba's index and
machine code, 143 KB on average), though a model only ever loads its best: a 1,000-trial tune
leaves about 140 MB, and one machine's cache after a day of tuning held 10,565 kernels in 1.4G.
So after compiles of new kernels (at most every ten minutes) and after each tuning run, a cache
grown past `MODELC_CACHE_MAX_SIZE` (default 2G; 0: no bound) is cut back to 80% of it, the
kernels used longest ago first, as ccache does; `modelc cache` shows it and prunes or clears it
by hand. A kernel's last use is its source file's access time, which loading it sets (numba
reads only the file's modification time and size, which stay). A kernel used within the last
hour, or locked by a process compiling or loading it now, is never removed: a process between
writing a kernel's source and loading it finds it there. A removed kernel needed again is
compiled again.
"""
from __future__ import annotations

import contextlib
import logging
import os
import re
import time
from dataclasses import dataclass

try:
    import fcntl
except ImportError:         # (not POSIX)
    fcntl = None

from ..errors import ModelcError


def cache_root() -> str:
    return os.environ.get("MODELC_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "modelc")


def kernel_dir() -> str:
    """The kernel folder. numba's cache files in it are loaded as machine code (and its index is a
    pickle), so a folder that another user could write to is refused, as ssh refuses such keys."""
    d = os.path.join(cache_root(), "kernels")
    os.makedirs(d, mode=0o700, exist_ok=True)
    st = os.stat(d)
    if hasattr(os, "getuid") and (st.st_uid != os.getuid() or st.st_mode & 0o022):
        raise ModelcError(f"kernel cache {d!r} is writable by other users (or not yours): modelc loads "
                          "compiled code from it; fix its permissions or set MODELC_CACHE_DIR")
    return d


def numba_dir(path: str) -> str:
    """Where numba caches the kernel file at `path`: beside it, or under the user's NUMBA_CACHE_DIR
    where that is set (where numba's own locator puts it)."""
    from numba.core import caching, config
    return os.path.join(config.CACHE_DIR, caching.UserProvidedCacheLocator.get_suitable_cache_subpath(path)) \
        if config.CACHE_DIR else os.path.join(os.path.dirname(path), "__pycache__")


@contextlib.contextmanager
def locked(path: str, wait: bool = True):
    """An exclusive lock on a kernel file while it is compiled or loaded (or removed, by
    the bound), across processes; yields whether it is held (False only without `wait`, when
    another process holds it). One process compiles a kernel and the others, waiting, then load
    it from numba's cache: two tuning runs or pytest workers on one cache, or a server's processes
    compiling one model at start-up, had each compiled every kernel they shared. flock: the lock
    ends with the process holding it, however it ends (a build worker killed at its timeout, an
    LLVM abort). Where there is no flock (Windows), each process compiles what it needs."""
    if fcntl is None:
        yield True
        return
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:                  # no file: nothing to guard (import_file writes it again)
        yield True
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)                 # (and with it the lock)


def touch(path: str):
    """Mark a kernel used now (its access time: the bound removes the least recently used first).
    Its modification time stays: numba's cache index is valid only for the file's mtime and size."""
    try:
        os.utime(path, ns=(time.time_ns(), os.stat(path).st_mtime_ns))
    except OSError:
        pass


logger = logging.getLogger(__name__)

DEFAULT_MAX = "2G"
KEEP_RECENT_S = 3600.0      # kernels used this recently stay, whatever the size
CHECK_EVERY_S = 600.0       # compiles look at the cache's size at most this often
LOW_WATER = 0.8             # a prune goes down to this share of the bound (not once per kernel over it)
_KERNEL = re.compile(r"(k_[0-9a-f]{24})(\.py|\..+\.nb[ic])$")
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(text: str, what: str = "MODELC_CACHE_MAX_SIZE") -> int:
    """Bytes of a size such as 500M, 2G, 1.5GB or 1048576 (binary units)."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([KMGT]?)(?:I?B)?\s*", str(text), re.IGNORECASE)
    if not m:
        raise ModelcError(f"{what}={text!r} is not a size: write bytes or a number with K, M, G or T (500M, 2G)")
    return int(float(m.group(1)) * _UNITS[m.group(2).upper()])


def max_bytes() -> int:
    """The bound, from MODELC_CACHE_MAX_SIZE (0: none)."""
    return parse_size(os.environ.get("MODELC_CACHE_MAX_SIZE") or DEFAULT_MAX)


@dataclass
class Entry:
    """One kernel: its source file and numba's index and machine code for it."""
    stem: str
    files: list
    size: int = 0
    used: float = 0.0           # the source's access time (0 if it is gone: numba's files alone)


def _listing() -> list:
    """(name, path, stat) of every file in the kernel folder and numba's folder for it."""
    kdir, out = kernel_dir(), []
    for d in {kdir, numba_dir(os.path.join(kdir, "k_0.py"))}:
        try:
            items = list(os.scandir(d))
        except OSError:
            continue
        for it in items:
            try:
                out.append((it.name, it.path, it.stat()))
            except OSError:
                pass
    return out


def entries(listing: list | None = None) -> list:
    """The cache's kernels, least recently used first (from `listing`, or a new one)."""
    found: dict = {}
    for name, path, st in _listing() if listing is None else listing:
        m = _KERNEL.match(name)
        if not m:
            continue
        e = found.setdefault(m.group(1), Entry(m.group(1), []))
        e.files.append(path)
        e.size += st.st_size
        if m.group(2) == ".py":
            e.used = st.st_atime
    return sorted(found.values(), key=lambda e: e.used)


def prune(limit: int, keep_recent_s: float = KEEP_RECENT_S, listing: list | None = None) -> tuple:
    """Remove the least recently used kernels until the cache takes at most `limit` bytes (those
    used within `keep_recent_s`, or locked now, stay), and the temporaries of writes that never
    finished. Returns (kernels removed, bytes removed, kernels left, bytes left)."""
    listing = _listing() if listing is None else listing
    es = entries(listing)
    total, removed, freed = sum(e.size for e in es), 0, _remove_stale_temporaries(listing)
    recent = time.time() - keep_recent_s
    for e in es:
        if total <= limit:
            break
        if e.used > recent:
            break                   # (sorted: the rest are as recent)
        if _remove(e):
            total -= e.size
            removed += 1
            freed += e.size
    return removed, freed, len(es) - removed, total


_checked = [0.0]            # when this process last looked (a look over 10,000 kernels takes 0.3 s)


def auto(every_s: float = 0.0):
    """Prune to LOW_WATER of the bound if the cache has outgrown it (after compiles, at most once in
    `every_s`, and after tuning runs)."""
    limit = max_bytes()
    if limit <= 0 or time.monotonic() - _checked[0] < every_s:
        return
    _checked[0] = time.monotonic()
    listing = _listing()
    if sum(e.size for e in entries(listing)) <= limit:
        return
    removed, freed, left, size = prune(int(limit * LOW_WATER), listing=listing)
    logger.info("kernel cache over its bound of %s (MODELC_CACHE_MAX_SIZE): removed %d least recently used "
                "kernels (%s); %d kernels, %s left", human(limit), removed, human(freed), left, human(size))


_TEMPORARY = re.compile(r"tmp\w+\.tmp|k_[0-9a-f]{24}\..+\.nb[ic]\.tmp\.\w+")     # ours, numba's


def _remove_stale_temporaries(listing: list) -> int:
    """Remove what writes that never finished left (a process killed between writing a temporary file
    and renaming it: write_source's, numba's cache saves) an hour or more ago; returns their bytes."""
    freed, old = 0, time.time() - KEEP_RECENT_S
    for name, path, st in listing:
        if _TEMPORARY.fullmatch(name) and st.st_mtime < old:
            try:
                os.remove(path)
                freed += st.st_size
            except OSError:
                pass
    return freed


def _remove(e: Entry) -> bool:
    """Remove a kernel's files, numba's first, under its lock; False if another process holds it."""
    src = next((f for f in e.files if f.endswith(".py")), None)
    with locked(src, wait=False) if src else contextlib.nullcontext(True) as held:
        if not held or src and _used(src) > e.used:      # (or used since the listing)
            return False
        for f in sorted(e.files, key=lambda f: f.endswith(".py")):
            try:
                os.remove(f)
            except FileNotFoundError:
                pass
    return True


def _used(path: str) -> float:
    try:
        return os.stat(path).st_atime
    except OSError:
        return 0.0


def human(n: int) -> str:
    """A size as parse_size reads it: 1.5G, 524M, 900."""
    for unit in ("T", "G", "M", "K"):
        if n >= _UNITS[unit]:
            return f"{n / _UNITS[unit]:.3g}{unit}"
    return f"{n}"
