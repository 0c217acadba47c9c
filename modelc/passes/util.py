"""Small queries the rewrite passes share."""
from __future__ import annotations

import contextlib
import contextvars

import numpy as np

from ..ir import Graph, Node


class Switch:
    """A pass that can be switched off for a block, as TVM's PassContext(disabled_pass=...): to
    measure what it brings, or to use tuning records of the groups it did not form."""

    def __init__(self, name: str):
        self._disabled = contextvars.ContextVar(f"{name}_disabled", default=False)

    @property
    def off(self) -> bool:
        return self._disabled.get()

    @contextlib.contextmanager
    def disabled(self):
        token = self._disabled.set(True)
        try:
            yield
        finally:
            self._disabled.reset(token)


def only_consumer(graph: Graph, tensor: str) -> Node | None:
    """The single node reading `tensor`, if exactly one does and it is not a graph output."""
    if tensor in graph.outputs:
        return None
    cs = graph.consumers(tensor)
    return cs[0] if len(cs) == 1 else None


def scalar(graph: Graph, name: str) -> float | None:
    """The value of a constant holding a single number, else None."""
    v = graph.value(name) if name else None
    if v is None or v.size != 1:
        return None
    return float(v.reshape(()))


def is_scalar(graph: Graph, name: str, target: float, rtol: float = 1e-4) -> bool:
    v = scalar(graph, name)
    return v is not None and abs(v - target) <= rtol * max(abs(target), 1e-12)


def other_input(node: Node, name: str) -> str | None:
    """For a binary node reading `name`, the other input."""
    if len(node.inputs) != 2 or name not in node.inputs:
        return None
    return node.inputs[1] if node.inputs[0] == name else node.inputs[0]


def forward(graph: Graph, node: Node, src: str):
    """Remove `node`, whose single output equals tensor `src`, rewiring its readers to `src`.

    When the output is a graph output its name must survive: then `src` is renamed instead,
    if `src` is an intermediate that nothing else needs under its own name.
    """
    out = node.outputs[0]
    if out in graph.outputs:
        p = graph.producer(src)
        if p is None or src in graph.outputs or src in graph.inputs:
            return False
        graph.remove_node(node.name, drop_outputs=False)
        del graph.tensors[out]
        graph.rename_tensor(src, out)
        return True
    graph.replace_uses(out, src)
    graph.remove_node(node.name)
    return True


def add_const_like(graph: Graph, hint: str, value) -> str:
    return graph.add_const(graph.fresh_name(hint), np.asarray(value))


def integer_clip(graph: Graph, clip: Node) -> tuple[int, int] | None:
    """(lo, hi) where `clip` is Clip(Round(v) [+ integral constants], lo, hi) with integral
    constant bounds (a quantize's saturation: integers from lo to hi), else None."""
    if clip.op_type != "Clip" or len(clip.inputs) != 3 or not all(clip.inputs):
        return None
    lo, hi = graph.value(clip.inputs[1]), graph.value(clip.inputs[2])
    if lo is None or hi is None or lo.size != 1 or hi.size != 1 or not np.isfinite([lo.item(), hi.item()]).all() \
            or lo.item() != round(lo.item()) or hi.item() != round(hi.item()) or lo.item() > hi.item():
        return None
    r = graph.producer(clip.inputs[0])
    while r is not None and r.op_type == "Add" and len(r.inputs) == 2:
        consts = [graph.value(i) for i in r.inputs]
        k = 0 if consts[0] is not None else 1
        if consts[k] is None or consts[1 - k] is not None or not np.all(np.round(consts[k]) == consts[k]):
            return None
        r = graph.producer(r.inputs[1 - k])
    return (int(lo.item()), int(hi.item())) if r is not None and r.op_type == "Round" else None
