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
    order = []
    for r in recs:
        if r.key not in order:
            order.append(r.key)
    desc = {r.key: r.desc for r in recs}
    weight = {r.key: r.weight for r in recs}
    best: dict = {}
    curves = {k: ([], []) for k in order}
    total_x, total_y, alloc_x, alloc_y = [], [], [], []
    for i, r in enumerate(recs, 1):
        best[r.key] = min(best.get(r.key, math.inf), r.cost)
        n = len(curves[r.key][0]) + 1
        if math.isfinite(best[r.key]):
            curves[r.key][0].append(n)
            curves[r.key][1].append(best[r.key] * 1e3)
        if all(math.isfinite(v) for v in best.values()):
            total_x.append(i)
            total_y.append(sum(weight[k] * v for k, v in best.items()) * 1e3)
        alloc_x.append(i)
        alloc_y.append(order.index(r.key))

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
