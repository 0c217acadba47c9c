"""The graph IR: operator nodes in a networkx.DiGraph plus a table of tensors.

Nodes carry the op type, attributes and the names of their input and output tensors; edges follow
data (producer -> consumer) and record which tensors flow along them. Tensors are named, have a static
shape and a dtype, and constants carry their value. Passes mutate a Graph through the few methods here
so that the edges, the producer table and the tensor table never disagree; `verify` checks that.
"""
from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass, field
from typing import Any, Iterator

import networkx as nx
import numpy as np

from .errors import ModelcError


@dataclass
class Tensor:
    name: str
    shape: tuple | None = None          # static shape; None while not yet inferred
    dtype: np.dtype | None = None
    value: np.ndarray | None = None     # set for constants (initializers, folded values)
    layout: tuple | None = None         # (block, halo) for NCHW[block]c buffers; None = plain

    @property
    def is_const(self) -> bool:
        return self.value is not None

    @property
    def size(self) -> int:
        return int(np.prod(self.shape)) if self.shape is not None else 0

    def __repr__(self):
        dt = np.dtype(self.dtype).name if self.dtype is not None else "?"
        shp = "x".join(map(str, self.shape)) if self.shape is not None else "?"
        lay = f"@c{self.layout[0]}h{self.layout[1]}" if self.layout else ""
        return f"{self.name}:{dt}[{shp}]{lay}{'=const' if self.is_const else ''}"


@dataclass
class Node:
    name: str                            # unique within the graph
    op_type: str
    inputs: list                         # tensor names; "" marks an omitted optional input
    outputs: list
    attrs: dict = field(default_factory=dict)
    onnx_name: str = ""                  # the node's name in the source model, for error messages
    subgraph: "Graph | None" = None      # fused groups hold the graph they stand for

    def attr(self, key, default=None):
        return self.attrs.get(key, default)

    def where(self) -> str:
        """How error messages refer to this node."""
        shown = self.onnx_name or self.name
        return f"node {shown!r} ({self.op_type})"

    def __repr__(self):
        return f"Node({self.name!r}, {self.op_type}, {self.inputs} -> {self.outputs})"


class Graph:
    """A dataflow graph of Nodes over a table of Tensors."""

    def __init__(self, name: str = "graph"):
        self.name = name
        self.nx = nx.DiGraph()
        self.tensors: dict[str, Tensor] = {}
        self.inputs: list[str] = []
        self.outputs: list[str] = []
        self.opset: int = 0
        self._producer: dict[str, str] = {}
        self._consumers: dict[str, set] = {}
        self._order = itertools.count()
        self.tail = None              # runtime.tail.Tail: the nodes whose shapes the data decides
        self.model_outputs: list[str] | None = None    # the model's outputs, when a tail makes some

    # ---- tensors -------------------------------------------------------------------------
    def add_tensor(self, name, shape=None, dtype=None, value=None) -> Tensor:
        if value is not None:
            value = np.asarray(value)
            shape, dtype = value.shape, value.dtype
        t = Tensor(name, tuple(int(d) for d in shape) if shape is not None else None,
                   np.dtype(dtype) if dtype is not None else None, value)
        self.tensors[name] = t
        return t

    def add_const(self, name, value) -> str:
        self.add_tensor(name, value=np.asarray(value))
        return name

    def fresh_name(self, hint: str) -> str:
        """A tensor or node name not used yet in this graph."""
        hint = hint or "t"
        if hint not in self.tensors and hint not in self.nx:
            return hint
        for i in itertools.count(1):
            cand = f"{hint}_{i}"
            if cand not in self.tensors and cand not in self.nx:
                return cand

    def tensor(self, name) -> Tensor:
        try:
            return self.tensors[name]
        except KeyError:
            raise ModelcError(f"tensor {name!r} is not in the graph") from None

    def value(self, name):
        """The constant value of a tensor, or None."""
        t = self.tensors.get(name)
        return None if t is None else t.value

    # ---- nodes ---------------------------------------------------------------------------
    def add_node(self, node: Node, order: int | None = None) -> Node:
        """Add `node`; `order` (kept when a node is re-added) breaks ties in topological order."""
        if node.name in self.nx:
            raise ModelcError(f"duplicate node name {node.name!r}")
        for out in node.outputs:
            if not out:
                continue
            if out in self._producer:
                raise ModelcError(f"tensor {out!r} is produced twice ({self._producer[out]!r} and "
                                  f"{node.where()})")
            self._producer[out] = node.name
            self.tensors.setdefault(out, Tensor(out))
        self.nx.add_node(node.name, node=node, order=next(self._order) if order is None else order)
        for inp in node.inputs:
            if inp:
                self._consumers.setdefault(inp, set()).add(node.name)
                self._link(self._producer.get(inp), node.name, inp)
        for out in node.outputs:
            for c in self._consumers.get(out, ()):
                self._link(node.name, c, out)
        return node

    def _link(self, src, dst, tensor):
        if src is None:
            return
        if self.nx.has_edge(src, dst):
            self.nx.edges[src, dst]["tensors"].add(tensor)
        else:
            self.nx.add_edge(src, dst, tensors={tensor})

    def remove_node(self, name: str, drop_outputs: bool = True):
        node = self.node(name)
        for inp in node.inputs:
            if inp and inp in self._consumers:
                self._consumers[inp].discard(name)
        for out in node.outputs:
            if out and self._producer.get(out) == name:
                del self._producer[out]
                if drop_outputs and not self._consumers.get(out) and out not in self.outputs:
                    self.tensors.pop(out, None)
        self.nx.remove_node(name)

    def node(self, name: str) -> Node:
        return self.nx.nodes[name]["node"]

    def producer(self, tensor: str) -> Node | None:
        p = self._producer.get(tensor)
        return None if p is None else self.node(p)

    def consumers(self, tensor: str) -> list[Node]:
        return [self.node(n) for n in sorted(self._consumers.get(tensor, ()),
                                             key=lambda n: self.nx.nodes[n]["order"])]

    def _rewire(self, nodes, edit):
        """Apply `edit(node)` to the tensor names of `nodes`, keeping edges and order right."""
        orders = {n.name: self.nx.nodes[n.name]["order"] for n in nodes}
        for n in nodes:
            self.remove_node(n.name, drop_outputs=False)
        for n in nodes:
            edit(n)
        for n in sorted(nodes, key=lambda n: orders[n.name]):
            self.add_node(n, orders[n.name])

    def replace_input(self, node: Node, old: str, new: str):
        """Make `node` read `new` wherever it read `old`."""
        def edit(n):
            n.inputs = [new if i == old else i for i in n.inputs]
        self._rewire([node], edit)

    def replace_uses(self, old: str, new: str):
        """Redirect every consumer (and graph output) of tensor `old` to tensor `new`."""
        for c in self.consumers(old):
            self.replace_input(c, old, new)
        self.outputs = [new if o == old else o for o in self.outputs]

    def rename_tensor(self, old: str, new: str):
        """Give tensor `old` the name `new` everywhere (producer, consumers, graph outputs)."""
        if new in self.tensors:
            raise ModelcError(f"cannot rename {old!r} to {new!r}: the name is taken")
        touched = [n for n in [self.producer(old)] + self.consumers(old) if n is not None]
        t = self.tensors.pop(old)
        t.name = new
        self.tensors[new] = t
        self.inputs = [new if i == old else i for i in self.inputs]
        self.outputs = [new if o == old else o for o in self.outputs]

        def edit(n):
            n.inputs = [new if i == old else i for i in n.inputs]
            n.outputs = [new if o == old else o for o in n.outputs]
        self._rewire(touched, edit)

    def __iter__(self) -> Iterator[Node]:
        return iter(self.topo())

    def topo(self) -> list[Node]:
        """Nodes in a deterministic topological order (ties broken by insertion order)."""
        order = nx.get_node_attributes(self.nx, "order")
        return [self.node(n) for n in nx.lexicographical_topological_sort(self.nx, key=order.get)]

    def __len__(self):
        return self.nx.number_of_nodes()

    def op_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for n in self.topo():
            counts[n.op_type] = counts.get(n.op_type, 0) + 1
        return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))

    def constants(self) -> list[Tensor]:
        return [t for t in self.tensors.values() if t.is_const]

    # ---- checks and printing ---------------------------------------------------------------
    def verify(self):
        """Raise ModelcError if the graph is inconsistent. Cheap enough to run after every pass."""
        problems = []
        if not nx.is_directed_acyclic_graph(self.nx):
            problems.append("the graph has a cycle")
        available = set(self.inputs) | {t.name for t in self.tensors.values() if t.is_const}
        for name in self.inputs:
            if name not in self.tensors:
                problems.append(f"graph input {name!r} has no tensor entry")
        for node in self.topo():
            for inp in node.inputs:
                if not inp:
                    continue
                if inp not in self.tensors:
                    problems.append(f"{node.where()} reads unknown tensor {inp!r}")
                elif inp not in available and inp not in self._producer:
                    problems.append(f"{node.where()} reads {inp!r}, which nothing produces")
                p = self._producer.get(inp)
                if p is not None and not self.nx.has_edge(p, node.name):
                    problems.append(f"missing edge {p!r} -> {node.name!r} for {inp!r}")
            for out in node.outputs:
                if not out:
                    continue
                t = self.tensors.get(out)
                if t is None:
                    problems.append(f"{node.where()} output {out!r} has no tensor entry")
                elif t.shape is None or t.dtype is None:
                    problems.append(f"{node.where()} output {out!r} has no shape or dtype")
                if self._producer.get(out) != node.name:
                    problems.append(f"producer table disagrees for {out!r}")
                if t is not None and t.is_const:
                    problems.append(f"{node.where()} output {out!r} is also a constant")
            available.update(o for o in node.outputs if o)
        for out in self.outputs:
            if out not in available:
                problems.append(f"graph output {out!r} is never produced")
        for t in self.tensors.values():
            if t.is_const and tuple(t.value.shape) != tuple(t.shape):
                problems.append(f"constant {t.name!r} shape {t.shape} disagrees with its value")
        for src, dst, data in self.nx.edges(data=True):
            for tname in data["tensors"]:
                if self._producer.get(tname) != src or tname not in self.node(dst).inputs:
                    problems.append(f"stale edge {src!r} -> {dst!r} for {tname!r}")
        if problems:
            raise ModelcError(f"graph {self.name!r} failed verification:\n  " + "\n  ".join(problems))

    def __str__(self):
        def fmt(name):
            t = self.tensors.get(name)
            return repr(t) if t is not None else name

        lines = [f"graph {self.name} (opset {self.opset}, {len(self)} nodes)"]
        lines += [f"  input  {fmt(i)}" for i in self.inputs]
        for n in self.topo():
            ins = ", ".join("-" if not i else (f"{i}=const" if self.value(i) is not None else i)
                            for i in n.inputs)
            outs = ", ".join(fmt(o) for o in n.outputs if o)
            attrs = ", ".join(f"{k}={_short(v)}" for k, v in sorted(n.attrs.items()))
            lines.append(f"  {outs} = {n.op_type}({ins}){' {' + attrs + '}' if attrs else ''}")
        lines += [f"  output {fmt(o)}" for o in self.outputs]
        return "\n".join(lines)

    def tail_outputs(self) -> set:
        """The model's outputs the data-dependent tail computes."""
        return set(self.tail.outputs) if self.tail is not None else set()

    def copy(self) -> "Graph":
        g = Graph(self.name)
        g.opset = self.opset
        for t in self.tensors.values():
            g.tensors[t.name] = dataclasses.replace(t)
        g.inputs, g.outputs = list(self.inputs), list(self.outputs)
        g.tail, g.model_outputs = self.tail, self.model_outputs
        for n in self.topo():
            g.add_node(dataclasses.replace(n, inputs=list(n.inputs), outputs=list(n.outputs),
                                           attrs=dict(n.attrs)))
        return g


def _short(v: Any) -> str:
    if isinstance(v, np.ndarray):
        return f"array{list(v.shape)}" if v.size > 8 else repr(v.tolist())
    if isinstance(v, (list, tuple)) and len(v) > 8:
        return f"[{', '.join(map(str, v[:8]))}, ...]"
    return repr(v)
