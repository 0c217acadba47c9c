"""Latency of modelc against onnxruntime on the example models, measured in the same process.

    python benchmarks/latency.py [resnet18 mobilenet_v2 transformer ...] [--log tuning.jsonl]

For each model: onnxruntime and modelc latency (batch 1, both on the same thread count, median
over alternating blocks of runs), their ratio, cold compile time (empty kernel cache, fresh process) and
warm compile time (fresh process, cache filled), the fastest convolution kernel's GFLOP/s and,
for scale, numpy's sgemm GFLOP/s on this machine. The machine is shared and noisy: read ratios.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import onnxruntime as ort

import models
import modelc
from modelc.compare import alternating_timings
from modelc.tune.records import ApplyHistoryBest

SHAPE = {"transformer": None}


def compile_seconds(path: str, shape, cache_dir: str, log: str | None) -> float:
    """Compile time in a fresh process (so nothing is reused from this process's memory)."""
    code = ("import time, contextlib, modelc\n"
            "from modelc.tune.records import ApplyHistoryBest\n"
            f"ctx = ApplyHistoryBest({log!r}) if {log!r} else contextlib.nullcontext()\n"
            "t = time.perf_counter()\n"
            "with ctx:\n"
            f"    modelc.compile({path!r}, shape={shape!r})\n"
            "print(time.perf_counter() - t)\n")
    env = dict(os.environ, MODELC_CACHE_DIR=cache_dir)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(out.stderr[-2000:])
    return float(out.stdout.strip().splitlines()[-1])


def sgemm_gflops(n: int = 1024) -> float:
    a = np.random.default_rng(0).standard_normal((n, n)).astype(np.float32)
    a @ a
    ts = []
    for _ in range(10):
        t = time.perf_counter()
        a @ a
        ts.append(time.perf_counter() - t)
    return 2 * n ** 3 / statistics.median(ts) / 1e9


def bench(name: str, threads: int, rounds: int, log: str | None) -> dict:
    path = models.cached_path(name)
    shape = SHAPE.get(name, {"input": (1, 3, 224, 224)})
    with tempfile.TemporaryDirectory() as cold_dir:
        cold = compile_seconds(path, shape, cold_dir, log)
        warm = compile_seconds(path, shape, cold_dir, log)
    if log:
        with ApplyHistoryBest(log):
            mod = modelc.compile(path, shape=shape)
    else:
        mod = modelc.compile(path, shape=shape)
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    spec = mod.input_specs[0]
    x = np.random.default_rng(0).standard_normal(spec["shape"]).astype(np.float32)
    feeds = {spec["name"]: x}
    want = sess.run(None, feeds)[0]
    got = mod(x)
    err = float(np.abs(got - want).max() / np.abs(want).max())
    times = alternating_timings({"ort": lambda: sess.run(None, feeds), "modelc": lambda: mod.run(feeds)}, rounds)
    t_ort, t_mc = times["ort"], times["modelc"]
    from modelc.extract import workload_flops
    best_conv = 0.0
    for p in mod.profile(repeat=5, feeds=feeds):
        s = mod.program["steps"][p["step"]]
        if s["template"] in ("conv2d", "depthwise_conv2d"):
            best_conv = max(best_conv, workload_flops(s["workload"]) / (p["ms"] / 1e3) / 1e9)
    return {"model": name, "ort_ms": statistics.median(t_ort) * 1e3, "modelc_ms": statistics.median(t_mc) * 1e3,
            "cold_s": cold, "warm_s": warm, "best_conv_gflops": best_conv, "rel_err": err}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("models", nargs="*", default=["resnet18", "mobilenet_v2", "transformer"])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=100, help="timed calls per runtime")
    p.add_argument("--log", help="compile with the best records of this tuning log")
    args = p.parse_args(argv)
    import numba
    numba.set_num_threads(args.threads)
    gemm = sgemm_gflops()
    print(f"numpy sgemm 1024^3: {gemm:.0f} GFLOP/s; threads {args.threads}; "
          f"{'tuned with ' + args.log if args.log else 'default configs'}")
    print(f"{'model':<14}{'onnxruntime ms':>15}{'modelc ms':>11}{'ratio':>8}{'cold s':>8}{'warm s':>8}"
          f"{'best conv GF/s':>16}{'rel err':>10}")
    for name in args.models:
        r = bench(name, args.threads, args.rounds, args.log)
        print(f"{r['model']:<14}{r['ort_ms']:>15.2f}{r['modelc_ms']:>11.2f}{r['modelc_ms'] / r['ort_ms']:>8.2f}"
              f"{r['cold_s']:>8.1f}{r['warm_s']:>8.2f}{r['best_conv_gflops']:>16.0f}{r['rel_err']:>10.1e}",
              flush=True)


if __name__ == "__main__":
    main()
