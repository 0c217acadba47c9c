"""The on-disk kernel cache: generated source -> file -> numba-compiled function, compiled once.

A kernel's file name is a hash of its source, numba's version and the CPU (name and features), so
numba's own cache (`cache=True`, which needs a real file) holds the machine code next to it and a
kernel is never compiled twice, across processes and runs. Cold kernels compile in parallel
worker processes (spawned, so they start clean); the parent then only loads them.
"""
from __future__ import annotations

import atexit
import contextlib
import gc
import glob
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import types

from ..target import prefer_wide_vectors

prefer_wide_vectors()     # numba must start with our CPU features
import numba  # noqa: E402

from ..errors import ModelcError  # noqa: E402
from . import launch  # noqa: E402
from . import cache_files  # noqa: E402
from .cache_files import cache_root, kernel_dir, locked, numba_dir, touch  # noqa: E402,F401

_loaded: dict[str, object] = {}      # kernel file -> its imported module


def target_tag() -> str:
    """What compiled code depends on besides its source: numba, the CPU, and the modelc modules
    whose native helpers generated code imports (numba's cache does not notice when a called
    function changes, so a changed launcher would otherwise be served stale)."""
    global _TAG
    if _TAG is None and os.environ.get(TAG_ENV):
        _TAG = os.environ[TAG_ENV]          # a worker of ours: the parent's tag, so paths agree
    if _TAG is None:
        import llvmlite.binding as llvm
        cpu = numba.config.CPU_NAME or llvm.get_host_cpu_name()
        features = numba.config.CPU_FEATURES or llvm.get_host_cpu_features().flatten()
        helpers = hashlib.sha256()
        for name in _HELPER_MODULES:
            with open(os.path.join(os.path.dirname(__file__), name), "rb") as f:
                helpers.update(f.read())
        _TAG = (f"numba {numba.__version__} py{sys.version_info[0]}{sys.version_info[1]} {cpu} {features} "
                f"slp {int(numba.config.SLP_VECTORIZE)} helpers {helpers.hexdigest()[:16]}")
    return _TAG


_TAG = None
TAG_ENV = "MODELC_KERNEL_TAG"   # set for worker processes: they file kernels as their parent does,
                                # even if a helper module changed on disk since the parent started


def worker_env(**extra) -> dict:
    """The environment of a worker process of ours: the parent's kernel tag, and an import path on which
    the worker finds the modelc this process runs (`import_root`)."""
    env = dict(os.environ, **{TAG_ENV: target_tag()}, **extra)
    root = import_root()
    if root is not None:
        env["PYTHONPATH"] = os.pathsep.join([root] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep)
                                                      if p and p != root])
    return env


def import_root() -> str | None:
    """The folder this process imported modelc from, where a new interpreter might not look there first:
    a source tree put on `sys.path` by hand (a worker then failed to import modelc at all) or a second
    copy ahead of an installed one (a worker would compile with the other copy's helpers under this
    one's kernel tag). None where modelc is an installed package: its site folder is on every
    interpreter's path, and putting it first would move it ahead of the user's own PYTHONPATH."""
    import site
    import sysconfig
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    installed = {sysconfig.get_paths().get(k) for k in ("purelib", "platlib")}
    installed |= set(getattr(site, "getsitepackages", lambda: [])()) | {site.getusersitepackages()}
    return None if any(d and os.path.abspath(d) == root for d in installed) else root


# the code generated kernels import
_HELPER_MODULES = ("launch.py", "stack.py", "intrinsics.py", "numba_pipeline.py", "int_dot.py")


def file_name(source: str) -> str:
    """A kernel file's name: the hash of its text and the target, so a changed file is caught."""
    digest = hashlib.sha256((target_tag() + "\n" + source).encode()).hexdigest()[:24]
    return f"k_{digest}.py"


def source_path(source: str) -> str:
    return os.path.join(kernel_dir(), file_name(source))


def is_compiled(path: str) -> bool:
    """Whether numba has cached the kernel file at `path` (its index in `numba_dir`: looking beside
    the file only, with NUMBA_CACHE_DIR set every kernel read as not compiled)."""
    stem = os.path.splitext(os.path.basename(path))[0]
    return bool(glob.glob(os.path.join(numba_dir(path), f"{stem}.*.nbi")))


def write_source(path: str, source: str):
    """Write a kernel file atomically (a reader never sees half a file); an identical one stays."""
    if os.path.exists(path):
        with open(path, encoding="utf-8", errors="replace") as f:
            if f.read() == source:
                touch(path)        # (used again: a prune leaves it until it has been loaded)
                return
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        f.write(source)
    os.replace(tmp, path)


def import_file(path: str, text: str | None = None):
    """The module of a kernel file, imported (and so compiled, or read from numba's cache) once.
    `text`, if given, is the file's content as the caller read and checked it (`load_file`)."""
    if path in _loaded:
        return _loaded[path]
    if text is None:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    if os.path.basename(path) != file_name(text):
        raise ModelcError(f"kernel cache file {path!r} does not hold the source its name is the hash "
                          "of (modified or corrupt); delete it and compile again")
    # executed from the text just checked, never from a .pyc that could have been put beside it
    name = "modelc_kernel_" + os.path.splitext(os.path.basename(path))[0]
    with locked(path):
        if path in _loaded:          # another thread of this process did it while this one waited
            return _loaded[path]
        if not os.path.exists(path):     # pruned (cache_files) while this process waited for it:
            write_source(path, text)     # numba caches only what a file holds
        mod = types.ModuleType(name)
        mod.__file__ = path
        sys.modules[name] = mod          # numba's cache resolves functions through their module
        try:
            with _no_gc():
                exec(compile(text, path, "exec"), mod.__dict__)
        except Exception as e:
            sys.modules.pop(name, None)
            raise ModelcError(f"kernel {os.path.basename(path)} failed to compile: "
                              f"{type(e).__name__}: {str(e)[:2000]}") from e
        _loaded[path] = mod
    touch(path)
    return mod


_gc_lock = threading.Lock()
_gc_holders = [0, False]       # compiles under way, and whether the collector was on before them


@contextlib.contextmanager
def _no_gc():
    """The cyclic garbage collector off while numba compiles: it walks numba's millions of young
    objects over and over, and a kernel compiled in 0.83 of the time without it (16 conv2d
    candidates, AMD EPYC Zen 4). What the compile leaves is collected once it is back on."""
    with _gc_lock:
        if _gc_holders[0] == 0:
            _gc_holders[1] = gc.isenabled()
            gc.disable()
        _gc_holders[0] += 1
    try:
        yield
    finally:
        with _gc_lock:
            _gc_holders[0] -= 1
            if _gc_holders[0] == 0 and _gc_holders[1]:
                gc.enable()


_drivers: dict[int, object] = {}


def _module(source: str):
    """The imported module of generated `source`, written to the cache first."""
    path = source_path(source)
    write_source(path, source)
    return import_file(path)


def driver(nwords: int):
    """The parallel launcher for kernels of `nwords` argument words (compiled once, cached)."""
    if nwords not in _drivers:
        _drivers[nwords] = _module(launch.driver_source(nwords)).drive
    return _drivers[nwords]


def sequence_runner():
    """The native loop that runs a module's kernels one after another (compiled once, cached)."""
    return _module(launch.sequence_source()).run_sequence


def profiled_sequence_runner():
    """`sequence_runner` stamping the cycle counter after each kernel, and the counter itself."""
    mod = _module(launch.sequence_source(stamped=True))
    return mod.run_sequence, mod.counter


def kernel_of(mod) -> launch.CompiledKernel:
    """The launchable kernel of an imported kernel module."""
    return launch.CompiledKernel(mod.kernel, mod.N_ITEMS, mod.PARALLEL, mod.DTYPES, mod.OUTPUTS,
                                 driver(2 * len(mod.DTYPES)))


def load(source: str) -> launch.CompiledKernel:
    """The compiled kernel of generated `source` (compiling it if not cached)."""
    return kernel_of(_module(source))


_FILE_NAME = re.compile(r"k_[0-9a-f]{24}\.py")


def load_file(name: str) -> launch.CompiledKernel | None:
    """The compiled kernel of the cache file `name` (as `file_name` makes them), which another
    process wrote; None if there is no such file or it does not hold the source its name is the
    hash of (the caller then writes the source again)."""
    if not isinstance(name, str) or not _FILE_NAME.fullmatch(name):
        raise ModelcError(f"not a kernel file name: {str(name)[:80]!r}")
    path = os.path.join(kernel_dir(), name)
    text = None
    if path not in _loaded:
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except (OSError, UnicodeDecodeError):
            return None
        if file_name(text) != name:
            return None
    return kernel_of(import_file(path, text))


_WORKER = """\
import json, select, sys
from modelc.kernels.cache import import_file, kernel_of
def wait():                     # False once idle for too long (where pipes can be polled)
    try:
        return bool(select.select([sys.stdin], [], [], float(sys.argv[1]))[0])
    except (OSError, ValueError):
        return True
while wait():
    p = sys.stdin.readline().rstrip("\\n")
    if not p:
        break
    print("start", p, flush=True)
    try:
        kernel_of(import_file(p))          # as the caller will: the machine code linked, the driver too
    except Exception as e:
        c = e.__cause__ or e
        print("error", p, json.dumps(f"{type(c).__name__}: {c}"[:4000]), flush=True)
    else:
        print("ok", p, flush=True)
"""
WORKER_IDLE_S = 60.0        # a compile worker left idle this long exits (the next compile starts one)
WORKER_MAX_KERNELS = 300    # and one is replaced after this many kernels (it keeps what it compiled)


class _Worker:
    """A compile worker process: kernel file paths in on stdin, one answer line each out."""

    def __init__(self):
        self.err = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen([sys.executable, "-c", _WORKER, str(WORKER_IDLE_S)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.err,
                                     text=True, bufsize=1, env=worker_env())
        self.count = 0

    def alive(self) -> bool:
        return self.proc.poll() is None and self.count < WORKER_MAX_KERNELS

    def compile(self, path: str, timeout: float | None) -> tuple[str, str]:
        """("ok", ""), ("error", message), ("died", how) or ("gone", "") if it exited idle."""
        self.count += 1
        pos = self.err.seek(0, os.SEEK_END)
        timed_out = []

        def kill():
            timed_out.append(True)
            self.proc.kill()
        timer = threading.Timer(timeout, kill) if timeout else None
        started = False
        try:
            self.proc.stdin.write(path + "\n")
            self.proc.stdin.flush()
            if timer:
                timer.start()
            for line in self.proc.stdout:
                kind, _, rest = line.rstrip("\n").partition(" ")
                if kind == "start":
                    started = True
                elif kind == "ok":
                    return "ok", ""
                elif kind == "error":
                    return "error", json.loads(rest.partition(" ")[2])
        except (BrokenPipeError, OSError):
            pass
        finally:
            if timer:
                timer.cancel()
        rc = self.proc.wait()
        if not started:                  # exited idle, or could not start: its stderr's last line says why
            self.err.seek(pos)
            lines = [ln.strip() for ln in self.err.read()[-4000:].splitlines() if ln.strip()]
            return "gone", lines[-1] if lines else ""
        how = exit_how(rc)
        if timed_out:
            how = f"killed after the timeout of {timeout:g} s"
        self.err.seek(pos)
        tail = " ".join(self.err.read()[-2000:].split())
        return "died", how + (f": {tail}" if tail else "")

    def close(self):
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc.stdout.close()
        self.err.close()


def exit_how(rc: int) -> str:
    """How a worker process ended, from its return code: "killed by signal SIGABRT", "exit status 1"."""
    if rc < 0:
        try:
            return f"killed by signal {signal.Signals(-rc).name}"
        except ValueError:
            return f"killed by signal {-rc}"
    return f"exit status {rc}"


_workers: list = []
_workers_lock = threading.Lock()


def _compile_in_subprocesses(paths: list, jobs: int, progress=None, timeout=None,
                             names: dict | None = None):
    """Compile kernel files in up to `jobs` worker processes; a ModelcError for any that failed.

    Workers are fresh interpreters (never a fork of a process with threads) kept for the next
    compile. A worker that dies while compiling (an LLVM fatal error aborts its process with
    SIGABRT) or overruns `timeout` seconds for one kernel is blamed on that kernel, which the
    error names (with `names[path]`, the caller's description); the worker is replaced.
    """
    names = names or {}
    todo = list(paths)
    failures = []

    def serve(slot):
        while True:
            with _workers_lock:
                if not todo:
                    return
                path = todo.pop(0)
                w = _workers[slot]
                if w is None or not w.alive():
                    if w is not None:
                        w.close()
                    w = _workers[slot] = _Worker()
            status, msg = w.compile(path, timeout)
            if status == "gone":                    # it had just exited idle: once more, anew
                with _workers_lock:
                    w.close()
                    w = _workers[slot] = _Worker()
                status, msg = w.compile(path, timeout)
                if status == "gone":                # a new one exited too: none can start
                    with _workers_lock:
                        failures.append(f"a kernel compile worker ({sys.executable}) exited before compiling "
                                        f"{_what(path, names)}: {msg or 'it wrote nothing'}")
                        todo.clear()
                    return
            if status == "ok":
                if progress is not None:
                    progress()
            elif status == "error":
                failures.append(f"{_what(path, names)} failed to compile: {msg}")
            else:
                failures.append(f"compiling {_what(path, names)} killed its worker process "
                                f"({msg or 'it exited'})")

    with _compile_lock:
        with _workers_lock:
            while len(_workers) < jobs:
                _workers.append(None)
        threads = [threading.Thread(target=serve, args=(k,), daemon=True) for k in range(1, jobs)]
        for t in threads:
            t.start()
        serve(0)
        for t in threads:
            t.join()
    if failures:
        raise ModelcError("; ".join(failures))


_compile_lock = threading.Lock()    # one compile at a time drives the workers


@atexit.register
def _close_workers():
    for w in _workers:
        if w is not None:
            w.close()


def _what(path: str, names: dict) -> str:
    base = f"kernel {os.path.basename(path)}"
    return f"{base} ({names[path]})" if names.get(path) else base


def compile_all(sources: list[str], jobs: int | None = None, progress=None,
                names: list | None = None, timeout: float | None = None) -> list:
    """Load many kernels; cold ones are compiled first in worker processes, never in this one.

    Why a worker even for one cold kernel: LLVM reports some failures (a runtime symbol numba
    does not link, such as `__powidf2`) by aborting the process, which no `except` can catch; in
    a worker that costs the worker, and the caller gets a ModelcError naming the kernel and
    `names[i]` (its op, node or pattern, as the caller describes source i). The price is one
    interpreter with numba imported (about 1 s on 2 cores) when no worker is running; workers are
    kept for the next compile (until idle for WORKER_IDLE_S), so a tiny kernel then costs what it
    costs in-process plus loading it from numba's cache. Warm kernels (in numba's on-disk cache)
    are only loaded, here, with no worker. Cold kernels compile in up to `jobs` workers at once
    (default: the CPU count).
    """
    paths = [source_path(s) for s in sources]
    for p, s in zip(paths, sources):
        write_source(p, s)
    cold = sorted({p for p in paths if not is_compiled(p) and p not in _loaded})
    if cold:
        jobs = max(1, min(jobs or os.cpu_count() or 1, len(cold)))
        labels = {}
        for p, n in zip(paths, names or []):
            labels.setdefault(p, n)
        _compile_in_subprocesses(cold, jobs, progress, timeout, labels)
    out = [kernel_of(import_file(p)) for p in paths]
    if cold:
        cache_files.auto(cache_files.CHECK_EVERY_S)     # (new kernels: it may have outgrown its bound)
    return out
