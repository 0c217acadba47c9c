"""Build, run and check one kernel against the reference executor (tests and tuning use this)."""
from __future__ import annotations

import time

import numpy as np

from .. import reference
from . import cache
from .layout import from_physical, physical_size, to_physical
from .template import Kernel, Template
from .workload import Workload


def bind(wl: Workload, kernel: Kernel, inputs: list, packed: dict | None = None) -> tuple[list, list]:
    """The kernel's argument arrays for logical `inputs`, and the output buffers among them."""
    if packed is None:
        consts = {k: inputs[k] for k, t in enumerate(wl.inputs) if t.const}
        packed = kernel.pack(consts) if kernel.pack else {}
    outs = [np.zeros(physical_size(t.shape, t.layout), t.dtype) for t in wl.outputs]
    args = []
    for a in kernel.args:
        if a.startswith("out"):
            args.append(outs[int(a[3:])])
        elif a.startswith("in"):
            k = int(a[2:])
            args.append(to_physical(inputs[k], wl.inputs[k].layout))
        else:
            args.append(packed[a])
    return args, outs


def reference_outputs(wl: Workload, inputs: list) -> list:
    g = wl.to_graph()
    res = reference.run(g, {f"i{k}": x for k, x in enumerate(inputs)})
    return [res[o] for o in g.outputs]


def max_rel_error(got: list, want: list) -> float:
    err = 0.0
    for g, w in zip(got, want):
        if w.dtype.kind in "biu":
            err = max(err, float(np.any(g != w)))
            continue
        scale = max(float(np.abs(w).max()) if w.size else 0.0, 1e-30)
        err = max(err, float(np.abs(g.astype(np.float64) - w).max()) / scale if w.size else 0.0)
    return err


def run(wl: Workload, template: Template, cfg, inputs: list | None = None, seed: int = 0):
    """(logical outputs, reference outputs, compiled fn, args) of one kernel on seeded inputs."""
    kernel = template.build(wl, cfg)
    fn = cache.load(kernel.source)
    inputs = inputs if inputs is not None else wl.random_inputs(seed)
    args, outs = bind(wl, kernel, inputs)
    fn(*args)
    got = [from_physical(o, t.shape, t.layout) for o, t in zip(outs, wl.outputs)]
    return got, reference_outputs(wl, inputs), fn, args


def time_kernel(fn, args, number: int = 10, repeat: int = 5, min_repeat_ms: float = 0.0,
                flush: list = (), warmup_ms: float = 50.0) -> list:
    """Seconds per call: `repeat` medians-to-be, each the mean of `number` calls (bound once, as
    a module runs it). With `flush` arrays, every call is timed alone right after those arrays
    were evicted from the caches (as a module finds its weights), and `min_repeat_ms` is moot.

    The kernel first runs for `warmup_ms`: timed right after an idle pause, the first
    measurement of a parallel kernel here often read exactly 2x (one core still waking up: the
    same conv read 2.0 ms, then 1.04 ms a moment later).
    """
    call = fn.bind(args)
    t_end = time.perf_counter() + warmup_ms / 1e3
    call()
    while time.perf_counter() < t_end:
        call()
    costs = []
    if flush:
        from ..tune.cache_flush import flush as evict
        for _ in range(repeat):
            total = 0.0
            for _ in range(number):
                for a in flush:
                    evict(a)
                t0 = time.perf_counter()
                call()
                total += time.perf_counter() - t0
            costs.append(total / number)
        return costs
    for _ in range(repeat):
        n = number
        while True:
            t0 = time.perf_counter()
            for _ in range(n):
                call()
            dt = time.perf_counter() - t0
            if dt * 1e3 >= min_repeat_ms or n >= 1 << 16:
                break
            n *= 2
        costs.append(dt / n)
    return costs
