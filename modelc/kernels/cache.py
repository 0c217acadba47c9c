"""The on-disk kernel cache: generated source -> file -> numba-compiled function, compiled once.

A kernel's file name is a hash of its source, numba's version and the CPU (name and features), so
numba's own cache (`cache=True`, which needs a real file) holds the machine code next to it and a
kernel is never compiled twice, across processes and runs. Cold kernels compile in parallel
worker processes (spawned, so they start clean); the parent then only loads them.
"""
from __future__ import annotations

import glob
import hashlib
import importlib.util
import os
import subprocess
import sys
import tempfile

from . import _prefer_wide_vectors  # noqa: F401  (numba must start with our CPU features)
import numba  # noqa: E402

from ..errors import ModelcError  # noqa: E402
from . import launch  # noqa: E402

_loaded: dict[str, object] = {}      # kernel file -> its imported module


def cache_root() -> str:
    return os.environ.get("MODELC_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "modelc")


def kernel_dir() -> str:
    d = os.path.join(cache_root(), "kernels")
    os.makedirs(d, exist_ok=True)
    return d


def target_tag() -> str:
    """What compiled code depends on besides its source: numba, the CPU, and the modelc modules
    whose native helpers generated code imports (numba's cache does not notice when a called
    function changes, so a changed launcher would otherwise be served stale)."""
    global _TAG
    if _TAG is None:
        import llvmlite.binding as llvm
        cpu = numba.config.CPU_NAME or llvm.get_host_cpu_name()
        features = numba.config.CPU_FEATURES or llvm.get_host_cpu_features().flatten()
        helpers = hashlib.sha256()
        for name in _HELPER_MODULES:
            with open(os.path.join(os.path.dirname(__file__), name), "rb") as f:
                helpers.update(f.read())
        _TAG = (f"numba {numba.__version__} py{sys.version_info[0]}{sys.version_info[1]} {cpu} {features} "
                f"helpers {helpers.hexdigest()[:16]}")
    return _TAG


_TAG = None
_HELPER_MODULES = ("launch.py", "stack.py", "reduce.py")     # imported by generated kernels


def source_path(source: str) -> str:
    digest = hashlib.sha256((target_tag() + "\n" + source).encode()).hexdigest()[:24]
    return os.path.join(kernel_dir(), f"k_{digest}.py")


def is_compiled(path: str) -> bool:
    stem = os.path.splitext(os.path.basename(path))[0]
    return bool(glob.glob(os.path.join(os.path.dirname(path), "__pycache__", f"{stem}.*.nbi")))


def _write(path: str, source: str):
    if os.path.exists(path):
        return
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        f.write(source)
    os.replace(tmp, path)


def _import(path: str):
    """The module of a kernel file, imported (and so compiled, or read from numba's cache) once."""
    if path in _loaded:
        return _loaded[path]
    name = "modelc_kernel_" + os.path.splitext(os.path.basename(path))[0]
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod          # numba's cache resolves functions through their module
    try:
        spec.loader.exec_module(mod)
    except Exception as e:
        sys.modules.pop(name, None)
        raise ModelcError(f"kernel {os.path.basename(path)} failed to compile: "
                          f"{type(e).__name__}: {str(e)[:2000]}") from e
    _loaded[path] = mod
    return mod


_drivers: dict[int, object] = {}


def _module(source: str):
    """The imported module of generated `source`, written to the cache first."""
    path = source_path(source)
    _write(path, source)
    return _import(path)


def driver(nwords: int):
    """The parallel launcher for kernels of `nwords` argument words (compiled once, cached)."""
    if nwords not in _drivers:
        _drivers[nwords] = _module(launch.driver_source(nwords)).drive
    return _drivers[nwords]


def sequence_runner():
    """The native loop that runs a module's kernels one after another (compiled once, cached)."""
    return _module(launch.SEQUENCE_SOURCE).run_sequence


def _kernel(mod) -> launch.CompiledKernel:
    return launch.CompiledKernel(mod.kernel, mod.N_ITEMS, mod.PARALLEL, mod.DTYPES, mod.OUTPUTS,
                                 driver(2 * len(mod.DTYPES)))


def load(source: str) -> launch.CompiledKernel:
    """The compiled kernel of generated `source` (compiling it if not cached)."""
    return _kernel(_module(source))


def _compile_in_subprocesses(paths: list, jobs: int, progress=None, timeout=None):
    """Compile kernel files in `jobs` fresh interpreters (no fork of a process with threads)."""
    chunks = [paths[k::jobs] for k in range(jobs)]
    procs = []
    for chunk in chunks:
        if not chunk:
            continue
        code = ("import sys\nfrom modelc.kernels.cache import _import\n"
                "for p in sys.argv[1:]:\n"
                "    try:\n        _import(p)\n    except Exception:\n        pass\n"
                "    print(p, flush=True)\n")
        procs.append(subprocess.Popen([sys.executable, "-c", code, *chunk], stdout=subprocess.PIPE,
                                      stderr=subprocess.DEVNULL, text=True))
    for proc in procs:
        for _ in proc.stdout:
            if progress is not None:
                progress()
        proc.wait(timeout=timeout)


def compile_all(sources: list[str], jobs: int | None = None, progress=None) -> list:
    """Load many kernels, compiling the cold ones in parallel worker processes first.

    Errors are not reported by the workers: a kernel that failed there is compiled again here,
    where its error surfaces with the kernel's name.
    """
    paths = [source_path(s) for s in sources]
    for p, s in zip(paths, sources):
        _write(p, s)
    cold = sorted({p for p in paths if not is_compiled(p) and p not in _loaded})
    jobs = min(jobs or os.cpu_count() or 1, len(cold))
    if len(cold) > 1 and jobs > 1:
        _compile_in_subprocesses(cold, jobs, progress)
    return [_kernel(_import(p)) for p in paths]
