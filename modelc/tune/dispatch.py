"""The dispatch context: which tuned config `compile` uses for each workload.

`ApplyHistoryBest` (tune/records.py) pushes itself here; `compile` asks `current()`.
"""
from __future__ import annotations

_stack: list = []


def current():
    return _stack[-1] if _stack else None


def push(ctx):
    _stack.append(ctx)


def pop(ctx):
    if _stack and _stack[-1] is ctx:
        _stack.pop()
