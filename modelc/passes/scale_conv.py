"""A per-channel gate computed at run time, multiplied into a convolution's input, moves into the
convolution: Mul(x, s[N, C, 1, 1]) -> Conv becomes ScaledConv(x, w, b, s).

Squeeze-excitation blocks (EfficientNet, MobileNetV3, RegNetY) end in `x * sigmoid(fc(pool(x)))`
followed by a 1x1 convolution. Alone, the multiply is a kernel that reads and writes a whole
feature map at memory speed (EfficientNet-B0's 16 of them took 0.5 ms, 7% of the model, on an EPYC);
inside the convolution it is one multiply per weight vector: conv(x * s, w) = conv(x, w * s) per
input channel, so the kernel scales the weights it loads instead of the pixels. Only convolutions without
padding: a zero-padded border of x * s is zero whatever s, while 0 * (w * s) is NaN for s = inf.
"""
from __future__ import annotations

import numpy as np

from ..ir import Graph, Node
from .util import only_consumer, other_input


def _gate(graph: Graph, mul: Node, x: str) -> bool:
    """Whether Mul's other operand is a run-time [N, C, 1, 1] scale of 4-d float32 `x`."""
    s = other_input(mul, x)
    if s is None or s == x:
        return False
    xt, st = graph.tensors[x], graph.tensors[s]
    return xt.shape is not None and len(xt.shape) == 4 and xt.dtype == np.float32 and \
        st.dtype == np.float32 and not st.is_const and \
        tuple(st.shape) == (xt.shape[0], xt.shape[1], 1, 1) and \
        tuple(graph.tensors[mul.outputs[0]].shape) == tuple(xt.shape)


def scale_into_conv(graph: Graph) -> Graph:
    for mul in graph.topo():
        if mul.op_type != "Mul" or mul.name not in graph.nx or len(mul.inputs) != 2:
            continue
        conv = only_consumer(graph, mul.outputs[0])
        if conv is None or conv.op_type != "Conv" or conv.inputs[0] != mul.outputs[0] or \
                mul.outputs[0] in conv.inputs[1:] or int(conv.attrs.get("group", 1)) != 1 or \
                any(conv.attrs.get("pads", [0])) or graph.value(conv.inputs[1]) is None:
            continue
        x = next((i for i in mul.inputs if _gate(graph, mul, i)), None)
        if x is None:
            continue
        s = other_input(mul, x)
        b = conv.inputs[2] if len(conv.inputs) > 2 else ""
        order = graph.nx.nodes[conv.name]["order"]
        graph.remove_node(conv.name, drop_outputs=False)
        graph.remove_node(mul.name)
        graph.add_node(Node(conv.name, "ScaledConv", [x, conv.inputs[1], b, s], list(conv.outputs),
                            dict(conv.attrs), conv.onnx_name), order)
    return graph
