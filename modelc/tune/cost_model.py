"""The XGBoost cost model that ranks candidate configs, as AutoTVM's XGBoostCostModel does.

It is trained on throughput (FLOPs / latency, 0 for a failed measurement) and only has to order
configs of one task, never to predict a latency: the "rank" loss (rank:pairwise) learns exactly
that, within groups (one group per task, so a slow task's configs are never compared with a fast
task's); the "reg" loss regresses throughput normalised by the best of its group. Small data,
so one thread, shallow trees and a fixed number of rounds.
"""
from __future__ import annotations

import numpy as np
import xgboost as xgb

from ..errors import ModelcError

LOSSES = {"rank": "rank:pairwise", "reg": "reg:squarederror"}


def _group_order(groups, n: int):
    """Row order that makes each group contiguous, and the group sizes in that order."""
    if groups is None:
        return np.arange(n), np.array([n])
    g = np.asarray(groups)
    if len(g) != n:
        raise ModelcError(f"groups has {len(g)} labels for {n} rows")
    _, inv = np.unique(g, return_inverse=True)
    order = np.argsort(inv, kind="stable")
    return order, np.bincount(inv)


def normalise(y, groups=None) -> np.ndarray:
    """Throughput as a fraction of the best of its group (failures stay 0)."""
    y = np.nan_to_num(np.asarray(y, dtype=np.float64), nan=0.0, posinf=0.0, neginf=0.0)
    y = np.maximum(y, 0.0)
    g = np.zeros(len(y), dtype=np.int64) if groups is None else np.unique(groups, return_inverse=True)[1]
    best = np.zeros(g.max() + 1 if len(g) else 1)
    np.maximum.at(best, g, y)
    return np.where(best[g] > 0, y / np.where(best[g] > 0, best[g], 1.0), 0.0)


class XGBCostModel:
    def __init__(self, loss: str = "rank", seed: int = 0, num_boost_round: int = 60,
                 max_depth: int = 3, eta: float = 0.3, nthread: int = 1):
        if loss not in LOSSES:
            raise ModelcError(f"unknown cost model loss {loss!r}: use one of {sorted(LOSSES)}")
        self.loss, self.seed, self.num_boost_round = loss, seed, num_boost_round
        self.params = {"objective": LOSSES[loss], "max_depth": max_depth, "eta": eta,
                       "gamma": 1e-4, "min_child_weight": 1, "subsample": 1.0, "lambda": 1.0,
                       "alpha": 0.0, "nthread": nthread, "seed": seed, "verbosity": 0,
                       "tree_method": "hist", "max_bin": 64}
        self.booster = None

    @property
    def trained(self) -> bool:
        return self.booster is not None

    def fit(self, X: np.ndarray, y_throughput: np.ndarray, groups=None, weights=None) -> None:
        """Train from scratch. `groups`: one label per row (e.g. the task key); rows are only
        ranked against rows of their own group. None: one group. `weights`: one per row (the
        rank loss weighs whole groups, so it takes each group's first row's weight)."""
        X = np.asarray(X, dtype=np.float32)
        if len(X) == 0:
            raise ModelcError("cannot fit the cost model on no data")
        order, sizes = _group_order(groups, len(X))
        y = normalise(y_throughput, groups)[order]
        dtrain = xgb.DMatrix(X[order], label=y, nthread=self.params["nthread"])
        if self.loss == "rank":
            dtrain.set_group(sizes)
        if weights is not None:
            w = np.asarray(weights, dtype=np.float32)[order]
            if self.loss == "rank":
                w = w[np.concatenate([[0], np.cumsum(sizes)[:-1]])]
            dtrain.set_weight(w)
        self.booster = xgb.train(self.params, dtrain, num_boost_round=self.num_boost_round)

    def predict(self, X: np.ndarray) -> np.ndarray:
        """A score per row, higher = faster (comparable within one task only)."""
        X = np.asarray(X, dtype=np.float32)
        if self.booster is None:
            raise ModelcError("the cost model was not trained")
        if len(X) == 0:
            return np.zeros(0)
        return np.asarray(self.booster.inplace_predict(X), dtype=np.float64)


__all__ = ["XGBCostModel", "normalise"]
