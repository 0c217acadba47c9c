"""Tuners that walk the space by index, without learning from measurements (AutoTVM's
index_based_tuner): random sampling, the baseline every other tuner must beat, and grid search."""
from __future__ import annotations

from .tuner import Tuner


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
