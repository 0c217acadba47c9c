"""The numpy reference executor: runs a Graph node by node with the registry's implementations.

It is the ground truth for passes, kernels and tuning measurements, so it checks every result
against the shape and dtype the graph declares.
"""
from __future__ import annotations

import numpy as np

from . import ops
from .errors import InputError, ModelcError
from .ir import Graph


def check_feeds(graph: Graph, feeds: dict) -> dict:
    """Validate names, shapes and dtypes of the inputs; return them as arrays."""
    unknown = sorted(set(feeds) - set(graph.inputs))
    if unknown:
        raise InputError(f"unknown input(s) {unknown}; the model's inputs are {graph.inputs}")
    missing = [n for n in graph.inputs if n not in feeds]
    if missing:
        raise InputError(f"missing input(s) {missing}; the model's inputs are {graph.inputs}")
    out = {}
    for name in graph.inputs:
        t = graph.tensors[name]
        x = np.asarray(feeds[name])
        if tuple(x.shape) != tuple(t.shape):
            raise InputError(f"input {name!r} has shape {list(x.shape)}, expected {list(t.shape)}")
        if x.dtype != t.dtype:
            raise InputError(f"input {name!r} has dtype {x.dtype}, expected {t.dtype}")
        out[name] = x
    return out


def run(graph: Graph, feeds: dict, keep_all: bool = False) -> dict:
    """Outputs of `graph` for `feeds`, as {output name: array}. `keep_all` returns every tensor."""
    env: dict[str, np.ndarray] = {t.name: t.value for t in graph.tensors.values() if t.is_const}
    env.update(check_feeds(graph, feeds))
    order = graph.topo()
    last_use = {}
    for i, node in enumerate(order):
        for t in node.inputs:
            last_use[t] = i
    keep = set(graph.outputs) | set(graph.tail.inputs if graph.tail is not None else ())
    for i, node in enumerate(order):
        args = [env[t] if t else None for t in node.inputs]
        if node.subgraph is not None:
            sub = node.subgraph
            res = run(sub, dict(zip(sub.inputs, args)))
            results = [res[o] for o in sub.outputs]
        else:
            results = ops.evaluate(node, args)
        for name, val in zip(node.outputs, results):
            if not name:
                continue
            t = graph.tensors[name]
            if tuple(val.shape) != tuple(t.shape) or val.dtype != t.dtype:
                raise ModelcError(f"{node.where()} produced {name!r} as {val.dtype}{list(val.shape)}, "
                                  f"but the graph declares {t.dtype}{list(t.shape)}")
            env[name] = val
        if not keep_all:
            for t in node.inputs:
                if t and last_use.get(t) == i and t not in keep and not graph.tensors[t].is_const:
                    env.pop(t, None)
    if keep_all:
        return env
    if graph.tail is not None:      # the nodes whose shapes the data decides (runtime/tail.py)
        made = graph.tail.run(env)
        return {o: made[o] if o in made else env[o] for o in graph.model_outputs}
    return {o: env[o] for o in graph.outputs}
