"""The `modelc` command line. Each subcommand is a thin layer over the Python API."""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

from . import logs, target
from .errors import ModelcError
from .resolve import resolve_model


def parse_shapes(items) -> dict | None:
    """--shape input=1,3,224,224 (repeatable) -> {"input": (1, 3, 224, 224)}."""
    if not items:
        return None
    out = {}
    for item in items:
        name, sep, dims = item.rpartition("=")
        if not sep or not name:
            raise ModelcError(f"--shape {item!r}: expected NAME=D1,D2,...")
        try:
            out[name] = tuple(int(d) for d in dims.replace("x", ",").split(",") if d)
        except ValueError:
            raise ModelcError(f"--shape {item!r}: dimensions must be integers") from None
    return out


def _import(args):
    from .frontend import from_onnx
    return from_onnx(resolve_model(args.model), shape=parse_shapes(args.shape),
                     default_batch=args.batch)


def cmd_info(args):
    from .ops.cost import graph_macs
    graph = _import(args)
    params = sum(t.size for t in graph.constants())
    print(f"model   {args.model}")
    print(f"graph   {graph.name}, opset {graph.opset}, {len(graph)} nodes")
    for name in graph.inputs:
        print(f"input   {graph.tensors[name]!r}")
    for name in graph.model_outputs or graph.outputs:
        print(f"output  {graph.tensors[name]!r}" if name not in graph.tail_outputs() else
              f"output  {name} (its shape decided by the data, in the tail)")
    print(f"params  {params:,} ({params / 1e6:.2f} M)")
    macs = graph_macs(graph)
    print(f"MACs    {macs:,} ({macs / 1e9:.3f} G)")
    print("ops     " + ", ".join(f"{op} x{n}" for op, n in graph.op_counts().items()))
    print(f"target  {target.current().describe()}")      # what default kernels are shaped for
    _print_fallbacks(_fallback_groups(graph))
    _print_tail(graph.tail)
    if args.graph:
        print(graph)


def _fallback_groups(graph) -> list:
    """(group, why) of the fused groups `compile` would run on the numpy reference."""
    from .extract import tasks_from_graph
    from .kernels.fallback import why
    from .kernels.workload import Workload
    from .passes.lower import lower
    return [(t.desc, why(Workload(t.workload))) for t in tasks_from_graph(lower(graph))
            for _ in range(t.weight) if t.template == "reference"]


def cmd_tasks(args):
    import json
    from .extract import tasks_from_graph
    from .passes.lower import lower
    fused = lower(_import(args))
    tasks = tasks_from_graph(fused)
    if args.graph:
        print(fused)
        for node in fused.topo():
            print(f"\n{node.name} [{node.attrs.get('pattern')}]")
            print("\n".join("    " + line for line in str(node.subgraph).splitlines()[1:]))
        print()
    if args.json:
        print(json.dumps([t.to_json() for t in tasks], indent=1))
        return
    total = sum(t.weight * t.flops for t in tasks) or 1
    rows = sorted(enumerate(tasks), key=lambda it: -it[1].weight * it[1].flops)
    print(f"{'#':>3}  {'task':<64}{'weight':>7}{'MFLOPs':>10}{'share':>8}  template")
    for i, t in rows:
        print(f"{i:>3}  {t.desc[:63]:<64}{t.weight:>7}{t.flops / 1e6:>10.2f}"
              f"{100 * t.weight * t.flops / total:>7.1f}%  {t.template}{'' if t.tunable else ' (fixed)'}"
              + "".join(f" | {a}" for a in t.alternatives))
    n_groups = sum(t.weight for t in tasks)
    n_alt = sum(len(t.alternatives) for t in tasks)
    print(f"     {len(tasks)} tasks, {n_groups} fused groups, {sum(t.tunable for t in tasks)} tunable"
          + (f" (+{n_alt} with a second algorithm, tuned as tasks of their own)" if n_alt else "")
          + f"; total {total / 1e9:.3f} GFLOPs")


def cmd_compile(args):
    import time
    from .compiler import compile as compile_model
    from .tune.records import ApplyHistoryBest
    t0 = time.perf_counter()
    graph = _import(args)
    if args.log:
        with ApplyHistoryBest(args.log):
            mod = compile_model(graph, jobs=args.jobs, progress=not args.quiet)
    else:
        mod = compile_model(graph, jobs=args.jobs, progress=not args.quiet)
    out = args.output or os.path.splitext(os.path.basename(args.model))[0] + ".mc"
    mod.save(out)
    mem = mod.memory_report()
    print(f"compiled {len(mod.step_names)} kernels in {time.perf_counter() - t0:.1f} s; "
          f"intermediate buffers {mem['planned_bytes'] / 2**20:.1f} MiB "
          f"(one per tensor: {mem['one_buffer_per_tensor_bytes'] / 2**20:.1f} MiB); wrote {out}")
    _print_fallbacks(mod.fallback_reasons)
    _print_tail(mod.tail)


def _print_tail(tail):
    """The nodes whose shapes the data decides, and where they begin."""
    if tail is None:
        return
    print(f"note: {tail.node_count} node(s) whose shapes depend on the input data run on ONNX's reference "
          f"evaluator after the compiled part (outputs {', '.join(tail.outputs)}), from:")
    for node, why in tail.starts[:5]:
        print(f"  {node}: {why}")
    if len(tail.starts) > 5:
        print(f"  ... and {len(tail.starts) - 5} more")


def _print_fallbacks(reasons: list):
    """Groups that run the numpy reference (not generated, not tunable) and why, once each."""
    if not reasons:
        return
    counts: dict = {}
    for r in reasons:
        counts[r] = counts.get(r, 0) + 1
    print(f"note: {len(reasons)} group(s) run the numpy reference, without generated kernels:")
    for (desc, why), n in counts.items():
        print(f"  {desc}{f' (x{n})' if n > 1 else ''}: {why}")


def cmd_run(args):
    from .runtime import load
    mod = load(args.module)
    if len(mod.input_specs) != 1 and args.input:
        raise ModelcError("--input takes one .npy file; this model has several inputs")
    spec = mod.input_specs[0]
    if args.input:
        try:
            x = np.load(args.input, allow_pickle=False)
        except (OSError, ValueError) as e:
            raise ModelcError(f"cannot read {args.input!r} as a .npy array: {e}") from None
    else:
        x = np.random.default_rng(args.seed).standard_normal(spec["shape"]).astype(spec["dtype"])
    outs = mod.run({spec["name"]: x})
    for name, val in outs.items():
        print(f"{name}: {val.dtype}{list(val.shape)} min {val.min():.4g} max {val.max():.4g}")
    if args.output:
        np.save(args.output, next(iter(outs.values())))
    if args.benchmark:
        b = mod.benchmark()
        print(f"latency median {b['median_ms']:.3f} ms (min {b['min_ms']:.3f}, max {b['max_ms']:.3f}, "
              f"{b['repeat']} x {b['number']} runs)")


def cmd_tune(args):
    from .tune.measure import MeasureOptions
    from .tune.tuning import tune
    graph = _import(args)
    opts = MeasureOptions(number=args.number, repeat=args.repeat, min_repeat_ms=args.min_repeat_ms,
                          build_timeout=args.build_timeout, run_timeout=args.run_timeout)
    tune(graph, n_trials=args.trials, log=args.log, tuner=args.tuner, strategy=args.strategy,
         trials_per_round=args.trials_per_round, early_stopping=args.early_stopping,
         measure_options=opts, verbose=0 if args.quiet else (2 if args.verbose else 1), seed=args.seed,
         cluster=args.cluster, target_cpu=args.target, module_check=args.module_check)


def cmd_records(args):
    from .tune import records as R
    if args.action == "distill":
        out = args.output or args.log.replace(".jsonl", "") + ".best.jsonl"
        n = R.distill(args.log, out)
        print(f"wrote {n} record(s) (best per workload, algorithm and target) to {out}")
    else:
        recs = R.load_records(args.log)
        best = R.best_by_key(recs)
        errors = sum(r.error != R.NO_ERROR for r in recs)
        print(f"{len(recs)} records, {errors} errors, {len({k for k, _ in best})} workloads, "
              f"{len(best)} workload x algorithm pairs")
        for (key, tpl), r in sorted(best.items(), key=lambda kv: kv[1].desc):
            print(f"  {r.desc[:60]:<62}{r.cost * 1e3:9.4f} ms  {tpl}  {r.config}")
        checks = R.module_checks(R.load_records(args.log, warn=False, in_module=True), None, best)
        if checks:
            print(f"module check: {len(checks)} workloads run the config chosen in the module:")
            for key, r in sorted(checks.items(), key=lambda kv: kv[1].desc):
                print(f"  {r.desc[:60]:<62}{r.cost * 1e3:9.4f} ms  {r.template}  {r.config}  (in the module)")


def cmd_compare(args):
    from .compare import run
    return run(args)


def cmd_plot(args):
    from .plot import plot_log
    plot_log(args.log, args.output)
    print(f"wrote {args.output}")


def cmd_export(args):
    import models
    if args.name not in models.MODELS:
        raise ModelcError(f"unknown model {args.name!r}; built-in: {', '.join(sorted(models.MODELS))}")
    out = args.output or f"{args.name}.onnx"
    models.save(args.name, out)
    print(f"wrote {out}")


def cmd_models(args):
    import models
    for name in sorted(models.MODELS):
        print(name)


def cmd_cache(args):
    import time

    from .kernels import cache, cache_files
    from .kernels.cache_files import human as _human
    bound = cache_files.max_bytes()
    if args.action == "prune":
        if not args.max_size and bound <= 0:
            raise ModelcError("the kernel cache has no bound (MODELC_CACHE_MAX_SIZE=0): give --max-size")
        limit = cache_files.parse_size(args.max_size, "--max-size") if args.max_size else bound
        removed, freed, left, size = cache_files.prune(limit)
        print(f"removed {removed} least recently used kernels ({_human(freed)}); {left} kernels ({_human(size)}) left")
    elif args.action == "clear":
        removed, freed, left, size = cache_files.prune(0, keep_recent_s=0.0)
        print(f"removed {removed} kernels ({_human(freed)})" +
              (f"; {left} in use by other processes left" if left else ""))
    es = cache_files.entries()
    used = [e.used for e in es if e.used]
    print(f"kernel cache {cache.kernel_dir()}: {len(es)} kernels, {_human(sum(e.size for e in es))}; "
          f"bound {_human(bound) if bound > 0 else 'none'} (MODELC_CACHE_MAX_SIZE)" +
          (f"; used from {time.strftime('%Y-%m-%d %H:%M', time.localtime(min(used)))} to "
           f"{time.strftime('%Y-%m-%d %H:%M', time.localtime(max(used)))}" if used else ""))


def cmd_run_reference(args):
    from . import reference
    graph = _import(args)
    rng = np.random.default_rng(args.seed)
    feeds = {}
    for name in graph.inputs:
        t = graph.tensors[name]
        if args.input:
            feeds[name] = np.load(args.input)
        else:
            feeds[name] = rng.standard_normal(t.shape).astype(t.dtype)
    outs = reference.run(graph, feeds)
    for name, val in outs.items():
        print(f"{name}: {val.dtype}{list(val.shape)} min {val.min():.4g} max {val.max():.4g}"
              + (f" argmax {int(val.reshape(val.shape[0], -1)[0].argmax())}" if val.ndim >= 2 else ""))
    if args.output:
        np.save(args.output, next(iter(outs.values())))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="modelc", description="ONNX model compiler for CPUs")
    sub = p.add_subparsers(dest="command", required=True)

    def model_cmd(name, help_):
        s = sub.add_parser(name, help=help_)
        s.add_argument("model", help="an .onnx file or a built-in example name (e.g. resnet18)")
        s.add_argument("--shape", action="append", metavar="NAME=D1,D2,...",
                       help="bind an input's shape (needed for dynamic dimensions)")
        s.add_argument("--batch", type=int, default=1,
                       help="batch size for inputs whose leading dimension is symbolic (default 1)")
        return s

    s = model_cmd("info", "inputs, outputs, op counts, parameters and MACs of a model")
    s.add_argument("--graph", action="store_true", help="also print the imported graph")
    s.set_defaults(fn=cmd_info)

    s = model_cmd("tasks", "the model's tuning tasks: unique fused operators with weights and FLOPs")
    s.add_argument("--json", action="store_true", help="print the tasks as JSON")
    s.add_argument("--graph", action="store_true", help="also print the fused graph")
    s.set_defaults(fn=cmd_tasks)

    s = model_cmd("compile", "compile a model into a module file")
    s.add_argument("-o", "--output", help="module path (default: MODEL.mc)")
    s.add_argument("-j", "--jobs", type=int, help="parallel kernel compiles (default: cores)")
    s.add_argument("--log", help="use the best records of this tuning log (ApplyHistoryBest)")
    s.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    s.set_defaults(fn=cmd_compile)

    s = model_cmd("tune", "tune the model's kernels, appending every measurement to a log")
    s.add_argument("--trials", type=int, default=1000, help="total measurement budget (default 1000)")
    s.add_argument("--log", default="tuning.jsonl", help="JSON-lines log; resumed if it exists")
    s.add_argument("--tuner", default="xgb", choices=["xgb", "ga", "random", "grid"])
    s.add_argument("--strategy", default="gradient", choices=["gradient", "round-robin"])
    s.add_argument("--trials-per-round", type=int, default=16)
    s.add_argument("--early-stopping", type=int, help="stop a task after this many trials without gain")
    s.add_argument("--number", type=int, default=5)
    s.add_argument("--repeat", type=int, default=3)
    s.add_argument("--min-repeat-ms", type=float, default=20.0)
    s.add_argument("--build-timeout", type=float, default=120.0)
    s.add_argument("--run-timeout", type=float, default=30.0)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--cluster", metavar="auto|HOST:PORT",
                   help="measure on the nodes of a Ray cluster (pip install -e \".[ray]\"; `ray start --head`)")
    s.add_argument("--target", metavar="CPU", help="with --cluster: the CPU model to tune for, as its nodes "
                   "report it (default: this machine's)")
    s.add_argument("--module-check", type=int, default=2, metavar="N",
                   help="afterwards, time each workload's N best configs and its default in the model's "
                        "module and keep the fastest there (default 2; 0: no check)")
    s.add_argument("-q", "--quiet", action="store_true")
    s.add_argument("-v", "--verbose", action="store_true", help="also print every failed measurement")
    s.set_defaults(fn=cmd_tune)

    s = sub.add_parser("compare", help="latency and accuracy of modelc (untuned, tuned) vs onnxruntime")
    from .compare import add_arguments
    add_arguments(s)
    s.set_defaults(fn=cmd_compare)

    s = sub.add_parser("plot", help="plot a tuning log (needs the 'plot' extra: matplotlib)")
    s.add_argument("log")
    s.add_argument("-o", "--output", default="tuning.png")
    s.set_defaults(fn=cmd_plot)

    s = sub.add_parser("records", help="inspect or distill a tuning log")
    s.add_argument("action", choices=["distill", "show"])
    s.add_argument("log")
    s.add_argument("-o", "--output", help="distill: output path (default LOG.best.jsonl)")
    s.set_defaults(fn=cmd_records)

    s = sub.add_parser("run", help="run a compiled module")
    s.add_argument("module", help="a .mc file written by `modelc compile`")
    s.add_argument("--input", help=".npy file for the (single) input; default: seeded random")
    s.add_argument("--output", help="write the first output to this .npy file")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--benchmark", action="store_true", help="also time the module")
    s.set_defaults(fn=cmd_run)

    s = model_cmd("reference", "run a model with the numpy reference executor")
    s.add_argument("--input", help=".npy file for the (single) input; default: seeded random")
    s.add_argument("--output", help="write the first output to this .npy file")
    s.add_argument("--seed", type=int, default=0)
    s.set_defaults(fn=cmd_run_reference)

    s = sub.add_parser("export", help="write a built-in example model to an .onnx file")
    s.add_argument("name")
    s.add_argument("-o", "--output")
    s.set_defaults(fn=cmd_export)

    s = sub.add_parser("models", help="list the built-in example models")
    s.set_defaults(fn=cmd_models)

    s = sub.add_parser("cache", help="the compiled-kernel cache: its size, or prune or clear it")
    s.add_argument("action", nargs="?", default="info", choices=["info", "prune", "clear"],
                   help="prune: remove the least recently used kernels down to the bound (not those used "
                        "in the last hour); clear: remove every kernel no process is using")
    s.add_argument("--max-size", metavar="SIZE", help="with prune: the size to prune to (500M, 2G; default "
                   "MODELC_CACHE_MAX_SIZE, 2G)")
    s.set_defaults(fn=cmd_cache)
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    with logs.to_stderr() as log:
        try:
            status = args.fn(args)
        except ModelcError as e:
            log.error("modelc: error: %s", e)
            return 2
    return int(status or 0)


if __name__ == "__main__":
    sys.exit(main())
