"""Search over one task's config space: random, grid, genetic and XGBoost-guided, as in AutoTVM.

The loop a caller runs (one tuner per task):

    tuner = TUNERS["xgb"](task, seed=0)      # task: .key .flops .template .wl .space (see task_parts)
    tuner.load_history(records)               # optional warm start: (task_like, values, cost)
    while tuner.has_next() and budget:
        configs = tuner.next_batch(8)         # never a config measured or still pending
        tuner.update(configs, latencies)      # seconds, inf for any error

Configs are handled internally as their space index (and as "digits": the candidate index of
each knob). Spaces up to `enum_limit` configs are enumerated once (valid ones only); larger
spaces are only ever sampled, so a 10^9-config space costs no more than a small one.
"""
from __future__ import annotations

import math

import numpy as np

from ..errors import ModelcError
from .cost_model import XGBCostModel
from .features import Featurizer

ENUM_LIMIT = 20000


def _get(obj, name, default=None):
    """An attribute of a task-like object, or a key of a dict-like one."""
    if isinstance(obj, dict):
        return obj.get(name, default)
    return getattr(obj, name, default)


def _cost_value(cost) -> float:
    """One latency from a cost (a number, a list of repeats, None for an error)."""
    if cost is None:
        return math.inf
    if isinstance(cost, (list, tuple, np.ndarray)):
        vals = [float(c) for c in cost if c is not None]
        return float(np.mean(vals)) if vals else math.inf
    c = float(cost)
    return c if math.isfinite(c) and c > 0 else math.inf


class Tuner:
    """Bookkeeping shared by the tuners; subclasses implement `_propose(n)` -> space indices."""

    def __init__(self, task, seed: int = 0, enum_limit: int = ENUM_LIMIT):
        self.task = task
        self.template, self.wl, self.space = task_parts(task)
        self.seed = seed
        self.rng = np.random.default_rng(seed)
        self.flops = float(_get(task, "flops", 0) or 0)
        self.radix = [len(k.values) for k in self.space.knobs]
        self.size = len(self.space)
        self.small = self.size <= enum_limit
        # mixed-radix place values, as int64 while indices fit (else Python ints)
        self._mults = np.array([math.prod(self.radix[:j]) for j in range(len(self.radix))],
                               dtype=np.int64 if self.size < 2 ** 62 else object)
        self.measured: dict[int, float] = {}        # index -> latency (inf: failed)
        self.pending: set[int] = set()
        self._preferred: list[int] = []        # handed out first, see prefer()
        self.best_cost, self.best_config = math.inf, None
        self._valid_cache: dict[int, bool] = {}
        self._valid: np.ndarray | None = None         # small spaces: all valid indices, sorted
        self._left: int | None = None                 # small spaces: valid and not visited
        self._dry = False                             # large spaces: sampling found nothing left

    # ---- indices, digits, validity ----------------------------------------------------------
    def digits(self, index: int) -> tuple:
        out, rest = [], int(index)
        for r in self.radix:
            rest, d = divmod(rest, r)
            out.append(d)
        return tuple(out)

    def index(self, digits) -> int:
        idx, mult = 0, 1
        for d, r in zip(digits, self.radix):
            idx += int(d) * mult
            mult *= r
        return idx

    def indices(self, digits: np.ndarray) -> list:
        """`index` of each row of a (configs x knobs) digit array, as Python ints."""
        return (np.asarray(digits).reshape(len(digits), len(self.radix)) @ self._mults).tolist()

    def is_valid(self, index: int) -> bool:
        v = self._valid_cache.get(index)
        if v is None:
            v = self._valid_cache[index] = self.space.is_valid(self.space.get(index))
        return v

    def valid_indices(self) -> np.ndarray:
        """Every valid index, in order (small spaces only)."""
        if self._valid is None:
            if not self.small:
                raise ModelcError(f"space of {self.size} configs is too large to enumerate")
            self._valid = np.array([i for i in range(self.size) if self.is_valid(i)], dtype=np.int64)
            self._left = sum(1 for i in self._valid.tolist() if not self.visited(i))
        return self._valid

    def visited(self, index: int) -> bool:
        return index in self.measured or index in self.pending

    def _mark(self, index: int, pending: bool):
        """Move an index to pending or measured, keeping the count of valid configs left."""
        was = self.visited(index)
        if pending:
            self.pending.add(index)
        else:
            self.pending.discard(index)
        if not was and self._left is not None and self.is_valid(index):
            self._left -= 1

    # ---- the interface ----------------------------------------------------------------------
    def has_next(self) -> bool:
        """Whether a valid config is left that was neither measured nor handed out."""
        if self.small:
            self.valid_indices()
            return self._left > 0
        return not self._dry and len(self.measured) + len(self.pending) < self.size

    def prefer(self, configs) -> None:
        """Configs to hand out first (the template's default: a tuned task is never worse than
        its untuned kernel just because a few random picks missed it)."""
        self._preferred += [c.index for c in configs]

    def next_batch(self, n: int) -> list:
        """Up to n valid configs, none measured or pending (fewer only near exhaustion)."""
        out = []
        preferred, self._preferred = self._preferred, []
        for idx in preferred + [int(i) for i in self._propose(n)]:
            idx = int(idx)
            if len(out) >= n or self.visited(idx) or not self.is_valid(idx):
                continue
            self._mark(idx, pending=True)
            out.append(self.space.get(idx))
        if len(out) < n:                       # a strategy that ran dry: top up at random
            for idx in self._random_unvisited(n - len(out)):
                self._mark(idx, pending=True)
                out.append(self.space.get(idx))
        if n > 0 and not out and not self.small:
            self._dry = True                   # nothing valid left that sampling can find
        return out

    def update(self, configs, costs) -> None:
        """Results of measured configs: latency in seconds, inf (or None) for any error."""
        for cfg, cost in zip(configs, costs):
            idx = cfg.index if hasattr(cfg, "index") else int(cfg)
            self._record(idx, _cost_value(cost))
        self._on_update()

    def load_history(self, records) -> int:
        """Warm start from log records `(task_like, config_values, cost)`; returns how many were
        used. This task's records (same key) count as measured; the base class ignores others."""
        used = 0
        key = _get(self.task, "key")
        for task_like, values, cost in records:
            if _get(task_like, "key") == key:
                try:
                    idx = self.space.from_values(values).index
                except (ModelcError, KeyError, TypeError, AttributeError):
                    continue
                if idx in self.measured and self.measured[idx] <= _cost_value(cost):
                    continue
                self._record(idx, _cost_value(cost))
                used += 1
            elif self._on_foreign(task_like, values, _cost_value(cost)):
                used += 1
        self._on_update()
        return used

    # ---- helpers for subclasses --------------------------------------------------------------
    def throughput(self, cost: float) -> float:
        """FLOP/s of a latency (1/latency without FLOPs); 0 for a failure."""
        if not math.isfinite(cost) or cost <= 0:
            return 0.0
        return (self.flops or 1.0) / cost

    def _record(self, idx: int, cost: float):
        if not self.visited(idx):
            self._mark(idx, pending=False)
        self.pending.discard(idx)
        self.measured[idx] = min(cost, self.measured.get(idx, math.inf))
        if cost < self.best_cost:
            self.best_cost, self.best_config = cost, self.space.get(idx)

    def _random_unvisited(self, n: int) -> list:
        """n distinct valid unvisited indices chosen at random (fewer if the space runs out)."""
        if n <= 0:
            return []
        if self.small:
            cand = [i for i in self.valid_indices().tolist() if not self.visited(i)]
            if not cand:
                return []
            pick = self.rng.choice(len(cand), size=min(n, len(cand)), replace=False)
            return [cand[i] for i in pick]
        out, seen = [], set()
        for _ in range(200 * n + 1000):
            idx = self.index([self.rng.integers(r) for r in self.radix])
            if idx in seen or self.visited(idx):
                continue
            seen.add(idx)
            if self.is_valid(idx):
                out.append(idx)
                if len(out) == n:
                    break
        return out

    def _propose(self, n: int) -> list:
        raise NotImplementedError

    def _on_update(self):
        pass

    def _on_foreign(self, task_like, values, cost) -> bool:
        return False


class RandomTuner(Tuner):
    """Uniform sampling without replacement: the baseline every other tuner must beat."""

    def _propose(self, n):
        return self._random_unvisited(n)


class GridSearchTuner(Tuner):
    """Every valid config in index order (the first knob varies fastest)."""

    def __init__(self, task, seed: int = 0, **kw):
        super().__init__(task, seed, **kw)
        self._cursor = 0

    def _propose(self, n):
        out = []
        while len(out) < n and self._cursor < self.size:
            idx = self._cursor
            self._cursor += 1
            if not self.visited(idx) and self.is_valid(idx):
                out.append(idx)
        return out


class GATuner(Tuner):
    """A genetic algorithm over knob digits, as AutoTVM's GATuner.

    The first generation is random; each next one breeds from the best `pop_size` configs measured
    so far: `elite` children mutate the very best configs (local search), the others cross two
    parents picked in proportion to their throughput (uniform crossover), and every knob of a
    child mutates to a random candidate with probability `mutation_prob`.
    """

    def __init__(self, task, seed: int = 0, pop_size: int = 16, elite: int = 2,
                 mutation_prob: float = 0.1, **kw):
        super().__init__(task, seed, **kw)
        self.pop_size, self.elite, self.mutation_prob = pop_size, elite, mutation_prob
        self._queue: list = []

    def _propose(self, n):
        out = []
        while len(out) < n:
            while self._queue and len(out) < n:
                idx = self._queue.pop(0)
                if not self.visited(idx):
                    out.append(idx)
            if len(out) >= n:
                break
            scored = [(self.throughput(c), i) for i, c in self.measured.items()]
            if sum(1 for s, _ in scored if s > 0) < max(2, self.pop_size // 2):
                out += [i for i in self._random_unvisited(n - len(out)) if i not in out]
                break
            self._queue = self._breed(sorted(scored, reverse=True)[:self.pop_size], exclude=set(out))
            if not self._queue:
                break
        return out

    def _mutate(self, digits: list) -> list:
        for j, r in enumerate(self.radix):
            if r > 1 and self.rng.random() < self.mutation_prob:
                digits[j] = int(self.rng.integers(r))
        return digits

    def _breed(self, parents, exclude) -> list:
        genes = [list(self.digits(i)) for _, i in parents]
        fit = np.array([s for s, _ in parents], dtype=np.float64)
        prob = fit + 1e-6 * fit.max()
        prob /= prob.sum()
        children, seen = [], set(exclude)
        for _ in range(self.pop_size * 30):
            if len(children) >= self.pop_size:
                break
            if len(children) < self.elite:
                child = list(genes[len(children) % len(genes)])
                j = int(self.rng.integers(len(self.radix)))          # an elite moves one knob
                child[j] = int(self.rng.integers(self.radix[j]))
                child = self._mutate(child)
            else:
                a, b = self.rng.choice(len(genes), size=2, p=prob)
                mask = self.rng.random(len(self.radix)) < 0.5
                child = self._mutate([ga if m else gb for ga, gb, m in zip(genes[a], genes[b], mask)])
            idx = self.index(child)
            if idx in seen or self.visited(idx) or not self.is_valid(idx):
                continue
            seen.add(idx)
            children.append(idx)
        return children


class XGBTuner(Tuner):
    """AutoTVM's model-based tuner: an XGBoost cost model ranks configs, search plans the next.

    Until `min_train` valid measurements exist (this task's plus warm-start records of tasks of
    the same template) it samples at random. Then it trains the model and plans the `plan_size`
    configs with the best predictions (all valid configs scored in a small space; simulated
    annealing over the predictions in a large one: `sa_points` walkers, `sa_iters` steps, each
    moving one knob to a neighbouring or random candidate). Batches come from the plan with about
    `epsilon` random picks; the model retrains when the data has grown by `retrain_growth`x (or by
    `plan_size` points), and the plan is redone when used up. Warm-start rows (at most
    `max_history`) form one ranking group per task; this task's group weighs `own_weight` times
    more, so its own measurements soon dominate what transferred.
    """

    def __init__(self, task, seed: int = 0, loss: str = "rank", plan_size: int = 64,
                 epsilon: float = 0.05, sa_iters: int = 40, retrain_growth: float = 1.2,
                 sa_points: int = 64, min_train: int = 8, num_boost_round: int = 60,
                 max_history: int = 2000, own_weight: float = 4.0, **kw):
        super().__init__(task, seed, **kw)
        self.plan_size, self.epsilon, self.sa_iters = plan_size, epsilon, sa_iters
        self.retrain_growth, self.sa_points, self.min_train = retrain_growth, sa_points, min_train
        self.max_history, self.own_weight = max_history, own_weight
        self.model = XGBCostModel(loss=loss, seed=seed, num_boost_round=num_boost_round)
        self.template_name = _template_name(self.template)
        self.feat = Featurizer(self.template, self.wl, self.space, self.flops or None)
        self._foreign_X: list = []             # warm-start rows of other tasks
        self._foreign_y: list = []
        self._foreign_g: list = []
        self._foreign_tasks: dict = {}         # key -> Featurizer (None: unusable)
        self._trained_on = 0
        self._plan: list = []
        self._space_X: np.ndarray | None = None
        self._walkers: np.ndarray | None = None
        self.n_train = 0                       # how often the model was trained

    # ---- warm start ---------------------------------------------------------------------------
    def _foreign_featurizer(self, task_like):
        key = _get(task_like, "key")
        if key not in self._foreign_tasks:
            self._foreign_tasks[key] = _resolve(task_like, self.template_name)
        return self._foreign_tasks[key]

    def _on_foreign(self, task_like, values, cost) -> bool:
        feat = self._foreign_featurizer(task_like)
        if feat is None:
            return False
        try:
            digits = [k.values.index(list(values[k.name]) if isinstance(values[k.name], tuple)
                                     else values[k.name]) for k in feat.space.knobs]
        except (KeyError, ValueError, TypeError):
            return False
        flops = feat.flops or 1.0
        self._foreign_X.append(feat.rows([digits])[0])
        self._foreign_y.append(flops / cost if math.isfinite(cost) and cost > 0 else 0.0)
        self._foreign_g.append(str(_get(task_like, "key")))
        return True

    # ---- training -------------------------------------------------------------------------------
    def _own_data(self):
        idx = list(self.measured)
        X = self.feat.rows([self.digits(i) for i in idx]) if idx else None
        y = [self.throughput(self.measured[i]) for i in idx]
        return X, y

    def _n_valid(self) -> int:
        return sum(1 for c in self.measured.values() if math.isfinite(c)) + \
            sum(1 for y in self._foreign_y if y > 0)

    def _maybe_train(self) -> bool:
        """Train once there is enough data; retrain when this task's own data grew enough."""
        n = len(self.measured)
        if self._n_valid() < self.min_train:
            return False
        if self.model.trained and (n <= self._trained_on or (
                n < self._trained_on * self.retrain_growth and n - self._trained_on < self.plan_size)):
            return False
        X, y = self._own_data()
        groups = ["\0own"] * len(y)
        Xs = [X] if X is not None else []
        fX, fy, fg = self._foreign_X, self._foreign_y, self._foreign_g
        if len(fy) > self.max_history:
            keep = np.random.default_rng(self.seed).choice(len(fy), self.max_history, replace=False)
            fX, fy, fg = [fX[i] for i in keep], [fy[i] for i in keep], [fg[i] for i in keep]
        if fy:
            Xs.append(np.stack(fX))
        weights = [self.own_weight] * len(y) + [1.0] * len(fy)
        self.model.fit(np.concatenate(Xs), np.asarray(y + list(fy)), groups + list(fg), weights)
        self._trained_on = n
        self.n_train += 1
        self._plan = []
        return True

    # ---- planning -------------------------------------------------------------------------------
    def _plan_small(self) -> list:
        valid = self.valid_indices()
        if self._space_X is None:
            self._space_X = self.feat.rows([self.digits(i) for i in valid.tolist()])
        scores = self.model.predict(self._space_X)
        free = np.array([not self.visited(i) for i in valid.tolist()], dtype=bool)
        order = np.argsort(-scores[free], kind="stable")[:self.plan_size]
        return valid[free][order].tolist()

    def _neighbours(self, walkers: np.ndarray) -> np.ndarray:
        """Each walker moves one knob: to an adjacent candidate, or half the time to any."""
        n = len(walkers)
        movable = np.array([j for j, r in enumerate(self.radix) if r > 1])
        radix = np.array(self.radix)
        j = movable[self.rng.integers(len(movable), size=n)]
        rows = np.arange(n)
        step = walkers[rows, j] + self.rng.choice([-1, 1], size=n)
        far = (self.rng.random(n) * radix[j]).astype(np.int64)
        new = walkers.copy()
        new[rows, j] = np.where(self.rng.random(n) < 0.5, np.clip(step, 0, radix[j] - 1), far)
        return new

    def _plan_sa(self) -> list:
        """Simulated annealing over model scores; the best unvisited valid configs seen."""
        if not any(r > 1 for r in self.radix):
            return []
        if self._walkers is None:
            starts = self._random_unvisited(self.sa_points) or [0]
            best = sorted(self.measured, key=self.measured.get)[: self.sa_points // 4]
            self._walkers = np.array([self.digits(i) for i in starts + best], dtype=np.int64)
        walkers = self._walkers
        scores = self.model.predict(self.feat.rows(walkers))
        scale = float(np.std(scores)) + 1e-9
        top: dict[int, float] = {}

        def consider(ws, ss):
            for idx, s in zip(self.indices(ws), ss):
                if idx not in top and not self.visited(idx) and self.is_valid(idx):
                    top[idx] = float(s)

        consider(walkers, scores)
        for it in range(self.sa_iters):
            temp = 1.0 - it / max(self.sa_iters, 1)
            cand = self._neighbours(walkers)
            ok = np.array([self.is_valid(i) for i in self.indices(cand)], dtype=bool)
            cs = np.full(len(cand), -np.inf)
            if ok.any():
                cs[ok] = self.model.predict(self.feat.rows(cand[ok]))
            gain = (cs - scores) / scale
            accept = ok & ((gain > 0) | (self.rng.random(len(cand)) <
                                         np.exp(np.minimum(gain, 0) / (temp + 1e-5))))
            walkers[accept], scores[accept] = cand[accept], cs[accept]
            consider(cand[ok], cs[ok])
        self._walkers = walkers
        return [i for i, _ in sorted(top.items(), key=lambda kv: -kv[1])][:self.plan_size]

    def _replan(self):
        self._plan = self._plan_small() if self.small else self._plan_sa()

    # ---- proposing ------------------------------------------------------------------------------
    def _propose(self, n):
        self._maybe_train()
        if not self.model.trained:
            return self._random_unvisited(n)
        out, taken = [], set()
        replanned = False
        while len(out) < n:
            if self.rng.random() < self.epsilon:
                pick = [i for i in self._random_unvisited(1) if i not in taken]
                if pick:
                    out.append(pick[0])
                    taken.add(pick[0])
                    continue
            while self._plan and (self.visited(self._plan[0]) or self._plan[0] in taken):
                self._plan.pop(0)
            if not self._plan:
                if replanned:
                    break
                self._replan()
                replanned = True
                continue
            idx = self._plan.pop(0)
            out.append(idx)
            taken.add(idx)
        return out


def _template_name(t) -> str | None:
    return t if isinstance(t, str) or t is None else getattr(t, "name", None)


def task_parts(task) -> tuple:
    """(template, workload, space) of a task-like object (attributes or dict keys): as given
    (.template object, .wl, .space) or rebuilt from a template name and workload JSON
    (.workload), which is what `tune.task.Task` and log records carry."""
    tpl = _get(task, "template")
    if isinstance(tpl, str):
        from ..kernels import template as registry
        from ..kernels import templates  # noqa: F401  (registers the templates)
        tpl = registry.get(tpl)
    wl = _get(task, "wl")
    if wl is None:
        from ..kernels.workload import Workload
        wl = Workload(_get(task, "workload"))
    space = _get(task, "space")
    return tpl, wl, tpl.space(wl) if space is None else space


def _resolve(task_like, template_name):
    """A Featurizer for another task's records; None if it is of another template or unusable."""
    if template_name is None or _template_name(_get(task_like, "template")) != template_name:
        return None
    try:
        tpl, wl, space = task_parts(task_like)
        return Featurizer(tpl, wl, space, _get(task_like, "flops"))
    except Exception:           # a record of a workload this version cannot rebuild: not usable
        return None


TUNERS = {"random": RandomTuner, "grid": GridSearchTuner, "ga": GATuner, "xgb": XGBTuner}

__all__ = ["Tuner", "RandomTuner", "GridSearchTuner", "GATuner", "XGBTuner", "TUNERS", "task_parts"]
