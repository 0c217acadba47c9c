"""`modelc.tune`: split a trial budget across a model's tasks and search each one, logging everything.

Top to bottom: lower the model and keep the tunable tasks; read the log (resume: trial counts,
best latencies and measured configs come back, and the cost models warm-start from every record);
then Ansor's task scheduler hands out rounds, each round asks that task's tuner for candidates,
measures them (parallel builds, one-at-a-time checked runs) and appends every record to the log
before the next round starts.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import sys
import time

from .. import logs
from ..errors import ModelcError
from ..extract import Task, extract_tasks, workload_flops
from ..kernels import cache_files
from ..kernels.template import valid_default
from ..target import use as use_target
from . import records as R
from .ga_tuner import GATuner
from .index_based_tuner import GridSearchTuner, RandomTuner
from .measure import MeasureOptions, Measurer
from .scheduler import PrintTableCallback, TaskScheduler
from .xgb_tuner import XGBTuner

logger = logging.getLogger(__name__)

TUNERS = {"random": RandomTuner, "grid": GridSearchTuner, "ga": GATuner, "xgb": XGBTuner}


def tuning_tasks(model, shape: dict | None = None) -> list[Task]:
    """The model's tasks: one per tunable workload and algorithm (template) that can run it."""
    out = []
    for t in extract_tasks(model, shape):
        for name in ([t.template] if t.tunable else []) + t.alternatives:
            label = "te" if name.startswith("te_") else name.split("_")[-1]
            desc = t.desc if name == t.template else f"{t.desc} [{label}]"
            out.append(dataclasses.replace(t, desc=desc, template=name, tunable=True, alternatives=[]))
    return out


def logged_tasks(records: list) -> dict:
    """A Task per (workload key, template) of a log, for the tuners' warm start: every tuner reads
    every record, so what derives from a workload is worked out once per logged task. A workload
    this version cannot rebuild is left out (its records teach nothing)."""
    out: dict = {}
    for r in records:
        k = (r.key, r.template)
        if r.workload is None or k in out:
            continue
        try:
            out[k] = Task(r.key, r.desc, r.template, r.workload, r.weight, workload_flops(r.workload))
        except Exception:
            out[k] = None
    return {k: t for k, t in out.items() if t is not None}


def similarity_groups(tasks: list) -> list:
    """Ansor's "similar tasks" (one fused op pattern), split by algorithm: a Winograd conv's
    FLOP/s counts the direct conv's FLOPs, so in one group with direct convs it promised them a
    speed they cannot reach, and the scheduler spent its rounds on them (seen: 52 of 300 trials
    on ResNet-18's stem conv, whose default was already its best)."""
    return [f"{(t.desc.split() or [''])[0]}/{t.template}" for t in tasks]


def best_of_alternatives(tasks: list):
    """The scheduler's objective when a workload has several algorithms (one task each): sum of
    weight x the best latency among its tasks, since compile keeps only the fastest."""
    groups: dict = {}
    for i, t in enumerate(tasks):
        groups.setdefault(t.key, []).append(i)
    if all(len(g) == 1 for g in groups.values()):
        return None
    weights = {k: tasks[g[0]].weight for k, g in groups.items()}

    def objective(costs):
        return sum(weights[k] * min(costs[i] for i in g) for k, g in groups.items())
    return objective


def cluster_measurer(address: str, options: MeasureOptions | None, target_cpu: str | None):
    from .cluster import ClusterMeasurer       # Ray is an optional extra
    return ClusterMeasurer(address, options, target_cpu=target_cpu)


class _Progress:
    """A tqdm bar over trials (the per-round table is the scheduler's callback)."""

    def __init__(self, total: int, initial: int, quiet: bool):
        self.bar = None
        if not quiet:
            from tqdm import tqdm
            self.bar = tqdm(total=total, initial=min(initial, total), desc="tuning", unit="trial",
                            file=sys.stderr, dynamic_ncols=True)

    def update(self, n, best_ms=None):
        if self.bar is not None:
            self.bar.update(n)
            if best_ms is not None:
                self.bar.set_postfix_str(f"est. total {best_ms:.2f} ms")

    def note(self, text: str):
        if self.bar is not None:
            self.bar.set_postfix_str(text)

    def close(self):
        if self.bar is not None:
            self.bar.close()


def tune(model, n_trials: int = 1000, log: str = "tuning.jsonl", shape: dict | None = None,
         tuner: str = "xgb", strategy: str = "gradient", trials_per_round: int = 16,
         early_stopping: int | None = None, measure_options: MeasureOptions | None = None,
         verbose: int = 1, callbacks=(), seed: int = 0, tasks: list | None = None,
         cluster: str | None = None, target_cpu: str | None = None, module_check: int = 2):
    """Tune a model's kernels with a budget of `n_trials` measurements, appending to `log`.

    The budget counts the trials already in the log for these tasks, so running the same
    command again after an interruption resumes and stops at the same total.
    verbose: 0 quiet, 1 progress bar and per-round table, 2 also every measurement error.
    cluster: None measures in local worker processes; "auto" or "HOST:PORT" on the nodes of a Ray
    cluster whose CPU is `target_cpu` (default: the driver's), and the records are for that CPU.
    module_check: afterwards, time each workload's best `module_check` configs and its default in
    the model's module and log the fastest there (module_check.py; 0: no check). Local tuning only.
    Returns the scheduler (best latencies, trials per task, the round log).
    """
    if tuner not in TUNERS:
        raise ModelcError(f"unknown tuner {tuner!r}; choose from {sorted(TUNERS)}")
    args = (model, n_trials, log, shape, tuner, strategy, trials_per_round, early_stopping, measure_options,
            verbose, callbacks, seed, tasks)
    if cluster is None:
        if target_cpu is not None:
            raise ModelcError("tuning for another CPU than this machine's needs a cluster of it (cluster=...)")
        size = os.path.getsize(log) if os.path.exists(log) else 0
        sched = _tune(*args, None, R.current_target())
        # after a run that measured something (not a resume at its budget), on a model (not tasks alone)
        if module_check and model is not None and os.path.exists(log) and os.path.getsize(log) > size:
            _module_check(model, log, shape, module_check, verbose)
        cache_files.auto()          # (every candidate measured left a kernel in the cache)
        return sched
    with logs.shown(verbose):
        measurer = cluster_measurer(cluster, measure_options, target_cpu)
    try:
        # another CPU's tasks and candidates follow its vectors and caches (layouts, tiles, spaces)
        with (use_target(measurer.host) if measurer.host is not None else contextlib.nullcontext()):
            return _tune(*args, measurer, measurer.target)
    finally:
        measurer.close()


def _module_check(model, log, shape, n: int, verbose: int):
    from . import module_check
    with logs.shown(verbose):
        bar = None
        if verbose >= 1:
            from tqdm import tqdm
            bar = tqdm(desc="module check", unit="step", file=sys.stderr, dynamic_ncols=True)

        def progress(done, total, text):
            bar.total = total
            bar.update(done - bar.n)
            bar.set_postfix_str(text)
            if done == total:
                bar.close()         # before the check's summary line
        try:
            module_check.check(model, log, shape=shape, n=n, progress=progress if bar is not None else None)
        finally:
            if bar is not None:
                bar.close()


def _tune(model, n_trials, log, shape, tuner, strategy, trials_per_round, early_stopping, measure_options,
          verbose, callbacks, seed, tasks, measurer, target):
    tasks = tasks if tasks is not None else tuning_tasks(model, shape)
    prior = [r for r in R.load_records(log) if R.same_target(r.target, target)]
    by_task = {(t.key, t.template): i for i, t in enumerate(tasks)}
    history: dict = {}
    seen: set = set()
    recheck: list[list] = [[] for _ in tasks]           # configs to measure once more
    rechecked: list[set] = [set() for _ in tasks]       # ... and those already measured twice
    for r in prior:
        i = by_task.get((r.key, r.template))
        if i is not None:
            history.setdefault(i, []).append(r.cost)
            cfg = (i, json.dumps(r.config, sort_keys=True))
            if cfg in seen:                                     # measured twice: a recheck
                with contextlib.suppress(Exception):            # (a config of an older space)
                    rechecked[i].add(tasks[i].space.from_values(r.config).index)
            seen.add(cfg)
    tuners = [TUNERS[tuner](t, seed=seed + i) for i, t in enumerate(tasks)]
    defaults = [valid_default(t.tpl, t.wl, t.space) for t in tasks]
    for tn, d in zip(tuners, defaults):
        tn.prefer([d])
    logged = logged_tasks(prior)
    warm = [(logged[(r.key, r.template)], r.config, r.cost) for r in prior if (r.key, r.template) in logged]
    for tn in tuners:
        tn.load_history(warm)

    with logs.shown(verbose):
        measurer = measurer or Measurer(measure_options)
        writer = R.RecordWriter(log)
        done = sum(len(v) for v in history.values())
        progress = _Progress(n_trials, done, verbose == 0)

        def write(i: int, rec):
            rec.weight = tasks[i].weight
            writer.write(rec)
            if verbose >= 2 and rec.error:
                logger.info("[%s] %s: %s", tasks[i].desc, R.ERROR_NAMES[rec.error], rec.error_msg)

        def measure(i: int, configs: list) -> list:
            if getattr(measurer, "streams", False):     # a cluster's records are logged as they arrive
                recs = measurer.measure(tasks[i], configs, target, on_record=lambda rec: write(i, rec))
            else:
                recs = measurer.measure(tasks[i], configs, target)
                for rec in recs:
                    write(i, rec)
            costs = [rec.cost for rec in recs]
            tuners[i].update(configs, costs)
            return costs

        def tune_round(i: int, n: int) -> list:
            # A config that has been beaten - the previous best, or the default (the untuned
            # kernel) - is measured once more, at the start of the task's next round: on a shared
            # machine one disturbed timing would otherwise lose it for good, and the tuned module
            # could end up slower than the untuned one (seen here: 0.96x, after a default conv had
            # read 2x slow). A config keeps the lowest of its measurements; a re-measurement is a
            # trial like any other, so the budget stays exact.
            again = recheck[i][:n]
            del recheck[i][:n]
            configs, prepared[i] = prepared[i][:n - len(again)], prepared[i][n - len(again):]
            if n > len(again) + len(configs):
                configs += tuners[i].next_batch(n - len(again) - len(configs))
            if not configs and not again:
                return []
            before = tuners[i].best_config
            costs = measure(i, again + configs)
            best = tuners[i].best_config
            for c in (before, defaults[i]):
                if (c is not None and best is not None and c.index != best.index
                        and c.index in tuners[i].measured and c.index not in rechecked[i]):
                    rechecked[i].add(c.index)
                    recheck[i].append(c)
            progress.update(len(costs))
            return costs

        prepared: list[list] = [[] for _ in tasks]       # warm-up candidates, compiled ahead

        def prepare(rounds: list):
            # the warm-up's candidates of all tasks compiled as one batch: a round of one
            # candidate keeps one builder busy, a batch keeps all of them
            for i, n in rounds:
                prepared[i] = tuners[i].next_batch(n)
            if hasattr(measurer, "prebuild"):
                total = sum(len(prepared[i]) for i, _ in rounds)
                measurer.prebuild([(tasks[i], prepared[i]) for i, _ in rounds],
                                  done=lambda k: progress.note(f"warm-up: compiled {k}/{total}"))

        cbs = list(callbacks)
        if verbose >= 1:
            cbs.append(PrintTableCallback(file=sys.stderr))
        sched = TaskScheduler(tasks, strategy=strategy, objective=best_of_alternatives(tasks),
                              similarity=similarity_groups(tasks), early_stopping_task=early_stopping,
                              callbacks=cbs, seed=seed)
        t0 = time.time()
        try:
            sched.tune(n_trials, trials_per_round, tune_round, history=history, prepare=prepare)
        finally:
            progress.close()
            writer.close()
            measurer.close()
        if verbose >= 1:
            logger.info("tuning finished: %d trials in %.0f s, estimated total latency %.3f ms; log: %s",
                        sched.total_trials, time.time() - t0, sched.objective_value() * 1e3, log)
    return sched
