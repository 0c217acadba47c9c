"""The module check: a workload's few best kernels timed where they run, in the model, after tuning.

Why: a tuner times a kernel alone, in a loop, with caches as cache_flush.py leaves them; in the
module it runs between its real neighbours, on data they have just written, sharing the cores'
caches with them. Those are different machines for memory-bound layers: on the 2-core EPYC,
MobileNetV2's module tuned for 300 trials ran 0.96x the speed of its untuned one, its 1x1 convs
with a residual read 0.065 ms in the tuned module against the default config's 0.051 ms.

So, after tuning, each workload's `candidates` best configs (over its algorithms) and its default
are built into variants of the module - variant j runs every workload's j-th candidate - and the
variants are run in alternation, each kernel stamped where it runs (Module.stamped_runs). The
candidate with the lowest median in the module is logged as a record of context "module", which
ApplyHistoryBest takes over the isolated best as long as no better kernel record comes after it.
These records are not trials: the budget and the tuners' history leave them out.
"""
from __future__ import annotations

import json
import logging
import statistics
import time

import numpy as np

from ..kernels.template import alternatives, select, untuned, valid_default
from ..kernels.workload import Workload
from . import dispatch
from . import records as R

logger = logging.getLogger(__name__)


class _Choices:
    """A dispatch context that hands `compile` a fixed (template, config) per workload key."""

    def __init__(self, choice: dict):
        self.choice = choice

    def choose(self, key: str, templates: list, untuned: str | None = None):
        c = self.choice.get(key)
        return c if c is not None and c[0] in templates else None

    def report(self, steps: list):
        pass


def candidates(program: dict, records: list, target: dict, n: int) -> dict:
    """Per tunable workload key of a module's program: its `n` best distinct (template, config)
    by the kernel records (over the algorithms that run it), then its default where that is not
    among them; keys with one candidate are left out."""
    by_key: dict = {}
    for r in records:
        if r.error == R.NO_ERROR and R.same_target(r.target, target):     # (kernel records only)
            by_key.setdefault(r.key, []).append(r)
    out = {}
    for step in program["steps"]:
        key = step["key"]
        if key in out or key not in by_key:
            continue
        view = Workload(step["workload"])
        tpl = select(view)
        if not tpl.tunable:
            continue
        algos = {tpl.name, *(t.name for t in alternatives(view, tpl))}
        cands, seen = [], set()
        for r in sorted(by_key[key], key=lambda r: r.cost):
            if r.template in algos and _id(r.template, r.config) not in seen and len(cands) < n:
                seen.add(_id(r.template, r.config))
                cands.append((r.template, r.config))
        plain = untuned(view, tpl)
        default = (plain.name, dict(valid_default(plain, view, plain.space(view)).values))
        if cands and _id(*default) not in seen:
            cands.append(default)
        if len(cands) > 1:
            out[key] = cands
    return out


def _id(template: str, config: dict) -> str:
    return template + json.dumps(config, sort_keys=True)


def check(model, log: str, shape: dict | None = None, n: int = 2, rounds: int = 30, repeat: int = 5,
          jobs: int | None = None, progress=None) -> list:
    """Time each workload's candidates in the module and log the fastest as a module record.
    Returns the records written (none when no workload has two candidates)."""
    from ..compiler import build_program, compile as compile_model
    from ..frontend import from_onnx
    from ..ir import Graph
    from ..passes.lower import lower

    t0 = time.time()
    graph = model if isinstance(model, Graph) else from_onnx(model, shape=shape)
    target = R.current_target()
    program, _ = build_program(lower(graph))
    cands = candidates(program, R.load_records(log, warn=False), target, n)
    if not cands:
        return []
    width = max(len(c) for c in cands.values())
    mods = []
    for j in range(width):
        ctx = _Choices({k: c[j] if j < len(c) else c[0] for k, c in cands.items()})
        dispatch.push(ctx)
        try:
            mods.append(compile_model(graph, jobs=jobs))
        finally:
            dispatch.pop(ctx)
        if progress:
            progress(j + 1, width + rounds, f"built {j + 1}/{width} variants of the module")
    keys = [program["steps"][i]["key"] for i in mods[0]._step_index]   # of each kernel run, alike in every variant
    cands = {k: c for k, c in cands.items() if k in keys}       # a view runs no kernel
    if not cands:
        return []
    rng = np.random.default_rng(0)
    feeds = {s["name"]: (rng.standard_normal(s["shape"]) if np.dtype(s["dtype"]).kind == "f"
                         else np.zeros(s["shape"])).astype(s["dtype"]) for s in mods[0].program["inputs"]}
    samples = [{} for _ in mods]                # variant -> key -> [ms of one run, summed over its steps]
    for m in mods:
        m.run(feeds)
    for r in range(rounds):
        for j in np.roll(np.arange(width), r):  # alternate, each variant first in turn
            times = mods[j].stamped_runs(repeat)
            for run in range(repeat):
                per = {}
                for key, ts in zip(keys, times):
                    if key in cands:
                        per[key] = per.get(key, 0.0) + ts[run]
                for key, ms in per.items():
                    samples[j].setdefault(key, []).append(ms)
        if progress:
            progress(width + r + 1, width + rounds, f"timing them, round {r + 1}/{rounds}")
    steps = {s["key"]: s for s in program["steps"]}
    now, out, moved = time.time(), [], 0
    before = sum(statistics.median(samples[0][k]) for k in cands)
    after = sum(min(statistics.median(samples[j][k]) for j in range(len(c))) for k, c in cands.items())
    with R.RecordWriter(log) as writer:
        for key, c in cands.items():
            med = [statistics.median(samples[j][key]) if j < len(c) else float("inf") for j in range(width)]
            j = int(np.argmin(med))
            step = steps[key]
            count = sum(1 for s in program["steps"] if s["key"] == key)
            runs = samples[j][key]
            costs = [statistics.median(runs[i::3]) / count * 1e-3 for i in range(3)]
            rec = R.Record(key, step["desc"], c[j][0], c[j][1], costs, target=target, workload=step["workload"],
                           timestamp=now, weight=count, context="module")
            writer.write(rec)
            out.append(rec)
            moved += j > 0
    logger.info("module check: %d workloads timed in the module (up to %d configs each) in %.0f s; %d run another "
                "config than their isolated best, estimated %.3f -> %.3f ms", len(out), width, time.time() - t0, moved,
                before, after)
    return out
