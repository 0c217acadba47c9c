"""Features of (workload, config) pairs for the XGBoost cost model.

The vector has a fixed length so records of different tasks can share one training set (the
warm start learns from every task in the log). Layout, in order:

* workload part (WL_LEN): template id, anchor op id, log2 FLOPs, number of fused ops, anchor
  strides, and for up to MAX_TENSORS tensors (inputs, then the first output) its rank, log2 of
  each dim (padded to MAX_DIMS), const flag and log2 of its layout block;
* derived part (DERIVED): schedule quantities recognised from knob names (see `_derived`):
  register tile, arithmetic intensity of the tile, padding waste, working set and whether it fits
  L1/L2, parallel work items, unrolling;
* hook part (HOOK_SLOTS): if the template defines `features(wl, cfg) -> dict[str, float]`, its
  values sorted by name (a template that knows its loop nest can add exact quantities there);
* knob part (MAX_KNOBS x KNOB_WIDTH), knobs in space order: slot 0 says the kind; numeric knobs
  give log2(v+1), split knobs log2 of each factor, bools 0/1, reorders and categorical knobs the
  candidate index then a one-hot of it (capped at ONEHOT).

Numbers are values, not candidate indices, wherever possible, so two workloads whose spaces list
different candidates still agree on what "tile_ow = 8" means.
"""
from __future__ import annotations

import math
import zlib

import numpy as np

from .. import target

MAX_DIMS = 5
MAX_TENSORS = 4          # three inputs and the first output
TENSOR_LEN = MAX_DIMS + 3
WL_LEN = 6 + MAX_TENSORS * TENSOR_LEN
DERIVED = ["log_reg_tile", "reg_dims", "intensity", "log_vec_regs", "tile_waste", "log_reduction",
           "log_working_set", "fits_l1", "fits_l2", "log_work_items", "few_items", "parallel",
           "unroll_count", "log_unroll"]
HOOK_SLOTS = 8
MAX_KNOBS = 12
KNOB_WIDTH = 7
ONEHOT = KNOB_WIDTH - 2
N_FEATURES = WL_LEN + len(DERIVED) + HOOK_SLOTS + MAX_KNOBS * KNOB_WIDTH

KIND = {"knob": 1.0, "split": 2.0, "reorder": 3.0, "annotate": 4.0}
# tile knob name suffix -> which output extent it tiles (used for padding waste)
TILE_AXES = {"ow": "W", "oh": "H", "oc": "C", "oc_blocks": "C", "m": "M", "n": "N"}


def _log2(x) -> float:
    return math.log2(max(float(x), 0.0) + 1.0)


def name_id(name: str) -> float:
    """A stable number for a name (template, op): the same in every process."""
    return float(zlib.crc32(str(name).encode()) % 4093)


def _is_num(v) -> bool:
    return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, (bool, np.bool_))


# ---- workload part -----------------------------------------------------------------------------

def _tensor_part(t) -> list:
    out = [0.0] * TENSOR_LEN
    if t is None:
        return out
    shape = list(getattr(t, "shape", ()) or ())
    out[0] = float(len(shape))
    for k, d in enumerate(shape[:MAX_DIMS]):
        out[1 + k] = _log2(d)
    out[MAX_DIMS + 1] = float(bool(getattr(t, "const", False)))
    layout = getattr(t, "layout", None)
    out[MAX_DIMS + 2] = _log2(layout[0]) if layout else 0.0
    return out


def _out_elems(wl) -> float:
    outs = getattr(wl, "outputs", None) or []
    return float(math.prod(outs[0].shape)) if outs else 1.0


def workload_features(template, wl, flops: float | None = None) -> np.ndarray:
    """The config-independent part of the vector (WL_LEN numbers)."""
    ops = getattr(wl, "ops", None) or []
    anchor = ops[0] if ops else None
    strides = list((getattr(anchor, "attrs", None) or {}).get("strides", []) or [])[:2]
    if flops is None:
        flops = _out_elems(wl)
    head = [name_id(getattr(template, "name", template)),
            name_id(anchor.op) if anchor is not None else 0.0,
            _log2(flops), float(len(ops))]
    head += [_log2(s) for s in strides] + [0.0] * (2 - len(strides))
    tensors = list(getattr(wl, "inputs", None) or [])[:MAX_TENSORS - 1]
    tensors += [None] * (MAX_TENSORS - 1 - len(tensors))
    outs = getattr(wl, "outputs", None) or [None]
    tensors.append(outs[0])
    vec = head + [x for t in tensors for x in _tensor_part(t)]
    return np.asarray(vec, dtype=np.float32)


# ---- knob part ---------------------------------------------------------------------------------

def _knob_row(knob, i: int) -> np.ndarray:
    """KNOB_WIDTH numbers for candidate i of a knob."""
    v = knob.values[i]
    row = np.zeros(KNOB_WIDTH, dtype=np.float32)
    row[0] = KIND.get(knob.kind, 5.0)
    if isinstance(v, (bool, np.bool_)):
        row[1] = float(v)
    elif _is_num(v):
        row[1] = _log2(v)
    elif knob.kind == "split" and all(_is_num(f) for f in v):
        fs = [_log2(f) for f in v][:KNOB_WIDTH - 1]
        row[1:1 + len(fs)] = fs
    else:                                       # reorder, strings, axis lists: categorical
        row[1] = float(i)
        if i < ONEHOT:
            row[2 + i] = 1.0
    return row


def knob_tables(space) -> list:
    """Per knob, a (candidates x KNOB_WIDTH) table: a config's knob part is a lookup per knob."""
    return [np.stack([_knob_row(k, i) for i in range(len(k.values))]) for k in space.knobs]


# ---- derived part ------------------------------------------------------------------------------

def _extent(wl, axis: str) -> float:
    outs = getattr(wl, "outputs", None) or []
    if not outs:
        return 0.0
    s = list(outs[0].shape)
    if axis == "M":
        return float(math.prod(s[:-1]))
    if axis == "N":
        return float(s[-1]) if s else 0.0
    if len(s) != 4:
        return 0.0
    return float(s[{"C": 1, "H": 2, "W": 3}[axis]])


def _derived(space, wl, values: dict, flops: float) -> list:
    """Schedule quantities from knob names, the way AutoTVM's and Ansor's features describe loops.

    Recognised: numeric `tile_*` knobs are register-tile extents (`*_blocks` counts output layout
    blocks); a split's innermost factor is a register-tile extent; `k_block`-like `*_block` knobs
    block the reduction; `*_per_task` / `*_group` knobs merge tiles into one parallel work item;
    `parallel` turns the parallel loop on or off; `unroll*` knobs unroll (bool or a factor).
    """
    outs = getattr(wl, "outputs", None) or []
    block = float(outs[0].layout[0]) if outs and getattr(outs[0], "layout", None) else 1.0
    dims, waste, group, red_block, parallel, unroll_n, unroll_f = [], 1.0, 1.0, None, 1.0, 0.0, 1.0
    for k in space.knobs:
        v, name = values[k.name], k.name
        if name.startswith("tile_") and _is_num(v):
            t = float(v) * (block if name.endswith("_blocks") else 1.0)
            dims.append(t)
            ext = _extent(wl, TILE_AXES.get(name[5:], "")) if name[5:] in TILE_AXES else 0.0
            if ext > 0:
                waste *= math.ceil(ext / t) * t / ext
        elif k.kind == "split" and isinstance(v, (list, tuple)) and v and all(_is_num(f) for f in v):
            dims.append(float(v[-1]))
        elif name.endswith("_block") and _is_num(v):
            red_block = float(v)
        elif (name.endswith("_per_task") or name.endswith("_group")) and _is_num(v):
            group *= float(v)
        if name == "parallel" and isinstance(v, (bool, np.bool_)):
            parallel = float(v)
        if "unroll" in name:
            if isinstance(v, (bool, np.bool_)) or isinstance(v, str):
                unroll_n += float(bool(v) and v != "none")
            elif _is_num(v):
                unroll_n += float(v > 1)
                unroll_f *= float(max(v, 1))
    reg = math.prod(dims) if dims else 1.0
    out_elems = _out_elems(wl)
    reduction = max(flops / (2.0 * max(out_elems, 1.0)), 1.0)
    rblock = min(red_block, reduction) if red_block else reduction
    ws = 4.0 * (reg + rblock * (sum(dims) if dims else 1.0))
    items = max(out_elems / (reg * group), 1.0)
    cpu = target.current()        # vectors and caches of the CPU the records are for
    vec_regs = math.ceil(dims[-1] / cpu.lanes()) * reg / dims[-1] if dims else 1.0
    return [_log2(reg), float(len(dims)), reg / sum(dims) if dims else 0.0, _log2(vec_regs),
            waste - 1.0, _log2(reduction), _log2(ws), float(ws <= cpu.l1d_bytes), float(ws <= cpu.l2_bytes),
            _log2(items), float(items < 16), parallel, unroll_n, _log2(unroll_f)]


def _hook(template, wl, cfg) -> list:
    fn = getattr(template, "features", None)
    out = [0.0] * HOOK_SLOTS
    if callable(fn):
        d = fn(wl, cfg) or {}
        for j, k in enumerate(sorted(d)[:HOOK_SLOTS]):
            out[j] = float(d[k])
    return out


# ---- the whole vector --------------------------------------------------------------------------

class Featurizer:
    """Features of many configs of one task: the workload part and knob tables computed once.

    `rows(digits)` takes configs as knob-candidate indices (n x knobs) so a search can featurise
    whole populations without building Config objects; the derived part is cached per config.
    """

    def __init__(self, template, wl, space, flops: float | None = None):
        self.template, self.wl, self.space = template, wl, space
        self.flops = float(flops) if flops is not None else _out_elems(wl)
        self.wl_part = workload_features(template, wl, self.flops)
        self.tables = knob_tables(space)[:MAX_KNOBS]
        self.has_hook = callable(getattr(template, "features", None))
        self._cache: dict = {}

    def _per_config(self, digits: tuple) -> np.ndarray:
        vec = self._cache.get(digits)
        if vec is None:
            values = {k.name: k.values[d] for k, d in zip(self.space.knobs, digits)}
            extra = _derived(self.space, self.wl, values, self.flops)
            if self.has_hook:
                from ..kernels.space import Config
                extra += _hook(self.template, self.wl, Config(self.space, -1, values))
            else:
                extra += [0.0] * HOOK_SLOTS
            vec = self._cache[digits] = np.asarray(extra, dtype=np.float32)
        return vec

    def rows(self, digits) -> np.ndarray:
        digits = np.array([list(d) for d in digits], dtype=np.int64).reshape(len(digits),
                                                                               len(self.space.knobs))
        n = len(digits)
        out = np.zeros((n, N_FEATURES), dtype=np.float32)
        out[:, :WL_LEN] = self.wl_part
        mid = WL_LEN + len(DERIVED) + HOOK_SLOTS
        for r, d in enumerate(digits):
            out[r, WL_LEN:mid] = self._per_config(tuple(int(x) for x in d))
        for j, table in enumerate(self.tables):
            out[:, mid + j * KNOB_WIDTH: mid + (j + 1) * KNOB_WIDTH] = table[digits[:, j]]
        return out


def config_digits(cfg) -> tuple:
    """A config as the candidate index of each knob."""
    out = []
    for k in cfg.space.knobs:
        v = cfg.values[k.name]
        out.append(k.values.index(list(v) if isinstance(v, tuple) else v))
    return tuple(out)


def config_features(template, wl, cfg, flops: float | None = None) -> np.ndarray:
    """The fixed-length (N_FEATURES) float vector of one (workload, config) pair.

    `flops` (the task's) is optional: without it the output size stands in for it.
    """
    return Featurizer(template, wl, cfg.space, flops).rows([config_digits(cfg)])[0]


__all__ = ["config_features", "workload_features", "Featurizer", "config_digits", "N_FEATURES",
           "DERIVED", "name_id"]
