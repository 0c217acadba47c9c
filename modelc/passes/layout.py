"""Layout planning: which activations live in the channel-blocked NCHW[b]c layout, with what halo.

Convolutions and pools run in the blocked layout; chains of them keep it, and a tensor that a
convolution reads gets a zero halo as wide as that convolution's padding, so padding costs
nothing. Elementwise groups between them read and write any layout. Transforms are inserted only
at the edges: where a plain tensor (a graph input, a reshape's result) feeds a convolution, and
where a blocked tensor feeds a kernel that needs plain rows (dense, matmul, softmax ...) or is a
graph output. Each transform is a fused group of one Identity, run by the injective kernel.
"""
from __future__ import annotations

import numpy as np

from ..ir import Graph, Node
from ..ops.internal import CONVS
from ..kernels.channel_tiles import channel_vectors
from ..kernels.expr import SUPPORTED as ELEMENTWISE
from ..kernels.layout import choose_block, same_as_plain

_POOLS = {"MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool"}


def _ops(node: Node) -> list:
    return node.subgraph.topo() if node.subgraph is not None else [node]


def _anchor(node: Node) -> Node:
    return _ops(node)[0]


# float16 activations are blocked too: their kernels (te, computing in float32) read halos as float32's
_BLOCKED_DTYPES = (np.float32, np.float16)


def _is_4d_blockable(graph: Graph, name: str) -> bool:
    t = graph.tensors.get(name)
    return t is not None and t.shape is not None and len(t.shape) == 4 and not t.is_const and \
        (t.dtype in _BLOCKED_DTYPES or _bytes_read(graph, name))


def _bytes_read(graph: Graph, name: str) -> bool:
    """An 8-bit tensor a quantized conv reads as bytes (passes/byte_inputs.py): blocked, without a
    halo (a zero byte is not the zero point; those kernels pad where they convert their patches)."""
    return any("x_zero" in _anchor(c).attrs and _data_input(c) == name for c in graph.consumers(name))


def _blocked_native(graph: Graph, node: Node) -> bool:
    """Groups whose kernels run in the blocked layout: 2-d convolutions (dense, grouped and
    depthwise), pools."""
    a = _anchor(node)
    sub = node.subgraph or graph
    if not node.outputs or not _is_4d_blockable(graph, node.outputs[0]) or len([o for o in node.outputs if o]) != 1:
        return False
    x = sub.tensors[a.inputs[0]]
    if len(x.shape) != 4 or x.dtype not in _BLOCKED_DTYPES and "x_zero" not in a.attrs:
        return False
    if a.op_type in CONVS:
        w = graph.tensors.get(_outer(node, a.inputs[1]))   # (None: computed inside the group)
        if (w is None or not w.is_const) and sub.value(a.inputs[1]) is None:
            return False
        # grouped ones where conv_generic vectorises over a group's output channels (8k of them):
        # it reads and writes blocks through their layout. With fewer, it vectorises along the
        # row, which blocks make strided: ResNeXt-50's 4-channel groups on 56x56 ran 0.62 ms
        # blocked against 0.33 plain (plus 0.25 of transforms), AMD EPYC Zen 4
        g = int(a.attrs.get("group", 1))
        c, k = x.shape[1], sub.tensors[a.outputs[0]].shape[1]
        return g == 1 or g == c == k or channel_vectors(k // g)
    if a.op_type in _POOLS:
        return not (a.op_type == "MaxPool" and len([o for o in a.outputs if o]) > 1)
    return False


def _flexible(node: Node) -> bool:
    """Elementwise-only groups read and write any layout."""
    return all(n.op_type in ELEMENTWISE for n in _ops(node))


def _conv_pad(node: Node) -> int:
    a = _anchor(node)
    return max(a.attrs.get("pads", [0])) if a.op_type in CONVS else 0


def _outer(node: Node, inner: str) -> str:
    """The parent-graph name of a fused group's boundary tensor (constants keep their name)."""
    sub = node.subgraph
    if sub is None or inner not in sub.inputs:
        return inner
    return node.inputs[sub.inputs.index(inner)]


def _data_input(node: Node) -> str:
    """The parent-graph tensor a blocked-native group reads as its data (first) input."""
    return _outer(node, _anchor(node).inputs[0])


def _transform(graph: Graph, src: str, layout, hint: str, dst: str | None = None) -> str:
    """A fused Identity group copying `src` into tensor `dst` (new if None) of `layout`."""
    t = graph.tensors[src]
    dst = dst or graph.fresh_name(f"{src}_{'blk' if layout else 'plain'}")
    graph.add_tensor(dst, t.shape, t.dtype).layout = layout
    sub = Graph("layout_transform")
    sub.opset = graph.opset
    sub.add_tensor("x", t.shape, t.dtype).layout = t.layout
    sub.add_tensor("y", t.shape, t.dtype).layout = layout
    sub.inputs, sub.outputs = ["x"], ["y"]
    sub.add_node(Node("identity", "Identity", ["x"], ["y"]))
    graph.add_node(Node(graph.fresh_name(f"layout_{hint}"), "Fused", [src], [dst],
                        {"pattern": "layout_transform"}, subgraph=sub))
    return dst


def plan_layouts(graph: Graph) -> Graph:
    nodes = graph.topo()
    native = {n.name for n in nodes if _blocked_native(graph, n)}
    flexible = {n.name for n in nodes if _flexible(n)}

    def consumers(t):
        return graph.consumers(t)

    # 1. which produced tensors are blocked
    blocked = set()
    for n in nodes:
        for o in n.outputs:
            if not o or not _is_4d_blockable(graph, o):
                continue
            # elementwise and data-movement groups write any layout: blocked when a blocked
            # kernel reads the result (a Concat of branches then needs no transform)
            if n.name in native or ((n.name in flexible or _writes_any_layout(graph, n)) and any(
                    c.name in native and _data_input(c) == o for c in consumers(o))):
                blocked.add(o)
    # 2. halos: as wide as the widest padding of a convolution reading the tensor
    halo = {t: 0 for t in blocked}
    for n in nodes:
        if n.name in native and _anchor(n).op_type in CONVS:
            x = _data_input(n)
            if x in halo and not _bytes_read(graph, x):
                halo[x] = max(halo[x], _conv_pad(n))
    # a tensor no convolution reads as data, but a blocked group reads as a second operand (a
    # residual Add after a downsample conv), takes the halo of that group's output: both are then
    # indexed alike, and the group's workload is the same as where the residual comes from a
    # block's output (ResNet's "conv + add + relu" is one task per stage, not two)
    data_read = {_data_input(n) for n in nodes if n.name in native and _anchor(n).op_type in CONVS}
    # the inputs of a Concat that can be done in place (written straight into its result,
    # runtime/plan.py) need its halo: all of them take the widest of theirs and its
    joins = [[n.outputs[0], *n.inputs] for n in nodes if _in_place_concat(graph, n, blocked)]
    for _ in range(len(nodes)):
        changed = False
        for n in nodes:
            out = n.outputs[0] if n.name in native and n.outputs else None
            for t in (n.inputs if out in halo else ()):
                if t in halo and t not in data_read and t != _data_input(n) and halo[t] < halo[out]:
                    halo[t], changed = halo[out], True
        for ts in joins:
            h = max(halo[t] for t in ts)
            for t in ts:
                if halo[t] < h:
                    halo[t], changed = h, True
        if not changed:
            break
    for t in blocked:
        graph.tensors[t].layout = (choose_block(graph.tensors[t].shape[1]), halo[t])
    # 3. plain tensors feeding blocked kernels get one transform each (shared by their readers)
    for t in list(graph.tensors):
        readers = [c for c in consumers(t) if c.name in native and _data_input(c) == t]
        if not readers or t in blocked or not _is_4d_blockable(graph, t):
            continue
        pad = 0 if _bytes_read(graph, t) else max((_conv_pad(c) for c in readers), default=0)
        new = _transform(graph, t, (choose_block(graph.tensors[t].shape[1]), pad), "to_blocked")
        for c in readers:
            graph.replace_input(c, t, new)
    # 4. blocked tensors feeding kernels that need plain rows, or leaving the graph
    for t in sorted(blocked):
        tt = graph.tensors[t]
        if same_as_plain(tt.shape, tt.layout):
            continue
        needs_plain = [c for c in consumers(t) if c.name not in native and c.name not in flexible
                       and not _reads_any_layout(c)]
        if t in graph.outputs:                       # the producer writes a blocked copy
            inner = graph.fresh_name(f"{t}_blk")
            outputs = list(graph.outputs)           # the ONNX output keeps its name (and position)
            graph.rename_tensor(t, inner)
            graph.outputs = outputs
            _transform(graph, inner, None, "output", dst=t)
            t = inner
        if needs_plain:
            new = _transform(graph, t, None, "to_plain")
            for c in needs_plain:
                graph.replace_input(c, t, new)
    _sync_subgraph_layouts(graph)
    return graph


def _in_place_concat(graph: Graph, node: Node, blocked: set) -> bool:
    """A Concat along the channels of one image of blocked tensors in whole blocks of the result's
    block size: what the module can do without copying, given one halo (runtime/plan.py)."""
    ops = _ops(node)
    if [n.op_type for n in ops] != ["Concat"] or len(node.outputs) != 1 or node.outputs[0] not in blocked:
        return False
    out = graph.tensors[node.outputs[0]]
    b = choose_block(out.shape[1])
    return out.shape[0] == 1 and int(ops[0].attrs.get("axis", 0)) % 4 == 1 and \
        len(set(node.inputs)) == len(node.inputs) and \
        all(t in blocked and choose_block(graph.tensors[t].shape[1]) == b and graph.tensors[t].shape[1] % b == 0
            for t in node.inputs)


def _writes_any_layout(graph: Graph, node: Node) -> bool:
    """Injective groups of one 4-d output: the injective kernel stores through the output's layout."""
    outs = [o for o in node.outputs if o]
    return node.subgraph is not None and len(outs) == 1 and _is_4d_blockable(graph, outs[0]) \
        and _reads_any_layout(node)


def _reads_any_layout(node: Node) -> bool:
    """Injective groups (no reductions, no compute anchors) index inputs through their layout."""
    from .. import ops
    from ..ops import Kind
    return all(ops.get(n.op_type).kind <= Kind.INJECTIVE for n in _ops(node))


def _sync_subgraph_layouts(graph: Graph):
    """Fused subgraphs see their boundary tensors in the layouts the parent graph chose."""
    for node in graph.topo():
        sub = node.subgraph
        if sub is None:
            continue
        for outer, inner in zip(node.inputs, sub.inputs):
            sub.tensors[inner].layout = graph.tensors[outer].layout
        for outer, inner in zip(node.outputs, sub.outputs):
            if outer:
                sub.tensors[inner].layout = graph.tensors[outer].layout
