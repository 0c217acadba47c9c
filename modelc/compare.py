"""`modelc compare`: is modelc right, and is it faster? One table against onnxruntime.

Builds the untuned module (default configs) and, with a tuning log, the tuned one; creates an
onnxruntime session on the same thread count with every graph optimisation on; times all of them
in this process in alternating blocks; and checks each module's outputs against onnxruntime over
K seeded inputs. The exit status is 1 when any module disagrees beyond the tolerance.
`--against openvino` adds OpenVINO's row (an optional extra); `--per-layer` adds where the time
goes, fused group by fused group, beside the onnxruntime nodes each replaces (layers.py).

    python -m modelc.compare resnet18 --trials 200 --log r18.jsonl --against openvino --per-layer
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

TOLERANCE = 1e-4          # max |modelc - onnxruntime| relative to the output's max |value|


def tolerance(dtypes) -> float:
    """TOLERANCE, or a few float16 ulps at the scale for float16 outputs (onnxruntime's own float16
    run differs from its float32 one by that much), as the measurer holds kernels to."""
    from .kernels.testing import dtype_tolerance
    return dtype_tolerance(dtypes, TOLERANCE)


def alternating_timings(fns: dict, rounds: int, block: int = 10, pause: float = 0.05) -> dict:
    """Per-call seconds of each runtime, measured in alternating blocks with pauses between them
    (spinning worker threads of the previous runtime must not hold the cores)."""
    times = {k: [] for k in fns}
    for _ in range(max(1, rounds // block)):
        for name, fn in fns.items():
            time.sleep(pause)
            fn()
            for _ in range(block):
                t = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t)
    return times


def _accuracy(run, reference, inputs: list, in_name: str) -> dict:
    abs_err, rel_err, agree = 0.0, 0.0, 0
    for x in inputs:
        want = reference({in_name: x})
        got = run({in_name: x})
        for w, g in zip(want, got):
            if w.shape != g.shape:      # a data-dependent tail selected other boxes
                abs_err = rel_err = float("inf")
                continue
            if not w.size:
                continue
            e = float(np.abs(g.astype(np.float64) - w).max())
            abs_err = max(abs_err, e)
            rel_err = max(rel_err, e / max(float(np.abs(w).max()), 1e-30))
        w0, g0 = want[0], got[0]
        if w0.shape != g0.shape or not w0.size:
            agree += int(w0.shape == g0.shape)
        elif w0.ndim >= 2:
            agree += int((w0.reshape(w0.shape[0], -1).argmax(-1) == g0.reshape(g0.shape[0], -1).argmax(-1)).all())
        else:
            agree += int(np.argmax(w0) == np.argmax(g0))
    return {"max_abs_err": abs_err, "max_rel_err": rel_err, "top1_agree": agree, "inputs": len(inputs)}


def compare(model: str, log: str | None = None, trials: int = 0, inputs: int = 5, threads: int = 2,
            rounds: int = 100, shape: dict | None = None, quiet: bool = False, against: tuple = (),
            per_layer: bool = False) -> dict:
    """Run the comparison; returns the results as a dict (what --json writes). `against` adds
    other runtimes (peers.PEERS: "openvino") as rows; `per_layer` adds layers.report of the
    tuned module (the untuned one without a log)."""
    import numba

    import modelc
    from . import peers
    from .resolve import resolve_model
    from .tune.records import ApplyHistoryBest

    path = resolve_model(model)
    numba.set_num_threads(threads)
    graph = modelc.from_onnx(path, shape=shape, default_batch=1)
    if trials:
        log = log or os.path.splitext(os.path.basename(path))[0].split("-seed")[0] + ".jsonl"
        modelc.tune(graph, n_trials=trials, log=log, verbose=0 if quiet else 1)
    untuned = modelc.compile(graph)
    modules = {"modelc (untuned)": untuned}
    summary = ""
    if log:
        with ApplyHistoryBest(log) as ctx:
            modules["modelc (tuned)"] = modelc.compile(graph)
        summary = ctx.summary
    spec = untuned.input_specs[0]
    in_name = spec["name"]
    shapes = {i["name"]: i["shape"] for i in untuned.input_specs}
    runtimes = {"onnxruntime": peers.runner("onnxruntime", path, threads, shapes)}
    runtimes.update({name: peers.runner(name, path, threads, shapes) for name in against if name != "onnxruntime"})
    out_names = [o["name"] for o in untuned.output_specs]
    tol = tolerance(o["dtype"] for o in untuned.output_specs if o["dtype"])   # a tail may not say
    for name, m in modules.items():
        runtimes[name] = (lambda m: (lambda feeds: outputs_in_order(m.run(feeds), out_names)))(m)
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal(spec["shape"]).astype(spec["dtype"]) for _ in range(inputs)]
    feeds = {in_name: xs[0]}
    times = alternating_timings({name: (lambda r: (lambda: r(feeds)))(r) for name, r in runtimes.items()}, rounds)
    rows = []
    ort_ms = statistics.median(times["onnxruntime"]) * 1e3
    base_ms = statistics.median(times["modelc (untuned)"]) * 1e3
    for name, ts in times.items():
        ms = sorted(t * 1e3 for t in ts)
        row = {"runtime": name, "median_ms": statistics.median(ms),
               "p10_ms": ms[len(ms) // 10], "p90_ms": ms[(9 * len(ms)) // 10],
               "speedup_vs_onnxruntime": ort_ms / statistics.median(ms)}
        if name != "onnxruntime":
            row.update(_accuracy(runtimes[name], runtimes["onnxruntime"], xs, in_name))
        if name in modules:
            row["speedup_vs_untuned"] = base_ms / statistics.median(ms)
            row["ok"] = row["max_rel_err"] <= tol
        rows.append(row)
    res = {"model": model, "path": path, "input": {in_name: spec["shape"]}, "threads": threads,
           "log": log, "tuning_summary": summary, "tolerance": tol, "rows": rows,
           "ok": all(r.get("ok", True) for r in rows), "cpu": _cpu()}
    if per_layer:
        from .layers import report
        from .passes.lower import lower
        mod = modules.get("modelc (tuned)", untuned)
        res["per_layer"] = report(mod, graph, lower(graph), path, feeds, threads, against=tuple(against))
        res["per_layer"]["module"] = "modelc (tuned)" if mod is not untuned else "modelc (untuned)"
        res["per_layer"]["latency_ms"] = {r["runtime"]: r["median_ms"] for r in rows
                                          if r["runtime"] in ("onnxruntime", res["per_layer"]["module"])}
    return res


def outputs_in_order(outputs: dict, names: list) -> list:
    """One run's outputs as a list (a run per output had timed multi-output models several times)."""
    return [outputs[n] for n in names]


def _cpu() -> str:
    from .tune.records import current_target
    return current_target()["cpu"]


def format_table(res: dict, markdown: bool = False) -> str:
    head = ["runtime", "median ms", "p10-p90 ms", "vs onnxruntime", "vs untuned", "max abs err",
            "max rel err", "top-1 agree"]
    lines = []
    for r in res["rows"]:
        cells = [r["runtime"], f"{r['median_ms']:.3f}", f"{r['p10_ms']:.2f}-{r['p90_ms']:.2f}",
                 f"{r['speedup_vs_onnxruntime']:.2f}x",
                 f"{r['speedup_vs_untuned']:.2f}x" if "speedup_vs_untuned" in r else "-",
                 f"{r['max_abs_err']:.2e}" if "max_abs_err" in r else "-",
                 f"{r['max_rel_err']:.2e}" if "max_rel_err" in r else "-",
                 f"{r['top1_agree']}/{r['inputs']}" if "top1_agree" in r else "-"]
        lines.append(cells)
    title = (f"modelc compare: {res['model']} (input {list(res['input'].values())[0]}), {res['threads']} threads, "
             f"{res['cpu']}" + (f"; tuning log {res['log']}" if res["log"] else "; no tuning log"))
    verdict = ("PASS" if res["ok"] else "FAIL") + \
        f": outputs {'agree' if res['ok'] else 'DISAGREE'} with onnxruntime within {res['tolerance']:g} " \
        "of the output scale; speedups > 1 mean faster than the reference"
    extra = [res["tuning_summary"]] if res["tuning_summary"] else []
    peer_rows = [r for r in res["rows"] if not r["runtime"].startswith("modelc")]
    if len(peer_rows) > 1:
        best = min(peer_rows, key=lambda r: r["median_ms"])
        extra += [f"{r['runtime']} / fastest peer ({best['runtime']}): {r['median_ms'] / best['median_ms']:.2f}"
                  for r in res["rows"] if r["runtime"].startswith("modelc")]
    if markdown:
        out = [f"**{title}**", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        out += ["| " + " | ".join(c) + " |" for c in lines]
        return "\n".join(out + [""] + extra + ["", verdict]) + "\n"
    widths = [max(len(h), *(len(c[i]) for c in lines)) for i, h in enumerate(head)]
    fmt = "  ".join(f"{{:<{w}}}" if i == 0 else f"{{:>{w}}}" for i, w in enumerate(widths))
    out = [title, fmt.format(*head), fmt.format(*["-" * w for w in widths])]
    out += [fmt.format(*c) for c in lines]
    text = "\n".join(out + extra + [verdict]) + "\n"
    if res.get("per_layer"):
        from .layers import format_report
        text += "\n" + format_report(res["per_layer"], f"per layer: {res['per_layer']['module']} against "
                                      f"onnxruntime's profiler, {res['threads']} threads, {res['cpu']}")
    return text


def add_arguments(p: argparse.ArgumentParser):
    p.add_argument("model", help="an .onnx file or a built-in example name (e.g. resnet18)")
    p.add_argument("--log", help="tuning log: compile a tuned module with its best records")
    p.add_argument("--trials", type=int, default=0, help="tune first with this budget (resumes the log)")
    p.add_argument("--inputs", type=int, default=5, help="seeded inputs for the accuracy check")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=100, help="timed runs per runtime")
    p.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    p.add_argument("--markdown", metavar="FILE", help="also write the table as Markdown")
    p.add_argument("--against", action="append", default=[], choices=["openvino"],
                   help="also time this runtime (an optional extra) and check it against onnxruntime")
    p.add_argument("--per-layer", action="store_true",
                   help="also print each fused group's kernel time beside the onnxruntime nodes it replaces")
    p.add_argument("-q", "--quiet", action="store_true", help="no tuning progress output")


def run(args) -> int:
    res = compare(args.model, args.log, args.trials, args.inputs, args.threads, args.rounds,
                  quiet=args.quiet, against=tuple(args.against), per_layer=args.per_layer)
    sys.stdout.write(format_table(res))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(format_table(res, markdown=True))
    return 0 if res["ok"] else 1


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m modelc.compare", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    from . import logs
    from .errors import ModelcError
    with logs.to_stderr() as log:
        try:
            return run(p.parse_args(argv))
        except ModelcError as e:
            log.error("modelc compare: error: %s", e)
            return 2


if __name__ == "__main__":
    sys.exit(main())
