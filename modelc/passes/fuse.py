"""Operator fusion with TVM's pattern kinds; each group becomes one `Fused` node (one kernel).

Rules, applied along single-consumer chains in topological order:
- a conv, dense or matmul (out-elementwise-fusable) absorbs the elementwise and broadcast ops that
  follow it and keep its output shape: bias, activation, residual add, clip, per-channel scale;
- injective, elementwise and broadcast ops fuse together;
- a reduction absorbs the elementwise ops after it that keep its output's shape, but not the ops
  before it (TVM lets an injective
  chain end in a reduction; our reduction templates read their input directly, and such a group
  would otherwise run on the numpy fallback);
- opaque ops stand alone;
- then, as TVM's dominator-based fusion does, an elementwise "diamond" closes: an injective group
  whose outputs are all read by one other injective group (a value used twice, as a recurrent
  cell's gates are, ends a single-consumer chain) joins that group, unless it would be read
  broadcast (recomputed per element) or a path between the two leaves and re-enters.
A Fused node holds its subgraph, so the reference executor can still run it. Weights and other
tensors become the node's inputs; shape parameters and scalar constants stay inside the subgraph,
because kernels are generated for them and they are part of the workload.
"""
from __future__ import annotations

import networkx as nx
import numpy as np

from .. import ops
from ..ir import Graph, Node
from ..kernels.expr import SUPPORTED as EPILOGUE_OPS
from ..kernels.workload import BYTES
from ..ops import Kind
from ..ops.internal import CONVS
from .util import only_consumer


def _kind(node: Node) -> Kind:
    return ops.get(node.op_type).kind


def _anchors_epilogue(node: Node) -> bool:
    """Ops whose kernels run elementwise ops after them on their output (conv, dense ...; a layer
    norm's or LRN's epilogue: an instance norm's per-channel scale and bias lowered onto a layer
    norm (passes/norms.py), an activation or residual add)."""
    return _kind(node) == Kind.OUT_ELEMWISE_FUSABLE or node.op_type in ("LayerNormalization", "LRN")


def _grow(graph: Graph, group: list, allow, done: set) -> list:
    """Extend `group` along its last node's single consumer while `allow(node, state)` holds."""
    state = {"reduced": _kind(group[0]) == Kind.REDUCTION}
    while True:
        last = group[-1]
        outs = [o for o in last.outputs if o]
        if len(outs) != 1:
            return group
        nxt = only_consumer(graph, outs[0])
        if nxt is None or nxt.name in done or nxt.subgraph is not None \
                or len([o for o in nxt.outputs if o]) != 1:
            return group
        if not allow(nxt, state):
            return group
        group.append(nxt)


def _anchor_allow(graph: Graph, shape, dtype, anchor: Node | None = None):
    # only ops an epilogue can emit: a BatchNormalization whose statistics are computed (not
    # folded) broadcasts along channels, which epilogues cannot; absorbed, it sent the whole
    # conv group to the numpy fallback, while alone it is an injective group. Likewise only
    # ops that keep the anchor's dtype: the dense and pool templates store the anchor's type,
    # so MatMul -> IsInf or AveragePool -> Greater ran on the fallback; such an op now starts
    # an injective group. A quantized conv's epilogue may end in a cast to the bytes the next
    # one reads (passes/byte_inputs.py), which its templates store in the blocked layout
    to_bytes = anchor is not None and anchor.op_type == "Conv" and bool(anchor.attrs.get("exact", 0))
    # a product stored transposed (passes/matmul_views.py) ends its group: an epilogue would index
    # the stored tensor by the product's dims
    stored = anchor is not None and "y_strides" in anchor.attrs

    def allow(node, state):
        if stored:
            return False
        k = _kind(node)
        out = graph.tensors[node.outputs[0]]
        return k <= Kind.BROADCAST and node.op_type in EPILOGUE_OPS and out.shape == shape and \
            (out.dtype == dtype or to_bytes and node.op_type == "Cast" and out.dtype in BYTES and
             any("x_zero" in c.attrs for c in graph.consumers(out.name)))
    return allow


def _chain_allow(graph: Graph, shape):
    def allow(node, state):
        k = _kind(node)
        if state["reduced"]:
            # only while the chain keeps the reduction's shape: an op that broadcasts the result
            # back over the reduced axes (x == max(x), x - max(x)) reads the reduction's input
            # again, which the reduction templates' epilogues cannot; it starts a group of its own
            return k <= Kind.BROADCAST and node.op_type in EPILOGUE_OPS and \
                graph.tensors[node.outputs[0]].shape == shape
        return k <= Kind.INJECTIVE
    return allow


# data movement the injective template generates for any shape (not Pad, Resize, GatherElements ...)
MERGE_MOVES = {"Reshape", "Transpose", "Slice", "Gather", "Expand", "Squeeze", "Unsqueeze", "Flatten",
               "Concat", "Split", "Identity"}
MAX_MERGED = 48          # ops in one merged group: beyond it a kernel's compile time grows for little


def _injective_only(group: list) -> bool:
    return all(_kind(n) <= Kind.INJECTIVE and (n.op_type in EPILOGUE_OPS or n.op_type in MERGE_MOVES)
               for n in group)


def _close_diamonds(graph: Graph, groups: list) -> list:
    """Merge each injective group into an injective group that reads its outputs. Outputs also read
    elsewhere stay outputs of the merged group, so they must have its loop's shape (the kernel
    stores them from the same loop, injective.py)."""
    owner = {n.name: k for k, g in enumerate(groups) for n in g}
    dag = nx.DiGraph()
    dag.add_nodes_from(range(len(groups)))
    for k, g in enumerate(groups):
        for n in g:
            for t in n.inputs:
                src = graph.producer(t) if t else None
                if src is not None and owner[src.name] != k:
                    dag.add_edge(owner[src.name], k)
    pos = {n.name: i for i, n in enumerate(graph.topo())}
    # a topological rank per group; a merged group keeps its reader's
    rank = {k: i for i, k in enumerate(nx.topological_sort(dag))}
    changed = True
    while changed:
        changed = False
        for a in sorted(dag.nodes, reverse=True):
            if a not in dag or not _injective_only(groups[a]):
                continue
            b = next((b for b in sorted(dag.successors(a)) if _joins(graph, dag, rank, groups, a, b)), None)
            if b is None:
                continue
            groups[b] = sorted(groups[a] + groups[b], key=lambda n: pos[n.name])
            for p in dag.predecessors(a):
                dag.add_edge(p, b)
            for c in dag.successors(a):
                if c != b:
                    dag.add_edge(b, c)
            dag.remove_node(a)
            if any(rank[c] < rank[b] for c in dag.successors(b)):      # (rare) ranks to renew
                rank = {k: i for i, k in enumerate(nx.topological_sort(dag))}
            changed = True
    return [groups[k] for k in sorted(dag.nodes, key=lambda k: pos[groups[k][0].name])]


def _joins(graph: Graph, dag, rank: dict, groups: list, a: int, b: int) -> bool:
    """Whether injective group a can join its reader b: one loop computes both, without reading a's
    values broadcast (recomputed per element) and without a cycle: none of a's other readers may lead
    back to b (a's producers rank below a, so b reaches none of them). A reader ranked after b cannot;
    only one ranked before it is searched (a search per candidate took 11.6 s on an LSTM of 1,500 steps,
    3,000 groups)."""
    if not _injective_only(groups[b]) or len(groups[a]) + len(groups[b]) > MAX_MERGED:
        return False
    inside = {n.name for n in groups[a]} | {n.name for n in groups[b]}
    loop = {graph.tensors[o].shape for n in groups[b] for o in n.outputs if o}
    size = max(graph.tensors[o].size for n in groups[b] for o in n.outputs if o)
    half = any(graph.tensors[t].dtype == np.float16 for n in groups[a] + groups[b]
               for t in [*n.inputs, *n.outputs] if t)
    for n in groups[a]:
        for o in (o for o in n.outputs if o):
            readers = graph.consumers(o)
            if o in graph.outputs or any(c.name not in inside for c in readers):
                if loop != {graph.tensors[o].shape} or half:
                    return False        # a's output stays one: it must fit b's loop; float16
                    #                     groups run te kernels, of one output (te/groups.py)
            elif readers and not _read_once(graph, o, inside, size):
                return False            # read broadcast: merged, it would be recomputed
    return all(rank[c] > rank[b] or not nx.has_path(dag, c, b) for c in dag.successors(a) if c != b)


# ops whose output elements each read a different element of an input (Pad: its constant mode)
READ_ONCE = {"Concat", "Slice", "Split", "Transpose", "Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity",
             "DepthToSpace", "SpaceToDepth", "Pad"}


def _read_once(graph: Graph, t: str, inside: set, size: int) -> bool:
    """Whether a loop over `size` elements computing the ops `inside` reads each element of value t
    at most once: t is of the loop's size, or every op inside reading it takes each of its elements
    for one output element at most (a part of a Concat, a Slice, a same-shape elementwise op, not a
    broadcast), whose results are read once in turn. torch.roll's slices and their concat, and Swin's
    patch merging (x[:, 0::2, 0::2] four times, concatenated), are then one kernel each."""
    if graph.tensors[t].size >= size:
        return True
    shape = graph.tensors[t].shape
    for c in graph.consumers(t):
        if c.name not in inside:
            continue
        once = (c.op_type in READ_ONCE and c.attrs.get("mode", "constant") == "constant" and  # (as data,
                (c.inputs.count(t) == 1 if c.op_type == "Concat" else t not in c.inputs[1:])) or (  # once)
            c.op_type in EPILOGUE_OPS and all(graph.tensors[o].shape == shape for o in c.outputs if o))
        if not once or not all(_read_once(graph, o, inside, size) for o in c.outputs if o):
            return False
    return True


def _external(graph: Graph, group: list, owner: dict, k: int) -> list:
    """The group's values read outside it or returned by the graph."""
    return [o for n in group for o in n.outputs if o and (o in graph.outputs or any(
        owner[c.name] != k for c in graph.consumers(o)))]


def _epilogue_anchor(group: list) -> Node | None:
    """The group's anchor when it runs an epilogue (a conv, dense ... of one output)."""
    head = group[0] if group else None
    return head if head is not None and _anchors_epilogue(head) and \
        len([o for o in head.outputs if o]) == 1 else None


def _into_epilogue(graph: Graph, groups: list, owner: dict, pos: dict, a: int, b: int) -> bool:
    """Merge group b into anchored group a's epilogue if each of b's ops can be an epilogue op of
    a's anchor (its shape and dtype, one output). The anchor stays first (it is the workload's
    anchor): b may begin with ops that precede it in the graph (r * s + t, then conv + that)."""
    head, ga, gb = groups[a][0], groups[a], groups[b]
    t = graph.tensors[head.outputs[0]]
    allow = _anchor_allow(graph, t.shape, t.dtype, head)
    if a == b or len(ga) + len(gb) > MAX_MERGED or \
            not all(allow(n, {}) and len([o for o in n.outputs if o]) == 1 for n in gb):
        return False
    groups[a], groups[b] = [head] + sorted(ga[1:] + gb, key=lambda n: pos[n.name]), []
    owner.update({n.name: a for n in gb})
    return True


def _absorb_diamonds(graph: Graph, groups: list) -> list:
    """A conv's (dense's ...) group whose one value leaving it is read only by one group of epilogue
    ops on its shape and dtype takes that group as the rest of its epilogue. A value read twice ends
    _grow's single-reader chains: a quantized model's SiLU (x * dequantize(quantize(sigmoid(x))),
    which patterns.py cannot name) ran as a pass of its own over EfficientNet's expanded tensors.
    No cycle can form: nothing but that group reads the anchor's group."""
    owner = {n.name: k for k, g in enumerate(groups) for n in g}
    pos = {n.name: i for i, n in enumerate(graph.topo())}
    for a, ga in enumerate(groups):
        if _epilogue_anchor(ga) is None:
            continue
        out = _external(graph, ga, owner, a)
        if len(out) != 1 or out[0] in graph.outputs or \
                len({owner[c.name] for c in graph.consumers(out[0])}) != 1:
            continue
        b = owner[graph.consumers(out[0])[0].name]
        if len(_external(graph, groups[b], owner, b)) == 1:
            _into_epilogue(graph, groups, owner, pos, a, b)
    return [g for g in groups if g]


def _absorb_side_inputs(graph: Graph, groups: list) -> list:
    """An elementwise group whose one value is read only by a conv's (dense's ...) epilogue, at the
    anchor's shape, runs inside that epilogue, after the anchor (it neither reads the anchor's group
    nor is read by the anchor): a quantized residual's dequantized shortcut ((x - zp) * scale, which
    QLinearAdd reads) was a pass of its own over every ResNet-50 bottleneck's shortcut."""
    owner = {n.name: k for k, g in enumerate(groups) for n in g}
    pos = {n.name: i for i, n in enumerate(graph.topo())}
    for p, gp in enumerate(groups):
        out = _external(graph, gp, owner, p) if gp else []
        if len(out) != 1 or out[0] in graph.outputs:
            continue
        readers = graph.consumers(out[0])
        a = owner[readers[0].name]
        head = _epilogue_anchor(groups[a])
        if head is None or any(owner[c.name] != a or c is head for c in readers):
            continue
        inside_a = {n.name for n in groups[a]}
        if not any(graph.producer(i) is not None and graph.producer(i).name in inside_a
                   for n in gp for i in n.inputs if i):
            _into_epilogue(graph, groups, owner, pos, a, p)
    return [g for g in groups if g]


def _is_param(graph: Graph, node: Node, index: int, name: str) -> bool:
    """Constants a kernel is generated for (shapes, axes, scalars) rather than reads as data."""
    t = graph.tensors[name]
    return t.is_const and (t.size <= 1 or (t.dtype.kind in "iub" and t.size <= 64)
                           or index in ops.get(node.op_type).param_inputs)


def _pattern_name(graph: Graph, group: list) -> str:
    first = group[0]
    op = first.op_type
    name = op.lower()
    if op in CONVS:
        w = graph.tensors[first.inputs[1]].shape
        c_in = graph.tensors[first.inputs[0]].shape[1]
        g = int(first.attrs.get("group", 1))
        name = f"conv{len(w) - 2}d"
        if g > 1:
            name = ("depthwise_" if g == c_in and w[1] == 1 else "group_") + name
        if op == "ScaledConv":
            name = "scaled_" + name
    elif op in ("MatMul", "StridedMatMul"):
        name = "batch_matmul" if len(graph.tensors[first.outputs[0]].shape) > 2 else "matmul"
    else:
        name = {"MaxPool": "max_pool", "AveragePool": "avg_pool", "GlobalAveragePool": "global_avg_pool",
                "GlobalMaxPool": "global_max_pool", "LayerNormalization": "layer_norm",
                "ConvTranspose": "conv_transpose"}.get(op, name)
    if op in (*CONVS, "Dense", "ConvTranspose", "Gemm") and len(first.inputs) > 2 and first.inputs[2]:
        name += "_bias"
    return "_".join([name] + [n.op_type.lower() for n in group[1:]])


def _make_fused(graph: Graph, group: list, index: int) -> Node:
    names = {n.name for n in group}
    produced = {o for n in group for o in n.outputs if o}
    sub = Graph(f"fused_{index}")
    sub.opset = graph.opset
    inputs: list[str] = []
    for n in group:
        for i, t in enumerate(n.inputs):
            if not t or t in produced or t in sub.tensors:
                continue
            if _is_param(graph, n, i, t):
                sub.add_const(t, graph.tensors[t].value)
            else:
                src = graph.tensors[t]
                sub.add_tensor(t, src.shape, src.dtype)
                sub.inputs.append(t)
                inputs.append(t)
    for n in group:
        for o in n.outputs:
            if o:
                src = graph.tensors[o]
                sub.add_tensor(o, src.shape, src.dtype)
        sub.add_node(Node(n.name, n.op_type, list(n.inputs), list(n.outputs), dict(n.attrs), n.onnx_name))
    outputs = [o for n in group for o in n.outputs if o and (
        o in graph.outputs or any(c.name not in names for c in graph.consumers(o)))]
    sub.outputs = outputs
    return Node(graph.fresh_name(f"fused_{index}_{group[0].name}"), "Fused", inputs, outputs,
                {"pattern": _pattern_name(graph, group)}, group[0].onnx_name, subgraph=sub)


def fuse(graph: Graph) -> Graph:
    done: set = set()
    groups = []
    for node in graph.topo():
        if node.name in done or node.subgraph is not None:
            continue
        k = _kind(node)
        if _anchors_epilogue(node) and len([o for o in node.outputs if o]) == 1:
            t = graph.tensors[node.outputs[0]]
            group = _grow(graph, [node], _anchor_allow(graph, t.shape, t.dtype, node), done)
        elif k <= Kind.REDUCTION:
            out = next((o for o in node.outputs if o), None)
            group = _grow(graph, [node], _chain_allow(graph, graph.tensors[out].shape if out else None), done)
        else:
            group = [node]
        done.update(n.name for n in group)
        groups.append(group)
    groups = _absorb_side_inputs(graph, _absorb_diamonds(graph, _close_diamonds(graph, groups)))
    for index, group in enumerate(groups):
        order = graph.nx.nodes[group[0].name]["order"]
        fused = _make_fused(graph, group, index)
        for n in group:
            graph.remove_node(n.name, drop_outputs=False)
        for n in group:
            for o in n.outputs:
                if o and o not in fused.outputs:
                    graph.tensors.pop(o, None)
        graph.add_node(fused, order)
    for t in [t for t in graph.tensors.values()
              if t.is_const and not graph.consumers(t.name) and t.name not in graph.outputs]:
        del graph.tensors[t.name]
    return graph
