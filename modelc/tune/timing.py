"""Timing one kernel the way a module runs it: bound once, warmed up, weights evicted if asked.

Measurement's side of a kernel (kernels know how to build and check themselves, not that they
are being tuned); the worker process calls this for every candidate it runs.
"""
from __future__ import annotations

import time

from .cache_flush import flush as evict


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
