"""Issue 14's goal table, from scratch, on the CPU it runs on.

    python benchmarks/goal.py [resnet18 mobilenet_v2 transformer ...] [--trials 300 1000] [--out DIR]

For each model (a built-in example name or an .onnx file): tune with the first budget, then resume
the same log to each larger one (as a user who tunes 300 trials and then more would), timing the
tuning rate; compile the untuned module and one tuned module per budget (the log's first N
records); then, in one process, time onnxruntime, OpenVINO (when the `openvino` extra is
installed), and every module in alternating blocks, check each against onnxruntime, and print:

- untuned / onnxruntime (goal <= 1.2; <= 1.3 for the larger torchvision models),
- tuned / min(onnxruntime, OpenVINO) per budget (goal <= 0.8; <= 0.9),
- the share of the largest budget's gain that the smallest reached (goal >= 80%), and that gain as a
  share of the untuned latency ("61% of 2%": below the noise, the share says nothing),
- trials per minute (goal >= 120 on 2 cores), and the seconds the module checks took after the runs,
- the module's latency against the sum of its kernels' latencies: timed in the same moments (blocks
  of runs and of stamped runs in alternation), against one profile, and against the tuning log's
  latencies of the configs it runs (goal within 5%).

Logs stay in --out, so a second run resumes and only re-times. The machine is shared: read ratios.

`--isa avx2` on an AVX-512 host runs the whole benchmark again with numba compiling for AVX2 (the host's
LLVM features less AVX-512 and its successors, so the target is 16 registers of 8 floats) and OpenVINO's
oneDNN capped at AVX2 (ONEDNN_MAX_CPU_ISA): an AVX2 machine's instruction set, not its caches or clocks.
onnxruntime has no such switch and still runs its AVX-512 kernels, which makes its column a harder bar.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import modelc  # noqa: E402
from modelc import peers  # noqa: E402
from modelc.compare import TOLERANCE, alternating_timings, outputs_in_order  # noqa: E402
from modelc.resolve import resolve_model  # noqa: E402
from modelc.target import current as current_target  # noqa: E402
from modelc.tune import module_check  # noqa: E402
from modelc.tune import records as R  # noqa: E402
from modelc.tune.tuning import tuning_tasks  # noqa: E402

GOALS = {"untuned": 1.2, "tuned": 0.8}
LARGER = {"resnet50", "efficientnet_b0", "squeezenet1_1"}     # goals 1.3 and 0.9


def tune_to(graph, log: str, budgets: list, keys: set) -> list:
    """Tune to each budget in turn, then run the module check (module_check.py); returns (budget,
    trials measured, seconds tuning, seconds checking) per budget."""
    out = []
    for n in budgets:
        before = sum(r.key in keys for r in R.load_records(log, warn=False)) if os.path.exists(log) else 0
        t0 = time.perf_counter()
        modelc.tune(graph, n_trials=n, log=log, verbose=0, module_check=0)
        secs = time.perf_counter() - t0
        after = sum(r.key in keys for r in R.load_records(log, warn=False))
        t0 = time.perf_counter()
        if after > before:
            module_check.check(graph, log)
        out.append((n, after - before, secs, time.perf_counter() - t0))
    return out


def tuned_module(graph, log: str, n: int, keys: set):
    """The module a log gives after an n-trial run: its first `n` kernel records of this model and
    the module check that followed them."""
    target = R.current_target()
    recs, trials = [], 0
    for r in R.load_records(log, warn=False, in_module=True):
        if r.key not in keys or not R.same_target(r.target, target):
            continue
        trials += r.context == "kernel"
        if trials > n:
            break
        recs.append(r)
    with R.ApplyHistoryBest(recs):
        return modelc.compile(graph)


def rel_err(got: list, want: list) -> float:
    return max(float(np.abs(g.astype(np.float64) - w).max() / max(float(np.abs(w).max()), 1e-30))
               for g, w in zip(got, want))


def bench(model: str, budgets: list, out: str, threads: int, rounds: int) -> dict:
    path = resolve_model(model)
    graph = modelc.from_onnx(path, default_batch=1)
    name = os.path.splitext(os.path.basename(model))[0]
    log = os.path.join(out, f"{name}.jsonl")
    keys = {t.key for t in tuning_tasks(graph)}          # the model's workloads: its records in the log
    rates = tune_to(graph, log, budgets, keys)
    mods = {"untuned": modelc.compile(graph)}
    for n in budgets:
        mods[f"tuned {n}"] = tuned_module(graph, log, n, keys)
    specs = mods["untuned"].input_specs
    shapes = {s["name"]: s["shape"] for s in specs}
    rng = np.random.default_rng(0)
    feeds = {s["name"]: rng.standard_normal(s["shape"]).astype(s["dtype"]) for s in specs}
    out_names = [o["name"] for o in mods["untuned"].output_specs]
    runs = {"onnxruntime": peers.runner("onnxruntime", path, threads, shapes)}
    try:
        runs["openvino"] = peers.runner("openvino", path, threads, shapes)
    except modelc.ModelcError:
        pass
    for k, m in mods.items():
        runs[k] = (lambda m: (lambda f: outputs_in_order(m.run(f), out_names)))(m)
    want = runs["onnxruntime"](feeds)
    errs = {k: rel_err(r(feeds), want) for k, r in runs.items() if k != "onnxruntime"}
    times = alternating_timings({k: (lambda r: (lambda: r(feeds)))(r) for k, r in runs.items()}, rounds)
    ms = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    big = mods[f"tuned {budgets[-1]}"]
    prof = big.profile(repeat=20, feeds=feeds)
    logged = logged_ms(big.program["steps"], prof, R.load_records(log, warn=False))
    return {"model": name, "ms": ms, "errs": errs, "rates": rates, "kernels_ms": sum(p["ms"] for p in prof),
            "run_vs_kernels": run_vs_kernels(big, feeds),
            "logged_ms": logged, "budgets": budgets}


def logged_ms(steps: list, prof: list, records: list) -> float:
    """The tuning log's latency of each kernel the module runs, in the config it runs (its profile
    where the log has no record of that config, as for a default). Not the log's best config of the
    workload: where the module check chose another (one faster where it runs), the best's own time
    says nothing of the module's (MobileNetV2's run configs logged 4.82 ms, its workloads' bests 4.24)."""
    target = R.current_target()
    best: dict = {}
    for r in records:
        if r.error == R.NO_ERROR and r.context == "kernel" and R.same_target(r.target, target):
            k = (r.key, r.template, json.dumps(r.config, sort_keys=True))
            best[k] = min(best.get(k, r.cost), r.cost)
    total = 0.0
    for p in prof:
        s = steps[p["step"]]
        k = (s["key"], p["template"], json.dumps(s.get("config"), sort_keys=True))
        total += best[k] * 1e3 if s.get("config") is not None and k in best else p["ms"]
    return total


def run_vs_kernels(mod, feeds: dict, rounds: int = 20, block: int = 5) -> float:
    """The module's latency over the sum of its kernels, both taken in the same moments: blocks of
    timed runs and blocks of stamped runs in alternation, the median of the per-round ratios (one
    profile after the timings read this machine's noise in whatever minute it ran)."""
    out = []
    for _ in range(rounds):
        walls = []
        for _ in range(block):
            t0 = time.perf_counter()
            mod.run(feeds)
            walls.append((time.perf_counter() - t0) * 1e3)
        sums = [sum(ts) for ts in zip(*mod.stamped_runs(block))]
        out.append(statistics.median(walls) / statistics.median(sums))
    return statistics.median(out)


def report(r: dict) -> list:
    ms, b = r["ms"], r["budgets"]
    peer = min(v for k, v in ms.items() if k in peers.PEERS)
    larger = r["model"] in LARGER
    g_untuned, g_tuned = GOALS["untuned"] + 0.1 * larger, GOALS["tuned"] + 0.1 * larger
    def verdict(x, goal):
        return f"{x:.2f} ({'ok' if x <= goal else 'miss'})"
    cells = [r["model"], f"{ms['onnxruntime']:.2f}",
             f"{ms['openvino'] / ms['onnxruntime']:.2f}" if "openvino" in ms else "-",
             verdict(ms["untuned"] / ms["onnxruntime"], g_untuned)]
    cells += [verdict(ms[f"tuned {n}"] / peer, g_tuned) for n in b]
    gain = ms["untuned"] - ms[f"tuned {b[-1]}"]
    share = (ms["untuned"] - ms[f"tuned {b[0]}"]) / gain if gain > 0 else float("nan")
    trials = sum(t for _, t, _, _ in r["rates"])
    secs = sum(s for _, _, s, _ in r["rates"])
    check = sum(c for *_, c in r["rates"])
    # the gain itself beside its share: a share of a gain smaller than the machine's noise means nothing
    size = f" of {100 * gain / ms['untuned']:.0f}%" if gain > 0 else ""
    cells.append("-" if len(b) < 2 else f"{100 * share:.0f}%{size}" if gain > 0 else "no gain")
    cells.append(f"{60 * trials / secs:.0f} ({check:.0f} s check)" if trials else "-")
    cells.append(f"{r['run_vs_kernels']:.2f} / {ms[f'tuned {b[-1]}'] / r['kernels_ms']:.2f} / "
                 f"{ms[f'tuned {b[-1]}'] / r['logged_ms']:.2f}")
    cells.append(f"{max(r['errs'][k] for k in r['errs'] if k != 'openvino'):.1e}")
    return cells


# LLVM features an AVX2-only x86 CPU lacks (AVX-512 and what came with or after it)
AFTER_AVX2 = ("avx512", "evex512", "amx", "avxvnni", "avxifma", "avxneconvert", "avx10")


def run_as_avx2(argv: list):
    """Start this script again compiling for AVX2 (numba reads its CPU features at import)."""
    import llvmlite.binding as llvm
    feats = ",".join("-" + f[1:] if f[1:].startswith(AFTER_AVX2) else f
                     for f in llvm.get_host_cpu_features().flatten().split(","))
    env = dict(os.environ, NUMBA_CPU_FEATURES=feats, ONEDNN_MAX_CPU_ISA="AVX2", MODELC_GOAL_ISA="avx2")
    os.execve(sys.executable, [sys.executable, os.path.abspath(__file__), *argv], env)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("models", nargs="*", default=["resnet18", "mobilenet_v2", "transformer"])
    p.add_argument("--trials", type=int, nargs="+", default=[300, 1000], help="budgets, smallest first")
    p.add_argument("--out", default="bench_goal", help="folder of the tuning logs (resumed)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=200, help="timed calls per runtime")
    p.add_argument("--isa", choices=["avx2"], help="compile for AVX2 on an AVX-512 host (see above)")
    args = p.parse_args(argv)
    if args.isa == "avx2" and os.environ.get("MODELC_GOAL_ISA") != "avx2":     # once, not again after it
        run_as_avx2(sys.argv[1:] if argv is None else argv)
    import numba
    numba.set_num_threads(args.threads)
    os.makedirs(args.out, exist_ok=True)
    budgets = sorted(args.trials)
    t = current_target()
    print(f"CPU: {t.describe()}; {args.threads} threads; medians of alternating blocks, latency / reference")
    if args.isa:
        print(f"compiled for {args.isa.upper()} on this host; OpenVINO capped at it (ONEDNN_MAX_CPU_ISA), "
              "onnxruntime on the host's full instruction set")
    head = ["model", "onnxruntime ms", "openvino/ort", "untuned/ort"] + \
        [f"tuned {n}/best peer" for n in budgets] + \
        [f"{budgets[0]}-trial share of gain", "trials/min", "module/kernels (same moments / profiled / logged)",
         "max rel err"]
    rows = []
    for m in args.models:
        rows.append(report(bench(m, budgets, args.out, args.threads, args.rounds)))
        print("| " + " | ".join(rows[-1]) + " |", flush=True)
    print()
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for c in rows:
        print("| " + " | ".join(c) + " |")
    print(f"goals: untuned/ort <= {GOALS['untuned']} ({GOALS['untuned'] + 0.1:.1f} for {', '.join(sorted(LARGER))}), "
          f"tuned/best peer <= {GOALS['tuned']} ({GOALS['tuned'] + 0.1:.1f}) at {budgets[-1]} trials, "
          f">= 80% of the gain at {budgets[0]}, >= 120 trials/min, module/kernels <= 1.05; "
          f"errors relative to the output scale, tolerance {TOLERANCE:g}")


if __name__ == "__main__":
    main()
