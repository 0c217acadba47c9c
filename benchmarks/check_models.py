"""Compile every ONNX model given (files or folders) and check it against onnxruntime.

For models we do not ship, such as PyTorch exports of torchvision networks made with
`benchmarks/export_torchvision.py` (needs torch and torchvision) or ONNX-zoo files. Each model gets
one line: imported/compiled or the error modelc gave, the kernels that fell back to numpy, the
error relative to the output scale over seeded inputs, top-1 agreement, and the latency ratio
(with `--against openvino`, OpenVINO's too: the goal is the faster of the two peers).

    python benchmarks/check_models.py /path/to/models --inputs 2 --jobs 1 --bench --against openvino
"""
from __future__ import annotations

import argparse
import glob
import os
import sys
import time
import traceback

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import modelc  # noqa: E402
from modelc import peers  # noqa: E402
from modelc.compare import alternating_timings, tolerance  # noqa: E402
from modelc.errors import ModelcError  # noqa: E402


_ORT_TYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(double)": np.float64,
              "tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(bool)": np.bool_}


def _inputs(sess, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    feeds = {}
    for i in sess.get_inputs():
        shape = [d if isinstance(d, int) else 1 for d in i.shape]
        dt = _ORT_TYPES.get(i.type, np.float32)
        if np.dtype(dt).kind in "iub":
            feeds[i.name] = rng.integers(0, 2 if dt == np.bool_ else 100, shape).astype(dt)
        else:
            feeds[i.name] = rng.standard_normal(shape).astype(dt)
    return feeds


def _list(out) -> list:
    """A module's outputs in the model's order (a dict of them where the model has several)."""
    if isinstance(out, dict):
        return list(out.values())
    return list(out) if isinstance(out, (list, tuple)) else [out]


def check(path: str, n_inputs: int, jobs: int, bench: bool, against: tuple = ()) -> dict:
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    res = {"model": os.path.basename(path)}
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    shapes = {i.name: [d if isinstance(d, int) else 1 for d in i.shape] for i in sess.get_inputs()}
    t0 = time.perf_counter()
    try:
        mod = modelc.compile(path, shape=shapes, jobs=jobs)
    except ModelcError as e:
        res["error"] = f"{type(e).__name__}: {e}"
        return res
    except Exception as e:           # a traceback from deep inside is a bug of ours: show where
        res["error"] = f"BUG {type(e).__name__}: {e} @ {traceback.format_exc().splitlines()[-3].strip()}"
        return res
    res["compile_s"] = time.perf_counter() - t0
    res["fallbacks"] = sorted(set(mod.fallbacks))
    res["tail"] = mod.tail.node_count if mod.tail is not None else 0
    rel, agree, ok = 0.0, 0, True
    for k in range(n_inputs):
        feeds = _inputs(sess, k)
        got = mod(**feeds) if len(feeds) > 1 else mod(*feeds.values())
        try:
            want = sess.run(None, feeds)
        except Exception as e:          # nothing to compare with: say so, keep going
            res["error"] = (f"onnxruntime cannot run it ({' '.join(str(e).split())[:200]}); modelc ran it "
                            f"(outputs finite: {all(np.isfinite(np.asarray(g)).all() for g in _list(got))})")
            return res
        got = _list(got)
        for w, g in zip(want, got):
            w = np.asarray(w)
            g = np.asarray(g)
            if w.shape != g.shape:
                res["error"] = f"output shape {g.shape} != onnxruntime's {w.shape}"
                return res
            if not w.size:
                r = 0.0
            elif w.dtype.kind == "f":
                r = float(np.abs(g.astype(np.float64) - w).max()) / max(float(np.abs(w).max()), 1e-30)
            else:
                r = float((g != w).mean())
            ok = ok and r <= tolerance([w.dtype])          # float16: a few of its ulps
            rel = max(rel, r)
        w0, g0 = np.asarray(want[0]), np.asarray(got[0])
        if not w0.size or w0.ndim == 0:        # no box left, or a scalar: nothing to rank
            agree += 1
            continue
        top1 = np.argmax(w0.reshape(w0.shape[0], -1), -1), np.argmax(g0.reshape(g0.shape[0], -1), -1)
        agree += int(top1[0].tolist() == top1[1].tolist())
    res.update(rel_err=rel, top1=f"{agree}/{n_inputs}", ok=ok)
    if bench:           # alternating blocks with pauses: onnxruntime's spinning threads must not
        feeds = _inputs(sess, 0)        # hold the cores while modelc is timed (and vice versa)
        fns = {"ort": lambda: sess.run(None, feeds), "modelc": lambda: mod(*feeds.values())}
        for name in against:
            try:
                run = peers.runner(name, path, 2, shapes)
            except Exception as e:      # a peer that cannot read the model is a row of its own
                res[f"{name}_refused"] = " ".join(str(e).split())[:300]
                continue
            fns[name] = lambda run=run: run(feeds)
        ts = alternating_timings(fns, rounds=50)
        for name in fns:
            res[f"{name}_ms"] = 1e3 * float(np.median(ts[name]))
    return res


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("paths", nargs="+")
    ap.add_argument("--inputs", type=int, default=2)
    ap.add_argument("--jobs", type=int, default=None, help="kernel compile processes")
    ap.add_argument("--bench", action="store_true", help="also time onnxruntime and modelc")
    ap.add_argument("--against", action="append", default=[], choices=[p for p in peers.PEERS if p != "onnxruntime"],
                    help="with --bench, also time this runtime (an optional extra)")
    args = ap.parse_args(argv)
    files = []
    for p in args.paths:
        files += sorted(glob.glob(os.path.join(p, "*.onnx"))) if os.path.isdir(p) else [p]
    bad = 0
    for f in files:
        r = check(f, args.inputs, args.jobs, args.bench, tuple(args.against))
        if "error" in r:
            bad += 1
            print(f"{r['model']:44s} ERROR {r['error'][:400]}", flush=True)
            continue
        bad += not r["ok"]
        line = (f"{r['model']:44s} {'ok  ' if r['ok'] else 'DIFF'} rel err {r['rel_err']:.1e} top-1 {r['top1']} "
                f"compile {r['compile_s']:.0f} s")
        if "ort_ms" in r:
            line += f"  ort {r['ort_ms']:.2f} ms modelc {r['modelc_ms']:.2f} ms ({r['modelc_ms'] / r['ort_ms']:.2f}x)"
            for name in args.against:
                if name + "_refused" in r:
                    line += f" {name} refused it: {r[name + '_refused']}"
                else:
                    line += f" {name} {r[name + '_ms']:.2f} ms (modelc {r['modelc_ms'] / r[name + '_ms']:.2f}x)"
        if r["tail"]:
            line += f"  tail: {r['tail']} nodes"
        if r["fallbacks"]:
            line += f"  fallback: {', '.join(r['fallbacks'])}"
        print(line, flush=True)
    print(f"{len(files)} models, {bad} failed")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
