"""What the module check (modelc/tune/module_check.py) changes, on the CPU it runs on.

    python benchmarks/module_check.py MODEL --log LOG [--candidates 2] [--rounds 200]

Copies LOG (a tuning log of MODEL) beside itself, runs the check on the copy (timed), then, in one
process in alternating blocks, times onnxruntime, the untuned module, the module of the log's best
isolated records and the module the check chose, and prints their latencies and ratios, with the
sum of each tuned module's kernels as stamped in the running module. The machine is shared: read
the ratios of one run.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import modelc  # noqa: E402
from modelc import peers  # noqa: E402
from modelc.compare import alternating_timings  # noqa: E402
from modelc.resolve import resolve_model  # noqa: E402
from modelc.target import current as current_target  # noqa: E402
from modelc.tune import module_check  # noqa: E402
from modelc.tune import records as R  # noqa: E402


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model")
    p.add_argument("--log", required=True)
    p.add_argument("--candidates", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=200, help="timed calls per runtime")
    args = p.parse_args(argv)
    import numba
    numba.set_num_threads(args.threads)
    path = resolve_model(args.model)
    graph = modelc.from_onnx(path, default_batch=1)
    copy = os.path.splitext(args.log)[0] + ".checked.jsonl"
    shutil.copyfile(args.log, copy)
    t0 = time.perf_counter()
    recs = module_check.check(graph, copy, n=args.candidates)
    secs = time.perf_counter() - t0
    mods = {"untuned": modelc.compile(graph)}
    with R.ApplyHistoryBest(R.load_records(args.log, warn=False)):       # kernel records only
        mods["tuned (isolated best)"] = modelc.compile(graph)
    with R.ApplyHistoryBest(copy):
        mods["tuned + module check"] = modelc.compile(graph)
    specs = mods["untuned"].input_specs
    rng = np.random.default_rng(0)
    feeds = {s["name"]: rng.standard_normal(s["shape"]).astype(s["dtype"]) for s in specs}
    runs = {"onnxruntime": peers.runner("onnxruntime", path, args.threads, {s["name"]: s["shape"] for s in specs})}
    for k, m in mods.items():
        runs[k] = (lambda m: (lambda f: m.run(f)))(m)
    times = alternating_timings({k: (lambda r: (lambda: r(feeds)))(r) for k, r in runs.items()}, args.rounds)
    ms = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    kernels = kernel_sums(mods, feeds)
    best = R.best_by_key(R.load_records(args.log, warn=False), R.current_target())
    moved = sum(1 for r in recs if (r.template, r.config) != _isolated(best, r.key))
    print(f"CPU: {current_target().describe()}; {args.threads} threads; {args.model}, log {args.log}")
    print(f"module check: {len(recs)} workloads, {moved} moved off their isolated best, {secs:.0f} s")
    print("| runtime | median ms | / onnxruntime | / untuned | kernels in the module, ms |")
    print("|---|---|---|---|---|")
    for k, v in ms.items():
        print(f"| {k} | {v:.3f} | {v / ms['onnxruntime']:.2f} | {v / ms['untuned']:.2f} | "
              f"{kernels[k]:.3f} |" if k in kernels else f"| {k} | {v:.3f} | 1.00 | - | - |")


def kernel_sums(mods: dict, feeds: dict, rounds: int = 10, repeat: int = 5) -> dict:
    """Each module's kernels as stamped where they run, summed: medians over runs taken in
    alternation with the other modules (a machine that slows down slows them all)."""
    samples = {k: None for k in mods}
    for m in mods.values():
        m.run(feeds)
    for _ in range(rounds):
        for k, m in mods.items():
            times = m.stamped_runs(repeat)
            samples[k] = times if samples[k] is None else [a + b for a, b in zip(samples[k], times)]
    return {k: sum(statistics.median(ts) for ts in v) for k, v in samples.items()}


def _isolated(best: dict, key: str):
    """(template, config) of a workload's fastest kernel record over its algorithms."""
    rs = [r for (k, _), r in best.items() if k == key]
    r = min(rs, key=lambda r: r.cost) if rs else None
    return (r.template, r.config) if r else None


if __name__ == "__main__":
    main()
