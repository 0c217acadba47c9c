"""Where the static graph ends: the nodes sent to the data-dependent tail (runtime/tail.py).

A node goes to the tail when its op decides its output's shape from the data (NonZero,
NonMaxSuppression, Unique, Compress; RoiAlign, which only detection heads use, with them), when
importing it needs a value the data decides (DynamicError: a TopK's count, a Reshape's shape, an
If's condition, a Loop's trip count), or when it reads anything the tail computes. Everything else
is compiled. The tail keeps the model's own nodes, so it is an ONNX graph: its inputs are the
compiled part's tensors it reads, values known at import become its initializers.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ..errors import DynamicError

# ops whose output shape the data decides, and RoiAlign, which reads what they select
TAIL_OPS = {"NonZero", "NonMaxSuppression", "Unique", "Compress", "RoiAlign"}


def outer_names(n: onnx.NodeProto) -> set:
    """Names `n` reads from its graph, those its subgraphs read from outside them included."""
    names = {x for x in n.input if x}
    for a in n.attribute:
        subs = [a.g] if a.type == onnx.AttributeProto.GRAPH else \
            list(a.graphs) if a.type == onnx.AttributeProto.GRAPHS else []
        for g in subs:
            local = {i.name for i in g.input} | {t.name for t in g.initializer}
            inner = set()
            for m in g.node:
                inner |= outer_names(m)
                local.update(o for o in m.output if o)
            names |= inner - local
    return names


class TailBuilder:
    """Collects the tail's nodes while the importer walks the model."""

    def __init__(self):
        self.nodes: list[onnx.NodeProto] = []
        self.produced: set[str] = set()
        self.read: set[str] = set()                 # every name its nodes read, its own included
        self.starts: list[tuple[str, str]] = []     # (node, why) of each node that began a branch of it

    def takes(self, n: onnx.NodeProto) -> bool:
        return bool(self.produced & outer_names(n))

    def add(self, n: onnx.NodeProto, why: str | None = None):
        if why is not None:
            self.starts.append((n.name or n.op_type, why))
        self.nodes.append(n)
        self.read |= outer_names(n)
        self.produced.update(o for o in n.output if o)

    def attach(self, ctx, proto: onnx.ModelProto):
        """The graph's tail; the compiled part returns what the tail reads, and the graph keeps the
        model's output order."""
        from ..runtime.tail import Tail
        graph = ctx.graph
        order = [o.name for o in proto.graph.output]
        model, reads = self.model(ctx, proto, [o for o in order if o in self.produced])
        graph.tail = Tail(model, where=f"the data-dependent part of the model (from node {self.where()})")
        graph.tail.starts = list(self.starts)
        graph.model_outputs = order
        graph.outputs += [r for r in reads if r not in graph.outputs and r not in graph.inputs]

    def model(self, ctx, proto: onnx.ModelProto, outputs: list) -> tuple[onnx.ModelProto, list]:
        """The tail as an ONNX model, and the compiled part's tensors it reads (its inputs)."""
        graph = ctx.graph
        inputs, inits = [], []
        for name in sorted(self.read - self.produced):
            if name in ctx.sequences:
                raise DynamicError(f"the data-dependent part of the model (from {self.where()}) reads "
                                   f"sequence {name!r}; modelc passes it tensors only")
            value = ctx.value(name)
            if value is not None:
                inits.append(numpy_helper.from_array(np.asarray(value), name))
                continue
            inputs.append(name)
        vis = [helper.make_tensor_value_info(
            n, helper.np_dtype_to_tensor_dtype(graph.tensors[n].dtype), list(graph.tensors[n].shape))
            for n in inputs]
        outs = []
        for vi in proto.graph.output:
            if vi.name in outputs:
                o = onnx.ValueInfoProto()
                o.CopyFrom(vi)
                outs.append(o)
        g = helper.make_graph(self.nodes, f"{proto.graph.name or 'graph'}_tail", vis, outs, inits)
        m = helper.make_model(g, opset_imports=list(proto.opset_import), ir_version=max(proto.ir_version, 7))
        return m, inputs

    def where(self) -> str:
        return ", ".join(f"{n!r}" for n, _ in self.starts[:3]) or "?"
