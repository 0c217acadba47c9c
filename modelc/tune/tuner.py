"""Search over one task's config space: the base class and the loop every tuner follows.

As in AutoTVM, one module per strategy: index_based_tuner (random, grid), ga_tuner (genetic) and
xgb_tuner (XGBoost-guided); `tuning.TUNERS` names them. The loop a caller runs (one tuner per task):

    tuner = TUNERS["xgb"](task, seed=0)      # task: an `extract.Task`
    tuner.load_history(records)               # optional warm start: (task, values, cost)
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
from ..extract import Task

ENUM_LIMIT = 20000


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

    def __init__(self, task: Task, seed: int = 0, enum_limit: int = ENUM_LIMIT):
        self.task = task
        self.template, self.wl, self.space = task.tpl, task.wl, task.space
        self.seed = seed
        self.rng = np.random.default_rng(seed)
        self.flops = float(task.flops or 0)
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
        """Warm start from log records `(task, config_values, cost)`; returns how many were used.
        This task's records (same key) count as measured; the base class ignores others."""
        used = 0
        for task, values, cost in records:
            if task.key == self.task.key:
                try:
                    idx = self.space.from_values(values).index
                except (ModelcError, KeyError, TypeError, AttributeError):
                    continue
                if idx in self.measured and self.measured[idx] <= _cost_value(cost):
                    continue
                self._record(idx, _cost_value(cost))
                used += 1
            elif self._on_foreign(task, values, _cost_value(cost)):
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

    def _on_foreign(self, task: Task, values, cost) -> bool:
        """A warm-start record of another task; True if it was used."""
        return False
