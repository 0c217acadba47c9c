"""What runs on each node of a Ray cluster: one actor that owns the node's CPUs and measures
candidates there with the local `Measurer` (parallel builds, one-at-a-time checked runs, timeouts,
error codes, cache flush), so a record measured on a node is the record a local tune would write.

Nothing of the driver's runs here: a task arrives as JSON (workload key, template name, workload),
configs as their knob values, and answers go back as record lines. The template is looked up in
this node's own registry and every config is checked against it before anything is generated.
"""
from __future__ import annotations

import json
import os
import platform
import time

from ..errors import ModelcError
from ..extract import Task, workload_flops
from ..kernels import cache_files
from ..target import Target
from ..validate import check_config, check_workload
from ..version import VERSION
from . import records as R
from .measure import MeasureOptions, Measurer

PROTOCOL = 1                      # the shape of describe()/measure(); the driver refuses another


def numba_version() -> str:
    import numba
    return numba.__version__


class NodeMeasurer:
    """A Ray actor class (the driver wraps it with `ray.remote`): `describe` says what this node
    would write into a record, `measure` measures a share of a round."""

    def __init__(self, options: dict):
        try:        # Ray starts its workers at nice 15: on a busy machine compiles and timings would lose
            os.setpriority(os.PRIO_PROCESS, 0, 0)          # the CPU (a local tune runs at 0)
        except (OSError, AttributeError):               # not allowed: describe() says so
            pass
        opt = MeasureOptions(**{k: v for k, v in options.items() if k in MeasureOptions.__dataclass_fields__})
        self.target = R.current_target()
        self.measurer = Measurer(opt)

    def describe(self) -> dict:
        return {"protocol": PROTOCOL, "modelc": VERSION, "numba": numba_version(),
                "python": platform.python_version(), "target": self.target, "cores": os.cpu_count() or 1,
                "builders": len(self.measurer.builders), "pid": os.getpid(),
                "nice": os.getpriority(os.PRIO_PROCESS, 0) if hasattr(os, "getpriority") else 0,
                "host": Target.host().to_json()}

    def measure(self, task_json: str, configs_json: str) -> dict:
        """{"records": record lines (JSON), one per config, in order; "seconds": time spent}. A config
        this node's template refuses is recorded as a compile error, as a local build would."""
        t0 = time.time()
        t = json.loads(task_json)
        wl = t["workload"]
        check_workload(wl, "task.workload", key=t["key"])
        task = Task(t["key"], t["desc"], t["template"], wl, int(t.get("weight", 1)), workload_flops(wl))
        configs = json.loads(configs_json)
        refused = {}
        for k, c in enumerate(configs):
            try:
                check_config(t["template"], wl, c, "config", key=t["key"])
            except ModelcError as e:
                refused[k] = R.Record(task.key, task.desc, task.template, c, [], R.COMPILE_ERROR, f"refused: {e}",
                                      self.target, wl, time.time())
        ok = [c for k, c in enumerate(configs) if k not in refused]
        measured = iter(self.measurer.measure(task, [_Values(c) for c in ok], self.target) if ok else [])
        recs = [refused[k] if k in refused else next(measured) for k in range(len(configs))]
        cache_files.auto(cache_files.CHECK_EVERY_S)     # (this node's cache keeps every candidate too)
        return {"records": [r.to_json() for r in recs], "seconds": time.time() - t0}

    def close(self):
        self.measurer.close()


class _Values:
    """A config as `Measurer.measure` reads it: only its knob values cross the wire."""

    def __init__(self, values: dict):
        self.values = values
