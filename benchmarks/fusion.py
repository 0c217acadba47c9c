"""What a pass brings, per model: fusing convolutions into the depthwise convolutions that read
them (`--pass fuse_depthwise`, the default), or quantized tensors as bytes (`--pass byte_inputs`).

    python benchmarks/fusion.py [mobilenet_v2 efficientnet_b0 ...] [--rounds 200] [--log LOG]
    python benchmarks/fusion.py DIR/mobilenet_v2_qop.onnx ... --pass byte_inputs

Each model (a built-in example name or an .onnx file) is compiled twice - as `compile` does, and with
the pass's `disabled()` - untuned (or with the records of --log for both; records of the two
modules' groups have different keys), the two outputs are compared with each other, and both
modules and onnxruntime are timed in alternating blocks in one process on the CPU it runs on.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import modelc  # noqa: E402
from modelc import peers  # noqa: E402
from modelc.compare import alternating_timings  # noqa: E402
from modelc.passes import byte_inputs, fuse_depthwise  # noqa: E402
from modelc.resolve import resolve_model  # noqa: E402
from modelc.target import current as current_target  # noqa: E402


PASSES = {"fuse_depthwise": fuse_depthwise.disabled, "byte_inputs": byte_inputs.disabled}


def compile_both(path: str, log: str | None, without=fuse_depthwise.disabled):
    graph = modelc.from_onnx(path, default_batch=1)

    def build():
        if log:
            with modelc.ApplyHistoryBest(log):
                return modelc.compile(graph)
        return modelc.compile(graph)
    fused = build()
    with without():
        unfused = build()
    return fused, unfused


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("models", nargs="*", default=["mobilenet_v2", "efficientnet_b0"])
    p.add_argument("--rounds", type=int, default=200, help="timed runs of each runtime")
    p.add_argument("--log", help="a tuning log for both modules")
    p.add_argument("--pass", dest="which", choices=sorted(PASSES), default="fuse_depthwise",
                   help="the pass measured (the second module is compiled without it)")
    args = p.parse_args(argv)
    tg = current_target()
    print(f"CPU: {tg.describe()}")
    print(f"pass: {args.which} (with it: 'fused', without: 'unfused')")
    print("| model | groups fused / unfused | onnxruntime ms | unfused / ort | fused / ort | fused / unfused | "
          "max rel diff |")
    print("|---|---|---|---|---|---|---|")
    for name in args.models:
        path = resolve_model(name)
        fused, unfused = compile_both(path, args.log, PASSES[args.which])
        spec = fused.input_specs[0]
        x = np.random.default_rng(0).standard_normal(spec["shape"]).astype(spec["dtype"])
        feeds = {spec["name"]: x}
        a, b = (list(m.run(feeds).values())[0] for m in (fused, unfused))
        diff = float(np.abs(a.astype(np.float64) - b).max() / max(float(np.abs(b).max()), 1e-30))
        ort = peers.runner("onnxruntime", path, tg.threads, {spec["name"]: spec["shape"]})
        times = alternating_timings({"ort": lambda: ort(feeds), "unfused": lambda: unfused.run(feeds),
                                     "fused": lambda: fused.run(feeds)}, args.rounds)
        med = {k: statistics.median(v) for k, v in times.items()}
        print(f"| {name} | {len(fused.step_names)} / {len(unfused.step_names)} | {med['ort'] * 1e3:.2f} | "
              f"{med['unfused'] / med['ort']:.3f} | {med['fused'] / med['ort']:.3f} | "
              f"{med['fused'] / med['unfused']:.3f} | {diff:.1e} |", flush=True)


if __name__ == "__main__":
    main()
