"""Ansor's gradient-based task scheduler: which task gets the next round of measurements.

A model has many tuning tasks but one trial budget. Tuning a task that is already fast, or that
appears once, buys little end-to-end latency; the scheduler spends each round where the estimated
decrease of the objective (default: sum of weight x best latency) is steepest (Ansor, OSDI'20, sec. 6):

    grad_i = d(objective)/d(best_i) * (alpha * backward_i + (1 - alpha) * forward_i)

- backward_i: the task's own recent progress, (best now - best `window` rounds ago) / window;
- forward_i: an optimistic guess of the next round, min(-best_i / rounds_i,
  beta * flops_i / (best FLOP/s of a similar task) - best_i): latency keeps falling like 1/t, or
  the task can reach 1/beta of the speed its fastest sibling (same op pattern) already reached.

The scheduler does not measure anything itself: `tune_round(task_index, n)` does (the lead's code
wires search, measurement and records into it), so it can be tested on synthetic cost curves.
"""
from __future__ import annotations

import math
import random
import sys
import time

INF = float("inf")
STRATEGIES = ("gradient", "round-robin")
# The gradient strategy's warm-up spends at most this share of the budget: a round per task at
# a fixed size took 288 of ResNet-18's 300 trials (32 tasks x 9), leaving the scheduler nothing to
# choose with. One trial (the default config) already gives a task the latency its gradient needs.
WARMUP_SHARE = 0.25


def _finite(x: float) -> bool:
    return not (math.isinf(x) or math.isnan(x))


def _latency(x) -> float:
    """A measured latency; NaN or None (a broken measurement) counts as a failure (inf)."""
    try:
        x = float(x)
    except (TypeError, ValueError):
        return INF
    return x if _finite(x) and x >= 0 else INF


class TaskScheduler:
    """Allocates a trial budget across tasks, one round of `trials_per_round` trials at a time.

    tasks: `extract.Task`s; the scheduler reads .weight (occurrences), .flops (per occurrence), .desc.
    strategy: "gradient" (Ansor) or "round-robin" (baseline).
    objective: callable(best_costs) -> float to minimise; default sum(weight_i * best_i).
    similarity: a group id per task (None: no group); tasks of one group bound each other's
        forward estimate by FLOP/s. Default: the first word of .desc (the fused op pattern).
    early_stopping_task: a task whose best has not improved for this many of its trials is dead.
    early_stopping_all: stop when the objective has not improved for this many trials.
    callbacks: each called as cb(scheduler) after every round.
    seed: for the one random choice, when every live task has the same gradient.
    """

    def __init__(self, tasks, strategy="gradient", objective=None, alpha=0.2, beta=2.0,
                 backward_window_size=3, early_stopping_task=None, early_stopping_all=None,
                 similarity=None, callbacks=(), seed=0, warmup_share=WARMUP_SHARE):
        self.tasks = list(tasks)
        if not self.tasks:
            raise ValueError("TaskScheduler needs at least one task")
        if strategy not in STRATEGIES:
            raise ValueError(f"unknown scheduling strategy {strategy!r}; expected one of {STRATEGIES}")
        self.strategy = strategy
        self.weights = [float(t.weight) for t in self.tasks]
        self.flops = [float(t.flops or 0.0) for t in self.tasks]
        self.custom_objective = objective is not None
        self.objective = objective if objective is not None else self._weighted_sum
        self.alpha, self.beta = float(alpha), float(beta)
        self.backward_window_size = int(backward_window_size)
        self.early_stopping_task = early_stopping_task
        self.early_stopping_all = early_stopping_all
        self.callbacks = list(callbacks)
        self.warmup_share = float(warmup_share)
        self.warmup_trials = None        # per task, as used
        self._rng = random.Random(seed)
        self._init_groups(similarity)

        n = len(self.tasks)
        self.best_costs: list[float] = [INF] * n
        self.task_trials: list[int] = [0] * n
        self.task_rounds: list[int] = [0] * n
        self.best_history: list[list[float]] = [[] for _ in range(n)]  # best after each own round
        self.dead: set[int] = set()
        self.total_trials = 0
        self.round_log: list[dict] = []
        self.trials_per_round = None     # as used (capped so the warm-up reaches every task)
        self.n_trials = None
        self.start_time = None
        self.stop_reason = None          # "budget", "all tasks dead" or "early stopping"
        self._improved_at = [0] * n      # the task's own trial count at its last improvement
        self._rr = -1                    # round-robin position
        self._best_objective = INF
        self._progress_at = 0            # total_trials at the last objective improvement

    # ---- objective -------------------------------------------------------------------------
    def _weighted_sum(self, costs) -> float:
        return sum(w * c for w, c in zip(self.weights, costs))

    def objective_value(self) -> float:
        """The objective at the current best latencies (inf while some task has none)."""
        return float(self.objective(list(self.best_costs)))

    def _dobj(self, i: int) -> float:
        """d(objective)/d(best_i): the weight, or a finite difference for a custom objective.

        Tasks without a valid latency count as 0 here, so one failed task does not turn every
        derivative into inf - inf.
        """
        if not self.custom_objective:
            return self.weights[i]
        costs = [c if _finite(c) else 0.0 for c in self.best_costs]
        h = max(abs(costs[i]) * 1e-3, 1e-12)   # relative: latencies are in seconds, often ~1e-5
        f0 = self.objective(list(costs))
        costs[i] -= h
        return (f0 - self.objective(costs)) / h

    # ---- similarity groups -----------------------------------------------------------------
    def _init_groups(self, similarity):
        if similarity is None:
            similarity = [(t.desc.split() or [None])[0] if t.desc else None for t in self.tasks]
        if len(similarity) != len(self.tasks):
            raise ValueError(f"similarity has {len(similarity)} entries for {len(self.tasks)} tasks")
        self.groups = list(similarity)
        self._members: dict = {}
        for i, g in enumerate(self.groups):
            if g is not None:
                self._members.setdefault(g, []).append(i)

    def _group_speed(self, i: int):
        """Best FLOP/s reached in task i's group (None: no group, or nothing measured there)."""
        members = self._members.get(self.groups[i], [])
        if len(members) < 2:
            return None
        speeds = [self.flops[j] / self.best_costs[j] for j in members
                  if self.flops[j] > 0 and _finite(self.best_costs[j]) and self.best_costs[j] > 0]
        return max(speeds) if speeds else None

    def _adjust_group(self, i: int):
        """Drop task i from its group once it has had many more rounds than its siblings and is
        still far below their speed: it is not similar after all (as in Ansor)."""
        g = self.groups[i]
        best_speed = self._group_speed(i)
        if best_speed is None or not _finite(self.best_costs[i]) or self.flops[i] <= 0:
            return
        others = [j for j in self._members[g] if j != i]
        speed = self.flops[i] / self.best_costs[i]
        if speed < best_speed / self.beta and \
                self.task_rounds[i] > 5 + max(self.task_rounds[j] for j in others):
            self._members[g].remove(i)
            self.groups[i] = None

    # ---- gradients -------------------------------------------------------------------------
    def _backward_grad(self, i: int) -> float:
        """Recent slope of task i's best latency per round (<= 0); 0 without enough history."""
        h, w = self.best_history[i], self.backward_window_size
        if w <= 0 or len(h) <= w or not (_finite(h[-1]) and _finite(h[-1 - w])):
            return 0.0
        return (h[-1] - h[-1 - w]) / w

    def _forward_grad(self, i: int) -> float:
        """Optimistic decrease of task i's best latency in its next round (<= 0).

        Per round, like the backward gradient and Ansor's task counts: if latency falls like
        1/rounds, the next round gains best/rounds.
        """
        best = self.best_costs[i]
        grad = -best / max(1, self.task_rounds[i])
        speed = self._group_speed(i)
        if speed is not None and self.flops[i] > 0:
            grad = min(grad, self.beta * self.flops[i] / speed - best)
        return grad

    def gradient(self, i: int) -> float:
        """Estimated change of the objective from one more round of task i (negative: better)."""
        return self._dobj(i) * (self.alpha * self._backward_grad(i)
                                + (1 - self.alpha) * self._forward_grad(i))

    # ---- choosing the next task ------------------------------------------------------------
    def _live(self) -> list[int]:
        return [i for i in range(len(self.tasks)) if i not in self.dead]

    def _next_round_robin(self) -> int:
        n = len(self.tasks)
        for step in range(1, n + 1):
            i = (self._rr + step) % n
            if i not in self.dead:
                self._rr = i
                return i
        raise RuntimeError("no live task")

    def _next_gradient(self) -> int:
        live = self._live()
        unmeasured = [i for i in live if not _finite(self.best_costs[i])]
        if unmeasured:                   # no valid latency yet: nothing to estimate, tune it first
            return min(unmeasured, key=lambda i: (self.task_rounds[i], i))
        grads = {i: self.gradient(i) for i in live}
        if len(set(grads.values())) == 1 and len(live) > 1:
            return self._rng.choice(live)   # no information (e.g. a flat custom objective)
        return min(live, key=lambda i: (grads[i], i))

    def next_task(self) -> int:
        """The task the strategy would tune next."""
        return self._next_gradient() if self.strategy == "gradient" else self._next_round_robin()

    # ---- bookkeeping -----------------------------------------------------------------------
    def _record(self, i: int, latencies) -> bool:
        """Count measurements of task i; True if its best improved."""
        improved = False
        for x in latencies:
            self.task_trials[i] += 1
            self.total_trials += 1
            if x < self.best_costs[i]:
                self.best_costs[i] = x
                self._improved_at[i] = self.task_trials[i]
                improved = True
        return improved

    def _restore(self, history: dict):
        """Replay earlier runs: trial counts, best latencies and per-round best history, with the
        rounds cut at `trials_per_round` (a guess when the earlier run used another round size)."""
        tpr = self.trials_per_round
        for key, lats in history.items():
            i = int(key)
            if not 0 <= i < len(self.tasks):
                raise ValueError(f"history names task {key!r}, but there are {len(self.tasks)} tasks")
            lats = [_latency(x) for x in lats]
            if not lats:
                continue
            self._record(i, lats)
            rounds = max(1, int(len(lats) / tpr + 0.5))
            prefix_best = []
            best = self.best_history[i][-1] if self.best_history[i] else INF
            for r in range(rounds):
                chunk = lats[r * tpr:(r + 1) * tpr] if r < rounds - 1 else lats[r * tpr:]
                best = min([best] + chunk)
                prefix_best.append(best)
            self.best_history[i].extend(prefix_best)
            self.task_rounds[i] += rounds
            self._check_task_stop(i)

    def _check_task_stop(self, i: int):
        es = self.early_stopping_task
        if es is not None and self.task_trials[i] - self._improved_at[i] >= es:
            self.dead.add(i)

    def _note_progress(self, improved: bool):
        """Global early stopping counts trials since the objective last fell. While it is inf
        (a task without a valid latency), any task's improvement counts as progress."""
        obj = self.objective_value()
        if obj < self._best_objective or (improved and not _finite(obj)):
            self._best_objective = min(obj, self._best_objective)
            self._progress_at = self.total_trials

    def _run_round(self, i: int, tune_round, size: int | None = None):
        n = min(size or self.trials_per_round, self.n_trials - self.total_trials)
        lats = [_latency(x) for x in tune_round(i, n)]
        if not lats:                     # the task's space is exhausted
            self.dead.add(i)
        else:
            improved = self._record(i, lats)
            self.task_rounds[i] += 1
            self.best_history[i].append(self.best_costs[i])
            self._adjust_group(i)
            self._check_task_stop(i)
            self._note_progress(improved)
        self.round_log.append({
            "round": len(self.round_log), "task": i, "trials": len(lats),
            "best_costs": list(self.best_costs), "objective": self.objective_value(),
            "time": time.perf_counter() - self.start_time})
        for cb in self.callbacks:
            cb(self)

    def _should_stop(self) -> bool:
        if self.total_trials >= self.n_trials:
            self.stop_reason = "budget"
        elif len(self.dead) == len(self.tasks):
            self.stop_reason = "all tasks dead"
        return self.stop_reason is not None

    def _early_stop_all(self) -> bool:
        es = self.early_stopping_all
        if es is not None and self.total_trials - self._progress_at >= es:
            self.stop_reason = "early stopping"
        return self.stop_reason is not None

    # ---- the loop --------------------------------------------------------------------------
    def tune(self, n_trials: int, trials_per_round: int, tune_round, history: dict | None = None,
             prepare=None):
        """Spend the budget: a round-robin warm-up, then one round at a time to the chosen task.

        n_trials is the total budget, trials from `history` included, so a resumed run stops
        where the first one would have. trials_per_round is capped at n_trials // len(tasks)
        (as Ansor does) so that the warm-up reaches every task; the gradient strategy's warm-up
        rounds are smaller still, `warmup_share` of the budget over the tasks (at least one
        trial each), so that a small budget is not spent before the scheduler chooses.
        tune_round(i, n) measures up to n new candidates of task i and returns their latencies
        in seconds (inf for failures); [] means the task's space is exhausted.
        history: {task_index: [earlier latencies]}.
        prepare([(task_index, n), ...]), if given, hears all the warm-up rounds before the first
        runs: their candidates can then be compiled together, with every builder busy (one
        candidate per round left all but one idle for the first quarter of a run).
        """
        if trials_per_round < 1:
            raise ValueError(f"trials_per_round must be >= 1, got {trials_per_round}")
        self.n_trials = int(n_trials)
        self.trials_per_round = max(1, min(int(trials_per_round), self.n_trials // len(self.tasks)))
        self.warmup_trials = self.trials_per_round if self.strategy == "round-robin" else \
            max(1, min(self.trials_per_round, int(self.warmup_share * self.n_trials / len(self.tasks))))
        self.stop_reason = None
        self.start_time = time.perf_counter()
        if history:
            self._restore(history)

        warmup, budget = [], self.n_trials - self.total_trials
        for i in range(len(self.tasks)):     # warm-up: one round each, unless tuned before
            n = min(self.warmup_trials - self.task_trials[i], budget)
            if i not in self.dead and n > 0:
                warmup.append((i, n))
                budget -= n
        if prepare is not None and warmup:
            prepare(warmup)
        for i, n in warmup:
            if self._should_stop():
                return
            self._run_round(i, tune_round, n)
        self._best_objective = self.objective_value()
        self._progress_at = self.total_trials

        while not self._should_stop():
            self._run_round(self.next_task(), tune_round)
            if self._early_stop_all():
                return


class PrintTableCallback:
    """Prints Ansor's progress table every `every` rounds: per task its best latency, speed and
    trials (a * after the ID: the task is dead), then the estimated total latency (the objective),
    trials so far and time used."""

    def __init__(self, every: int = 1, file=None, desc_width: int = 60):
        self.every = max(1, int(every))
        self.file = file
        self.desc_width = desc_width

    def __call__(self, sched: TaskScheduler):
        if len(sched.round_log) % self.every:
            return
        print(self.format(sched), file=self.file or sys.stdout, flush=True)

    def format(self, sched: TaskScheduler) -> str:
        w = max(4, min(self.desc_width, max(len(t.desc) for t in sched.tasks)))
        head = (f"| {'ID':>3} | {'Task':<{w}} | {'Latency (ms)':>12} | {'Speed (GFLOP/s)':>15} "
                f"| {'Trials':>6} |")
        rule = "-" * len(head)
        lines = [rule, head, rule]
        for i, t in enumerate(sched.tasks):
            best = sched.best_costs[i]
            ok = _finite(best) and best > 0
            lat = f"{best * 1e3:.3f}" if ok else "-"
            speed = f"{sched.flops[i] / best / 1e9:.2f}" if ok and sched.flops[i] > 0 else "-"
            desc = t.desc if len(t.desc) <= w else t.desc[:w - 3] + "..."
            mark = "*" if i in sched.dead else " "
            lines.append(f"| {i:>3}{mark}| {desc:<{w}} | {lat:>12} | {speed:>15} | "
                         f"{sched.task_trials[i]:>6} |")
        lines.append(rule)
        obj = sched.objective_value()
        total = f"{obj * 1e3:.3f}" if _finite(obj) else "-"
        used = sched.round_log[-1]["time"] if sched.round_log else 0.0
        lines.append(f"Estimated total latency: {total} ms | Trials: {sched.total_trials} | "
                     f"Used time: {used:.0f} s")
        return "\n".join(lines)
