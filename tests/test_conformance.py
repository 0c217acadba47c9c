"""ONNX's operator conformance cases through the frontend and the reference executor.

Every case whose ops are supported must pass, and no case in the committed baseline may stop
passing. Refresh the baseline after adding ops:
    python -m modelc.conformance --write-baseline tests/data/conformance_baseline.txt
"""
import os

import pytest

from modelc import conformance

BASELINE = os.path.join(os.path.dirname(__file__), "data", "conformance_baseline.txt")


@pytest.fixture(scope="module")
def results():
    return {r.name: r for r in conformance.run_all()}


def test_no_supported_case_fails(results):
    failed = [f"{r.name}: {r.reason}" for r in results.values() if r.status == conformance.FAILED]
    assert not failed, f"{len(failed)} conformance case(s) fail:\n" + "\n".join(failed)


def test_no_regression_against_baseline(results):
    with open(BASELINE) as f:
        baseline = [line.strip() for line in f if line.strip()]
    lost = [f"{n}: {results[n].status} {results[n].reason}" if n in results else f"{n}: gone"
            for n in baseline if n not in results or results[n].status != conformance.PASSED]
    assert not lost, f"{len(lost)} case(s) passed before and do not now:\n" + "\n".join(lost)


def test_every_case_not_run_has_a_reason(results):
    for r in results.values():
        if r.status == conformance.NOT_RUN:
            assert r.reason


def _through_compile(sample):
    results = conformance.run_all(backend="compile", sample=sample)
    ran = [r for r in results if r.status != conformance.NOT_RUN]
    failed = [f"{r.name}: {r.reason}" for r in results if r.status == conformance.FAILED]
    assert not failed, "\n".join(failed)
    return ran


def test_sample_of_cases_through_compiled_kernels():
    ran = _through_compile(sample=24)
    assert len(ran) >= 12          # most sampled cases have kernels, not the reference fallback


@pytest.mark.slow
def test_all_cases_through_compiled_kernels():
    _through_compile(sample=None)
