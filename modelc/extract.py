"""Tasks: the distinct fused operators of a model, with their weights (occurrence counts).

As in Ansor's `extract_tasks`, every fused group of the optimised graph is described by a workload
(canonical.py: a JSON of its ops, shapes, dtypes, layouts and small constants, never names or
weights), whose hash is the key tuning records are filed under.

This sits below both the compiler (which files each kernel under its key) and the tuner (which
tunes tasks), so neither has to import the other.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field

from .canonical import COMMUTATIVE, KEY_VERSION, workload_key, workload_of  # noqa: F401  (their home)
from .frontend import from_onnx
from .ir import Graph, Node
from .kernels import templates as _templates  # noqa: F401  (registers the templates)
from .kernels.space import ConfigSpace
from .kernels.template import Template, alternatives, select
from .kernels.template import get as get_template
from .kernels.workload import Workload
from .te.workload import view
from .ops.cost import node_macs
from .ops.internal import CONVS
from .passes.lower import lower


@dataclass(eq=False)
class Task:
    """A workload and the template (algorithm) that runs it: what `modelc tasks` lists, the
    scheduler shares the budget across, a tuner searches and measurement builds.

    `wl`, `tpl` and `space` (the workload's view, the template and its config space) are derived
    on first use, so a task read back from a log costs nothing until a tuner needs them.
    """
    key: str
    desc: str
    template: str                     # the kernel template's name (records file configs under it)
    workload: dict = field(repr=False)
    weight: int = 1                   # occurrences in the model
    flops: float = 0                  # for one occurrence
    pattern: str = ""
    tunable: bool = True
    alternatives: list = field(default_factory=list)  # other algorithms' templates (Winograd ...)
    node: Node | None = field(repr=False, default=None)    # the first occurrence
    graph: Graph | None = field(repr=False, default=None)  # the fused graph it was found in

    @functools.cached_property
    def wl(self) -> Workload:
        return view(self.workload)

    @functools.cached_property
    def tpl(self) -> Template:
        return get_template(self.template)

    @functools.cached_property
    def space(self) -> ConfigSpace:
        return self.tpl.space(self.wl)

    def to_json(self) -> dict:
        return {"key": self.key, "desc": self.desc, "pattern": self.pattern, "weight": self.weight,
                "flops": self.flops, "template": self.template, "tunable": self.tunable,
                "alternatives": self.alternatives, "workload": self.workload}


def _flops(graph: Graph, nodes) -> int:
    """2 x MACs for the compute ops, plus one operation per output element for the others."""
    total = 0
    for n in nodes:
        macs = node_macs(graph, n)
        if macs:
            total += 2 * macs
        elif n.op_type not in ("Reshape", "Identity", "Flatten", "Squeeze", "Unsqueeze"):
            total += sum(graph.tensors[o].size for o in n.outputs if o)
    return int(total)


def group_flops(graph: Graph, node: Node) -> int:
    sub = node.subgraph
    return _flops(sub, sub.topo()) if sub is not None else _flops(graph, [node])


def workload_flops(workload: dict) -> int:
    """FLOPs of a workload from its JSON alone (for records of tasks not in the current model)."""
    if isinstance(workload, dict) and "te" in workload:
        from .te.document import flops
        return flops(workload)
    g = Workload(workload).to_graph()
    return _flops(g, g.topo())


def _anchor(node: Node) -> Node:
    return node.subgraph.topo()[0] if node.subgraph is not None else node


def describe(graph: Graph, node: Node) -> str:
    """A human-readable workload, e.g. `conv2d_bias_add_relu 1x64x56x56 k64 3x3 s1 p1`."""
    a = _anchor(node)
    g = node.subgraph if node.subgraph is not None else graph
    pattern = node.attrs.get("pattern", a.op_type.lower())
    dims = lambda s: "x".join(map(str, s))  # noqa: E731
    x = g.tensors[a.inputs[0]].shape
    if a.op_type in CONVS:
        w = g.tensors[a.inputs[1]].shape
        s = a.attrs.get("strides", [1])
        p = a.attrs.get("pads", [0])
        d = a.attrs.get("dilations", [1])
        extra = f" g{a.attrs['group']}" if a.attrs.get("group", 1) > 1 else ""
        extra += f" d{d[0]}" if max(d) > 1 else ""
        one = lambda v: v[0] if len(set(v)) == 1 else dims(v)  # noqa: E731
        second = next((n for n in g.topo()[1:] if n.op_type in CONVS), None)
        if second is not None:          # a fused pair (expand + depthwise): the second conv's window
            extra += f" + {dims(g.tensors[second.inputs[1]].shape[2:])} s{one(second.attrs.get('strides', [1]))}" \
                     f" p{one(second.attrs.get('pads', [0]))}"
        return f"{pattern} {dims(x)} k{w[0]} {dims(w[2:])} s{one(s)} p{one(p)}{extra}"
    stored = f" -> {dims(a.attrs['y_shape'])}" if "y_shape" in a.attrs else ""    # (passes/matmul_views.py)
    if a.op_type == "Dense":
        return f"{pattern} {dims(x)} n{g.tensors[a.inputs[1]].shape[1]}{stored}"
    if a.op_type == "MatMul":
        return f"{pattern} {dims(x)} @ {dims(g.tensors[a.inputs[1]].shape)}"
    if a.op_type == "StridedMatMul":        # the operands as the matmul reads them
        return f"{pattern} {dims(a.attrs['a_shape'])} @ {dims(a.attrs['b_shape'])}{stored} (views)"
    if a.op_type in ("MaxPool", "AveragePool"):
        return f"{pattern} {dims(x)} {dims(a.attrs['kernel_shape'])} s{a.attrs['strides'][0]}"
    out = graph.tensors[node.outputs[0]].shape
    return f"{pattern} {dims(x)} -> {dims(out)}"


def tasks_from_graph(graph: Graph) -> list[Task]:
    """One Task per distinct workload of a fused graph, in order of first occurrence.

    The template is the kernel template `compile` would pick; a group whose template has no
    knobs (or a single config) runs that fixed kernel and is marked not tunable. `alternatives`
    names the other algorithms a tuning record may replace it with.
    """
    by_key: dict[str, Task] = {}
    for node in graph.topo():
        wl = workload_of(graph, node)
        key = workload_key(wl)
        if key in by_key:
            by_key[key].weight += 1
            continue
        view = Workload(wl)
        tpl = select(view)
        alts = alternatives(view, tpl) if tpl.tunable else []
        # an algorithm that supersedes the others where it applies is the task's only one: no
        # trial goes to kernels that cannot win (a quantized conv's float32 FMAs against VNNI's)
        tpl = next((t for t in alts if t.supersedes and t.preferred(view)), tpl)
        alts = [t.name for t in alts if t is not tpl] if not tpl.supersedes else []
        tunable = tpl.tunable and len(tpl.space(view)) > 1
        by_key[key] = Task(key, describe(graph, node), tpl.name, wl, 1, group_flops(graph, node),
                           node.attrs.get("pattern", node.op_type.lower()), tunable, alts, node, graph)
    return list(by_key.values())


def extract_tasks(model, shape: dict | None = None) -> list[Task]:
    """The tasks of a model (path, ModelProto or imported Graph), as Ansor extracts them.

    The graph goes through the same passes, fusion and layout planning as `compile`, so the keys
    are the ones tuning records and `ApplyHistoryBest` use.
    """
    graph = model if isinstance(model, Graph) else from_onnx(model, shape=shape)
    return tasks_from_graph(lower(graph))
