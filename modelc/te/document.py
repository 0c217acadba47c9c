"""A te kernel as data: the JSON document a tuning record and a measurement worker carry.

A declaration is Python (a registered function), which a worker process, another machine or a
shared log cannot run safely; the document of one kernel (its input shapes and dtypes, and its one
or two stages as expression trees over numbered axes and inputs) is data. It holds no names: the
user's names stay in the task's description. Reading one back re-declares it through `te.compute`,
so every check a declaration gets (types, index ranges, reductions) is applied to a document too,
and an expression tree deeper or larger than a kernel needs is refused before it is walked.

    {"te": 1, "inputs": [{"shape": [1024, 1024], "dtype": "float32"}, ...],
     "stages": [{"shape": [...], "reduce": {"op": "sum", "axes": [[0, 1024]], "source": E}},
                {"shape": [...], "value": E}]}          # the second reads ["stage", 0, [...]]

E: ["const", v, dtype] | ["axis", k] | ["raxis", k] | ["input", k, [E...]] | ["stage", 0, [E...]] |
   ["binary", op, E, E] | ["select", E, E, E] | ["cast", dtype, E] | ["call", fn, E...]
"""
from __future__ import annotations

import math

import numpy as np

from ..errors import ModelcError
from ..schema import DocumentError, check_keys, check_list, check_shape
from .expr import (ARITH, CMP, FUNCS, LOGIC, Binary, Call, Cast, Const, Read, Select, Var, binary, call, cast,
                   if_then_else, walk)
from .lower import Acc, KernelPlan

VERSION = 1
MAX_NODES = 4096
MAX_DEPTH = 64
MAX_INPUTS = 64
MAX_STEPS = 1 << 42          # output points x reduction steps: a 16384^3 matmul is 2^42
REDUCE_OPS = ("sum", "max", "min")


def to_document(p: KernelPlan) -> dict:
    """The document of a kernel plan (inputs in the order of `p.reads`)."""
    spatial = {id(a): k for k, a in enumerate(p.axis)}
    reduce = {id(a): k for k, a in enumerate(p.reduce.axes)} if p.reduce is not None else {}
    inputs = {id(t): k for k, t in enumerate(p.reads)}
    shape = [int(d) for d in p.tensor.shape]

    def enc(e):
        if isinstance(e, Const):
            v = e.value
            return ["const", bool(v) if e.dtype == "bool" else (int(v) if e.dtype.startswith("int") else float(v)),
                    e.dtype]
        if isinstance(e, Acc):
            return ["stage", 0, [["axis", k] for k in range(len(shape))]]
        if isinstance(e, Var):
            return ["axis", spatial[id(e)]] if id(e) in spatial else ["raxis", reduce[id(e)]]
        if isinstance(e, Read):
            return ["input", inputs[id(e.tensor)], [enc(i) for i in e.indices]]
        if isinstance(e, Binary):
            return ["binary", e.op, enc(e.a), enc(e.b)]
        if isinstance(e, Select):
            return ["select", enc(e.cond), enc(e.a), enc(e.b)]
        if isinstance(e, Cast):
            return ["cast", e.dtype, enc(e.a)]
        if isinstance(e, Call):
            return ["call", e.fn, *(enc(a) for a in e.operands)]
        raise TypeError(f"no document form for {type(e).__name__}")

    stages = []
    if p.reduce is not None:
        stages.append({"shape": shape, "reduce": {"op": p.reduce.op, "axes": [[a.lo, a.hi] for a in p.reduce.axes],
                                                  "source": enc(p.reduce.source)}})
        if not isinstance(p.value, Acc):
            stages.append({"shape": shape, "value": enc(p.value)})
    else:
        stages.append({"shape": shape, "value": enc(p.value)})
    return {"te": VERSION, "inputs": [{"shape": [int(d) for d in t.shape], "dtype": t.dtype} for t in p.reads],
            "stages": stages}


def from_document(doc, path: str = "workload"):
    """(ComputeDAG, KernelPlan) of a document, checked as a declaration is; DocumentError naming
    the field otherwise."""
    from .. import memory
    from . import tensor as te
    from .dag import ComputeDAG
    from .expr import check_dtype
    from .lower import plan

    check_keys(doc, path, {"te", "inputs", "stages"})
    if doc["te"] != VERSION or isinstance(doc["te"], bool):
        raise DocumentError(f"{path}.te: document version {doc['te']!r}; this modelc reads {VERSION}")
    placeholders, sizes = [], {}
    for k, t in enumerate(check_list(doc["inputs"], f"{path}.inputs", MAX_INPUTS)):
        p = f"{path}.inputs[{k}]"
        check_keys(t, p, {"shape", "dtype"})
        shape = check_shape(t["shape"], f"{p}.shape")
        try:
            dt = check_dtype(t["dtype"])
        except ModelcError as e:
            raise DocumentError(f"{p}.dtype: {e}") from None
        sizes[p] = math.prod(shape) * 8
        placeholders.append(te.placeholder(shape, name=f"in{k}", dtype=dt))
    stages = check_list(doc["stages"], f"{path}.stages", 2)
    if not stages:
        raise DocumentError(f"{path}.stages: is empty")
    for k, s in enumerate(stages):
        check_keys(s, f"{path}.stages[{k}]", {"shape"}, {"reduce", "value"})
        sizes[f"{path}.stages[{k}]"] = math.prod(check_shape(s["shape"], f"{path}.stages[{k}].shape")) * 8
    memory.check(sizes, path)
    _count(stages, path)                 # sized before anything is decoded
    built = []
    for k, s in enumerate(stages):
        p = f"{path}.stages[{k}]"
        if ("reduce" in s) == ("value" in s):
            raise DocumentError(f"{p}: a stage has either a reduce or a value")
        if "reduce" in s and k != 0:
            raise DocumentError(f"{p}: only the first stage may reduce (the second is its epilogue)")
        if k == 1 and "reduce" not in stages[0]:
            raise DocumentError(f"{p}: a second stage only follows a reduction")
        shape = tuple(s["shape"])
        if k == 1 and shape != tuple(stages[0]["shape"]):
            raise DocumentError(f"{p}.shape: an epilogue has its reduction's shape {list(stages[0]['shape'])}")
        try:
            if "reduce" in s:
                r = s["reduce"]
                check_keys(r, f"{p}.reduce", {"op", "axes", "source"})
                if r["op"] not in REDUCE_OPS:
                    raise DocumentError(f"{p}.reduce.op: {r['op']!r} is not one of {', '.join(REDUCE_OPS)}")
                axes = []
                for j, dom in enumerate(check_list(r["axes"], f"{p}.reduce.axes", 8)):
                    if not (isinstance(dom, list) and len(dom) == 2
                            and all(isinstance(x, int) and not isinstance(x, bool) and abs(x) < 1 << 40 for x in dom)):
                        raise DocumentError(f"{p}.reduce.axes[{j}]: expected [lo, hi], got {dom!r}")
                    axes.append(te.reduce_axis(tuple(dom), name=f"r{j}"))
                if not axes:
                    raise DocumentError(f"{p}.reduce.axes: is empty")
                body = lambda *ax, r=r, axes=axes: te.reduction(  # noqa: E731
                    r["op"], _decode(r["source"], ax, axes, placeholders, built, f"{p}.reduce.source"), axes)
            else:
                body = lambda *ax, s=s, p=p: _decode(s["value"], ax, (), placeholders, built,  # noqa: E731
                                                       f"{p}.value")
            built.append(te.compute(shape, body, name=f"s{k}"))
        except DocumentError:
            raise
        except ModelcError as e:
            raise DocumentError(f"{p}: {e}") from None
    steps = math.prod(stages[0]["shape"]) * math.prod(
        hi - lo for lo, hi in (stages[0].get("reduce") or {}).get("axes", []))
    if steps > MAX_STEPS:
        raise DocumentError(f"{path}: {steps:.3g} loop steps, more than the {MAX_STEPS:.3g} a kernel may run "
                            "(hours of work from one document)")
    dag = ComputeDAG([*placeholders, built[-1]])
    plans = plan(dag)
    if len(plans) != 1 or len(plans[0].reads) != len(placeholders):
        raise DocumentError(f"{path}: is not one kernel that reads each of its inputs")
    pl = plans[0]
    order = {id(t): k for k, t in enumerate(pl.reads)}
    if [order.get(id(t)) for t in placeholders] != list(range(len(placeholders))):
        raise DocumentError(f"{path}.inputs: not in the order the kernel first reads them")
    return dag, pl


def _count(stages, path):
    """Refuse expression trees larger or deeper than a kernel needs, without recursing."""
    n = 0
    for s in stages:
        red = s.get("reduce")
        stack = [(e, 0) for e in (s.get("value"), red.get("source") if isinstance(red, dict) else None)
                 if e is not None]
        while stack:
            e, d = stack.pop()
            n += 1
            if n > MAX_NODES or d > MAX_DEPTH:
                raise DocumentError(f"{path}: expressions larger than {MAX_NODES} nodes or deeper than {MAX_DEPTH}")
            if isinstance(e, list):
                stack.extend((x, d + 1) for x in e[1:] if isinstance(x, list))


def _decode(e, axis, raxes, inputs, stages, path):
    """An expression from its document form (te's constructors check types as they build); `_count`
    has bounded its depth."""
    if not isinstance(e, list) or not e or not isinstance(e[0], str):
        raise DocumentError(f"{path}: expected an expression [tag, ...], got {str(e)[:80]}")
    tag, args = e[0], e[1:]

    def sub(x, k):
        return _decode(x, axis, raxes, inputs, stages, f"{path}[{k}]")

    def index(k, n):
        if len(args) != 1 or isinstance(args[0], bool) or not isinstance(args[0], int) or not 0 <= args[0] < n:
            raise DocumentError(f"{path}: {tag} index {args!r} out of range [0, {n})")
        return args[0]

    if tag == "const" and len(args) == 2:
        from .expr import check_dtype
        v, dt = args[0], check_dtype(args[1])
        if dt == "bool":
            ok = isinstance(v, bool)
        elif dt.startswith("int"):           # within the dtype: numpy would refuse it in codegen
            ok = isinstance(v, int) and not isinstance(v, bool) and np.iinfo(dt).min <= v <= np.iinfo(dt).max
        else:
            ok = isinstance(v, (int, float)) and not isinstance(v, bool)
        if not ok:
            raise DocumentError(f"{path}: {v!r} is not a {dt} constant")
        return Const(v, dt)
    if tag == "axis":
        return axis[index("axis", len(axis))]
    if tag == "raxis":
        return raxes[index("raxis", len(raxes))]
    if tag in ("input", "stage") and len(args) == 2 and isinstance(args[1], list):
        pool = inputs if tag == "input" else stages
        k = args[0]
        if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k < len(pool):
            raise DocumentError(f"{path}: {tag} {k!r} out of range [0, {len(pool)})")
        return pool[k][tuple(sub(x, j) for j, x in enumerate(args[1]))]
    if tag == "binary" and len(args) == 3 and args[0] in ARITH + CMP + LOGIC:
        return binary(args[0], sub(args[1], 2), sub(args[2], 3))
    if tag == "select" and len(args) == 3:
        return if_then_else(*(sub(x, j + 1) for j, x in enumerate(args)))
    if tag == "cast" and len(args) == 2:
        return cast(args[0], sub(args[1], 2))
    if tag == "call" and args and args[0] in FUNCS:
        return call(args[0], *(sub(x, j + 2) for j, x in enumerate(args[1:])))
    raise DocumentError(f"{path}: unknown expression {str(e)[:80]}")


def plan_flops(p: KernelPlan) -> int:
    """Floating-point operations of a kernel plan: arithmetic on values, not on indices or
    conditions (a conv's padding test is no FLOP)."""
    def count(e):
        return sum(isinstance(x, (Binary, Call)) and x.dtype.startswith("float") for x in walk(e))
    points = math.prod(p.tensor.shape)
    total = points * count(p.value)
    if p.reduce is not None:
        n = math.prod(a.hi - a.lo for a in p.reduce.axes)
        total += points * n * (1 + count(p.reduce.source))
    return int(total)


def flops(doc) -> int:
    """Floating-point operations of a (valid) document's kernel."""
    return plan_flops(from_document(doc)[1])
