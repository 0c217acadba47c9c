"""ONNX's conformance cases, their results, and their runs in worker processes: a case that aborts or
segfaults in native code (an LLVM fatal error, a kernel's stray write) costs its worker, never the run.
"""
from __future__ import annotations

import sys
import warnings
from dataclasses import dataclass

import numpy as np

from .kernels.cache import worker_env

PASSED, FAILED, NOT_RUN = "passed", "failed", "not run"
PASSED_FALLBACK = "passed (fallback)"   # through compile, part of the graph on the numpy fallback
PASSED_TAIL = "passed (tail)"           # shapes decided by the data: those nodes on ONNX's evaluator
CRASHED = "crash"                       # a raw exception, or the case killed its worker process
STATUSES = (PASSED, PASSED_FALLBACK, PASSED_TAIL, FAILED, CRASHED, NOT_RUN)
FOLDED = "folded to constants: no kernel ran"   # the reason of a case passed with no step at all


@dataclass
class CaseResult:
    name: str
    ops: tuple
    status: str
    reason: str = ""


def collect_cases():
    from onnx.backend.test.case.node import collect_testcases
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with np.errstate(all="ignore"):
            return collect_testcases(None)


CASE_TIMEOUT_S = 900.0       # one case, its compiles included, in one worker
ABORT_CASE = "__abort__"     # not a case: a worker asked for it aborts (tests of the isolation)


class _CaseWorker:
    """A worker process running cases by name (`python -m modelc.conformance --worker`), the
    cases read from `cases_file` (run_isolated's pickle)."""

    def __init__(self, backend: str, cases_file: str):
        import subprocess
        import tempfile
        self.err = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen([sys.executable, "-m", "modelc.conformance", "--worker", backend,
                                      "--cases-file", cases_file],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.err,
                                     text=True, bufsize=1, env=worker_env())

    def run(self, name: str, timeout: float) -> CaseResult:
        import json
        import signal
        import threading

        self.err.seek(0)
        self.err.truncate()
        timed_out = []

        def kill():
            timed_out.append(True)
            self.proc.kill()
        timer = threading.Timer(timeout, kill)
        timer.start()
        try:
            self.proc.stdin.write(name + "\n")
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
        except OSError:
            line = ""
        finally:
            timer.cancel()
        if line:
            d = json.loads(line)
            return CaseResult(d["name"], tuple(d["ops"]), d["status"], d["reason"])
        rc = self.proc.wait()
        how = (f"killed by signal {signal.Signals(-rc).name}" if rc < 0 and -rc in signal.valid_signals()
               else f"exit status {rc}")
        if timed_out:
            how = f"timeout: killed after {timeout:g} s"
        self.err.seek(0)
        tail = [ln for ln in self.err.read().splitlines() if ln.strip()][-3:]
        return CaseResult(name, (), CRASHED, f"worker process died ({how})" +
                          (": " + " | ".join(t.strip()[:200] for t in tail) if tail else ""))

    def close(self):
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=30)
            except Exception:
                self.proc.kill()
                self.proc.wait()
        self.proc.stdout.close()
        self.err.close()


def run_isolated(names: list, backend: str = "compile", jobs: int | None = None,
                 timeout: float = CASE_TIMEOUT_S, progress=None, cases: list | None = None) -> list:
    """Cases by name, each in one of `jobs` worker processes (default: the CPU count) that run
    many cases; a worker that dies is replaced and its case reported as a crash.

    The workers read the cases from a file this process writes (`cases`, or collected here):
    collecting them runs every case's numpy reference, 9-10 s a process, which each worker and
    each replacement had spent to run a handful (a pickle of our own, in a private temp dir)."""
    import os
    import pickle
    import shutil
    import tempfile
    wanted = set(names)
    cases = [c for c in (collect_cases() if cases is None else cases) if c.name in wanted]
    tmp = tempfile.mkdtemp(prefix="modelc-cases-")
    cases_file = os.path.join(tmp, "cases.pickle")
    with open(cases_file, "wb") as f:
        pickle.dump(cases, f, protocol=pickle.HIGHEST_PROTOCOL)
    try:
        return _run_isolated(names, backend, jobs, timeout, progress, cases, cases_file)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _run_isolated(names, backend, jobs, timeout, progress, cases, cases_file) -> list:
    import os
    import threading
    todo = list(enumerate(names))
    results: list = [None] * len(names)
    lock = threading.Lock()

    def serve():
        worker = None
        try:
            while True:
                with lock:
                    if not todo:
                        return
                    k, name = todo.pop(0)
                if worker is None:
                    worker = _CaseWorker(backend, cases_file)
                r = worker.run(name, timeout)
                if r.status == CRASHED and worker.proc.poll() is not None:
                    worker.close()
                    worker = None
                with lock:
                    results[k] = r
                    if progress:
                        progress(r)
        finally:
            if worker is not None:
                worker.close()

    jobs = max(1, min(jobs or os.cpu_count() or 1, len(names)))
    threads = [threading.Thread(target=serve, daemon=True) for _ in range(jobs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ops_of = {c.name: tuple(sorted({n.op_type for n in c.model.graph.node})) for c in cases}
    for k, r in enumerate(results):      # a crashed case's ops, for the per-op table
        if r is not None and r.status == CRASHED and not r.ops:
            results[k] = CaseResult(r.name, ops_of.get(r.name, ()), r.status, r.reason)
    return results
