"""A candidate's source is written once per tuning round: the builder that sizes a round writes the
files, builds compile them by name, and the runner loads the builder's file and builds the kernel
without its source (only its arguments and packed weights). A file name from anywhere else is
checked: not a kernel file name is an error, a missing or altered file is written again."""
import os

import pytest

from modelc.kernels import cache, offsets, template
from modelc.kernels.template import get, without_source
from modelc.tune import records as R
from modelc.tune import worker
from workloads import conv2d_wl

WL = conv2d_wl(C=16, H=6, W=6, K=16, k=3, s=1, p=1, hin=1, hout=0)


def _request(op: str, **extra) -> dict:
    tpl = get("conv2d")
    cfg = tpl.default_config(WL, tpl.space(WL))
    return {"op": op, "key": "k", "workload": WL.json, "template": "conv2d", "module": None,
            "config": cfg.values, "number": 1, "repeat": 1, "min_repeat_ms": 0.0, "tolerance": 1e-4,
            "cache_flush": False, "settle": False, **extra}


@pytest.fixture
def sources_written(monkeypatch):
    """How many kernel sources share_offsets writes (the costly part of writing one)."""
    calls = []
    real = offsets.share_offsets
    monkeypatch.setattr(template, "share_offsets", lambda lines: calls.append(1) or real(lines))
    return calls


def test_a_round_writes_each_source_once(sources_written):
    lines = worker._handle({"op": "lines", "requests": [_request("build")]}, {})
    (n,), (name,) = lines["lines"], lines["files"]
    assert n > 10 and os.path.exists(os.path.join(cache.kernel_dir(), name))
    built = worker._handle(_request("build", file=name), {})
    assert built == {"error": R.NO_ERROR, "file": name}
    ran = worker._handle(_request("run", file=name), {})
    assert ran["error"] == R.NO_ERROR and len(ran["costs"]) == 1, ran
    assert len(sources_written) == 1                  # the lines step's; build and run wrote none


def test_a_kernel_built_without_its_source_keeps_its_arguments_and_packing():
    tpl = get("conv2d")
    cfg = tpl.default_config(WL, tpl.space(WL))
    full = tpl.build(WL, cfg)
    with without_source():
        bare = tpl.build(WL, cfg)
    assert full.source and bare.source == "" and bare.args == full.args and bare.pack is not None
    assert tpl.build(WL, cfg).source == full.source          # only inside the block


def test_a_missing_or_altered_file_is_written_again(sources_written):
    name = worker._handle({"op": "lines", "requests": [_request("build")]}, {})["files"][0]
    gone = "k_" + "0" * 24 + ".py"
    assert worker._handle(_request("run", file=gone), {})["error"] == R.NO_ERROR
    path = os.path.join(cache.kernel_dir(), name)
    with open(path, "a") as f:
        f.write("\nimport os  # altered\n")
    cache._loaded.pop(path, None)                     # as a fresh worker finds it
    try:
        assert worker._handle(_request("build", file=name), {}) == {"error": R.NO_ERROR, "file": name}
        with open(path) as f:
            assert "altered" not in f.read()          # the build wrote the true source again
    finally:
        cache.write_source(path, tpl_source())


def tpl_source() -> str:
    tpl = get("conv2d")
    return tpl.build(WL, tpl.default_config(WL, tpl.space(WL))).source


@pytest.mark.parametrize("name", ["../../k_000000000000000000000000.py", "/etc/passwd", "k_12.py", 7])
def test_a_file_name_that_is_no_kernel_file_name_is_refused(name):
    res = worker._handle(_request("run", file=name), {})
    assert res["error"] == R.COMPILE_ERROR and "not a kernel file name" in res["msg"]


def test_only_runs_right_after_compiles_settle():
    """The runner waits for the cores to go idle and warms up longer only for the first run after
    compiles: the warm-up's rounds run candidates compiled together beforehand, one after another."""
    from modelc.extract import Task, workload_key
    from modelc.tune.measure import MeasureOptions, Measurer
    tpl = get("conv2d")
    space = tpl.space(WL)
    task = Task(workload_key(WL.json), "conv", "conv2d", WL.json, 1, 1)
    configs = [space.get(i) for i in range(3)]
    m = Measurer(MeasureOptions(number=1, repeat=1, n_parallel=1, cache_flush=False))
    settles = []
    real = m.runner.call
    m.runner.call = lambda req, timeout: settles.append(req["settle"]) or real(req, timeout)
    try:
        m.prebuild([(task, configs[:2])])
        for c in configs[:2]:                          # the warm-up: prebuilt, one round each
            assert [r.error for r in m.measure(task, [c], R.current_target())] == [R.NO_ERROR]
        assert [r.error for r in m.measure(task, configs[1:], R.current_target())] == [R.NO_ERROR] * 2
    finally:
        m.close()
    assert settles == [True, False, True, False]
