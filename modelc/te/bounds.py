"""Interval arithmetic over loop extents: which tensor reads are provably inside their tensor.

A read outside any `if_then_else` must be provably in range, or the declaration is refused (A[i + 1]
with i in [0, N) against extent N). A read under a condition is the padding idiom: the condition's
comparisons of a variable or of an expression against a constant narrow that variable's or
expression's interval inside the branch; a guarded read still not proven in range is clamped by the
code generator, so no declaration can make a kernel read outside an array.
"""
from __future__ import annotations

from .expr import Binary, Call, Cast, Const, Expr, Read, Select, Var


def interval(e: Expr, ranges: dict, known: dict):
    """(lo, hi) inclusive bounds of an integer expression, or None when they cannot be decided.
    `ranges`: Var -> (lo, hi); `known`: key -> (lo, hi) of expressions narrowed by conditions."""
    got = _interval(e, ranges, known)
    k = known.get(e.key())
    if k is not None:
        got = k if got is None else (max(got[0], k[0]), min(got[1], k[1]))
    return got


def _interval(e, ranges, known):
    if isinstance(e, Const):
        return (int(e.value), int(e.value)) if e.dtype != "bool" and float(e.value).is_integer() else None
    if isinstance(e, Var):
        return ranges.get(e, (e.lo, e.hi - 1))
    if isinstance(e, Cast) and e.a.dtype in ("int32", "int64"):
        return interval(e.a, ranges, known)
    if isinstance(e, Select):
        a, b = interval(e.a, ranges, known), interval(e.b, ranges, known)
        return None if a is None or b is None else (min(a[0], b[0]), max(a[1], b[1]))
    if isinstance(e, Call) and e.fn in ("max", "min"):
        a, b = (interval(x, ranges, known) for x in e.operands)
        if a is None or b is None:
            return None
        f = max if e.fn == "max" else min
        return (f(a[0], b[0]), f(a[1], b[1]))
    if isinstance(e, Call) and e.fn == "abs":           # a reflect Pad's index folding
        a = interval(e.operands[0], ranges, known)
        if a is None:
            return None
        return a if a[0] >= 0 else (-a[1], -a[0]) if a[1] <= 0 else (0, max(-a[0], a[1]))
    if not isinstance(e, Binary) or e.op not in ("+", "-", "*", "//", "%"):
        return None
    a, b = interval(e.a, ranges, known), interval(e.b, ranges, known)
    if e.op == "%" and b is not None and b[0] == b[1] and b[0] > 0:
        if a is not None and 0 <= a[0] and a[1] < b[0]:
            return a
        return (0, b[0] - 1)
    if a is None or b is None:
        return None
    if e.op == "+":
        return (a[0] + b[0], a[1] + b[1])
    if e.op == "-":
        return (a[0] - b[1], a[1] - b[0])
    if e.op == "*":
        p = [x * y for x in a for y in b]
        return (min(p), max(p))
    if e.op == "//" and b[0] == b[1] and b[0] > 0:
        return (a[0] // b[0], a[1] // b[0])
    return None


_FLIP = {"<": ">", "<=": ">=", ">": "<", ">=": "<=", "==": "=="}


def narrow(cond: Expr, ranges: dict, known: dict) -> tuple[dict, dict]:
    """`ranges` and `known` inside the branch where `cond` holds (its && of comparisons)."""
    ranges, known = dict(ranges), dict(known)
    stack = [cond]
    while stack:
        c = stack.pop()
        if isinstance(c, Binary) and c.op == "&&":
            stack += [c.a, c.b]
            continue
        if not isinstance(c, Binary) or c.op not in _FLIP:
            continue
        lhs, op, rhs = c.a, c.op, c.b
        if interval(lhs, ranges, known) is not None and _const(lhs, ranges, known) is not None:
            lhs, op, rhs = rhs, _FLIP[op], lhs
        v = _const(rhs, ranges, known)
        if v is None:
            continue
        lo, hi = {"<": (None, v - 1), "<=": (None, v), ">": (v + 1, None), ">=": (v, None),
                  "==": (v, v)}[op]
        cur = interval(lhs, ranges, known)
        if cur is None:
            continue
        new = (cur[0] if lo is None else max(cur[0], lo), cur[1] if hi is None else min(cur[1], hi))
        if isinstance(lhs, Var):
            ranges[lhs] = new
        else:
            known[lhs.key()] = new
    return ranges, known


def _const(e, ranges, known):
    iv = interval(e, ranges, known)
    return iv[0] if iv is not None and iv[0] == iv[1] else None


def unproven_reads(e: Expr, ranges: dict | None = None, known: dict | None = None,
                   guarded: bool = False) -> list:
    """[(read, dim, interval, guarded)] for every read of `e` not provably inside its tensor."""
    ranges, known = ranges or {}, known or {}
    out = []
    if isinstance(e, Select):
        out += unproven_reads(e.cond, ranges, known, guarded)
        out += unproven_reads(e.a, *narrow(e.cond, ranges, known), True)
        out += unproven_reads(e.b, ranges, known, True)
        return out
    if isinstance(e, Read):
        for d, (ix, ext) in enumerate(zip(e.indices, e.tensor.shape)):
            iv = interval(ix, ranges, known)
            if iv is None or iv[0] < 0 or iv[1] >= ext:
                out.append((e, d, iv, guarded))
    for a in e.args:
        out += unproven_reads(a, ranges, known, guarded)
    return out
