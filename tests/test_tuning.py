"""modelc.tune end to end on a two-layer model: records, kill -9 and resume, ApplyHistoryBest."""
import os
import signal
import subprocess
import sys
import time

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import modelc
from modelc.tune import records as R


def _tiny(path):
    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array((rng.standard_normal((32, 16, 3, 3)) * 0.1).astype(np.float32), "w1")
    b1 = numpy_helper.from_array(rng.standard_normal(32).astype(np.float32), "b1")
    w2 = numpy_helper.from_array((rng.standard_normal((32, 32, 3, 3)) * 0.1).astype(np.float32), "w2")
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1], strides=[2, 2]),
             helper.make_node("Relu", ["c2"], ["y"])]
    g = helper.make_graph(nodes, "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 28, 28])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 32, 14, 14])], [w1, b1, w2])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    onnx.save(m, path)


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    d = tmp_path_factory.mktemp("tune")
    model, log = str(d / "tiny.onnx"), str(d / "tiny.jsonl")
    _tiny(model)
    cmd = [sys.executable, "-m", "modelc", "tune", model, "--trials", "12", "--trials-per-round", "2",
           "--log", log, "-q", "--number", "2", "--repeat", "2", "--min-repeat-ms", "1",
           "--module-check", "0"]         # the isolated records alone (test_module_check.py: the check)
    proc = subprocess.Popen(cmd, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        if os.path.exists(log) and sum(1 for _ in open(log)) >= 5:
            break
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)          # the run and its measurement workers, mid-tuning
    proc.wait()
    before = R.load_records(log, warn=False)
    assert len(before) >= 5
    subprocess.run(cmd, check=True, timeout=600, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return model, log, before


def test_killed_run_keeps_records_and_resume_reaches_the_budget(tuned):
    model, log, before = tuned
    after = R.load_records(log, warn=False)
    assert after[:len(before)] == before             # nothing flushed was lost or rewritten
    assert len(after) == 12                          # the budget counts the first run's trials
    pairs = [(r.key, r.template, repr(sorted(r.config.items()))) for r in after]
    # the resumed run re-measured nothing: a config appears twice only when it was rechecked
    assert max(pairs.count(p) for p in pairs) <= 2
    assert all(r.error == R.NO_ERROR for r in after), [r.error_msg for r in after if r.error]
    # the stride-1 conv is tuned with three algorithms (direct, Winograd, the te declaration), the
    # stride-2 one with two (no Winograd)
    assert {r.template for r in after} == {"conv2d", "conv2d_winograd", "te_conv2d"}
    winograd = {r.key for r in after if r.template == "conv2d_winograd"}
    assert len(winograd) == 1 and len({r.key for r in after}) == 2
    assert len({r.key for r in after if r.template == "te_conv2d"}) == 2


def test_apply_history_best_uses_the_best_records(tuned, caplog):
    model, log, _ = tuned
    best = R.best_by_key(R.load_records(log, warn=False), R.current_target())
    caplog.set_level("INFO", logger="modelc")
    with modelc.ApplyHistoryBest(log):
        mod = modelc.compile(model)
    assert "2 of 2 tunable workloads tuned" in caplog.text
    used = {(s["key"], s["template"]): s["config"] for s in mod.program["steps"] if s["config"] is not None}
    fastest = {}                      # per workload, the fastest record of any algorithm
    for (key, _), r in best.items():
        if key not in fastest or r.cost < fastest[key].cost:
            fastest[key] = r
    assert used == {(k, r.template): r.config for k, r in fastest.items()}
    x = np.random.default_rng(0).standard_normal((1, 16, 28, 28)).astype(np.float32)
    ref = modelc.reference.run(modelc.from_onnx(model), {"x": x})["y"]
    np.testing.assert_allclose(mod(x), ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())


def test_records_cli(tuned, tmp_path, capsys):
    from modelc.cli import main
    _, log, _ = tuned
    out = str(tmp_path / "best.jsonl")
    assert main(["records", "distill", log, "-o", out]) == 0
    assert len(R.load_records(out)) == 5       # two workloads: one with three algorithms, one with two
    assert main(["records", "show", log]) == 0
    assert "12 records" in capsys.readouterr().out


def test_a_beaten_default_is_measured_again_so_one_bad_timing_cannot_lose_it(tmp_path, monkeypatch):
    """The default config's first timing reads 2x slow (a disturbed machine); every other config
    is truly 1.5x slower than the default. Tuning must still end with the default as the best."""
    from modelc.tune import tuning

    model, log = str(tmp_path / "tiny.onnx"), str(tmp_path / "tiny.jsonl")
    _tiny(model)
    tasks = [t for t in tuning.tuning_tasks(model) if t.template == "conv2d"]
    defaults = {t.key: t.tpl.default_config(t.wl, t.space).index for t in tasks}
    timed = []

    class DisturbedMeasurer:
        def __init__(self, options=None):
            pass

        def measure(self, task, configs, target):
            out = []
            for c in configs:
                first = (task.key, c.index) not in timed
                timed.append((task.key, c.index))
                if c.index == defaults[task.key]:
                    cost = 2e-3 if first else 1e-3
                else:
                    cost = 1.5e-3 + c.index * 1e-9
                out.append(R.Record(task.key, task.desc, task.template, c.values, [cost], R.NO_ERROR,
                                    "", target, task.workload, time.time()))
            return out

        def close(self):
            pass

    monkeypatch.setattr(tuning, "Measurer", DisturbedMeasurer)
    tuning.tune(model, n_trials=16, log=log, tasks=tasks, trials_per_round=4, verbose=0)
    recs = R.load_records(log, warn=False)
    assert len(recs) == 16                                     # the recheck is inside the budget
    best = R.best_by_key(recs, R.current_target())
    for t in tasks:
        assert t.space.from_values(best[(t.key, t.template)].config).index == defaults[t.key]
    assert max(timed.count(k) for k in set(timed)) == 2          # measured again once, not more
