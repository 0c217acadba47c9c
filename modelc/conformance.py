"""ONNX's operator conformance cases, run through the frontend and the reference executor.

`python -m modelc.conformance` prints the pass count per op and the reason for every case not run.
The cases ship inside the onnx package (`onnx.backend.test.case.node.collect_testcases`), each a
one-node model with inputs, expected outputs and its own tolerances.
"""
from __future__ import annotations

import argparse
import collections
import sys
import warnings

import numpy as np
import onnx

from . import ops, reference
from .errors import DynamicError, ModelcError, UnsupportedOpError
from .frontend import converters, functions, onnx_import
from .frontend.tail import TAIL_OPS
from .case_workers import (ABORT_CASE, CASE_TIMEOUT_S, CRASHED, FAILED, FOLDED, NOT_RUN, PASSED,  # noqa: F401
                           PASSED_FALLBACK, PASSED_TAIL, STATUSES, CaseResult, collect_cases, run_isolated)

# Cases whose expected outputs carry their generator's own float32 roundoff past the case's absolute
# tolerance, so that only the generator's arithmetic could meet it: numpy's complex64 inverse FFT
# leaves 1.9e-7 where the exact inverse of the (Hermitian) input is 0, against the case's atol of
# 1e-7, on outputs of scale 54 (onnxruntime misses them by 1.9e-5). These are checked float32-honestly
# instead, relative to the output's scale.
SCALE_CHECKED = {"test_dft_inverse": 1e-6, "test_dft_inverse_opset19": 1e-6}


def _check_output(case, res, exp):
    """Raises AssertionError where `res` is not `exp` within the case's tolerances (SCALE_CHECKED's bound,
    relative to the output's scale, for the cases it names)."""
    bound = SCALE_CHECKED.get(case.name)
    if bound is None:
        np.testing.assert_allclose(res, exp, rtol=case.rtol, atol=case.atol)
        return
    scale = max(float(np.abs(exp).max()) if exp.size else 0.0, 1e-30)
    err = float(np.abs(res.astype(np.float64) - exp).max()) / scale if exp.size else 0.0
    if not err <= bound:
        raise AssertionError(f"max error {err:.3g} of the output's scale, over {bound:g}")


def _unsupported_ops(model: onnx.ModelProto) -> list[str]:
    out = []
    opset = onnx_import.model_opset(model)
    for n in model.graph.node:
        if n.domain not in onnx_import.ONNX_DOMAINS:
            out.append(f"{n.domain}.{n.op_type}")
        elif n.op_type not in ops.REGISTRY and n.op_type not in converters.CONVERTED_AWAY and \
                n.op_type not in TAIL_OPS and not functions.expands(n.op_type, n.domain, opset):
            out.append(n.op_type)
    return sorted(set(out))


def _value_type_problem(vi: onnx.ValueInfoProto) -> str | None:
    if not vi.type.HasField("tensor_type"):
        return f"non-tensor type ({vi.type.WhichOneof('value')}) for {vi.name!r}"
    et = vi.type.tensor_type.elem_type
    try:
        dt = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(et))
    except Exception:
        dt = None
    if dt is None or dt.kind not in "biuf" or dt.itemsize == 1 and dt.kind == "f" or \
            onnx.TensorProto.DataType.Name(et) in ("BFLOAT16",) or dt.kind == "V":
        return f"dtype {onnx.TensorProto.DataType.Name(et)} of {vi.name!r}"
    return None


def _array(x):
    return onnx.numpy_helper.to_array(x) if isinstance(x, onnx.TensorProto) else np.asarray(x)


def _bind_shape_parameters(model: onnx.ModelProto, feeds: dict) -> onnx.ModelProto:
    """Turn graph inputs that decide shapes (Reshape's shape, Pad's pads, axes ...) into constants.

    modelc compiles for static shapes, so such values are compile-time constants for it; the
    conformance cases feed them as inputs only because ONNX allows it. Inputs at a registry op's
    parameter positions, parameter inputs of ops rewritten at import, and small integer inputs
    are bound to the case's values.
    """
    params = set()
    for n in model.graph.node:
        if n.domain not in onnx_import.ONNX_DOMAINS:
            continue
        opdef = ops.REGISTRY.get(n.op_type)
        positions = opdef.param_inputs if opdef is not None else \
            range(1, len(n.input)) if n.op_type in converters.CONVERTED_AWAY else ()
        params.update(n.input[i] for i in positions if i < len(n.input) and n.input[i])
    params.update(k for k, v in feeds.items() if v.dtype.kind in "iu" and v.size <= 16)
    params &= {i.name for i in model.graph.input} & set(feeds)
    if not params:
        return model
    m = onnx.ModelProto()
    m.CopyFrom(model)
    keep = [i for i in m.graph.input if i.name not in params]
    del m.graph.input[:]
    m.graph.input.extend(keep)
    m.graph.initializer.extend(onnx.numpy_helper.from_array(feeds[k], k) for k in sorted(params))
    return m


def run_case(case, backend: str = "reference") -> CaseResult:
    """Run one case through the reference executor, or through `modelc.compile` (kernels)."""
    return _run_case(case, backend)


def _run_case(case, backend) -> CaseResult:
    model = case.model
    op_types = tuple(sorted({n.op_type for n in model.graph.node}))
    missing = _unsupported_ops(model)
    if missing:
        return CaseResult(case.name, op_types, NOT_RUN, "unsupported op: " + ", ".join(missing))
    for vi in list(model.graph.input) + list(model.graph.output):
        problem = _value_type_problem(vi)
        if problem:
            return CaseResult(case.name, op_types, NOT_RUN, "unsupported " + problem)
    fallbacks, steps, tail = set(), 0, 0
    try:
        for inputs, expected in case.data_sets:
            names = [i.name for i in model.graph.input]
            feeds = {n: _array(x) for n, x in zip(names, inputs)}
            expected = [_array(e) for e in expected]
            m = _bind_shape_parameters(model, feeds)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                graph = onnx_import.from_onnx(m, shape={n: x.shape for n, x in feeds.items()
                                                        if n in {i.name for i in m.graph.input}})
            feeds = {n: x for n, x in feeds.items() if n in graph.inputs}
            tail = graph.tail.node_count if graph.tail is not None else 0
            with np.errstate(all="ignore"):
                if backend == "compile":
                    from .compiler import compile as compile_graph
                    mod = compile_graph(graph, jobs=1)
                    fallbacks.update(mod.fallbacks)
                    steps += len(mod.program["steps"])
                    got = mod.run(feeds)
                else:
                    got = reference.run(graph, feeds)
            for out_name, exp in zip([o.name for o in model.graph.output], expected):
                exp = np.asarray(exp)
                res = got[out_name]
                if res.dtype != exp.dtype:
                    return CaseResult(case.name, op_types, FAILED,
                                      f"output {out_name!r} dtype {res.dtype}, expected {exp.dtype}")
                if res.shape != exp.shape:
                    return CaseResult(case.name, op_types, FAILED,
                                      f"output {out_name!r} shape {res.shape}, expected {exp.shape}")
                try:
                    _check_output(case, res, exp)
                except AssertionError as e:
                    msg = " ".join(str(e).split())
                    return CaseResult(case.name, op_types, FAILED, f"output {out_name!r}: {msg[:300]}")
    except UnsupportedOpError as e:
        return CaseResult(case.name, op_types, NOT_RUN, "unsupported form: " + " ".join(str(e).split()))
    except DynamicError as e:      # (what the data decides runs in the tail; a sequence cannot cross to it)
        return CaseResult(case.name, op_types, NOT_RUN, "unsupported form: " + " ".join(str(e).split()))
    except ModelcError as e:
        return CaseResult(case.name, op_types, FAILED, f"{type(e).__name__}: {' '.join(str(e).split())}")
    except Exception as e:  # a raw exception is a bug: a crash, not a failure nor not-run
        return CaseResult(case.name, op_types, CRASHED, f"{type(e).__name__}: {' '.join(str(e).split())[:300]}")
    if tail:
        return CaseResult(case.name, op_types, PASSED_TAIL, f"{tail} node(s) whose shapes the data decides "
                          "on ONNX's reference evaluator")
    if fallbacks:
        return CaseResult(case.name, op_types, PASSED_FALLBACK, "no kernel: " + ", ".join(sorted(fallbacks)))
    if backend == "compile" and not steps:
        return CaseResult(case.name, op_types, PASSED, FOLDED)
    return CaseResult(case.name, op_types, PASSED)


def data_model_dirs() -> list[str]:
    """Model folders (model.onnx + test_data_set_*) shipped under onnx/backend/test/data."""
    import glob
    import os
    root = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data")
    return sorted(os.path.dirname(p) for p in glob.glob(os.path.join(root, "*", "*", "model.onnx")))


def light_models() -> list[str]:
    """The 'light' ONNX-zoo models (opset 9 structure, ConstantOfShape-made weights)."""
    import glob
    import os
    root = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")
    return sorted(glob.glob(os.path.join(root, "*.onnx")))


def run_model_dir(path: str, rtol: float = 1e-3, atol: float = 1e-7) -> CaseResult:
    """Import a stored test model and compare with its stored expected outputs."""
    import glob
    import os
    from onnx import numpy_helper
    name = os.path.relpath(path, os.path.dirname(os.path.dirname(path)))
    model = onnx.load(os.path.join(path, "model.onnx"))
    sets = []
    for d in sorted(glob.glob(os.path.join(path, "test_data_set_*"))):
        def read(kind):
            files = sorted(glob.glob(os.path.join(d, f"{kind}_*.pb")),
                           key=lambda f: int(f.rsplit("_", 1)[1].split(".")[0]))
            out = []
            for f in files:
                t = onnx.TensorProto()
                with open(f, "rb") as fh:
                    t.ParseFromString(fh.read())
                out.append(numpy_helper.to_array(t))
            return out
        sets.append((read("input"), read("output")))

    class _Case:
        pass
    case = _Case()
    case.name, case.model, case.data_sets, case.rtol, case.atol = name, model, sets, rtol, atol
    inits = {i.name for i in model.graph.initializer}
    real_inputs = [i for i in model.graph.input if i.name not in inits]
    del model.graph.input[:]
    model.graph.input.extend(real_inputs)   # stored inputs feed the real inputs only
    return run_case(case)


def _static_problem(case) -> str | None:
    """Why a case cannot run, decided without running it (unsupported op or dtype), or None."""
    missing = _unsupported_ops(case.model)
    if missing:
        return "unsupported op"
    for vi in list(case.model.graph.input) + list(case.model.graph.output):
        if _value_type_problem(vi):
            return "unsupported dtype"
    return None


def sample_cases(cases: list, n: int) -> list:
    """`n` cases evenly spaced (by name) among those with supported ops and dtypes: the same
    cases on every machine and run, chosen without running anything."""
    ok = sorted((c for c in cases if _static_problem(c) is None), key=lambda c: c.name)
    if n >= len(ok):
        return ok
    return [ok[k * len(ok) // n] for k in range(n)]


def run_all(pattern: str | None = None, backend: str = "reference", sample: int | None = None,
            jobs: int | None = None, isolate: bool | None = None, progress=None) -> list:
    """Every case (or a deterministic sample of `sample` runnable ones) through `backend`.

    Through compile the cases run isolated (`isolate`, the default there) in `jobs` worker
    processes: a case that kills its worker (an abort or a segfault in native code) is reported
    as a crash and the worker replaced, so the run always reaches the end.
    """
    cases = [c for c in collect_cases() if pattern is None or pattern in c.name]
    if sample is not None:
        cases = sample_cases(cases, sample)
    if isolate is None:
        isolate = backend == "compile"
    if not isolate:
        out = []
        for c in cases:
            out.append(run_case(c, backend))
            if progress:
                progress(out[-1])
        return out
    return run_isolated([c.name for c in cases], backend, jobs, progress=progress, cases=cases)


def _worker_main(backend: str, cases_file: str | None):
    """Read case names on stdin, answer one JSON line each on the real stdout (anything else
    the run prints goes to stderr). The cases come from `cases_file`, which the parent process
    wrote for it (a pickle: never a file from anyone else), or are collected here."""
    import json
    import os
    import pickle
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    if cases_file:
        with open(cases_file, "rb") as f:
            cases = {c.name: c for c in pickle.load(f)}
    else:
        cases = {c.name: c for c in collect_cases()}
    for line in sys.stdin:
        name = line.strip()
        if not name:
            continue
        if name == ABORT_CASE:
            os.abort()
        case = cases.get(name)
        r = run_case(case, backend) if case is not None else \
            CaseResult(name, (), NOT_RUN, "no such case")
        out.write(json.dumps({"name": r.name, "ops": list(r.ops), "status": r.status,
                              "reason": r.reason}) + "\n")
        out.flush()


def summarize(results: list[CaseResult], out=sys.stdout, verbose: bool = False, backend: str = "reference"):
    by_status = collections.Counter(r.status for r in results)
    if backend == "compile":
        print(f"ONNX conformance through modelc.compile: {len(results)} cases", file=out)
        folded = sum(r.status == PASSED and r.reason == FOLDED for r in results)
        rows = [("passed, generated kernels only", by_status[PASSED]),
                ("  of which folded to constants", folded),
                ("passed, with the numpy fallback", by_status[PASSED_FALLBACK]),
                ("passed, data-dependent tail", by_status[PASSED_TAIL]),
                ("failed", by_status[FAILED]), ("crashed", by_status[CRASHED]),
                ("not run", by_status[NOT_RUN])]
        for label, n in rows:
            print(f"  {label:<34}{n:>6}", file=out)
    else:
        print(f"ONNX conformance: {len(results)} cases: {by_status[PASSED]} passed, "
              f"{by_status[PASSED_TAIL]} passed with a data-dependent tail, "
              f"{by_status[FAILED]} failed, {by_status[CRASHED]} crashed, {by_status[NOT_RUN]} not run",
              file=out)
    per_op: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for r in results:
        if r.status != NOT_RUN:
            for op in r.ops:
                per_op[op][r.status] += 1
    cols = [(PASSED, "kernels" if backend == "compile" else "passed")] + \
        ([(PASSED_FALLBACK, "fallback")] if backend == "compile" else []) + \
        [(PASSED_TAIL, "tail"), (FAILED, "failed"), (CRASHED, "crashed")]
    print(f"\n{'op':<28}" + "".join(f"{h:>10}" for _, h in cols), file=out)
    for op in sorted(per_op):
        print(f"{op:<28}" + "".join(f"{per_op[op][st]:>10}" for st, _ in cols), file=out)
    if backend == "compile":
        fb = collections.Counter(p for r in results if r.status == PASSED_FALLBACK
                                 for p in r.reason.partition(": ")[2].split(", "))
        if fb:
            print("\ngroups run on the numpy fallback, by cases:", file=out)
            for pattern, n in fb.most_common():
                print(f"  {n:5d}  {pattern}", file=out)
    reasons = collections.Counter(r.reason.split(":")[0].split(" of '")[0] for r in results
                                  if r.status == NOT_RUN)
    print("\nnot run, by reason:", file=out)
    for reason, n in reasons.most_common():
        print(f"  {n:5d}  {reason}", file=out)
    for status, title in ((FAILED, "failed"), (CRASHED, "crashed")):
        bad = [r for r in results if r.status == status]
        if bad:
            print(f"\n{title}:", file=out)
            for r in bad:
                print(f"  {r.name}: {r.reason}", file=out)
    if verbose and backend == "compile":
        print("\non the numpy fallback:", file=out)
        for r in results:
            if r.status == PASSED_FALLBACK:
                print(f"  {r.name}: {r.reason}", file=out)
    if verbose:
        print("\nnot run:", file=out)
        for r in results:
            if r.status == NOT_RUN:
                print(f"  {r.name}: {r.reason}", file=out)


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m modelc.conformance", description=__doc__)
    p.add_argument("-k", "--pattern", help="only cases whose name contains this")
    p.add_argument("-v", "--verbose", action="store_true", help="list every case not run (with --compile, "
                   "every case on the fallback too)")
    p.add_argument("--compile", action="store_true",
                   help="run the cases through modelc.compile (generated kernels) instead, each "
                        "checked against its expected outputs, in isolated worker processes")
    p.add_argument("--sample", type=int, metavar="N",
                   help="only N cases, evenly spaced by name among those with supported ops and "
                        "dtypes (the same N cases on every run)")
    p.add_argument("-j", "--jobs", type=int, help="worker processes for --compile (default: CPUs)")
    p.add_argument("--write-baseline", metavar="FILE",
                   help="write the names of the passing cases (the regression baseline) to FILE")
    p.add_argument("--worker", choices=("reference", "compile"), help=argparse.SUPPRESS)
    p.add_argument("--cases-file", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        _worker_main(args.worker, args.cases_file)
        return 0
    import time
    backend = "compile" if args.compile else "reference"
    t0 = time.perf_counter()
    progress = None
    if backend == "compile" and sys.stderr.isatty():
        done = collections.Counter()

        def progress(r):
            done[r.status] += 1
            print(f"\r{sum(done.values())} cases: " + ", ".join(f"{n} {st}" for st, n in done.items()),
                  end="", file=sys.stderr, flush=True)
    results = run_all(args.pattern, backend, args.sample, jobs=args.jobs, progress=progress)
    if progress:
        print(file=sys.stderr)
    summarize(results, verbose=args.verbose, backend=backend)
    print(f"\n{len(results)} cases in {time.perf_counter() - t0:.0f} s", file=sys.stdout)
    if args.write_baseline:
        with open(args.write_baseline, "w") as f:
            f.writelines(f"{r.name}\n" for r in results if r.status == PASSED)
    # cases on the fallback pass (they are counted apart); wrong results and crashes fail the run
    return 1 if any(r.status in (FAILED, CRASHED) for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
