"""Measurement: build candidates in parallel worker processes, then time them one at a time.

As in AutoTVM's LocalBuilder/LocalRunner: the builder compiles a batch of candidates in parallel
(each with a timeout), the runner times the built ones sequentially in a separate process
(`number` calls per repeat, `repeat` repeats, at least `min_repeat_ms` per repeat), checks every
result against the reference executor, and every outcome - including compile errors, runtime
errors, timeouts and wrong results, each with its own code - becomes a record.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

from . import records as R


class Worker:
    """One long-lived worker process speaking JSON lines; restarted after a timeout or crash."""

    def __init__(self):
        self.proc = None

    def _start(self):
        # the reference check runs numpy; BLAS threads left spinning after it would steal the
        # cores from the kernel being timed (the first candidate of each task read 2-10x slow)
        env = dict(os.environ, OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
        self.proc = subprocess.Popen([sys.executable, "-m", "modelc.tune.worker"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                     bufsize=1, env=env)

    def call(self, request: dict, timeout: float) -> dict | None:
        """The worker's answer, or None if it timed out or died (it is then restarted)."""
        if self.proc is None or self.proc.poll() is not None:
            self._start()
        answer = []

        def read():
            answer.append(self.proc.stdout.readline())

        try:
            self.proc.stdin.write(json.dumps(request) + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            self.close()
            return None
        t = threading.Thread(target=read, daemon=True)
        t.start()
        t.join(timeout)
        if t.is_alive() or not answer or not answer[0]:
            self.close()
            return None
        return json.loads(answer[0])

    def close(self):
        if self.proc is not None:
            try:
                self.proc.kill()
                self.proc.wait(5)
            except Exception:
                pass
            self.proc = None


@dataclass
class MeasureOptions:
    number: int = 5
    repeat: int = 3
    min_repeat_ms: float = 20.0
    build_timeout: float = 120.0
    run_timeout: float = 30.0
    n_parallel: int = 0               # builders; 0 = one per core
    tolerance: float = 1e-4
    cache_flush: bool = True          # evict a kernel's weights before each timed call (cache_flush.py)


class Measurer:
    def __init__(self, options: MeasureOptions | None = None):
        self.opt = options or MeasureOptions()
        n = self.opt.n_parallel or os.cpu_count() or 1
        self.builders = [Worker() for _ in range(n)]
        self.runner = Worker()

    def measure(self, task, configs: list, target: dict) -> list:
        """Records (one per config) for candidates of `task` (has .key, .desc, .template, .workload)."""
        reqs = [{"op": "build", "key": task.key, "workload": task.workload, "template": task.template.name,
                 "config": c.values} for c in configs]
        built = [None] * len(reqs)

        def build_some(worker, idxs):
            for i in idxs:
                t0 = time.time()
                res = worker.call(reqs[i], self.opt.build_timeout)
                built[i] = (res, time.time() - t0)

        n = len(self.builders)
        threads = [threading.Thread(target=build_some, args=(self.builders[k], range(k, len(reqs), n)))
                   for k in range(n)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        out = []
        for req, (res, _) in zip(reqs, built):
            if res is None:
                res = {"error": R.BUILD_TIMEOUT, "msg": f"no answer within {self.opt.build_timeout} s"}
            elif res["error"] == R.NO_ERROR:
                run = dict(req, op="run", number=self.opt.number, repeat=self.opt.repeat,
                           min_repeat_ms=self.opt.min_repeat_ms, tolerance=self.opt.tolerance,
                           cache_flush=self.opt.cache_flush)
                res = self.runner.call(run, self.opt.run_timeout) or {
                    "error": R.RUN_TIMEOUT, "msg": f"no answer within {self.opt.run_timeout} s"}
            out.append(R.Record(task.key, task.desc, task.template.name, req["config"],
                                res.get("costs", []), res["error"], res.get("msg", ""), target,
                                task.workload, time.time()))
        return out

    def close(self):
        for w in self.builders + [self.runner]:
            w.close()
