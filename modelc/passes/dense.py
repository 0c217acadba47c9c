"""MatMul and Gemm with constant weights become Dense(x, w[K, N], bias[N]), absorbing a bias Add.

One canonical form means one kernel template and one workload key for a fully connected layer,
whether it was exported as Gemm(transB=1) (torchvision's classifier), MatMul + Add (transformers),
Gemm with alpha/beta, or a convolution whose window is its whole unpadded input: the squeeze-and-
excitation blocks' 1x1 convs on 1x1 maps (EfficientNet, MobileNetV3, RegNetY) and old zoo models'
fully connected layers written as convs. conv2d ran those as one pixel's reduction over all input
channels (EfficientNet-B3's 2304 -> 96: 0.176 ms, onnxruntime 0.034); the dense template, 0.009.
"""
from __future__ import annotations

import numpy as np

from ..ir import Graph, Node
from ..ops.registry import REGISTRY, Kind
from .util import only_consumer, other_input


def _replace(graph: Graph, old: Node, new: Node):
    order = graph.nx.nodes[old.name]["order"]
    graph.remove_node(old.name, drop_outputs=False)
    graph.add_node(new, order)


def _gemm_is_dense(graph: Graph, node: Node) -> bool:
    """A Gemm with constant B, no transA, and a bias C of one row at most."""
    a = node.attrs
    b = graph.value(node.inputs[1])
    if b is None or b.ndim != 2 or a.get("transA", 0):
        return False
    n = b.shape[0] if a.get("transB", 0) else b.shape[1]
    if len(node.inputs) > 2 and node.inputs[2]:
        c = graph.value(node.inputs[2])
        if c is None or c.size != n or (c.ndim == 2 and c.shape[0] != 1):
            return False
    return True


def _to_dense(graph: Graph, node: Node) -> Node | None:
    if node.op_type == "MatMul":
        w = graph.value(node.inputs[1])
        if w is None or w.ndim != 2 or len(graph.tensors[node.inputs[0]].shape) < 2:
            return None
        return Node(node.name, "Dense", [node.inputs[0], node.inputs[1]], list(node.outputs), _quantized(node),
                    node.onnx_name)
    if node.op_type == "Gemm" and _gemm_is_dense(graph, node):
        a = node.attrs
        b = graph.value(node.inputs[1])
        n = b.shape[0] if a.get("transB", 0) else b.shape[1]
        bias = None
        if len(node.inputs) > 2 and node.inputs[2]:
            c = graph.value(node.inputs[2])
            bias = c.reshape(n).astype(np.float64) * float(a.get("beta", 1.0))
        w = (b.T if a.get("transB", 0) else b).astype(np.float64) * float(a.get("alpha", 1.0))
        dtype = b.dtype
        inputs = [node.inputs[0], graph.add_const(graph.fresh_name(f"{node.name}_w"),
                                                  np.ascontiguousarray(w.astype(dtype)))]
        if bias is not None:
            inputs.append(graph.add_const(graph.fresh_name(f"{node.name}_b"), bias.astype(dtype)))
        notes = _quantized(node) if float(a.get("alpha", 1.0)) == 1.0 else {}    # alpha scales the integers
        return Node(node.name, "Dense", inputs, list(node.outputs), notes, node.onnx_name)
    return None


def _quantized(node: Node) -> dict:
    """The quantized product's notes (`exact`, `x_min`: ops/conv.py) the Dense keeps."""
    return {k: node.attrs[k] for k in ("exact", "x_min") if k in node.attrs}


def _absorb_bias(graph: Graph, dense: Node):
    y = dense.outputs[0]
    add = only_consumer(graph, y)
    if add is None or add.op_type != "Add" or len(dense.inputs) > 2:
        return
    c_name = other_input(add, y)
    c = graph.value(c_name) if c_name else None
    n = graph.tensors[dense.inputs[1]].shape[1]
    if c is None or c.size != n or c.shape[-1] != n or c.ndim > len(graph.tensors[y].shape):
        return
    bias = graph.add_const(graph.fresh_name(f"{dense.name}_bias"), c.reshape(n))
    graph.remove_node(add.name, drop_outputs=False)
    new = Node(dense.name, "Dense", dense.inputs + [bias], [add.outputs[0]], dict(dense.attrs), dense.onnx_name)
    graph.tensors.pop(y)
    _replace(graph, dense, new)


def _decompose_gemm(graph: Graph, node: Node):
    """alpha * A' @ B' + beta * C as Transpose / MatMul / Mul / Add, for the Gemms that are not a
    dense layer (B computed, transA, C a full matrix): the parts have kernels, Gemm as such has none."""
    x, b = node.inputs[0], node.inputs[1]
    c = node.inputs[2] if len(node.inputs) > 2 and node.inputs[2] else None
    dt = graph.tensors[x].dtype
    if dt.kind != "f" or len(graph.tensors[x].shape) != 2 or len(graph.tensors[b].shape) != 2:
        return
    a = node.attrs
    order = graph.nx.nodes[node.name]["order"]
    new = []

    def emit(op, inputs, shape, attrs=None, out=None):
        name = out or graph.fresh_name(f"{node.name}_{op.lower()}")
        if out is None:
            graph.add_tensor(name, tuple(shape), dt)
        new.append(Node(graph.fresh_name(f"{node.name}_{op.lower()}"), op, inputs, [name], attrs or {},
                        node.onnx_name))
        return name

    def scalar(v):
        return graph.add_const(graph.fresh_name(f"{node.name}_scale"), np.array(v, dt))

    def operand(t, trans):
        if not trans:
            return t
        shape = graph.tensors[t].shape[::-1]
        v = graph.value(t)
        if v is not None:
            return graph.add_const(graph.fresh_name(f"{t}_t"), np.ascontiguousarray(v.T))
        return emit("Transpose", [t], shape, {"perm": [1, 0]})

    xa, bb = operand(x, a.get("transA", 0)), operand(b, a.get("transB", 0))
    out = node.outputs[0]
    shape = graph.tensors[out].shape
    alpha, beta = float(a.get("alpha", 1.0)), float(a.get("beta", 1.0))
    last = c is None or beta == 0.0
    y = emit("MatMul", [xa, bb], shape, out=out if last and alpha == 1.0 else None)
    if alpha != 1.0:
        y = emit("Mul", [y, scalar(alpha)], shape, out=out if last else None)
    if not last:
        cv = graph.value(c)
        if beta != 1.0:
            c = graph.add_const(graph.fresh_name(f"{c}_beta"), (cv * beta).astype(dt)) if cv is not None \
                else emit("Mul", [c, scalar(beta)], graph.tensors[c].shape)
        emit("Add", [y, c], shape, out=out)
    graph.remove_node(node.name, drop_outputs=False)
    for n in new:
        graph.add_node(n, order)


def _conv_as_dense(graph: Graph, node: Node):
    """Conv(x[N, C, *S], w[K, C, *S]) without groups or pads, its output one pixel:
    Reshape(x, [N, C * prod(S)]) -> Dense -> Reshape([N, K, 1, ...])."""
    a = node.attrs
    x, out = node.inputs[0], node.outputs[0]
    w = graph.value(node.inputs[1])
    xs, ys = graph.tensors[x].shape, graph.tensors[out].shape
    if w is None or a.get("group", 1) != 1 or any(a.get("pads", [0])) or a.get("auto_pad", "NOTSET") != "NOTSET" \
            or len(xs) < 3 or tuple(w.shape[2:]) != tuple(xs[2:]) or any(d != 1 for d in ys[2:]) \
            or graph.tensors[x].dtype != np.float32 or w.shape[1] != xs[1]:
        return
    bias = node.inputs[2] if len(node.inputs) > 2 and node.inputs[2] else ""
    if bias and graph.value(bias) is None:
        return
    n, k, flat = xs[0], w.shape[0], int(np.prod(xs[1:]))
    dt = graph.tensors[x].dtype
    order = graph.nx.nodes[node.name]["order"]

    def shape_const(v):
        return graph.add_const(graph.fresh_name(f"{node.name}_shape"), np.array(v, np.int64))
    y2 = graph.fresh_name(f"{node.name}_dense")
    graph.add_tensor(y2, (n, k), dt)
    wk = graph.add_const(graph.fresh_name(f"{node.name}_w"), np.ascontiguousarray(w.reshape(k, flat).T))
    new = []
    src = graph.producer(x)
    if src is not None and src.op_type == "Reshape" and graph.tensors[src.inputs[0]].shape == (n, flat):
        x2 = src.inputs[0]             # the last one's [N, K] (two SE convs in a row): no reshapes between
    else:
        x2 = graph.fresh_name(f"{node.name}_flat")
        graph.add_tensor(x2, (n, flat), dt)
        new.append(Node(graph.fresh_name(f"{node.name}_flatten"), "Reshape", [x, shape_const([n, flat])], [x2], {},
                        node.onnx_name))
    new += [Node(node.name, "Dense", [x2, wk] + ([bias] if bias else []), [y2], _quantized(node), node.onnx_name),
           Node(graph.fresh_name(f"{node.name}_unflatten"), "Reshape", [y2, shape_const(list(ys))], [out], {},
                node.onnx_name)]
    # the activations after it run on [N, K], before the shape is restored, so that they stay the
    # dense kernel's epilogue (a Reshape in between would leave each a kernel of its own)
    as_rows = {out: y2}                # 4-d tensor -> its [N, K] form
    chain = _pointwise_chain(graph, out)
    for t in [out] + [op.outputs[0] for op in chain]:
        live = _live_readers(graph, t)
        for r in graph.consumers(t):   # dead readers (left by pattern recognition) go now
            if r not in live:
                graph.remove_node(r.name)
    for op in chain:
        graph.remove_node(op.name, drop_outputs=False)
        y = graph.fresh_name(f"{op.name}_flat")
        graph.add_tensor(y, (n, k), graph.tensors[op.outputs[0]].dtype)
        new.insert(-1, Node(op.name, op.op_type, [as_rows.get(i, i) for i in op.inputs], [y], dict(op.attrs),
                            op.onnx_name))
        out = op.outputs[0]
        as_rows[out] = y
    new[-1].inputs[0], new[-1].outputs[0] = as_rows[out], out
    graph.remove_node(node.name, drop_outputs=False)
    for m in new:
        graph.add_node(m, order)


def _pointwise_chain(graph: Graph, t: str) -> list:
    """The elementwise ops reading `t` one after another (each the only reader of the last, or x *
    sigmoid(x), as TorchScript writes SiLU), whose other operands are single constants: they
    commute with a reshape."""
    chain = []
    while True:
        readers = _live_readers(graph, t)
        op = readers[0] if len(readers) == 1 else None
        if op is None:
            pair = _silu(graph, t)
            if pair is None:
                return chain
            chain += pair
            t = pair[1].outputs[0]
            continue
        if not _pointwise(graph, op, t):
            return chain
        chain.append(op)
        t = op.outputs[0]


def _live_readers(graph: Graph, t: str) -> list:
    """Nodes reading `t` whose results are used (a recognised pattern leaves its old ops to the
    dead-code pass, which runs later), none if `t` is a graph output."""
    if t in graph.outputs:
        return []
    return [r for r in graph.consumers(t)
            if any(o in graph.outputs or graph.consumers(o) for o in r.outputs if o)]


def _pointwise(graph: Graph, op: Node, t: str, inner: tuple = ()) -> bool:
    return REGISTRY.get(op.op_type) is not None and \
        REGISTRY[op.op_type].kind in (Kind.ELEMWISE, Kind.BROADCAST) and len(op.outputs) == 1 and \
        graph.tensors[op.outputs[0]].shape == graph.tensors[t].shape and \
        all(i in (t, *inner) or not i or (graph.value(i) is not None and graph.value(i).size == 1)
            for i in op.inputs)


def _silu(graph: Graph, t: str):
    """[Sigmoid(t), Mul(t, that)] when they are t's only readers, else None."""
    if t in graph.outputs:
        return None
    readers = _live_readers(graph, t)
    if len(readers) != 2:
        return None
    sig = next((r for r in readers if r.op_type == "Sigmoid"), None)
    mul = next((r for r in readers if r.op_type == "Mul"), None)
    if sig is None or mul is None or only_consumer(graph, sig.outputs[0]) is not mul or \
            sorted(mul.inputs) != sorted([t, sig.outputs[0]]) or not _pointwise(graph, sig, t) or \
            not _pointwise(graph, mul, t, (sig.outputs[0],)):
        return None
    return [sig, mul]


def to_dense(graph: Graph) -> Graph:
    for node in graph.topo():
        if node.op_type == "Conv":
            _conv_as_dense(graph, node)
    for node in graph.topo():
        if node.op_type == "Gemm" and not _gemm_is_dense(graph, node):
            _decompose_gemm(graph, node)
    for node in graph.topo():
        dense = _to_dense(graph, node)
        if dense is not None:
            _replace(graph, node, dense)
            _absorb_bias(graph, dense)
    return graph
