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
from dataclasses import dataclass

import numpy as np
import onnx

from . import ops, reference
from .errors import ModelcError, UnsupportedOpError
from .frontend import converters, onnx_import

PASSED, FAILED, NOT_RUN = "passed", "failed", "not run"


@dataclass
class CaseResult:
    name: str
    ops: tuple
    status: str
    reason: str = ""


def collect_cases():
    from onnx.backend.test.case.node import collect_testcases
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with np.errstate(all="ignore"):
            return collect_testcases(None)


def _unsupported_ops(model: onnx.ModelProto) -> list[str]:
    out = []
    for n in model.graph.node:
        if n.domain not in onnx_import.ONNX_DOMAINS:
            out.append(f"{n.domain}.{n.op_type}")
        elif n.op_type not in ops.REGISTRY and n.op_type not in converters.CONVERTED_AWAY:
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
            with np.errstate(all="ignore"):
                if backend == "compile":
                    from .compiler import compile as compile_graph
                    mod = compile_graph(graph)
                    if mod.fallbacks:
                        return CaseResult(case.name, op_types, NOT_RUN,
                                          "no kernel: " + ", ".join(sorted(set(mod.fallbacks))))
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
                    np.testing.assert_allclose(res, exp, rtol=case.rtol, atol=case.atol)
                except AssertionError as e:
                    msg = " ".join(str(e).split())
                    return CaseResult(case.name, op_types, FAILED, f"output {out_name!r}: {msg[:300]}")
    except UnsupportedOpError as e:
        return CaseResult(case.name, op_types, NOT_RUN, "unsupported form: " + " ".join(str(e).split()))
    except ModelcError as e:
        return CaseResult(case.name, op_types, FAILED, f"{type(e).__name__}: {' '.join(str(e).split())}")
    except Exception as e:  # a crash is a bug; report it as a failure, not as not-run
        return CaseResult(case.name, op_types, FAILED, f"crash {type(e).__name__}: {e}")
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


def run_all(pattern: str | None = None, backend: str = "reference", sample: int | None = None) -> list:
    """Every case (or an evenly spaced sample of those the reference passes) through `backend`."""
    cases = [c for c in collect_cases() if pattern is None or pattern in c.name]
    if sample is not None:
        ok = [c for c in cases if run_case(c).status == PASSED]
        step = max(1, len(ok) // sample)
        cases = ok[::step][:sample]
    return [run_case(c, backend) for c in cases]


def summarize(results: list[CaseResult], out=sys.stdout, verbose: bool = False):
    by_status = collections.Counter(r.status for r in results)
    print(f"ONNX conformance: {len(results)} cases: {by_status[PASSED]} passed, "
          f"{by_status[FAILED]} failed, {by_status[NOT_RUN]} not run", file=out)
    per_op: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for r in results:
        if r.status != NOT_RUN:
            for op in r.ops:
                per_op[op][r.status] += 1
    print(f"\n{'op':<28}{'passed':>8}{'failed':>8}", file=out)
    for op in sorted(per_op):
        print(f"{op:<28}{per_op[op][PASSED]:>8}{per_op[op][FAILED]:>8}", file=out)
    reasons = collections.Counter(r.reason.split(":")[0] for r in results if r.status == NOT_RUN)
    print("\nnot run, by reason:", file=out)
    for reason, n in reasons.most_common():
        print(f"  {n:5d}  {reason}", file=out)
    fails = [r for r in results if r.status == FAILED]
    if fails:
        print("\nfailed:", file=out)
        for r in fails:
            print(f"  {r.name}: {r.reason}", file=out)
    if verbose:
        print("\nnot run:", file=out)
        for r in results:
            if r.status == NOT_RUN:
                print(f"  {r.name}: {r.reason}", file=out)


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m modelc.conformance", description=__doc__)
    p.add_argument("-k", "--pattern", help="only cases whose name contains this")
    p.add_argument("-v", "--verbose", action="store_true", help="list every case not run")
    p.add_argument("--compile", action="store_true",
                   help="run the cases through modelc.compile (generated kernels) instead")
    p.add_argument("--sample", type=int, help="only an evenly spaced sample of N passing cases")
    p.add_argument("--write-baseline", metavar="FILE",
                   help="write the names of the passing cases (the regression baseline) to FILE")
    args = p.parse_args(argv)
    results = run_all(args.pattern, "compile" if args.compile else "reference", args.sample)
    summarize(results, verbose=args.verbose)
    if args.write_baseline:
        with open(args.write_baseline, "w") as f:
            f.writelines(f"{r.name}\n" for r in results if r.status == PASSED)
    return 1 if any(r.status == FAILED for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
