"""The module check (modelc/tune/module_check.py): after tuning, each workload's best configs and
its default are timed in the model's module; the fastest there is logged as a record of context
"module", which is no trial, and which `ApplyHistoryBest` takes until a better kernel record comes."""
import dataclasses
import json

import numpy as np
import pytest

import modelc
from modelc.tune import records as R
from modelc.tune import tuning
from modelc.tune.measure import MeasureOptions
from test_tuning import _tiny


@pytest.fixture(scope="module")
def checked(tmp_path_factory):
    d = tmp_path_factory.mktemp("check")
    model, log = str(d / "tiny.onnx"), str(d / "tiny.jsonl")
    _tiny(model)
    tuning.tune(model, n_trials=10, log=log, trials_per_round=5, verbose=0, module_check=2,
                measure_options=MeasureOptions(number=2, repeat=2, min_repeat_ms=1))
    return model, log


def _cfg(template, config):
    return template, json.dumps(config, sort_keys=True)


def test_the_check_logs_one_in_module_choice_per_workload_and_no_trial(checked):
    model, log = checked
    kernel = R.load_records(log, warn=False)
    every = R.load_records(log, warn=False, in_module=True)
    assert len(kernel) == 10                        # the budget: the check's records are no trials
    checks = [r for r in every if r.context == "module"]
    assert checks and len({r.key for r in checks}) == len(checks) == len({r.key for r in kernel})
    for c in checks:
        assert c.error == R.NO_ERROR and all(0 < t < 1 for t in c.costs)
        # the choice is one of the workload's measured configs, or its default
        measured = {_cfg(r.template, r.config) for r in kernel if r.key == c.key}
        from modelc.kernels.template import get
        from modelc.kernels.workload import Workload
        wl = Workload(c.workload)
        tpl = get(c.template)
        default = _cfg(tpl.name, dict(tpl.default_config(wl, tpl.space(wl)).values))
        assert _cfg(c.template, c.config) in measured | {default}
    # a resumed run with the same budget measures nothing more
    tuning.tune(model, n_trials=10, log=log, verbose=0, module_check=0)
    assert len(R.load_records(log, warn=False)) == 10


def test_compile_takes_the_module_choice_and_stays_correct(checked):
    model, log = checked
    checks = {r.key: r for r in R.load_records(log, warn=False, in_module=True) if r.context == "module"}
    with modelc.ApplyHistoryBest(log):
        mod = modelc.compile(model)
    used = {s["key"]: _cfg(s["template"], s["config"]) for s in mod.program["steps"] if s["key"] in checks}
    assert used == {k: _cfg(r.template, r.config) for k, r in checks.items()}
    x = np.random.default_rng(0).standard_normal((1, 16, 28, 28)).astype(np.float32)
    ref = modelc.reference.run(modelc.from_onnx(model), {"x": x})["y"]
    np.testing.assert_allclose(mod(x), ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())


def test_a_better_kernel_record_after_the_check_supersedes_it(checked):
    _, log = checked
    every = R.load_records(log, warn=False, in_module=True)
    check = next(r for r in every if r.context == "module")
    other = next(r for r in every if r.context == "kernel" and r.key == check.key
                 and _cfg(r.template, r.config) != _cfg(check.template, check.config))
    algos = sorted({r.template for r in every if r.key == check.key})
    later = dataclasses.replace(other, costs=[1e-9], timestamp=check.timestamp + 1)
    assert R.ApplyHistoryBest(every + [later]).choose(check.key, algos) == (later.template, later.config)
    earlier = dataclasses.replace(later, timestamp=check.timestamp - 1)      # tuned before the check
    assert R.ApplyHistoryBest(every + [earlier]).choose(check.key, algos) == (check.template, check.config)


def test_module_records_round_trip_and_a_bad_context_is_skipped(checked, tmp_path):
    _, log = checked
    check = next(r for r in R.load_records(log, warn=False, in_module=True) if r.context == "module")
    assert R.Record.from_json(check.to_json()) == check
    d = json.loads(check.to_json())
    d["context"] = "elsewhere"
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(d) + "\n" + check.to_json() + "\n")
    with pytest.warns(UserWarning, match=r"skipped 1 corrupt.*context"):
        assert len(R.load_records(str(bad), in_module=True)) == 1
    # distill keeps the latest check of each workload beside the best kernel records
    out = str(tmp_path / "best.jsonl")
    R.distill(log, out)
    assert {r.key for r in R.load_records(out, in_module=True) if r.context == "module"} == \
        {r.key for r in R.load_records(log, in_module=True) if r.context == "module"}


def test_records_show_lists_the_module_choices(checked, capsys):
    from modelc.cli import main
    _, log = checked
    assert main(["records", "show", log]) == 0
    out = capsys.readouterr().out
    n = len({r.key for r in R.load_records(log, warn=False, in_module=True) if r.context == "module"})
    assert "10 records" in out and f"module check: {n} workloads" in out and "(in the module)" in out
