"""A genetic algorithm over knob digits, as AutoTVM's GATuner."""
from __future__ import annotations

import numpy as np

from .tuner import Tuner


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
