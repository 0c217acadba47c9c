"""The dispatch context: which tuned config `compile` uses for each workload.

`ApplyHistoryBest` (tune/records.py) pushes itself here; `compile` asks `current()`. The stack is
per thread (a context variable): a server compiling two models at once from two threads, one under
a tuning log and one without, must not hand one thread's records to the other.
"""
from __future__ import annotations

import contextvars

_stack: contextvars.ContextVar = contextvars.ContextVar("modelc_dispatch", default=())


def current():
    s = _stack.get()
    return s[-1] if s else None


def push(ctx):
    _stack.set(_stack.get() + (ctx,))


def pop(ctx):
    s = _stack.get()
    if s and s[-1] is ctx:
        _stack.set(s[:-1])
