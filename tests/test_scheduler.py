"""Task scheduler allocation on synthetic tasks with fixed cost curves (no kernels are built)."""
import io
import math
import random
import pytest

from modelc.extract import Task
from modelc.tune.scheduler import PrintTableCallback, TaskScheduler

MS = 1e-3


def fake_task(desc, weight=1, flops=1e8, key=""):
    """A task of no real workload: the scheduler reads only its weight, FLOPs and description."""
    return Task(key, desc, "synthetic", {}, weight, flops)


def curve(a, b, noise=0.0, seed=0, fail_first=0):
    """Latency of a task's t-th trial: a + b / (1 + t), optionally noisy; the first trials may fail."""
    rng = random.Random(seed)

    def f(t):
        if t < fail_first:
            return math.inf
        return (a + b / (1 + t)) * (1 + noise * rng.random())
    return f


class Runner:
    """tune_round over fixed curves; records every call and every latency it returned."""

    def __init__(self, curves, space=None):
        self.curves, self.space = curves, space or {}
        self.calls, self.measured = [], {i: [] for i in range(len(curves))}

    def __call__(self, i, n):
        self.calls.append((i, n))
        left = self.space.get(i, 10 ** 9) - len(self.measured[i])
        out = [self.curves[i](len(self.measured[i]) + k) for k in range(max(0, min(n, left)))]
        self.measured[i] += out
        return out


def tasks_of(n, **kw):
    return [fake_task(desc=f"pattern{i} 1x{i}", key=f"k{i}", **kw) for i in range(n)]


def run(tasks, curves, n_trials, tpr=8, space=None, history=None, **kw):
    sched = TaskScheduler(tasks, **kw)
    runner = Runner(curves, space)
    if history:                               # earlier measurements continue the same curves
        for i, lats in history.items():
            runner.measured[i] = list(lats)
    sched.tune(n_trials, tpr, runner, history=history)
    return sched, runner


def test_steepest_task_gets_most_rounds():
    curves = [curve(1 * MS, 0), curve(1 * MS, 50 * MS), curve(1 * MS, 0), curve(1 * MS, 0.2 * MS)]
    sched, runner = run(tasks_of(4), curves, 320)
    assert sched.total_trials == 320 and sched.stop_reason == "budget"
    others = [r for i, r in enumerate(sched.task_rounds) if i != 1]
    assert sched.task_rounds[1] > 1.3 * max(others)
    assert [i for i, _ in runner.calls[:4]] == [0, 1, 2, 3]      # round-robin warm-up first


def test_weight_counts_in_the_allocation():
    curves = [curve(1 * MS, 4 * MS) for _ in range(3)]
    tasks = tasks_of(3)
    tasks[2].weight = 6
    sched, _ = run(tasks, curves, 400)
    assert sched.task_rounds[2] > 2 * max(sched.task_rounds[:2])


def test_round_robin_splits_evenly():
    curves = [curve(1 * MS, 50 * MS), curve(1 * MS, 0), curve(2 * MS, 1 * MS)]
    sched, runner = run(tasks_of(3), curves, 240, tpr=10, strategy="round-robin")
    assert sched.task_trials == [80, 80, 80] and sched.task_rounds == [8, 8, 8]
    assert [i for i, _ in runner.calls[:6]] == [0, 1, 2, 0, 1, 2]


def test_round_robin_skips_dead_tasks():
    curves = [curve(1 * MS, 1 * MS)] * 3
    sched, _ = run(tasks_of(3), curves, 120, tpr=10, strategy="round-robin", space={1: 15})
    assert sched.dead == {1} and sched.task_trials == [55, 15, 50]


def test_budget_is_exact_and_last_round_is_short():
    curves = [curve(1 * MS, 5 * MS), curve(2 * MS, 5 * MS)]
    sched, runner = run(tasks_of(2), curves, 45, tpr=8, warmup_share=1.0)      # warm-up rounds of 8 too
    assert sched.total_trials == 45 and sum(n for _, n in runner.calls) == 45
    assert runner.calls[-1][1] == 45 % 8
    assert len(sched.round_log) == len(runner.calls)


@pytest.mark.parametrize("n_trials,done", [(300, {}), (20, {}), (300, {2: [1e-3] * 5})])
def test_prepare_hears_exactly_the_warmup_rounds_that_run(n_trials, done):
    """The warm-up's candidates are compiled as one batch: `prepare` must announce the rounds
    the scheduler then runs, in order, cut by the budget, without tasks tuned before."""
    heard = []
    sched = TaskScheduler(tasks_of(30))
    runner = Runner([curve(1 * MS, 1 * MS)] * 30)
    for i, lats in done.items():
        runner.measured[i] = list(lats)
    sched.tune(n_trials, 16, runner, history=done or None, prepare=heard.extend)
    warm = [(i, n) for i, n in heard]
    assert runner.calls[:len(warm)] == warm
    assert sum(n for _, n in warm) <= n_trials - sum(len(v) for v in done.values())
    assert all(i not in done for i, _ in warm)
    assert len(warm) == (30 - len(done) if n_trials >= 30 else n_trials)


def test_trials_per_round_capped_so_warmup_reaches_every_task():
    sched, runner = run(tasks_of(5), [curve(1 * MS, 1 * MS)] * 5, 50, tpr=64, strategy="round-robin")
    assert sched.trials_per_round == 10 and sched.task_trials == [10] * 5


@pytest.mark.parametrize("n_trials,tasks,warmup", [(300, 32, 2), (1000, 32, 7), (50, 5, 2), (20, 30, 1)])
def test_gradient_warmup_spends_a_quarter_of_the_budget_at_most(n_trials, tasks, warmup):
    """ResNet-18's 32 tasks once took 288 of 300 trials in a warm-up of full rounds."""
    sched, runner = run(tasks_of(tasks), [curve(1 * MS, 1 * MS)] * tasks, n_trials, tpr=16)
    assert sched.warmup_trials == warmup
    first = [n for _, n in runner.calls[:min(tasks, len(runner.calls))]]
    assert all(n == warmup for n in first[:n_trials // warmup])
    assert sched.total_trials == n_trials
    if n_trials >= tasks:
        assert all(t >= 1 for t in sched.task_trials)        # every task has a latency


def test_early_stopping_kills_a_flat_task():
    curves = [curve(1 * MS, 20 * MS), curve(3 * MS, 0), curve(1 * MS, 10 * MS)]
    sched, runner = run(tasks_of(3), curves, 400, early_stopping_task=24)
    assert 1 in sched.dead and sched.task_trials[1] <= 24 + 8
    assert all(i != 1 for i, _ in runner.calls[-20:])
    assert sched.total_trials == 400                         # the budget went to the others


def test_global_early_stopping():
    curves = [curve(1 * MS, 0), curve(2 * MS, 0), curve(3 * MS, 0)]
    sched, _ = run(tasks_of(3), curves, 1000, early_stopping_all=40)
    assert sched.stop_reason == "early stopping"
    assert sched.total_trials == 24 + 40                     # warm-up, then 40 trials of no progress


def test_exhausted_task_dies():
    curves = [curve(1 * MS, 30 * MS), curve(5 * MS, 30 * MS), curve(1 * MS, 1 * MS)]
    sched, runner = run(tasks_of(3), curves, 300, space={1: 10})
    assert sched.dead == {1} and sched.task_trials[1] == 10
    calls1 = [n for i, n in runner.calls if i == 1]
    assert len(calls1) == 3                                   # 8, then 2, then [] -> dead
    assert sched.total_trials == 300


def test_all_dead_stops():
    sched, _ = run(tasks_of(2), [curve(1 * MS, 1 * MS)] * 2, 1000, space={0: 5, 1: 12})
    assert sched.dead == {0, 1} and sched.total_trials == 17 and sched.stop_reason == "all tasks dead"


def test_resume_restores_counts_and_skips_warmup():
    curves = [curve(1 * MS, 10 * MS), curve(2 * MS, 5 * MS), curve(1 * MS, 1 * MS)]
    first, r1 = run(tasks_of(3), curves, 100)
    history = {i: list(r1.measured[i]) for i in range(3)}
    history[2] = history[2][:3]                               # task 2: too few trials to count as warm

    sched = TaskScheduler(tasks_of(3))
    r2 = Runner(curves)
    r2.measured = {i: list(history[i]) for i in range(3)}
    sched.tune(200, 8, r2, history=history)
    assert r2.calls[0][0] == 2                                # only task 2 is warmed up again
    assert sched.total_trials == 200
    assert sum(len(v) for v in history.values()) + sum(n for _, n in r2.calls) == 200
    for i in range(3):
        assert sched.task_trials[i] == len(r2.measured[i])
        assert sched.best_costs[i] == min(r2.measured[i])


def test_resume_state_before_any_new_round():
    history = {0: [5 * MS] * 16 + [3 * MS] * 4, 1: [math.inf, 2 * MS, 4 * MS]}
    seen = []
    sched = TaskScheduler(tasks_of(2), callbacks=[lambda s: seen.append(list(s.task_trials))])
    sched.tune(23, 8, lambda i, n: [], history=history)
    assert sched.best_costs == [3 * MS, 2 * MS]
    assert sched.task_rounds == [3, 1] and sched.best_history[0] == [5 * MS, 5 * MS, 3 * MS]
    assert sched.total_trials == 23 and seen == []            # budget already spent: nothing to do


def test_custom_objective_changes_allocation():
    curves = [curve(1 * MS, 5 * MS), curve(1 * MS, 5 * MS)]
    default, _ = run(tasks_of(2), curves, 200)
    assert abs(default.task_rounds[0] - default.task_rounds[1]) <= 1
    only_first, runner = run(tasks_of(2), curves, 200, objective=lambda c: c[0])
    assert only_first.task_rounds[1] == 1                     # warm-up only: it does not count
    assert only_first.objective_value() == only_first.best_costs[0]
    # a pipeline's latency is its slowest stage: each round goes to whichever is slower now
    bottleneck, _ = run(tasks_of(2), [curve(1 * MS, 40 * MS), curve(2 * MS, 1 * MS)], 200,
                        objective=max)
    log = bottleneck.round_log
    for prev, entry in zip(log[1:], log[2:]):
        assert entry["task"] == max((0, 1), key=lambda i: prev["best_costs"][i])
    assert 3 <= bottleneck.task_rounds[0] <= 8                 # until it beats task 1's 2 ms floor


@pytest.mark.parametrize("n_trials", [200, 480])
def test_gradient_beats_round_robin_on_mixed_tasks(n_trials):
    spec = [  # weight, floor a, reducible b, noise
        (6, 0.5 * MS, 20 * MS, 0.1), (1, 4 * MS, 1 * MS, 0.05), (3, 1 * MS, 8 * MS, 0.1),
        (1, 0.2 * MS, 0.4 * MS, 0.0), (2, 2 * MS, 0.0, 0.2), (4, 0.3 * MS, 30 * MS, 0.1),
        (1, 1 * MS, 2 * MS, 0.1), (2, 0.8 * MS, 6 * MS, 0.05)]
    tasks = [fake_task(desc=f"op{i} 1x{i}", weight=w, flops=1e8, key=str(i))
             for i, (w, *_) in enumerate(spec)]
    floor = sum(w * a for w, a, _, _ in spec)               # the objective no schedule goes below
    excess = {}
    for strategy in ("gradient", "round-robin"):
        curves = [curve(a, b, noise, seed=i) for i, (_, a, b, noise) in enumerate(spec)]
        sched, _ = run(tasks, curves, n_trials, strategy=strategy)
        assert sched.total_trials == n_trials
        excess[strategy] = sched.objective_value() - floor
    assert excess["gradient"] < 0.85 * excess["round-robin"]


def test_unmeasured_task_gets_priority():
    curves = [curve(1 * MS, 10 * MS), curve(1 * MS, 0, fail_first=8), curve(1 * MS, 10 * MS)]
    sched, runner = run(tasks_of(3), curves, 80, objective=lambda c: sum(c))
    assert runner.calls[3][0] == 1                            # first round after the warm-up
    assert math.isfinite(sched.objective_value())


def test_failed_measurements_are_inf_and_counted():
    sched, _ = run(tasks_of(1), [lambda t: float("nan") if t % 2 else 1 * MS], 10, tpr=5)
    assert sched.task_trials == [10] and sched.best_costs == [1 * MS]


def test_forward_gradient_uses_similar_tasks():
    sched = TaskScheduler([fake_task("conv2d a", flops=1e9), fake_task("conv2d b", flops=1e9),
                           fake_task("dense c", flops=1e9)])
    sched.best_costs = [1 * MS, 10 * MS, 10 * MS]
    sched.task_rounds = [10, 10, 10]
    # task 1 could be 5x faster than now (half its sibling's speed); task 2 has no sibling
    assert sched._forward_grad(1) == pytest.approx(2 * MS - 10 * MS)
    assert sched._forward_grad(2) == pytest.approx(-1 * MS)
    assert sched._forward_grad(0) == pytest.approx(-0.1 * MS)
    grouped = TaskScheduler(sched.tasks, similarity=[0, None, None])
    grouped.best_costs, grouped.task_rounds = sched.best_costs, sched.task_rounds
    assert grouped._forward_grad(1) == pytest.approx(-1 * MS)


def test_backward_gradient_and_chain_rule():
    sched = TaskScheduler(tasks_of(2, weight=3), backward_window_size=2)
    sched.best_history[0] = [9 * MS, 6 * MS, 5 * MS, 3 * MS]
    assert sched._backward_grad(0) == pytest.approx((3 - 6) * MS / 2)
    assert sched._backward_grad(1) == 0.0
    assert sched._dobj(0) == 3
    custom = TaskScheduler(tasks_of(2), objective=lambda c: 2 * c[0] + c[1] ** 2)
    custom.best_costs = [1 * MS, 4 * MS]
    assert custom._dobj(0) == pytest.approx(2, rel=1e-6)
    assert custom._dobj(1) == pytest.approx(8 * MS, rel=1e-2)


def test_dissimilar_task_leaves_its_group():
    curves = [curve(1 * MS, 0), curve(20 * MS, 1 * MS)]
    tasks = [fake_task("conv2d a", weight=1), fake_task("conv2d b", weight=5)]
    sched, _ = run(tasks, curves, 200)
    assert sched.groups[1] is None and sched.groups[0] == "conv2d"


def test_callbacks_and_round_log():
    out = io.StringIO()
    calls = []
    tasks = [fake_task("conv2d_bias_relu 1x3x224x224 k64 7x7 s2 p3", weight=1, flops=2.36e8)] + tasks_of(2)
    cb = PrintTableCallback(every=2, file=out)
    sched, runner = run(tasks, [curve(1 * MS, 1 * MS)] * 3, 40, warmup_share=1.0,
                        callbacks=[cb, lambda s: calls.append(s.total_trials)])
    assert calls == [8, 16, 24, 32, 40]
    log = sched.round_log
    assert [e["round"] for e in log] == list(range(5)) and [e["trials"] for e in log] == [8] * 5
    assert set(log[0]) == {"round", "task", "trials", "best_costs", "objective", "time"}
    assert log[-1]["objective"] == pytest.approx(sched.objective_value())
    text = out.getvalue()
    assert text.count("Estimated total latency") == 2        # rounds 2 and 4
    assert "|  ID | Task" in text and "Speed (GFLOP/s)" in text and "Trials: 32" in text
    last = cb.format(sched)
    assert "conv2d_bias_relu 1x3x224x224 k64 7x7 s2 p3" in last


def test_bad_arguments():
    with pytest.raises(ValueError):
        TaskScheduler([])
    with pytest.raises(ValueError):
        TaskScheduler(tasks_of(1), strategy="random")
    with pytest.raises(ValueError):
        TaskScheduler(tasks_of(2), similarity=[0])
    with pytest.raises(ValueError):
        TaskScheduler(tasks_of(1)).tune(10, 5, lambda i, n: [], history={3: [1.0]})


def test_a_workloads_slower_algorithm_gets_no_rounds():
    """Two tasks of one workload (direct and Winograd, say): compile keeps the faster, so the
    objective counts only it and the slower algorithm is not tuned after the warm-up."""
    from modelc.tune.tuning import best_of_alternatives
    tasks = [fake_task("conv 1x64", key="a"), fake_task("conv 1x64 [winograd]", key="a"),
             fake_task("dense 1x512", key="b")]
    objective = best_of_alternatives(tasks)
    assert objective([3.0, 1.0, 2.0]) == 3.0 and best_of_alternatives(tasks[1:]) is None
    curves = [curve(4 * MS, 20 * MS), curve(1 * MS, 5 * MS), curve(1 * MS, 5 * MS)]
    sched, _ = run(tasks, curves, 200, objective=objective)
    assert sched.task_rounds[0] == 1                          # warm-up only
    assert sched.task_rounds[1] > 5 and sched.task_rounds[2] > 5
    assert sched.objective_value() == pytest.approx(sched.best_costs[1] + sched.best_costs[2])


def test_similar_tasks_are_split_by_algorithm():
    from modelc.tune.tuning import similarity_groups
    tasks = [Task("", "conv2d_bias_relu 1x64", "conv2d", {}),
             Task("", "conv2d_bias_relu 1x64 [winograd]", "conv2d_winograd", {}),
             Task("", "conv2d_bias_relu 1x3", "conv2d", {})]
    groups = similarity_groups(tasks)
    assert groups[0] == groups[2] != groups[1]
