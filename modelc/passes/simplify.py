"""Remove ops that compute nothing and give pure reshapes one canonical form.

Identity, inference-mode Dropout, Cast to the same dtype, Expand to the same shape, Transpose
by the identity permutation and Pad by zeros (Swin pads its maps to whole windows: by nothing at
224 x 224) are dropped, and so is a cast to an integer type and back of floats that
are integers in its range already (a quantized op's output read by the next one's dequantize).
Flatten, Squeeze and Unsqueeze are all row-major
reshapes, and so is a Transpose that moves only axes of length 1 (torch's sequence-first attention
at batch 1: 1 x 197 x 768 -> 197 x 1 x 768), so they become Reshape to a constant shape, a view rather
than a copy kernel; chains of reshapes collapse to one, and a reshape to the same shape disappears.
"""
from __future__ import annotations

import numpy as np

from ..ir import Graph, Node
from .util import forward, integer_clip, only_consumer

_RESHAPES = {"Reshape", "Flatten", "Squeeze", "Unsqueeze"}


def _is_noop(graph: Graph, node: Node) -> bool:
    op = node.op_type
    if op == "Identity":
        return True
    if op == "Dropout":
        return len(node.outputs) < 2 or not node.outputs[1] or (
            not graph.consumers(node.outputs[1]) and node.outputs[1] not in graph.outputs)
    x, y = graph.tensors[node.inputs[0]], graph.tensors[node.outputs[0]]
    if op in {"Cast", "CastLike", "Expand"} | _RESHAPES:
        return x.shape == y.shape and x.dtype == y.dtype
    if op == "Pad":
        pads = node.attrs.get("pads")
        if pads is None and len(node.inputs) > 1 and node.inputs[1]:
            pads = graph.value(node.inputs[1])
        return pads is not None and not np.any(np.asarray(pads)) and x.shape == y.shape and x.dtype == y.dtype
    if op == "Transpose":
        perm = node.attrs.get("perm")
        return perm is None and len(x.shape) <= 1 or perm is not None and list(perm) == sorted(perm)
    return False


# ops that move or select values without computing them: on the integers or on the floats that hold
# them, the same values
_ORDER_KEEPING = {"MaxPool", "Reshape", "Flatten", "Transpose", "Squeeze", "Unsqueeze", "Identity"}


def _integer_round_trip(graph: Graph, node: Node):
    """For Cast(ops(Cast(y, int type)), y's float type) where y = Clip(Round(v) [+ integral
    constants], lo, hi) with lo and hi within the integer type (a quantize, then a dequantize):
    (the inner Cast, the order-keeping ops between), which may as well run on y; else None."""
    chain, t = [], node.inputs[0]
    out = graph.tensors[node.outputs[0]].dtype
    # the last op's result may have other readers if each is such a Cast too (a max pool's output
    # read by a conv and a residual add): they become no-op Casts of its floats
    top = all(r.op_type == "Cast" and graph.tensors[r.outputs[0]].dtype == out for r in graph.consumers(t))
    p = graph.producer(t)
    while p is not None and p.op_type in _ORDER_KEEPING and len([o for o in p.outputs if o]) == 1 and \
            (len(graph.consumers(t)) == 1 or top and t == node.inputs[0]) and t not in graph.outputs:
        chain.append(p)
        t = p.inputs[0]
        p = graph.producer(t)
    first = p
    if first is None or first.op_type != "Cast":
        return None
    y, mid = graph.tensors[first.inputs[0]], graph.tensors[first.outputs[0]]
    if graph.tensors[node.outputs[0]].dtype != y.dtype or y.dtype.kind != "f" or mid.dtype.kind not in "iu":
        return None
    clip = graph.producer(y.name)
    rng = integer_clip(graph, clip) if clip is not None else None
    info = np.iinfo(mid.dtype)
    return (first, chain[::-1]) if rng is not None and info.min <= rng[0] and rng[1] <= info.max else None


def _drop_round_trip(graph: Graph, node: Node, first: Node, chain: list):
    """The ops between read y's floats (their results become floats of the same values)."""
    y = first.inputs[0]
    if chain:
        graph.replace_input(chain[0], chain[0].inputs[0], y)
        for op in chain:
            graph.tensors[op.outputs[0]].dtype = graph.tensors[y].dtype
    forward(graph, node, chain[-1].outputs[0] if chain else y)


def simplify(graph: Graph) -> Graph:
    for node in graph.topo():
        if node.name not in graph.nx:
            continue
        if _is_noop(graph, node):
            forward(graph, node, node.inputs[0])
            continue
        trip = _integer_round_trip(graph, node) if node.op_type == "Cast" else None
        if trip:
            _drop_round_trip(graph, node, *trip)
            continue
        if node.op_type in _RESHAPES or node.op_type == "Transpose" and _keeps_order(graph, node):
            _canonical_reshape(graph, node)
    return graph


def _keeps_order(graph: Graph, node: Node) -> bool:
    """Whether a Transpose leaves every element where it was: its axes longer than 1 stay in order."""
    shape = graph.tensors[node.inputs[0]].shape
    if shape is None:
        return False
    perm = node.attrs.get("perm")
    perm = list(range(len(shape)))[::-1] if perm is None else list(perm)
    if sorted(perm) != list(range(len(shape))):
        return False
    moved = [a for a in perm if shape[a] != 1]
    return moved == sorted(moved)


def _canonical_reshape(graph: Graph, node: Node):
    """Reshape(x, const) in place of any pure reshape, reading through a preceding reshape."""
    out = graph.tensors[node.outputs[0]]
    if node.op_type == "Reshape" and graph.value(node.inputs[1]) is None or 0 in out.shape:
        return
    src = node.inputs[0]
    p = graph.producer(src)
    through = p is not None and p.op_type == "Reshape" and only_consumer(graph, src) is node
    if through:
        src = p.inputs[0]
    if node.op_type == "Reshape" and src == node.inputs[0] and not node.attrs \
            and tuple(graph.value(node.inputs[1]).tolist()) == out.shape:
        return
    shape = graph.add_const(graph.fresh_name(f"{node.name}_shape"), np.array(out.shape, np.int64))
    new = Node(node.name, "Reshape", [src, shape], list(node.outputs), {}, node.onnx_name)
    order = graph.nx.nodes[node.name]["order"]
    graph.remove_node(node.name, drop_outputs=False)
    graph.add_node(new, order)
    # the reshape read through (a multi-output producer's other outputs are not its to drop: an
    # LSTM step op whose sequence output nobody read was removed with its last state)
    if through and not graph.consumers(p.outputs[0]) and p.outputs[0] not in graph.outputs:
        graph.remove_node(p.name)
    if graph.tensors[src].shape == out.shape:
        forward(graph, new, src)
