"""Quantized convolutions read their input as bytes, as onnxruntime's QLinearConv does.

The importer turns a quantized tensor into float32 integers (`simplify` drops the cast to uint8 and
back), so a quantized model moved four bytes per value between its kernels: the output of every
requantizing epilogue, and every conv's read of it. Where such a tensor y = clip(round(v) + c, lo,
hi) fits 8 bits and is read by convolutions on integer dot products (through its centering y - z,
the dequantize's zero point), this pass casts it back: q = Cast(y, uint8 or int8) ends the
producer's epilogue, each such conv reads q (`x_zero` = z on the Conv: it convolves q - z, padded
with zeros of that), and every other reader - elementwise ops, which fuse the cast back to float
into their own kernel - reads Cast(q, float32). A model's own 8-bit input (widened by a Cast) is
read as bytes the same way. The kernels that take such a conv
(conv2d_int8, expand_depthwise_int8) copy bytes into their patches instead of converting floats.

Only where the CPU has an integer dot product (`int_dot.dot_form`): no other kernel reads bytes.
"""
from __future__ import annotations

import numpy as np
from onnx import helper

from .. import target
from ..ir import Graph, Node
from ..kernels.expr import SUPPORTED as ELEMENTWISE
from ..kernels.conv2d_int8 import dot_conv_fits
from ..kernels.int_dot import dot_form
from ..kernels.layout import choose_block
from .. import ops
from ..ops import Kind
from ..kernels.workload import BYTES
from .util import Switch, integer_clip, scalar


def _kind(node: Node) -> Kind:
    return ops.get(node.op_type).kind


def _byte_conv(graph: Graph, node: Node, z: int, dtype) -> bool:
    """A 2-d quantized conv (exact, with x_min) over a centered input whose 8-bit values q give
    x_min = the type's least value - z, with constant weights, of a shape conv2d_int8 takes (a
    byte-reading conv that no template took would run on the numpy reference)."""
    a = node.attrs
    x_min = a.get("x_min")
    if node.op_type != "Conv" or len(node.inputs) < 2:
        return False
    x, w = graph.tensors[node.inputs[0]], graph.value(node.inputs[1])
    if not a.get("exact", 0) or not isinstance(x_min, int) or "x_zero" in a or \
            int(a.get("group", 1)) != 1 or x.shape is None or len(x.shape) != 4 or w is None or w.ndim != 4 or \
            x_min != int(np.iinfo(dtype).min) - z or a.get("auto_pad", "NOTSET") not in ("NOTSET", b"NOTSET"):
        return False
    k = w.shape[0]
    return dot_conv_fits(dot_form(target.current()), x.shape[1], k, *w.shape[2:], a.get("dilations", [1, 1]),
                         choose_block(k))


def _readers(graph: Graph, y: str, dtype):
    """([(conv, z)] reading y - z (or y) that would read bytes instead, [the other readers of y]),
    or None where another reader is not an elementwise op (it would need a kernel of its own
    to widen the bytes back)."""
    convs, others = [], []
    for r in graph.consumers(y):
        if _byte_conv(graph, r, 0, dtype) and r.inputs[0] == y and y not in r.inputs[1:]:
            convs.append((r, 0))
            continue
        if r.op_type not in ELEMENTWISE:
            return None
        z = scalar(graph, r.inputs[1]) if r.op_type == "Sub" and r.inputs[0] == y and r.inputs[1] != y else None
        if z is not None and z == round(z):
            x = r.outputs[0]
            cs = [c for c in graph.consumers(x) if _byte_conv(graph, c, int(z), dtype) and c.inputs[0] == x
                  and x not in c.inputs[1:]]
            rest = [c for c in graph.consumers(x) if all(c is not b for b in cs)]
            if cs and (x in graph.outputs or len(rest) > 1 or any(c.op_type not in ELEMENTWISE for c in rest)):
                # read by others too, the centering would widen the bytes back in a kernel of its own
                return None
            convs += [(c, int(z)) for c in cs]
            if cs and not rest:
                continue                    # the centering is left unread (else it joins its one reader)
        others.append(r)                    # reads Cast(q, float32) instead
    return convs, others


def _stores_bytes(graph: Graph, clip: Node) -> bool:
    """Whether the kernel computing `clip` can end in the cast to bytes: a quantized conv's epilogue
    (conv2d_int8, depthwise, expand_depthwise_int8 store bytes) or an injective kernel; not a
    pool's or a product's, whose templates store their anchor's type (a cast of its own would cost
    more than the bytes save)."""
    n = clip
    while n is not None and n.op_type in ELEMENTWISE:
        ins = [t for t in n.inputs if t and graph.value(t) is None]
        if len(ins) != 1:
            return True                     # elementwise of several tensors: an injective kernel
        n = graph.producer(ins[0])
    if n is None or _kind(n) <= Kind.INJECTIVE:
        return True
    if n.op_type != "Conv" or not n.attrs.get("exact", 0):
        return False
    g, c = int(n.attrs.get("group", 1)), graph.tensors[n.inputs[0]].shape[1]
    return g == 1 or g == c == graph.tensors[n.outputs[0]].shape[1]


_SWITCH = Switch("byte_inputs")


def disabled():
    """Compile without this pass inside the block (float32 tensors between quantized kernels, as
    before 2026-11-28): to measure what it brings (benchmarks/fusion.py --pass byte_inputs), or to
    use tuning records written before it."""
    return _SWITCH.disabled()


def byte_inputs(graph: Graph) -> Graph:
    if _SWITCH.off or dot_form(target.current()) is None:
        return graph
    for node in graph.topo():
        if node.name not in graph.nx or node.op_type not in ("Clip", "Cast"):
            continue
        y = node.outputs[0]
        if node.op_type == "Cast":          # bytes already (a model's uint8 input, widened)
            q, dtype = node.inputs[0], graph.tensors[node.inputs[0]].dtype
            if dtype not in BYTES or graph.tensors[y].dtype != np.float32:
                continue
        else:
            rng = integer_clip(graph, node)
            q, dtype = None, next((d for d in BYTES if rng is not None and np.iinfo(d).min <= rng[0]
                                   and rng[1] <= np.iinfo(d).max), None)
        found = _readers(graph, y, dtype) if dtype is not None and y not in graph.outputs else None
        if not found or not found[0]:
            continue
        convs, others = found
        if q is None:
            if not _stores_bytes(graph, node):
                continue
            shape = graph.tensors[y].shape
            q = graph.add_tensor(graph.fresh_name(f"{y}_bytes"), shape, dtype).name
            to = helper.np_dtype_to_tensor_dtype(dtype)
            graph.add_node(Node(graph.fresh_name(f"{node.name}_bytes"), "Cast", [y], [q], {"to": to}))
            for r in others:                # a cast each: it joins that reader's kernel
                f = graph.add_tensor(graph.fresh_name(f"{y}_float"), shape, graph.tensors[y].dtype).name
                graph.add_node(Node(graph.fresh_name(f"{node.name}_float"), "Cast", [q], [f], {"to": 1}))
                graph.replace_input(r, y, f)
        for c, z in convs:
            graph.replace_input(c, c.inputs[0], q)
            c.attrs["x_zero"] = z
    return graph


byte_inputs.disabled = disabled        # modelc.passes.byte_inputs names this function, not the module
