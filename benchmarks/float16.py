"""float16 models on generated kernels, against onnxruntime running the same float16 model.

    python benchmarks/float16.py [resnet18 mobilenet_v2 ...] [--trials N --log-dir DIR]

Each built-in model (float32, seeded weights) is converted to float16 here (weights, inputs,
outputs and Cast targets), compiled (untuned, or tuned with --trials), checked for groups on the
numpy fallback, compared with onnxruntime's float16 output and with the float32 model's (float16
is coarse: both runtimes are compared with the float32 result), and timed against onnxruntime in
alternating blocks on the CPU it runs on.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import modelc  # noqa: E402
from modelc import peers  # noqa: E402
from modelc.compare import alternating_timings  # noqa: E402
from modelc.resolve import resolve_model  # noqa: E402
from modelc.target import current as current_target  # noqa: E402


def to_float16(m: onnx.ModelProto) -> onnx.ModelProto:
    """The model with float32 weights, graph inputs and outputs, constants and Cast targets made
    float16 (value_info is dropped and re-inferred)."""
    m = onnx.ModelProto.FromString(m.SerializeToString())
    g = m.graph
    for i, t in enumerate(list(g.initializer)):
        if t.data_type == TensorProto.FLOAT:
            g.initializer[i].CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float16), t.name))
    for vi in [*g.input, *g.output]:
        if vi.type.tensor_type.elem_type == TensorProto.FLOAT:
            vi.type.tensor_type.elem_type = TensorProto.FLOAT16
    del g.value_info[:]
    for n in g.node:
        for a in n.attribute:
            if n.op_type == "Cast" and a.name == "to" and a.i == TensorProto.FLOAT:
                a.i = TensorProto.FLOAT16
            if a.type == onnx.AttributeProto.TENSOR and a.t.data_type == TensorProto.FLOAT:
                a.t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(a.t).astype(np.float16), a.t.name))
    onnx.checker.check_model(m)
    return m


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("models", nargs="*", default=["resnet18", "mobilenet_v2"])
    p.add_argument("--trials", type=int, default=0)
    p.add_argument("--log-dir", default="bench_float16")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=100)
    args = p.parse_args(argv)
    import numba
    numba.set_num_threads(args.threads)
    print(f"CPU: {current_target().describe()}; {args.threads} threads")
    print("| model (float16) | onnxruntime ms | modelc ms | modelc / ort | groups on the fallback | "
          "err vs ort | err vs float32: ort, modelc |")
    print("|---|---|---|---|---|---|---|")
    for name in args.models:
        src = resolve_model(name)
        m32 = onnx.load(src)
        path = os.path.join(args.log_dir, f"{name}.f16.onnx")
        os.makedirs(args.log_dir, exist_ok=True)
        onnx.save(to_float16(m32), path)
        graph = modelc.from_onnx(path, default_batch=1)
        if args.trials:
            modelc.tune(graph, n_trials=args.trials, log=os.path.join(args.log_dir, f"{name}.f16.jsonl"), verbose=0)
            with modelc.ApplyHistoryBest(os.path.join(args.log_dir, f"{name}.f16.jsonl")):
                mod = modelc.compile(graph)
        else:
            mod = modelc.compile(graph)
        spec = mod.input_specs[0]
        x = np.random.default_rng(0).standard_normal(spec["shape"]).astype(np.float16)
        shapes = {spec["name"]: spec["shape"]}
        ort = peers.runner("onnxruntime", path, args.threads, shapes)
        ort32 = peers.runner("onnxruntime", src, args.threads, shapes)
        out = mod.output_specs[0]["name"]
        got = mod.run({spec["name"]: x})[out].astype(np.float32)
        want = ort({spec["name"]: x})[0].astype(np.float32)
        ref = ort32({spec["name"]: x.astype(np.float32)})[0]
        scale = float(np.abs(ref).max())
        times = alternating_timings({"ort": lambda: ort({spec["name"]: x}),
                                     "modelc": lambda: mod.run({spec["name"]: x})}, args.rounds)
        ms = {k: statistics.median(v) * 1e3 for k, v in times.items()}
        print(f"| {name}{f' ({args.trials} trials)' if args.trials else ''} | {ms['ort']:.2f} | {ms['modelc']:.2f} | "
              f"{ms['modelc'] / ms['ort']:.2f} | {len(mod.fallbacks)} | {np.abs(got - want).max() / scale:.1e} | "
              f"{np.abs(want - ref).max() / scale:.1e}, {np.abs(got - ref).max() / scale:.1e} |", flush=True)


if __name__ == "__main__":
    main()
