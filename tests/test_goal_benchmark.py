"""benchmarks/goal.py's reading of a tuning log against the module it gave."""
import importlib.util
import os

from modelc.tune import records as R


def _goal():
    path = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "goal.py")
    spec = importlib.util.spec_from_file_location("goal_benchmark", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_logged_latency_is_that_of_the_config_the_module_runs():
    """Where the module check chose a config other than the log's fastest, the module is compared with
    the time logged for the config it runs; a kernel without a record of its config keeps its profile."""
    goal = _goal()
    target = R.current_target()

    def rec(key, config, ms, **kw):
        return R.Record(key, key, "conv2d", config, [ms / 1e3], **{"target": target, **kw})
    records = [rec("a", {"t": 1}, 1.0), rec("a", {"t": 2}, 2.0), rec("a", {"t": 2}, 1.5),
               rec("a", {"t": 3}, 0.5, error=R.RUNTIME_ERROR),
               rec("a", {"t": 1}, 0.2, context="module"),
               rec("b", {"t": 1}, 3.0), rec("b", {"t": 1}, 0.1, target={**target, "cpu": "another"})]
    steps = [{"key": "a", "config": {"t": 2}}, {"key": "b", "config": {"t": 1}},
             {"key": "b", "config": None}, {"key": "c", "config": {"t": 1}}]
    prof = [{"step": i, "template": "conv2d", "ms": ms} for i, ms in enumerate([9.0, 9.0, 0.7, 0.3])]
    assert abs(goal.logged_ms(steps, prof, records) - (1.5 + 3.0 + 0.7 + 0.3)) < 1e-9
