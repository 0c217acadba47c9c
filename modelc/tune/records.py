"""Tuning records: one JSON object per line, appended and flushed as each measurement lands.

The log is the database: resuming a run, `ApplyHistoryBest` and the cost model's warm start all
read it. A killed run loses nothing that was measured (every line is flushed and fsynced before
the next measurement starts); a corrupt or foreign line is skipped with one warning counting them.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import warnings
from dataclasses import dataclass, field

try:
    import fcntl
except ImportError:                   # not POSIX: single O_APPEND writes only
    fcntl = None

from ..errors import ModelcError
from ..target import Target
from ..validate import check_config, check_record
from ..version import VERSION
from . import dispatch

logger = logging.getLogger(__name__)

RECORD_VERSION = 1

NO_ERROR, COMPILE_ERROR, RUNTIME_ERROR, RUN_TIMEOUT, WRONG_RESULT, BUILD_TIMEOUT = range(6)
ERROR_NAMES = {NO_ERROR: "ok", COMPILE_ERROR: "compile error", RUNTIME_ERROR: "runtime error",
               RUN_TIMEOUT: "run timeout", WRONG_RESULT: "wrong result", BUILD_TIMEOUT: "build timeout"}


def current_target(threads: int | None = None) -> dict:
    """What a measurement depends on: CPU model, ISA features numba compiles for, thread count."""
    return Target.host(threads).record()


def same_target(a: dict, b: dict) -> bool:
    return (a.get("cpu"), a.get("isa"), a.get("threads")) == (b.get("cpu"), b.get("isa"), b.get("threads"))


@dataclass
class Record:
    key: str
    desc: str
    template: str
    config: dict
    costs: list                       # seconds per run; empty on error
    error: int = NO_ERROR
    error_msg: str = ""
    target: dict = field(default_factory=dict)
    workload: dict | None = None
    timestamp: float = 0.0
    version: str = VERSION
    weight: int = 1                   # occurrences of the workload in the tuned model (for plots)
    context: str = "kernel"           # "module": timed where it runs in a model (module_check.py)

    @property
    def cost(self) -> float:
        """Median latency in seconds; infinity for failed measurements."""
        if self.error != NO_ERROR or not self.costs:
            return float("inf")
        s = sorted(self.costs)
        return s[len(s) // 2]

    def to_json(self) -> str:
        return json.dumps({"v": RECORD_VERSION, "key": self.key, "desc": self.desc, "template": self.template,
                           "config": self.config, "costs": self.costs, "error": self.error,
                           "error_msg": self.error_msg[:500], "target": self.target, "workload": self.workload,
                           "time": self.timestamp, "modelc": self.version, "weight": self.weight,
                           **({"context": self.context} if self.context != "kernel" else {})},
                          separators=(",", ":"))

    @staticmethod
    def from_json(line: str) -> "Record":
        d = json.loads(line)
        if not isinstance(d, dict) or d.get("v") != RECORD_VERSION:
            raise ValueError("not a modelc record of this version")
        check_record(d, n_errors=len(ERROR_NAMES))    # a shared log is untrusted: schema first
        return Record(d["key"], d.get("desc", ""), d["template"], d["config"], list(d["costs"]),
                      int(d["error"]), d.get("error_msg", ""), d.get("target", {}), d.get("workload"),
                      float(d.get("time", 0.0)), d.get("modelc", ""), int(d.get("weight", 1)),
                      d.get("context", "kernel"))


class RecordWriter:
    """Appends records to a log; each one is on disk before `write` returns.

    Several writers may append to one log at once (two `modelc tune` runs sharing it): each line
    goes out as one `os.write` on an O_APPEND descriptor, under an exclusive `flock` held through
    the fsync, so lines never interleave, however long. A line left half-written by a killed
    writer is ended before the next record (under the same lock), so only that line is lost.
    """

    def __init__(self, path: str):
        self.path = path
        d = os.path.dirname(os.path.abspath(path))
        os.makedirs(d, exist_ok=True)
        self._fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o666)
        with self._locked():
            if self._torn():
                self._write_all(b"\n")

    @contextlib.contextmanager
    def _locked(self):
        if fcntl is not None:
            fcntl.flock(self._fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            if fcntl is not None:
                fcntl.flock(self._fd, fcntl.LOCK_UN)

    def _torn(self) -> bool:
        """Whether the log ends inside a line (call under the lock)."""
        size = os.fstat(self._fd).st_size
        return size > 0 and os.pread(self._fd, 1, size - 1) != b"\n"

    def _write_all(self, data: bytes):
        view = memoryview(data)
        while view:                               # one call, unless the disk is full or a signal
            view = view[os.write(self._fd, view):]  # cut it short (still under the lock)

    def write(self, rec: Record):
        line = (rec.to_json() + "\n").encode("utf-8")
        with self._locked():
            if self._torn():
                line = b"\n" + line
            self._write_all(line)
            os.fsync(self._fd)

    def close(self):
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def load_records(path_or_lines, warn: bool = True, in_module: bool = False) -> list:
    """The tuners' records of a log (with `in_module`, also the module checks' records, which are
    no trials: module_check.py); corrupt or foreign lines are skipped with one warning that counts
    them."""
    if isinstance(path_or_lines, (str, os.PathLike)):
        if not os.path.exists(path_or_lines):
            return []
        with open(path_or_lines, encoding="utf-8", errors="replace") as f:
            lines = f.readlines()
        where = os.fspath(path_or_lines)
    else:
        lines, where = list(path_or_lines), "the records"
    out, bad, first = [], 0, ""
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = Record.from_json(line)
            if rec.workload is not None:      # the config must be one of the template's for it
                _check_config(rec)
            if in_module or rec.context == "kernel":
                out.append(rec)
        except (ValueError, KeyError, TypeError, RecursionError, ModelcError) as e:
            bad += 1
            first = first or f" (first: line {n}: {str(e)[:300]})"
    if bad and warn:
        warnings.warn(f"skipped {bad} corrupt or foreign line(s) in {where}{first}", stacklevel=2)
    return out


_config_checked: set = set()


def _check_config(rec: Record):
    k = (rec.key, rec.template, json.dumps(rec.config, sort_keys=True))
    if k not in _config_checked:
        check_config(rec.template, rec.workload, rec.config, "record", key=rec.key)
        _config_checked.add(k)


def best_by_key(records, target: dict | None = None) -> dict:
    """The best valid record per (workload key, template) for `target` (None: any target)."""
    best: dict = {}
    for r in records:
        if r.error != NO_ERROR or r.context != "kernel" or (target is not None and not same_target(r.target, target)):
            continue
        k = (r.key, r.template)
        if k not in best or r.cost < best[k].cost:
            best[k] = r
    return best


def distill(src: str, dst: str) -> int:
    """Keep the best record per workload, algorithm (template) and target, and the latest module
    check of each workload; returns how many were written. `ApplyHistoryBest` then takes the
    fastest algorithm of each workload."""
    recs = load_records(src, in_module=True)
    best: dict = {}
    for r in recs:
        if r.error != NO_ERROR:
            continue
        k = (r.key, r.template if r.context == "kernel" else "", json.dumps(r.target, sort_keys=True), r.context)
        if k not in best or (r.cost < best[k].cost if r.context == "kernel" else r.timestamp >= best[k].timestamp):
            best[k] = r
    tmp = dst + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        for r in best.values():
            f.write(r.to_json() + "\n")
    os.replace(tmp, dst)
    return len(best)


def module_checks(records, target: dict | None, best: dict) -> dict:
    """The latest module check's choice per workload key (module_check.py), where no kernel record
    of that workload is newer (tuned since, the isolated best is again the one to take)."""
    newest: dict = {}
    for r in best.values():
        newest[r.key] = max(newest.get(r.key, 0.0), r.timestamp)
    out: dict = {}
    for r in records:
        if r.context != "module" or r.error != NO_ERROR or (target is not None and not same_target(r.target, target)):
            continue
        if r.timestamp >= newest.get(r.key, float("inf")) and (r.key not in out or r.timestamp >= out[r.key].timestamp):
            out[r.key] = r
    return out


class ApplyHistoryBest:
    """Under this context, `modelc.compile` uses the best record per workload from a log.

    Records of another target (CPU, ISA, thread count) are ignored unless `any_target=True`.
    When `compile` finishes, one line says how many workloads were tuned and names the rest.
    """

    def __init__(self, log_or_records, any_target: bool = False, target: dict | None = None):
        if isinstance(log_or_records, (str, os.PathLike)):
            if not os.path.exists(log_or_records):
                raise ModelcError(f"tuning log {os.fspath(log_or_records)!r} does not exist")
            recs = load_records(log_or_records, in_module=True)
        else:
            recs = list(log_or_records)
        self.target = target or current_target()
        self.best = best_by_key(recs, None if any_target else self.target)
        self.in_module = module_checks(recs, None if any_target else self.target, self.best)
        self.hits: list = []
        self.misses: list = []
        self.summary = ""

    def query(self, key: str, template: str):
        rec = self.best.get((key, template))
        return None if rec is None else rec.config

    def choose(self, key: str, templates: list, untuned: str | None = None):
        """(template, config) of the fastest record among a workload's algorithms, or None: the
        module check's choice where there is one (module_check.py). None too where the fastest is
        of another algorithm than the one an untuned module runs (`untuned`) and that one has no
        record: nothing says the tuned kernel beats it (a log from before Winograd ran untuned)."""
        checked = self.in_module.get(key)
        if checked is not None and checked.template in templates:
            return checked.template, checked.config
        recs = [self.best[(key, t)] for t in templates if (key, t) in self.best]
        if not recs:
            return None
        rec = min(recs, key=lambda r: r.cost)
        if untuned is not None and rec.template != untuned and (key, untuned) not in self.best:
            return None
        return rec.template, rec.config

    def report(self, steps: list):
        """Which of a module's tunable steps found a record (`hits`, `misses`), and one line that
        says so (`summary`, also logged): the user learns which workloads run untuned."""
        tuned = [s for s in steps if (s["key"], s["template"]) in self.best]
        missed = [s for s in steps if (s["key"], s["template"]) not in self.best]
        self.hits, self.misses = tuned, missed
        uniq = sorted({s["desc"] for s in missed})
        line = f"ApplyHistoryBest: {len({s['key'] for s in tuned})} of " \
               f"{len({s['key'] for s in steps})} tunable workloads tuned"
        if uniq:
            line += f"; untuned (default config): {'; '.join(uniq[:8])}" + (" ..." if len(uniq) > 8 else "")
        self.summary = line
        # a miss is a warning: shown even to a program that set up no logging (Python's last resort)
        (logger.warning if uniq else logger.info)(line)

    def __enter__(self):
        dispatch.push(self)
        return self

    def __exit__(self, *exc):
        dispatch.pop(self)

