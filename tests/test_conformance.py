"""ONNX's operator conformance cases through the frontend and the reference executor.

Every case whose ops are supported must pass, and no case in the committed baseline may stop
passing. Refresh the baseline after adding ops:
    python -m modelc.conformance --write-baseline tests/data/conformance_baseline.txt
"""
import os

import onnx
import pytest

from modelc import conformance, ops
from modelc.frontend import converters
from modelc.ops.cast import onnx_dtype

BASELINE = os.path.join(os.path.dirname(__file__), "data", "conformance_baseline.txt")


@pytest.fixture(scope="module")
def results():
    return {r.name: r for r in conformance.run_all()}


def test_no_supported_case_fails(results):
    failed = [f"{r.name}: {r.status}: {r.reason}" for r in results.values()
              if r.status in (conformance.FAILED, conformance.CRASHED)]
    assert not failed, f"{len(failed)} conformance case(s) fail:\n" + "\n".join(failed)


def test_no_regression_against_baseline(results):
    with open(BASELINE) as f:
        baseline = [line.strip() for line in f if line.strip()]
    lost = [f"{n}: {results[n].status} {results[n].reason}" if n in results else f"{n}: gone"
            for n in baseline if n not in results or results[n].status != conformance.PASSED]
    assert not lost, f"{len(lost)} case(s) passed before and do not now:\n" + "\n".join(lost)


def test_a_case_not_run_needs_what_modelc_lacks(results):
    """A case is skipped only for an op the registry lacks, an element type modelc does not compute
    in, a non-tensor value, a form the frontend rejects or control flow on the data (an If or Loop
    whose condition or trip count is an input); and what the reason names is lacking."""
    wrong = []
    for r in results.values():
        if r.status != conformance.NOT_RUN:
            continue
        kind, _, what = r.reason.partition(": ")
        if kind == "unsupported op":
            ok = all(op not in ops.REGISTRY and op not in converters.CONVERTED_AWAY
                     for op in what.split(", "))
        elif r.reason.startswith("unsupported dtype "):
            name = r.reason.split()[2]
            try:
                onnx_dtype(onnx.TensorProto.DataType.Value(name))
                ok = False
            except ValueError:
                ok = True
        elif r.reason.startswith("control flow on the input data"):
            ok = bool({"If", "Loop"} & set(r.ops))
        else:
            ok = r.reason.startswith(("unsupported non-tensor type", "unsupported form: "))
        if not ok:
            wrong.append(f"{r.name}: {r.reason}")
    assert not wrong, "cases not run for a reason that does not hold:\n" + "\n".join(wrong)


def _through_compile(sample):
    """Cases through modelc.compile, each checked (fallback or not): none fails or crashes."""
    results = conformance.run_all(backend="compile", sample=sample)
    bad = [f"{r.name}: {r.status}: {r.reason}" for r in results
           if r.status in (conformance.FAILED, conformance.CRASHED)]
    assert not bad, f"{len(bad)} case(s) fail or crash through compile:\n" + "\n".join(bad)
    return results


def test_sample_of_cases_through_compiled_kernels():
    results = _through_compile(sample=SAMPLE)
    ran = [r for r in results if r.status != conformance.NOT_RUN]   # a few are unsupported forms
    assert len(results) == SAMPLE and len(ran) >= SAMPLE * 9 // 10
    kernels_only = [r for r in results if r.status == conformance.PASSED]
    assert len(kernels_only) >= SAMPLE // 2     # most sampled cases run generated kernels only


SAMPLE = 100    # 15 s with a warm kernel cache on 2 cores, 47 s from an empty one


def test_sample_is_deterministic():
    cases = conformance.collect_cases()
    a = [c.name for c in conformance.sample_cases(cases, 10)]
    assert a == [c.name for c in conformance.sample_cases(list(reversed(cases)), 10)] and len(set(a)) == 10


def test_a_case_that_kills_its_worker_is_a_crash_and_the_run_goes_on():
    names = ["test_relu", conformance.ABORT_CASE, "test_abs"]
    results = conformance.run_isolated(names, "reference", jobs=1)
    assert [r.status for r in results] == [conformance.PASSED, conformance.CRASHED, conformance.PASSED]
    assert "SIGABRT" in results[1].reason and results[1].name == conformance.ABORT_CASE


@pytest.mark.slow
def test_all_cases_through_compiled_kernels():
    _through_compile(sample=None)
