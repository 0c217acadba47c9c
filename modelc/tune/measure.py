"""Measurement: build candidates in parallel worker processes, then time them one at a time.

As in AutoTVM's LocalBuilder/LocalRunner: the builder compiles a batch of candidates in parallel
(each with a timeout), the runner times the built ones sequentially in a separate process
(`number` calls per repeat, `repeat` repeats, at least `min_repeat_ms` per repeat), checks every
result against the reference executor, and every outcome - including compile errors, runtime
errors, timeouts and wrong results, each with its own code - becomes a record.
"""
from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

from ..errors import ModelcError
from ..kernels import cache
from . import records as R

TIMEOUT = "timeout"


class Worker:
    """One long-lived worker process speaking JSON lines; restarted after a timeout or crash.

    A new process first answers a ping (its imports done) within `start_timeout`, so a
    candidate's timeout counts only its own work, never the worker's start-up.
    """

    def __init__(self, start_timeout: float = 120.0):
        self.proc = None
        self.start_timeout = start_timeout
        self._stderr: collections.deque = collections.deque(maxlen=20)
        self._drainer = None

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    def _start(self):
        # the reference check runs numpy; BLAS threads left spinning after it would steal the
        # cores from the kernel being timed (the first candidate of each task read 2-10x slow)
        env = cache.worker_env(OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
        self.proc = subprocess.Popen([sys.executable, "-m", "modelc.tune.worker"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     bufsize=1, env=env, errors="replace")
        self._stderr = collections.deque(maxlen=20)        # its last lines say why it died
        self._drainer = threading.Thread(target=_drain, args=(self.proc.stderr, self._stderr), daemon=True)
        self._drainer.start()
        answer, failure = self._ask({"op": "ping", "path": sys.path}, self.start_timeout)
        if answer is None:
            raise ModelcError(f"a measurement worker ({sys.executable} -m modelc.tune.worker) did not start: "
                              f"{'no answer within %g s' % self.start_timeout if failure == TIMEOUT else failure}")

    def call(self, request: dict, timeout: float) -> tuple[dict | None, str]:
        """(answer, "") or (None, why there is none): TIMEOUT, or how the worker died. Either way
        the worker is gone and the next call starts a new one (ModelcError if it cannot start)."""
        if self.proc is None or self.proc.poll() is not None:
            self.close()
            self._start()
        return self._ask(request, timeout)

    def _ask(self, request: dict, timeout: float) -> tuple[dict | None, str]:
        proc, answer = self.proc, []
        try:
            proc.stdin.write(json.dumps(request) + "\n")
            proc.stdin.flush()
        except (BrokenPipeError, OSError):
            return None, self._died(proc)
        t = threading.Thread(target=_read_line, args=(proc.stdout, answer), daemon=True)
        t.start()
        t.join(timeout)
        if t.is_alive():
            self.close()
            return None, TIMEOUT
        if not answer or not answer[0]:
            return None, self._died(proc)
        try:
            res = json.loads(answer[0])
            if not isinstance(res, dict) or not isinstance(res.get("error"), int):
                raise ValueError("not an answer")
        except ValueError:
            self.close()
            return None, f"the worker answered {answer[0][:200]!r}"
        return res, ""

    def _died(self, proc) -> str:
        """How the worker died (it is then cleaned up): exit status and its last stderr lines."""
        try:
            code = proc.wait(5)
        except subprocess.TimeoutExpired:
            code = None
        if self._drainer is not None:
            self._drainer.join(1.0)          # its last stderr lines
        self.close()
        how = "closed its output" if code is None else f"ended ({cache.exit_how(code)})"
        tail = " | ".join(ln.strip() for ln in list(self._stderr)[-5:] if ln.strip())
        return f"the worker process {how}" + (f"; its stderr ended: {tail}" if tail else "")

    def close(self):
        if self.proc is not None:
            try:
                self.proc.kill()
                self.proc.wait(5)
            except Exception:
                pass
            for f in (self.proc.stdin, self.proc.stdout):
                try:
                    f.close()
                except Exception:
                    pass
            self.proc = None


def _read_line(stream, answer):
    try:
        answer.append(stream.readline())
    except (OSError, ValueError):             # closed under it: the worker was killed
        pass


def _drain(stream, tail):
    try:
        for line in stream:
            tail.append(line[:500])
    except (OSError, ValueError):
        pass


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
        self._prebuilt: dict = {}
        self._settle = True             # the next run follows compiles (or nothing): it settles first

    def _requests(self, task, configs: list) -> list:
        module = type(task.tpl).__module__
        return [{"op": "build", "key": task.key, "workload": task.workload, "template": task.template,
                 "module": module, "config": c.values} for c in configs]

    def _build(self, reqs: list, done=None) -> list:
        """(answer, failure) of each build request, the builders taking the next request when free:
        compiles take 0.3-9 s, and a fixed share per builder left one idle while the other finished
        a slow share. With more requests than builders, the longest kernels (in lines, which the
        builders count first) go first: a round's long compile started last kept the other builder
        idle (ResNet-18, 200 trials in rounds of 4: the builders' compiles summed to 2 x 87 s in
        98 s of building; longest-first would have taken 93). Requests built ahead by `prebuild`
        are answered from there; done(k) hears each new answer."""
        built: list = [self._prebuilt.pop(_request_key(r), None) for r in reqs] if self._prebuilt else \
            [None] * len(reqs)          # (past the warm-up nothing is prebuilt: no keys to make)
        todo = [i for i, b in enumerate(built) if b is None]
        self._settle = self._settle or bool(todo)
        files: dict = {}
        if len(todo) > len(self.builders):
            written = self._on_builders(todo, lambda w, share: _lines(w, [(i, reqs[i]) for i in share]))
            todo.sort(key=lambda i: -written[i][0])
            files = {i: f for i, (_, f) in written.items() if f is not None}
        queue = iter(todo)
        lock = threading.Lock()
        count = [0]

        def build_some(worker, _):
            out = {}
            while True:
                with lock:
                    i = next(queue, None)
                if i is None:
                    return out
                req = dict(reqs[i], file=files[i]) if i in files else reqs[i]   # written already
                out[i] = worker.call(req, self.opt.build_timeout)
                if done is not None:
                    with lock:
                        count[0] += 1
                        done(count[0])

        for i, b in self._on_builders([], build_some).items():
            built[i] = b
        return built

    def _on_builders(self, items: list, work) -> dict:
        """Run work(builder, share) on every builder at once, each with its share of `items`
        (every k-th), and merge the dicts they return; a builder that cannot start is the
        caller's error."""
        shares = [items[k::len(self.builders)] for k in range(len(self.builders))]
        results: list = []
        raised: list = []

        def run(worker, share):
            try:
                results.append(work(worker, share))
            except BaseException as e:
                raised.append(e)

        threads = [threading.Thread(target=run, args=(w, sh)) for w, sh in zip(self.builders, shares)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        if raised:
            raise raised[0]
        return {k: v for r in results for k, v in r.items()}

    def prebuild(self, batches: list, done=None):
        """Compile the candidates of several tasks at once ([(task, configs), ...]); `measure`
        then runs them without building again (a failed build is reported there)."""
        reqs = [r for task, configs in batches for r in self._requests(task, configs)]
        for r, b in zip(reqs, self._build(reqs, done)):
            self._prebuilt[_request_key(r)] = b

    def measure(self, task, configs: list, target: dict) -> list:
        """Records (one per config) for candidates of a Task.

        A build that does not answer within `build_timeout` is BUILD_TIMEOUT, a run past
        `run_timeout` RUN_TIMEOUT; a builder that dies (an LLVM abort) is COMPILE_ERROR, a runner
        that dies (a kernel's stray write) RUNTIME_ERROR, each naming the signal; the worker is
        killed if need be and a new one started for the next candidate.
        """
        reqs = self._requests(task, configs)
        built = self._build(reqs)
        out = []
        for req, (res, failure) in zip(reqs, built):
            if res is None:
                res = _failure("build", failure, self.opt.build_timeout, R.BUILD_TIMEOUT, R.COMPILE_ERROR)
            elif res["error"] == R.NO_ERROR:
                # the first run after compiles settles (worker.py); the runs after it follow the
                # runner's own timings (a wait was a third of a run's 0.14 s), and so do the rounds
                # that only run what was compiled before: the warm-up's, one candidate per task
                # (EfficientNet-B0's 113 rounds had spent 11 s of a 185 s tune settling)
                run = dict(req, op="run", number=self.opt.number, repeat=self.opt.repeat,
                           min_repeat_ms=self.opt.min_repeat_ms, tolerance=self.opt.tolerance,
                           cache_flush=self.opt.cache_flush, settle=self._settle)
                if isinstance(res.get("file"), str):
                    run["file"] = res["file"]       # the runner loads what the builder compiled
                self._settle = False
                res, failure = self.runner.call(run, self.opt.run_timeout)
                if res is None:
                    self._settle = True             # a new runner starts cold
                    res = _failure("run", failure, self.opt.run_timeout, R.RUN_TIMEOUT, R.RUNTIME_ERROR)
            out.append(R.Record(task.key, task.desc, task.template, req["config"],
                                res.get("costs", []) if res["error"] == R.NO_ERROR else [], res["error"],
                                res.get("msg", ""), target, task.workload, time.time()))
        return out

    def close(self):
        for w in self.builders + [self.runner]:
            w.close()


LINES_TIMEOUT = 10.0     # seconds for a builder to write a round's sources (they take milliseconds)


def _lines(worker, reqs: list) -> dict:
    """{request index: (its kernel's length in lines, its cache file)} for requests this builder
    writes the sources of ((0, None) where it could not: that build fails on its own)."""
    if not reqs:
        return {}
    res, _ = worker.call({"op": "lines", "requests": [r for _, r in reqs]}, LINES_TIMEOUT)
    got = res.get("lines") if res is not None else None
    files = res.get("files") if res is not None else None
    if not isinstance(got, list) or len(got) != len(reqs):
        got = [0] * len(reqs)
    if not isinstance(files, list) or len(files) != len(reqs):
        files = [None] * len(reqs)
    return {i: (n if isinstance(n, int) else 0, f if isinstance(f, str) else None)
            for (i, _), n, f in zip(reqs, got, files)}


def _request_key(req: dict) -> str:
    return json.dumps(req, sort_keys=True)


def _failure(stage: str, failure: str, timeout: float, timeout_code: int, crash_code: int) -> dict:
    if failure == TIMEOUT:
        return {"error": timeout_code, "msg": f"no answer within {timeout:g} s: the {stage} worker was killed"}
    return {"error": crash_code, "msg": f"{stage} crashed: {failure}"}
