"""Fusing a pointwise conv group into the depthwise conv group that reads it (one kernel:
kernels/expand_depthwise.py), after layout planning.

MobileNet's and EfficientNet's inverted residual blocks expand the channels (1x1 conv + activation)
and filter the expanded tensor with a depthwise conv; OpenVINO fuses the pair so that the expanded
tensor, the block's largest, never leaves the cache. A pair is fused when
- the 1x1 conv's group ends in elementwise ops of its own values and constants (an activation),
  and its only reader is the depthwise conv's group, as that conv's data input and nothing else;
- the fused template takes the merged group (shapes, dtypes, epilogues): expand_depthwise_int8
  where the 1x1 conv is a quantized one on integer dot products, else expand_depthwise;
- the expanded tensor is larger than the L1 data caches of the threads that would share it: below
  that the unfused kernels pass it through L1 already, and the fused kernel's ring of rows is
  overhead. The size comes from the target's description, not from this machine.
"""
from __future__ import annotations

import numpy as np

from .. import target
from ..canonical import workload_of
from ..ir import Graph, Node
from ..kernels.layout import physical_size
from ..kernels.template import get
from ..kernels.workload import Workload
from .util import Switch, only_consumer


_SWITCH = Switch("fuse_depthwise")


def disabled():
    """Compile without this fusion inside the block: to measure what it brings
    (benchmarks/fusion.py), or to use tuning records of the unfused groups."""
    return _SWITCH.disabled()


def _anchor(node: Node) -> Node | None:
    return node.subgraph.topo()[0] if node.subgraph is not None else None


def _is_conv(node: Node, depthwise: bool) -> bool:
    a = _anchor(node)
    if a is None or a.op_type != "Conv" or len([o for o in node.outputs if o]) != 1:
        return False
    return (int(a.attrs.get("group", 1)) > 1) == depthwise


def worth_fusing(graph: Graph, tensor: str, tg=None) -> bool:
    """Whether the expanded tensor outgrows the threads' L1 data caches (see the module doc)."""
    tg = tg or target.current()
    t = graph.tensors[tensor]
    nbytes = physical_size(t.shape, t.layout) * np.dtype(t.dtype).itemsize
    return nbytes > tg.l1d_bytes * max(1, tg.threads)


def _merge(graph: Graph, a: Node, b: Node, t: str) -> Node | None:
    """The Fused node running group `a` then group `b` (which reads `a`'s output `t`), or None when
    their subgraphs' inner names clash."""
    sa, sb = a.subgraph, b.subgraph
    mid = sa.outputs[a.outputs.index(t)]
    b_mid = sb.inputs[b.inputs.index(t)]
    if b.inputs.count(t) != 1 or [n for n in sb.topo() if b_mid in n.inputs] != [_anchor(b)] or \
            _anchor(b).inputs[0] != b_mid:
        return None
    rename = {b_mid: mid}
    sub = Graph(f"{sa.name}_{sb.name}")
    sub.opset = sa.opset
    for name, ten in sa.tensors.items():
        sub.tensors[name] = ten
    for name, ten in sb.tensors.items():
        if name == b_mid:
            continue
        old = sub.tensors.get(name)
        if old is not None and not (old.is_const and ten.is_const and old.value.dtype == ten.value.dtype
                                    and np.array_equal(old.value, ten.value)):
            return None
        sub.tensors[name] = ten
    for n in sa.topo():
        sub.add_node(Node(n.name, n.op_type, list(n.inputs), list(n.outputs), dict(n.attrs), n.onnx_name))
    for n in sb.topo():
        if n.name in sub.nx:
            return None
        sub.add_node(Node(n.name, n.op_type, [rename.get(i, i) for i in n.inputs], list(n.outputs),
                          dict(n.attrs), n.onnx_name))
    keep = [k for k, x in enumerate(b.inputs) if x != t]
    sub.inputs = list(sa.inputs) + [sb.inputs[k] for k in keep]
    sub.outputs = list(sb.outputs)
    pattern = f"{a.attrs.get('pattern', 'conv2d')}_{b.attrs.get('pattern', 'depthwise_conv2d')}"
    return Node(graph.fresh_name(f"{a.name}_{b.name}"), "Fused", list(a.inputs) + [b.inputs[k] for k in keep],
                list(b.outputs), {"pattern": pattern}, a.onnx_name, subgraph=sub)


def fuse_expand_depthwise(graph: Graph) -> Graph:
    if _SWITCH.off:
        return graph
    tpl, int8 = get("expand_depthwise"), get("expand_depthwise_int8")
    for a in graph.topo():
        if a.name not in graph.nx or not _is_conv(a, depthwise=False):
            continue
        t = next(o for o in a.outputs if o)
        b = only_consumer(graph, t)
        if b is None or not _is_conv(b, depthwise=True) or not worth_fusing(graph, t):
            continue
        # a quantized expand on integer dot products, then the depthwise, beat both in one kernel
        # of float32 FMAs (MobileNetV2 QOperator 3.19 -> 2.95 ms with VNNI, 4.40 -> 4.22 with int16
        # pairs), and both in one kernel that keeps the dot products beat them unfused (2.78 ->
        # 2.37 ms; 5.69 -> 4.86; AMD EPYC Zen 4): such a pair is fused only into that kernel
        want = int8 if get("conv2d_int8").matches(Workload(workload_of(graph, a))) else tpl
        fused = _merge(graph, a, b, t)
        if fused is None or not want.matches(Workload(workload_of(graph, fused))):
            continue
        order = graph.nx.nodes[a.name]["order"]
        graph.remove_node(b.name, drop_outputs=False)
        graph.remove_node(a.name, drop_outputs=False)
        graph.tensors.pop(t, None)
        graph.add_node(fused, order)
    return graph
