"""Measurement failure paths and a log shared by concurrent writers.

The real measurer (worker processes, timeouts, restarts) is driven through a compile error, a wrong
result, a build timeout, a run timeout and crashing workers by a test-only template whose one knob
picks the fault; every failure becomes a record with its own error code that nothing applies.
Two processes appending to one log at once lose and break nothing.
"""
import functools
import json
import os
import subprocess
import sys
import time

import pytest
from onnx import TensorProto, helper

import modelc
from modelc.kernels.space import ConfigSpace
from modelc.kernels.template import Kernel, Template, register, source
from modelc.tune import records as R
from modelc.tune.measure import MeasureOptions, Measurer
from modelc.tune.records import ApplyHistoryBest, Record, RecordWriter, best_by_key, load_records
from modelc.extract import Task, workload_key
from workloads import onnx_model

# ---- a template whose one knob picks how its candidate fails ---------------------------------

FAULTS = {"ok": R.NO_ERROR, "compile_error": R.COMPILE_ERROR, "wrong_result": R.WRONG_RESULT,
          "build_timeout": R.BUILD_TIMEOUT, "run_timeout": R.RUN_TIMEOUT,
          "build_crash": R.COMPILE_ERROR, "run_crash": R.RUNTIME_ERROR}
BUILD_TIMEOUT, RUN_TIMEOUT = 4.0, 3.0


@register
class FaultyRelu(Template):
    """Relu, or one of the ways a candidate fails. Measurement workers import this module to find
    it (the parent's import path is passed on); compile never picks it (an "alternative" to no
    template)."""
    name = "test_faulty_relu"
    alternative_to = "no such template"
    faults = list(FAULTS)

    def matches(self, wl):
        return [o.op for o in wl.ops] == ["Relu"]

    def space(self, wl):
        s = ConfigSpace()
        s.define_knob("fault", self.faults)
        return s

    def build(self, wl, cfg):
        fault, n = cfg["fault"], wl.outputs[0].size
        if fault == "build_timeout":
            time.sleep(600)
        if fault == "build_crash":                   # as LLVM's fatal errors end a process
            sys.stderr.write("LLVM ERROR: Symbol not found: __modelc_test_symbol\n")
            sys.stderr.flush()
            os.abort()
        body = {"ok": [f"for i in prange({n}):", "    out0[i] = max(in0[i], 0.0)"],
                "compile_error": [f"for i in prange({n}):", "    out0[i] = in0[i] + no_such_name"],
                "wrong_result": [f"for i in prange({n}):", "    out0[i] = max(in0[i], 0.0) + 0.01"],
                "run_timeout": ["x = in0[0]", "for r in range(1 << 50):", "    x = x * 0.5 + 1.0",
                                "out0[0] = x"],
                "run_crash": [f"for i in prange({n}):", "    out0[i + (1 << 42)] = in0[i]"]}[fault]
        return Kernel(source(["in0", "out0"], ["float32", "float32"], body), ["in0", "out0"])


@register
class QuickFaultyRelu(FaultyRelu):
    """The faults that cost no timeout, for tuning end to end."""
    name = "test_quick_faulty_relu"
    faults = ["ok", "compile_error", "wrong_result", "build_crash", "run_crash"]


@functools.lru_cache(maxsize=None)
def _workload_json() -> str:
    """A Relu's workload, as task extraction makes it."""
    m = onnx_model([helper.make_node("Relu", ["x"], ["y"])],
                   [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 7, 3])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 7, 3])], ir_version=8)
    (task,) = modelc.extract_tasks(m)
    return json.dumps(task.workload)


def _task(tpl=None):
    workload = json.loads(_workload_json())
    tpl = tpl or FaultyRelu()
    return Task(workload_key(workload), "relu 1x7x3 [faulty]", tpl.name, workload, 1, 21)


def _options():
    return MeasureOptions(number=1, repeat=1, min_repeat_ms=0.0, build_timeout=BUILD_TIMEOUT,
                          run_timeout=RUN_TIMEOUT, n_parallel=1, cache_flush=False)


@pytest.fixture(scope="module")
def measurer():
    m = Measurer(_options())
    task = _task()
    ok = m.measure(task, [task.space.from_values({"fault": "ok"})], R.current_target())
    assert [r.error for r in ok] == [R.NO_ERROR], ok[0].error_msg       # workers up, kernel cached
    yield m
    pids = [w.pid for w in m.builders + [m.runner] if w.pid]
    m.close()
    assert pids and not any(_alive(p) for p in pids)            # close leaves no worker behind


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_prebuilt_candidates_are_measured_without_building_again(measurer):
    """The warm-up compiles all tasks' first candidates as one batch (tuning.py); their rounds
    then only run them, and a build that failed in the batch is recorded as it would have been."""
    task, target = _task(), R.current_target()
    configs = [task.space.from_values({"fault": f}) for f in ("ok", "compile_error")]
    heard = []
    measurer.prebuild([(task, configs)], done=heard.append)
    assert heard == [1, 2] and len(measurer._prebuilt) == 2
    calls = []
    real = measurer.builders[0].call
    measurer.builders[0].call = lambda *a: calls.append(a) or real(*a)
    try:
        ok, bad = measurer.measure(task, configs, target)
    finally:
        measurer.builders[0].call = real
    assert calls == [] and not measurer._prebuilt
    assert ok.error == R.NO_ERROR and bad.error == R.COMPILE_ERROR


@pytest.mark.parametrize("fault", [f for f in FAULTS if f != "ok"])
def test_each_failure_is_recorded_with_its_own_code_and_never_applied(measurer, fault):
    task, target = _task(), R.current_target()
    builder, runner = measurer.builders[0].pid, measurer.runner.pid
    configs = [task.space.from_values({"fault": fault}), task.space.from_values({"fault": "ok"})]
    t0 = time.time()
    bad, ok = measurer.measure(task, configs, target)
    took = time.time() - t0
    assert (bad.error, bad.costs, bad.cost, bad.config) == (FAULTS[fault], [], float("inf"), {"fault": fault})
    # the next candidate, measured by the same measurer, is fine: a dead worker was replaced
    assert ok.error == R.NO_ERROR and ok.costs and 0 < ok.cost < 1, ok.error_msg
    restarted_builder = fault in ("build_timeout", "build_crash")
    restarted_runner = fault in ("run_timeout", "run_crash")
    assert (measurer.builders[0].pid != builder) == restarted_builder
    assert (measurer.runner.pid != runner) == restarted_runner
    if restarted_builder or restarted_runner:
        assert not _alive(builder if restarted_builder else runner)        # the old one is gone
    msg = bad.error_msg
    if fault == "compile_error":
        assert "no_such_name" in msg and "\x1b" not in msg and "\n" not in msg
    elif fault == "wrong_result":
        assert "max error" in msg
    elif fault.endswith("timeout"):
        limit = BUILD_TIMEOUT if fault == "build_timeout" else RUN_TIMEOUT
        assert f"no answer within {limit:g} s" in msg
        assert took < limit + 20                     # the timeout was enforced (the fault lasts for ever)
    elif fault == "build_crash":
        assert "SIGABRT" in msg and "LLVM ERROR: Symbol not found" in msg
    elif fault == "run_crash":
        assert "SIGSEGV" in msg or "SIGBUS" in msg
    # never applied: not the best, whatever cost a record claims
    forged = Record(**{**bad.__dict__, "costs": [1e-12]})
    for recs in ([bad, ok], [forged, ok]):
        assert best_by_key(recs, target) == {(task.key, FaultyRelu.name): ok}
        assert ApplyHistoryBest(recs, target=target).query(task.key, FaultyRelu.name) == {"fault": "ok"}
    assert ApplyHistoryBest([bad, forged], target=target).query(task.key, FaultyRelu.name) is None

def test_tuning_logs_every_failure_and_its_best_is_the_valid_candidate(tmp_path):
    task, log = _task(QuickFaultyRelu()), str(tmp_path / "faults.jsonl")
    sched = modelc.tune(None, n_trials=5, log=log, tuner="grid", trials_per_round=5, tasks=[task],
                        measure_options=_options(), verbose=0)
    recs = load_records(log)
    assert sorted((r.config["fault"], r.error) for r in recs) == sorted(
        (f, FAULTS[f]) for f in QuickFaultyRelu.faults)
    ok = next(r for r in recs if r.error == R.NO_ERROR)
    assert sched.best_costs == [ok.cost]
    with ApplyHistoryBest(log) as best:
        assert best.query(task.key, QuickFaultyRelu.name) == {"fault": "ok"}


# ---- a log shared by concurrent writers ------------------------------------------------------

_WRITER = r"""
import os, sys, time
from modelc.tune.records import Record, RecordWriter
log, who, n, lead = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
other = "b" if who == "a" else "a"

def signal(what):
    open(f"{log}.{who}.{what}", "w").close()

def wait(what):                                     # the other writer's signal, or fail after 60 s
    deadline = time.time() + 60
    while not os.path.exists(f"{log}.{other}.{what}"):
        if time.time() > deadline:
            sys.exit(f"{who}: no {what!r} from {other}")
        time.sleep(0.001)

with RecordWriter(log) as w:
    for i in range(n):
        if who == "b" and i == 0:
            wait("lead")                            # b starts once a has written its first lines,
        if who == "a" and i == n - lead:
            wait("lead")                            # and a ends only after b has written its own
        pad = f"{who}{i}." * (800 + 97 * (i % 40))        # 4-25 KB lines, longer than a pipe's atomic write
        w.write(Record("k", pad, "t", {"who": who, "i": i}, [1e-3], 0, "", {}, None, 1.0))
        if i == lead - 1:
            signal("lead")
"""


def test_two_processes_appending_to_one_log_lose_and_break_nothing(tmp_path):
    log = tmp_path / "shared.jsonl"
    log.write_text(_rec_line("before"))
    n, lead = 500, 10                  # the 480 records between the leads are written concurrently
    procs = [subprocess.Popen([sys.executable, "-c", _WRITER, str(log), who, str(n), str(lead)])
             for who in "ab"]
    assert [p.wait(120) for p in procs] == [0, 0]
    raw = log.read_bytes()
    assert raw.endswith(b"\n")
    lines = raw.decode().split("\n")[:-1]
    assert len(lines) == 1 + 2 * n                   # no line lost, none split in two
    recs = [json.loads(ln) for ln in lines]           # every line parses (raises otherwise)
    seen = {"a": [], "b": []}
    for r in recs[1:]:
        who, i = r["config"]["who"], r["config"]["i"]
        assert r["desc"] == f"{who}{i}." * (800 + 97 * (i % 40))           # nothing interleaved
        seen[who].append(i)
    assert seen == {"a": list(range(n)), "b": list(range(n))}             # each writer's order kept
    who_at = [r["config"].get("who") for r in recs]
    first_a, last_a = who_at.index("a"), len(who_at) - 1 - who_at[::-1].index("a")
    assert "b" in who_at[first_a:last_a]             # the writers really did overlap


def _rec_line(key):
    return Record(key, "d", "t", {"x": 1}, [1e-3], 0, "", {}, None, 1.0).to_json() + "\n"


def test_a_line_torn_while_a_writer_is_open_is_ended_before_its_next_record(tmp_path):
    log = tmp_path / "log.jsonl"
    with RecordWriter(str(log)) as w:
        w.write(Record("a", "d", "t", {}, [1e-3], 0, "", {}, None, 1.0))
        with open(log, "a") as other:                # another writer killed mid-line
            other.write(_rec_line("b")[:25])
        w.write(Record("c", "d", "t", {}, [1e-3], 0, "", {}, None, 1.0))
    with pytest.warns(UserWarning, match="skipped 1 corrupt"):
        assert [r.key for r in load_records(str(log))] == ["a", "c"]


def test_a_corrupt_line_in_the_middle_is_skipped_with_a_counted_warning(tmp_path):
    log = tmp_path / "log.jsonl"
    log.write_text(_rec_line("a") + '{"v": 1, "key": "trunc' + "\n" + _rec_line("b") + "\x00\x01garbage\n"
                   + _rec_line("c"))
    with pytest.warns(UserWarning, match=r"skipped 2 corrupt or foreign line\(s\) in .*log.jsonl"):
        assert [r.key for r in load_records(str(log))] == ["a", "b", "c"]


@register
class SizedRelu(FaultyRelu):
    """Relu with `pad` idle lines: kernels of known lengths (and one that kills its builder)."""
    name = "test_sized_relu"

    def space(self, wl):
        s = ConfigSpace()
        s.define_knob("pad", [0, 20, 5, 10, -1])
        return s

    def build(self, wl, cfg):
        if cfg["pad"] < 0:
            os.abort()
        n = wl.outputs[0].size
        body = [f"x{k} = {k}.0" for k in range(cfg["pad"])]
        body += [f"for i in prange({n}):", "    out0[i] = max(in0[i], 0.0)"]
        return Kernel(source(["in0", "out0"], ["float32", "float32"], body), ["in0", "out0"])


@pytest.mark.parametrize("crash", [False, True])
def test_a_rounds_longest_kernels_are_built_first(crash):
    """With more candidates than builders, the builders first count each kernel's lines and then
    build the longest first (a long compile started last kept the other builder idle). A kernel
    whose writing kills the builder costs its own record, not the others'."""
    m = Measurer(_options())
    task = _task(SizedRelu())
    pads = [0, 20, 5, 10] + ([-1] if crash else [])
    sent = []
    call = m.builders[0].call

    def spy(req, timeout):
        if req["op"] == "build":
            sent.append(req["config"]["pad"])
        return call(req, timeout)
    m.builders[0].call = spy
    try:
        recs = m.measure(task, [task.space.from_values({"pad": p}) for p in pads], R.current_target())
    finally:
        m.close()
    assert [r.error for r in recs] == [R.NO_ERROR] * 4 + [R.COMPILE_ERROR] * crash
    if crash:           # the builder died counting lines: no order known, the round is built as given
        assert sent == pads
    else:
        assert sent == [20, 10, 5, 0]
