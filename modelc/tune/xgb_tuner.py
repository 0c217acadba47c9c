"""AutoTVM's model-based tuner: an XGBoost cost model ranks configs, simulated annealing plans (or,
for the spaces derived from a te declaration, Ansor's evolutionary search)."""
from __future__ import annotations

import functools
import math

import numpy as np

from ..extract import Task
from .cost_model import XGBCostModel
from .features import Featurizer
from .tuner import Tuner


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
                 max_history: int = 2000, own_weight: float = 4.0, crossover_prob: float = 0.15, **kw):
        super().__init__(task, seed, **kw)
        self.crossover_prob = crossover_prob
        self.plan_size, self.epsilon, self.sa_iters = plan_size, epsilon, sa_iters
        self.retrain_growth, self.sa_points, self.min_train = retrain_growth, sa_points, min_train
        self.max_history, self.own_weight = max_history, own_weight
        self.model = XGBCostModel(loss=loss, seed=seed, num_boost_round=num_boost_round)
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
    def _foreign_featurizer(self, task: Task):
        """A Featurizer for another task's records; None if it is of another template or unusable."""
        if task.key not in self._foreign_tasks:
            feat = None
            if task.template == self.task.template:
                try:
                    feat = Featurizer(task.tpl, task.wl, task.space, task.flops)
                except Exception:   # a record of a workload this version cannot rebuild: not usable
                    pass
            self._foreign_tasks[task.key] = feat
        return self._foreign_tasks[task.key]

    def _on_foreign(self, task: Task, values, cost) -> bool:
        feat = self._foreign_featurizer(task)
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
        self._foreign_g.append(str(task.key))
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
        if self.small:
            self._plan = self._plan_small()
        elif getattr(self.template, "search", "sa") == "evolutionary":
            self._plan = self._plan_evolutionary()
        else:
            self._plan = self._plan_sa()

    # ---- Ansor's evolutionary search (derived spaces) ---------------------------------------------
    @functools.cached_property
    def mutation_kinds(self) -> dict:
        """Ansor's mutation rules as groups of knobs: tile sizes, parallel granularity, unrolling,
        and where and how the computation is laid out (compute location, vectorised axis)."""
        kinds = {}
        for j, k in enumerate(self.space.knobs):
            if self.radix[j] < 2:
                continue
            n = k.name
            kind = ("tile_size" if "tile" in n or "block" in n else "unroll" if "unroll" in n else
                    "parallel" if n in ("order", "m_group") or "parallel" in n else "compute_location")
            kinds.setdefault(kind, []).append(j)
        return kinds

    def mutate(self, pop: np.ndarray) -> np.ndarray:
        """Each member mutated by one rule (a rule chosen uniformly, then one of its knobs): a tile
        size to a neighbouring or any candidate, the other rules to any other candidate."""
        kinds = list(self.mutation_kinds.values())
        out = pop.copy()
        for row in out:
            knobs = kinds[self.rng.integers(len(kinds))]
            j = knobs[self.rng.integers(len(knobs))]
            r = self.radix[j]
            if self.rng.random() < 0.5:
                row[j] = min(max(row[j] + self.rng.choice([-1, 1]), 0), r - 1)
            else:
                row[j] = (row[j] + 1 + self.rng.integers(r - 1)) % r      # any other value
        return out

    def crossover(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Children taking each knob group (a mutation kind: the steps of one rule) from either parent."""
        kids = a.copy()
        for knobs in self.mutation_kinds.values():
            take = self.rng.random(len(a)) < 0.5
            for j in knobs:
                kids[take, j] = b[take, j]
        return kids

    def _plan_evolutionary(self) -> list:
        """Ansor's evolutionary search over model scores: a population of the best measured configs
        and random ones; each generation picks parents in proportion to their scores, makes children
        by crossover (`crossover_prob`) or mutation, and keeps the best `sa_points` valid ones; the
        plan is the best unvisited configs seen. The budget matches simulated annealing's
        (`sa_iters` generations of `sa_points`)."""
        if not self.mutation_kinds:
            return []
        best = sorted(self.measured, key=self.measured.get)[: self.sa_points // 2]
        starts = best + self._random_unvisited(self.sa_points - len(best))
        pop = np.array([self.digits(i) for i in starts or [0]], dtype=np.int64)
        scores = self.model.predict(self.feat.rows(pop))
        top: dict[int, float] = {}

        def consider(ws, ss):
            for idx, sc in zip(self.indices(ws), ss):
                if idx not in top and not self.visited(idx):
                    top[idx] = float(sc)
        consider(pop, scores)
        n = self.sa_points
        for _ in range(self.sa_iters):
            w = np.exp((scores - scores.max()) / (float(np.std(scores)) + 1e-9))
            p = w / w.sum()
            pa = pop[self.rng.choice(len(pop), size=n, p=p)]
            pb = pop[self.rng.choice(len(pop), size=n, p=p)]
            cross = (self.rng.random(n) < self.crossover_prob)[:, None]
            kids = np.where(cross, self.crossover(pa, pb), self.mutate(pa))
            ok = np.array([self.is_valid(i) for i in self.indices(kids)], dtype=bool)
            if not ok.any():
                continue
            kids = kids[ok]
            ks = self.model.predict(self.feat.rows(kids))
            consider(kids, ks)
            allp, alls = np.concatenate([pop, kids]), np.concatenate([scores, ks])
            _, first = np.unique(np.asarray(self.indices(allp)), return_index=True)
            keep = first[np.argsort(-alls[first], kind="stable")[:n]]
            pop, scores = allp[keep], alls[keep]
        return [i for i, _ in sorted(top.items(), key=lambda kv: -kv[1])][:self.plan_size]

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
