"""A measurement worker process: builds (compiles) or runs one candidate kernel per request.

Requests and answers are JSON lines on stdin/stdout, so the parent can kill a worker that hangs
or crashes and start a new one: a bad kernel costs one record, never the tuning run. Run timings
happen in a worker of their own, one candidate at a time, so compiles never disturb them.
"""
from __future__ import annotations

import importlib
import json
import os
import re
import sys
import time
import traceback

import numpy as np


def _template(name: str, module: str | None):
    """A registered template; one registered outside modelc is found by importing its module."""
    from ..errors import ModelcError
    from ..kernels.template import get
    try:
        return get(name)
    except ModelcError:
        if not module or module == "__main__" or module in sys.modules:
            raise
    importlib.import_module(module)
    return get(name)


def _ping(req: dict) -> dict:
    """The first request of a new worker: the parent's import path (as multiprocessing's spawn
    passes it, so templates registered in the parent's own modules can be imported here), and
    every import a measurement needs, done before any candidate's timeout starts."""
    for p in req.get("path", []):
        if isinstance(p, str) and p not in sys.path:
            sys.path.append(p)
    from ..kernels import cache, templates, testing  # noqa: F401
    from . import cache_flush, timing  # noqa: F401
    return {"error": 0, "pid": os.getpid()}


def _handle(req: dict, refs: dict) -> dict:
    from ..kernels import testing
    from . import cache_flush, timing
    from . import records as R

    if req["op"] == "ping":
        return _ping(req)
    if req["op"] == "lines":            # the parent orders a round's builds, longest first
        written = [_write(r) for r in req["requests"]]
        return {"error": 0, "lines": [n for n, _ in written], "files": [f for _, f in written]}
    try:                                  # a config the template cannot instantiate fails its build
        wl, kernel, fn, name = _compiled(req, req["op"] == "run")
    except Exception as e:
        return {"error": R.COMPILE_ERROR, "msg": _message(e)}
    if req["op"] == "build":
        return {"error": R.NO_ERROR, "file": name}
    try:
        key = req["key"]
        if key not in refs:
            inputs = wl.random_inputs(seed=0)
            refs.clear()
            refs[key] = (inputs, testing.reference_outputs(wl, inputs))
        inputs, want = refs[key]
        args, outs = testing.bind(wl, kernel, inputs)
        fn(*args)
        from ..kernels.layout import from_physical
        got = [from_physical(o, t.shape, t.layout) for o, t in zip(outs, wl.outputs)]
        err = testing.max_rel_error(got, want)
        if not err <= testing.tolerance(wl, req.get("tolerance", 1e-4)):
            return {"error": R.WRONG_RESULT, "msg": f"max error {err:.3g} relative to the output scale"}
        settle = req.get("settle", True)
        if settle:
            time.sleep(0.05)    # let the threads of whatever ran before (builds, numpy) go idle
        flush = []
        if req.get("cache_flush") and cache_flush.supported():    # as a module finds them
            flush = cold_arrays(wl, kernel.args, args)
        costs = timing.time_kernel(fn, args, req.get("number", 5), req.get("repeat", 3),
                                    req.get("min_repeat_ms", 0.0), flush=flush,
                                    # idle cores wake up for 50 ms; after the run before, they are
                                    # awake (a warm-up was a third of a run; 40 timings each way read
                                    # a median 0.998 of each other)
                                    warmup_ms=50.0 if settle else 10.0)
    except Exception as e:
        return {"error": R.RUNTIME_ERROR, "msg": _message(e)}
    return {"error": R.NO_ERROR, "costs": costs}


def _kernel(req: dict):
    """(workload, generated kernel) of a build or run request."""
    from ..te.workload import view
    wl = view(req["workload"])
    tpl = _template(req["template"], req.get("module"))
    return wl, tpl.build(wl, tpl.space(wl).from_values(req["config"]))


def _compiled(req: dict, run: bool):
    """(workload, kernel, compiled kernel, its file name) of a request. A request that names the
    kernel's cache file (as this round's `lines` or the build answered) loads that file: a build
    compiles it without writing the source again, and a run builds the kernel without its source
    (`template.without_source`), needing only its arguments and packed weights. A source costs a
    Winograd candidate 35 ms; written three times it was 8% of a tuning run. Without a file (or
    if it is gone), the source is written here."""
    from ..kernels import cache
    from ..kernels.template import without_source
    name = req.get("file")
    fn = cache.load_file(name) if name is not None else None
    if fn is not None:
        if not run:
            return None, None, fn, name
        with without_source():
            wl, kernel = _kernel(req)
        return wl, kernel, fn, name
    wl, kernel = _kernel(req)
    return wl, kernel, cache.load(kernel.source), cache.file_name(kernel.source)


def _write(req: dict) -> tuple[int, str | None]:
    """The length in lines of the kernel a build request would compile, and its cache file, written
    (0 and None if it cannot be)."""
    from ..kernels import cache
    try:
        source = _kernel(req)[1].source
        path = cache.source_path(source)
        cache.write_source(path, source)
        return source.count("\n"), os.path.basename(path)
    except Exception:
        return 0, None


def cold_arrays(wl, names: list, arrays: list) -> list:
    """The arrays a kernel finds out of cache in a module: all but the activation its anchor
    reads first, which the kernel before it has just written. Weights, the output buffer (last
    written an inference ago) and second activations (a residual made layers earlier) are cold:
    timed warm, MobileNetV2's depthwise convs read 0.010-0.040 ms where the module spent
    0.023-0.076 ms, and the tuning log's total was 22% under the module's latency."""
    first = wl.anchor.args[0] if wl.ops and wl.anchor.args else None
    return [a.reshape(-1).view(np.uint8) for name, a in zip(names, arrays)      # bytes: any dtype
            if not name.startswith("in") or f"i{name[2:]}" != first]


def _message(e: Exception) -> str:
    """An exception as one line of a record (numba colours its messages with terminal escapes)."""
    text = re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", f"{type(e).__name__}: {e}")
    return " ".join(text.split())[:500]


def main():
    # Answers go to a private copy of stdout; anything else that writes to fd 1 (a print in a
    # template, numba or LLVM diagnostics) lands in stderr instead of breaking the protocol.
    answers = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    refs: dict = {}
    for line in sys.stdin:
        req: dict = {}
        try:
            req = json.loads(line)
            res = _handle(req, refs)
        except Exception:
            from . import records as R
            res = {"error": R.COMPILE_ERROR if req.get("op") == "build" else R.RUNTIME_ERROR,
                   "msg": traceback.format_exc()[-500:]}
        answers.write(json.dumps(res) + "\n")
        answers.flush()


if __name__ == "__main__":
    main()
