"""Workloads and search tasks, as TVM's auto_scheduler names them.

A workload key is the registered function's name and its arguments as JSON, so it means the same
computation in every process that registered the function (records will apply across runs).
"""
from __future__ import annotations

import json
import textwrap

import numpy as np

from ..errors import InputError, ModelcError
from .dag import ComputeDAG

WORKLOADS: dict = {}


def register_workload(func=None, *, name: str | None = None, override: bool = False):
    """Register a function returning [inputs..., outputs...] as a workload (a decorator)."""
    def reg(f):
        key = name or f.__name__
        if key in WORKLOADS and WORKLOADS[key] is not f and not override:
            old = WORKLOADS[key]
            if getattr(old, "__qualname__", None) != f.__qualname__ or old.__module__ != f.__module__:
                raise ModelcError(f"workload {key!r} is already registered by another function "
                                  "(pass override=True to replace it)")
        WORKLOADS[key] = f
        return f
    return reg(func) if func is not None else reg


def workload_key(name: str, args) -> str:
    try:
        return json.dumps([name, *args])
    except TypeError as e:
        raise ModelcError(f"workload {name!r}: its arguments must be JSON values (numbers, strings, "
                          f"lists): {e}") from None


class SearchTask:
    """A computation to schedule: `func` (registered, or its name) applied to `args`."""

    def __init__(self, func=None, args=(), workload_key: str | None = None):
        if workload_key is not None:
            try:
                name, *args = json.loads(workload_key)
            except (ValueError, TypeError):
                raise ModelcError(f"bad workload key {workload_key!r}") from None
        elif callable(func):
            name = next((k for k, f in WORKLOADS.items() if f is func), None)
            if name is None:
                raise ModelcError(f"{getattr(func, '__name__', func)!r} is not a registered workload: "
                                  "decorate it with @modelc.register_workload")
        else:
            name = func
        if name not in WORKLOADS:
            raise ModelcError(f"no workload registered as {name!r}")
        self.args = tuple(args)
        self.workload_key = globals()["workload_key"](name, self.args)
        self.compute_dag = ComputeDAG(WORKLOADS[name](*self.args))

    def __repr__(self):
        return f"SearchTask({self.workload_key})"

    @property
    def plans(self) -> list:
        from .lower import plan
        if not hasattr(self, "_plans"):
            self._plans = plan(self.compute_dag)
        return self._plans

    def tuning_tasks(self) -> list:
        """One tuning task per kernel of the computation (as a model has one per fused group):
        keyed by the hash of the kernel's document, so the same kernel declared anywhere, under
        any name, shares its records."""
        from ..extract import Task, workload_key as doc_key
        from .document import plan_flops, to_document
        if not hasattr(self, "_docs"):     # the documents are the target's-independent part
            self._docs = [(doc_key(d), d, plan_flops(p)) for p in self.plans for d in [to_document(p)]]
        return [Task(key, f"{self.workload_key} {p.name}", "te", doc, 1, flops, pattern="te")
                for (key, doc, flops), p in zip(self._docs, self.plans)]

    def tune(self, n_trials: int = 200, log: str = "tuning.jsonl", **options):
        """Search the derived schedule space of each kernel with a budget of `n_trials`
        measurements, appending records to `log` (resumable; options as `modelc.tune`)."""
        from ..tune.tuning import tune
        return tune(None, n_trials=n_trials, log=log, tasks=self.tuning_tasks(), **options)

    def _best_records(self, log: str) -> list:
        """Per kernel, its best record in `log` for this CPU, or None."""
        import os

        from ..tune import records as R
        if not os.path.exists(log):
            raise ModelcError(f"no tuning log at {log!r}")
        best = R.best_by_key(R.load_records(log), R.current_target())
        return [best.get((t.key, "te")) for t in self.tuning_tasks()]

    def best_values(self, log: str | None) -> list:
        """Per kernel, the knob values of its best record in `log` for this CPU (None: no record)."""
        return [None] * len(self.plans) if log is None else self._values(self._best_records(log))

    def _values(self, records: list) -> list:
        from .sketch import space
        return [None if r is None else space(p).from_values(r.config).values for r, p in zip(records, self.plans)]

    def print_best(self, log: str) -> str:
        """Each kernel's best schedule in `log`: its measured latency, the schedule steps and the
        loop nest they make."""
        from .codegen import kernel_source
        from .sketch import default_values, steps
        out = []
        records = self._best_records(log)
        for t, p, r, v in zip(self.tuning_tasks(), self.plans, records, self._values(records)):
            values = v if v is not None else default_values(p)
            head = (f"{t.desc}: {r.cost * 1e3:.4f} ms ({t.flops / r.cost / 1e9:.1f} GFLOP/s)" if r is not None
                    else f"{t.desc}: no record in {log}; the default schedule")
            src, _ = kernel_source(p, values)
            body = textwrap.dedent("\n".join(ln for ln in src[src.index("def kernel("):].splitlines()[1:]
                                              if "ptr__" not in ln))
            out += [head, *("  " + s for s in steps(p, values)), "  loop nest:",
                    *("    " + ln for ln in body.splitlines()), ""]
        return "\n".join(out)

    def build(self, log: str | None = None, compile: bool = True) -> "BuiltFunction":
        """The computation compiled with each kernel's best record in `log` for this CPU (the
        default schedule where there is none); compile=False defers compiling to the first call or
        to `build_many`."""
        return BuiltFunction(self.compute_dag, compile=compile, values=self.best_values(log), plans=self.plans)


class BuiltFunction:
    """f(*inputs) -> output(s), or f(*inputs, *outputs) writing into given arrays."""

    def __init__(self, dag: ComputeDAG, compile: bool = True, values: list | None = None,
                 plans: list | None = None):
        from .codegen import kernel_source
        from .lower import plan
        self.dag = dag
        self.plans = plans if plans is not None else plan(dag)
        values = values or [None] * len(self.plans)
        made = [kernel_source(p, v) for p, v in zip(self.plans, values)]
        self.sources = [s for s, _ in made]
        self.arguments = [ts for _, ts in made]
        self.names = [f"te stage {p.name!r}" for p in self.plans]
        self.kernels = None
        if compile:
            build_many([self])

    def __call__(self, *arrays):
        if self.kernels is None:
            build_many([self])
        return self._run(arrays)

    def _run(self, arrays):
        dag = self.dag
        n_in, n_out = len(dag.inputs), len(dag.outputs)
        if len(arrays) not in (n_in, n_in + n_out):
            raise InputError(f"expected {n_in} input array(s) ({', '.join(t.name for t in dag.inputs)}), "
                             f"optionally followed by {n_out} output array(s); got {len(arrays)}")
        ins = dag.check_inputs(arrays[:n_in])
        if len(arrays) == n_in:
            outs = [np.empty(t.shape, t.dtype) for t in dag.outputs]
        else:
            outs = list(arrays[n_in:])
            for t, a in zip(dag.outputs, outs):
                if not (isinstance(a, np.ndarray) and a.shape == tuple(t.shape) and a.dtype == np.dtype(t.dtype)
                        and a.flags.c_contiguous and a.flags.writeable):
                    raise InputError(f"output {t.name!r} must be a writable C-contiguous {t.dtype} array of "
                                     f"shape {tuple(t.shape)}, got {type(a).__name__} "
                                     f"{getattr(a, 'dtype', '')} {getattr(a, 'shape', '')}")
                if any(np.may_share_memory(a, x) for x in [*ins, *(o for o in outs if o is not a)]):
                    raise InputError(f"output {t.name!r} overlaps another argument")
        buffers = {id(t): a for t, a in zip(dag.inputs, ins)}
        buffers.update({id(t): a for t, a in zip(dag.outputs, outs)})
        for plan, args, kernel in zip(self.plans, self.arguments, self.kernels):
            if id(plan.tensor) not in buffers:
                buffers[id(plan.tensor)] = np.empty(plan.tensor.shape, plan.tensor.dtype)
            kernel.bind([buffers[id(t)].reshape(-1) for t in args])()
        return outs[0] if n_out == 1 else tuple(outs)


def build_many(functions: list) -> list:
    """Compile the kernels of several built functions at once (cold kernels compile in parallel)."""
    from ..kernels import cache
    todo = [f for f in functions if f.kernels is None]
    kernels = cache.compile_all([s for f in todo for s in f.sources], names=[n for f in todo for n in f.names])
    for f in todo:
        f.kernels, kernels = kernels[:len(f.sources)], kernels[len(f.sources):]
    return functions
