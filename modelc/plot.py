"""`modelc plot LOG`: how tuning went, from the log alone (matplotlib, the 'plot' extra).

Three panels: each task's best-so-far latency against its trials; the estimated total latency
(sum of weight x best latency over the tasks seen so far) against all trials; and which task
each trial went to, which shows how the scheduler allocated the budget.
"""
from __future__ import annotations

import math

from .errors import ModelcError
from .tune.records import load_records


def plot_log(log: str, output: str):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ModelcError("modelc plot needs matplotlib: pip install 'modelc[plot]'") from None
    recs = load_records(log)
    if not recs:
        raise ModelcError(f"no records in {log!r}")
    order, desc, curves, (total_x, total_y), (alloc_x, alloc_y) = series(recs)

    fig, axes = plt.subplots(1, 3, figsize=(18, 5.5))
    ax = axes[0]
    for k in order:
        xs, ys = curves[k]
        if xs:
            ax.plot(xs, ys, drawstyle="steps-post", label=desc[k][:40])
    ax.set(xlabel="trials of the task", ylabel="best latency (ms)", yscale="log", title="per task")
    if len(order) <= 12:
        ax.legend(fontsize=7)
    ax = axes[1]
    ax.plot(total_x, total_y, drawstyle="steps-post")
    ax.set(xlabel="trials", ylabel="sum of weight x best latency (ms)", yscale="log",
           title="estimated total latency")
    ax = axes[2]
    ax.scatter(alloc_x, alloc_y, s=4)
    ax.set(xlabel="trial", ylabel="task index (first seen order)", title="allocation of trials")
    fig.suptitle(f"{log}: {len(recs)} records, {len(order)} tasks")
    fig.tight_layout()
    fig.savefig(output, dpi=110)
    plt.close(fig)


def series(recs) -> tuple:
    """What the three panels show: per task (workload, algorithm) its best-so-far curve, the
    estimated total latency after each record, and which task each record went to."""
    # a task is a workload and an algorithm (direct or Winograd ...); the estimated total counts
    # each workload's fastest algorithm, as compile does
    order = []
    for r in recs:
        if (r.key, r.template) not in order:
            order.append((r.key, r.template))
    desc = {(r.key, r.template): r.desc for r in recs}
    weight = {r.key: r.weight for r in recs}
    best: dict = {}
    curves = {k: ([], []) for k in order}
    total_x, total_y, alloc_x, alloc_y = [], [], [], []
    for i, r in enumerate(recs, 1):
        t = (r.key, r.template)
        best[t] = min(best.get(t, math.inf), r.cost)
        n = len(curves[t][0]) + 1
        if math.isfinite(best[t]):
            curves[t][0].append(n)
            curves[t][1].append(best[t] * 1e3)
        per_key: dict = {}
        for (key, _), v in best.items():
            per_key[key] = min(per_key.get(key, math.inf), v)
        if all(math.isfinite(v) for v in per_key.values()):
            total_x.append(i)
            total_y.append(sum(weight[k] * v for k, v in per_key.items()) * 1e3)
        alloc_x.append(i)
        alloc_y.append(order.index(t))
    return order, desc, curves, (total_x, total_y), (alloc_x, alloc_y)
