"""Template-free auto-scheduling (issue 15) against its references, in one process.

    python benchmarks/autoschedule.py [--trials 300] [--size 1024] [--log-dir DIR] [--only matmul|conv|depthwise]

matmul: matmul_add (the README's tutorial workload, N = L = M = --size) tuned with the derived schedule
space to --trials (resuming the log in --log-dir), then the untuned (default) and tuned kernels timed
against numpy's sgemm (`np.matmul(a, b, out=o)`: without the + C modelc also does) in alternating
blocks, medians of each. Prints GFLOP/s and the ratio to numpy, with the CPU's name.

conv: ResNet-18's 3x3 conv on 56x56 (64 -> 64 channels, pad 1, + bias, ReLU) declared in te (NCHW, the
padding a condition in the reduction) and the same ONNX Conv + Relu through the direct conv2d template
(NCHWc), and the ONNX group's own te declaration (te_conv2d, the second algorithm `compile` may pick),
each tuned to --trials by the same measurer; prints the best latencies from the logs.
depthwise: likewise for MobileNetV2's depthwise conv 1x144x56x56 3x3 s1 p1 + bias + clip to [0, 6].
"""
from __future__ import annotations

import argparse
import os
import time

import numpy as np

import modelc
from modelc import target, te


@modelc.register_workload
def matmul_add(N, L, M, dtype):
    A = te.placeholder((N, L), name="A", dtype=dtype)
    B = te.placeholder((L, M), name="B", dtype=dtype)
    C = te.placeholder((N, M), name="C", dtype=dtype)
    k = te.reduce_axis((0, L), name="k")
    matmul = te.compute((N, M), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="matmul",
                        attrs={"layout_free_placeholders": [B]})
    out = te.compute((N, M), lambda i, j: matmul[i, j] + C[i, j], name="out")
    return [A, B, C, out]


@modelc.register_workload
def conv2d_bias_relu(N, C, H, W, K, R, pad):
    X = te.placeholder((N, C, H, W), name="X")
    Wt = te.placeholder((K, C, R, R), name="W")
    bias = te.placeholder((K,), name="bias")
    OH, OW = H + 2 * pad - R + 1, W + 2 * pad - R + 1
    rc, ry, rx = te.reduce_axis((0, C), "rc"), te.reduce_axis((0, R), "ry"), te.reduce_axis((0, R), "rx")

    def f(n, k, y, x):
        h, w = y + ry - pad, x + rx - pad
        v = te.if_then_else(te.all(h >= 0, h < H, w >= 0, w < W), X[n, rc, h, w], 0.0)
        return te.sum(v * Wt[k, rc, ry, rx], axis=[rc, ry, rx])
    conv = te.compute((N, K, OH, OW), f, name="conv")
    out = te.compute((N, K, OH, OW), lambda n, k, y, x: te.max(conv[n, k, y, x] + bias[k], 0.0), name="relu")
    return [X, Wt, bias, out]


@modelc.register_workload
def conv2d_nchwc_bias_relu(N, CO, H, W, KO, R, cb, kb):
    """The conv in the template's layouts: channels in blocks of a vector (NCHW[x]c), the input
    already padded (as the module's buffers are: a zero halo the previous kernel never writes)."""
    X = te.placeholder((N, CO, H + R - 1, W + R - 1, cb), name="X")
    Wt = te.placeholder((KO, CO, R, R, cb, kb), name="W")
    bias = te.placeholder((KO, kb), name="bias")
    rco, ry, rx, rci = (te.reduce_axis((0, CO), "rco"), te.reduce_axis((0, R), "ry"),
                        te.reduce_axis((0, R), "rx"), te.reduce_axis((0, cb), "rci"))
    conv = te.compute((N, KO, H, W, kb), lambda n, ko, y, x, ki: te.sum(
        X[n, rco, y + ry, x + rx, rci] * Wt[ko, rco, ry, rx, rci, ki], axis=[rco, ry, rx, rci]), name="conv")
    out = te.compute((N, KO, H, W, kb), lambda n, ko, y, x, ki: te.max(conv[n, ko, y, x, ki] + bias[ko, ki], 0.0),
                     name="relu")
    return [X, Wt, bias, out]


@modelc.register_workload
def depthwise_bias_clip(N, C, H, W, R, stride, pad):
    X = te.placeholder((N, C, H, W), name="X")
    Wt = te.placeholder((C, 1, R, R), name="W")
    bias = te.placeholder((C,), name="bias")
    OH, OW = (H + 2 * pad - R) // stride + 1, (W + 2 * pad - R) // stride + 1
    ry, rx = te.reduce_axis((0, R), "ry"), te.reduce_axis((0, R), "rx")

    def f(n, c, y, x):
        h, w = y * stride + ry - pad, x * stride + rx - pad
        v = te.if_then_else(te.all(h >= 0, h < H, w >= 0, w < W), X[n, c, h, w], 0.0)
        return te.sum(v * Wt[c, 0, ry, rx], axis=[ry, rx])
    dw = te.compute((N, C, OH, OW), f, name="dw")
    out = te.compute((N, C, OH, OW), lambda n, c, y, x: te.min(te.max(dw[n, c, y, x] + bias[c], 0.0), 6.0),
                     name="clip")
    return [X, Wt, bias, out]


@modelc.register_workload
def depthwise_nchwc_bias_clip(N, CO, H, W, R, cb):
    """The depthwise conv in the template's layout: channel blocks of a vector, input padded."""
    X = te.placeholder((N, CO, H + R - 1, W + R - 1, cb), name="X")
    Wt = te.placeholder((CO, R, R, cb), name="W")
    bias = te.placeholder((CO, cb), name="bias")
    ry, rx = te.reduce_axis((0, R), "ry"), te.reduce_axis((0, R), "rx")
    dw = te.compute((N, CO, H, W, cb), lambda n, c, y, x, ci: te.sum(
        X[n, c, y + ry, x + rx, ci] * Wt[c, ry, rx, ci], axis=[ry, rx]), name="dw")
    out = te.compute((N, CO, H, W, cb), lambda n, c, y, x, ci: te.min(te.max(dw[n, c, y, x, ci] + bias[c, ci], 0.0),
                                                                      6.0), name="clip")
    return [X, Wt, bias, out]


def conv_model(C, H, K, R, pad, stride=1, group=1, act="Relu"):
    """One ONNX Conv (+ bias) and its activation (Relu, or Clip to [0, 6]) with seeded weights."""
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((K, C // group, R, R)) * np.sqrt(2 / (C // group * R * R))).astype(np.float32)
    b = rng.standard_normal(K).astype(np.float32) * 0.1
    oh = (H + 2 * pad - R) // stride + 1
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")]
    if act == "Clip":
        inits += [numpy_helper.from_array(np.float32(0), "lo"), numpy_helper.from_array(np.float32(6), "hi")]
    g = helper.make_graph(
        [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[pad] * 4, strides=[stride] * 2, group=group),
         helper.make_node(act, ["c", "lo", "hi"] if act == "Clip" else ["c"], ["y"])],
        "conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, C, H, H])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, K, oh, oh])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


GROUP_TEMPLATE = {"conv2d": "te_conv2d", "depthwise_conv2d": "te_depthwise"}
CASES = {   # te workload and arguments, the same layer as ONNX, its template, FLOPs, description
    "conv": (conv2d_bias_relu, (1, 64, 56, 56, 64, 3, 1), lambda: conv_model(64, 56, 64, 3, 1), "conv2d",
             2.0 * 64 * 56 * 56 * 64 * 9, "ResNet-18's conv2d 1x64x56x56 k64 3x3 p1 + bias + relu"),
    "depthwise": (depthwise_bias_clip, (1, 144, 56, 56, 3, 1, 1),
                  lambda: conv_model(144, 56, 144, 3, 1, group=144, act="Clip"), "depthwise_conv2d",
                  2.0 * 144 * 56 * 56 * 9, "MobileNetV2's depthwise 1x144x56x56 3x3 s1 p1 + bias + clip"),
}


def versus_template(args, case: str):
    from modelc.tune import records as R
    from modelc.tune.tuning import tune, tuning_tasks
    func, shape, model, template, flops, title = CASES[case]
    declared = [("te, derived (NCHW)", func, shape, f"{case}_te.jsonl")]
    lanes = target.current().lanes(4)
    if case == "conv":
        declared.append(("te, derived (NCHWc, padded)", conv2d_nchwc_bias_relu,
                         (1, 64 // lanes, 56, 56, 64 // lanes, 3, lanes, lanes), "conv_te_nchwc.jsonl"))
    if case == "depthwise":
        declared.append(("te, derived (NCHWc, padded)", depthwise_nchwc_bias_clip,
                         (1, 144 // lanes, 56, 56, 3, lanes), "depthwise_te_nchwc.jsonl"))
    te_best = []
    for name, func, shape, log in declared:
        task = modelc.SearchTask(func=func, args=shape)
        te_log = os.path.join(args.log_dir, log)
        task.tune(n_trials=args.trials, log=te_log)
        print(task.print_best(te_log).split("  loop nest:")[0])
        te_best.append((name, min(r.cost for r in R.load_records(te_log) if r.error == R.NO_ERROR)))
    model = model()
    direct = [t for t in tuning_tasks(model) if t.template == template]
    tpl_log = os.path.join(args.log_dir, f"{case}_template.jsonl")
    tune(model, n_trials=args.trials, log=tpl_log, tasks=direct)
    tpl_best = min(r.cost for r in R.load_records(tpl_log) if r.error == R.NO_ERROR)
    # the ONNX group itself declared in te (te/groups.py): the second algorithm `compile` may pick
    group = [t for t in tuning_tasks(model) if t.template == GROUP_TEMPLATE[template]]
    group_log = os.path.join(args.log_dir, f"{case}_te_group.jsonl")
    tune(model, n_trials=args.trials, log=group_log, tasks=group)
    te_best.append((f"te, the model's group ({GROUP_TEMPLATE[template]})",
                    min(r.cost for r in R.load_records(group_log) if r.error == R.NO_ERROR)))
    print(f"\n{title} on {target.current().describe()}; {args.trials} trials each")
    print(f"{'space':<36} {'best ms':>9} {'GFLOP/s':>9} {'template/te':>12}")
    for k, t in ((f"{template} template (NCHWc)", tpl_best), *te_best):
        print(f"{k:<36} {t * 1e3:>9.4f} {flops / t / 1e9:>9.1f} {tpl_best / t:>12.2f}")


def timed(fn, seconds: float = 0.5) -> float:
    fn()
    ts, end = [], time.perf_counter() + seconds
    while time.perf_counter() < end or len(ts) < 5:
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return float(np.median(ts))


def alternate(fns: dict, blocks: int = 5) -> dict:
    """Median latency of each function over `blocks` alternating blocks."""
    got = {k: [] for k in fns}
    for _ in range(blocks):
        for k, fn in fns.items():
            got[k].append(timed(fn))
    return {k: float(np.median(v)) for k, v in got.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=300)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--log-dir", default="autoschedule_logs")
    ap.add_argument("--only", choices=["matmul", *CASES])
    args = ap.parse_args()
    os.makedirs(args.log_dir, exist_ok=True)
    if args.only in (None, "matmul"):
        matmul(args)
    for case in CASES:
        if args.only in (None, case):
            versus_template(args, case)


def matmul(args):
    n = args.size
    task = modelc.SearchTask(func=matmul_add, args=(n, n, n, "float32"))
    log = os.path.join(args.log_dir, f"matmul_add_{n}.jsonl")
    t0 = time.time()
    sched = task.tune(n_trials=args.trials, log=log)
    tuning_s = time.time() - t0
    print(task.print_best(log))
    rng = np.random.default_rng(0)
    a, b, c = (rng.standard_normal((n, n)).astype(np.float32) for _ in range(3))
    untuned, tuned = task.build(), task.build(log=log)
    ref = a @ b + c
    for name, f in (("untuned", untuned), ("tuned", tuned)):
        err = float(np.abs(f(a, b, c) - ref).max() / np.abs(ref).max())
        assert err < 1e-5, f"{name}: max error {err:.2g} relative to the output's scale"
    o1, o2, o3 = (np.empty((n, n), np.float32) for _ in range(3))
    lat = alternate({"numpy sgemm": lambda: np.matmul(a, b, out=o1),
                     "modelc untuned": lambda: untuned(a, b, c, o2),
                     "modelc tuned": lambda: tuned(a, b, c, o3)})
    flops = 2.0 * n ** 3
    print(f"\nmatmul_add {n}x{n}x{n} float32 on {target.current().describe()}; "
          f"{sched.total_trials} trials ({tuning_s:.0f} s this run)")
    print(f"{'runtime':<16} {'median ms':>10} {'GFLOP/s':>9} {'of numpy':>9}")
    for k, t in lat.items():
        print(f"{k:<16} {t * 1e3:>10.3f} {flops / t / 1e9:>9.1f} {lat['numpy sgemm'] / t:>9.2f}")


if __name__ == "__main__":
    main()
