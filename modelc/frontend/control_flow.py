"""If, Loop, Scan and sequences, resolved at import: modelc compiles static graphs.

TorchScript exports keep Python's control flow as If and Loop nodes even where nothing in it
depends on the data: an If on a rank or a shape (torchvision's MViT: `if x.ndim == 4`), a Loop
over a fixed range filling a sequence that is read back element by element (MViT's pooling of
each attention head). Where the condition and the trip count are known at import (constants, or
computed from shapes), an If becomes its taken branch and a Loop its body written out once per
iteration, as TVM's and onnxruntime's graph optimisers do with constant control flow; the
sequences they build are lists of tensor names here and never reach the graph. A Scan (an RNN
cell written as a body, or ONNX's LinearAttention) runs over inputs whose length is a shape, so
it is written out once per element too. A condition, trip
count or sequence position that depends on the model's inputs is refused, naming the node.

The nodes of a branch or body are imported exactly as the graph's own (checked against their
schema, converted, shape-inferred), under fresh names, one set per inlined copy.
"""
from __future__ import annotations

import numpy as np
import onnx

from ..errors import DynamicError, ModelcError
from ..ops.params import axis_index
from .converters import converter

MAX_UNROLLED_NODES = 50_000       # nodes written out by Loops: beyond it, a loop is not "static"


def _known(ctx, node, name: str, what: str):
    v = ctx.value(name)
    if v is None:
        raise DynamicError(f"{node.where()}: its {what} ({name!r}) depends on the model's inputs; modelc "
                          "compiles static graphs (control flow and sequence positions known at import)")
    return np.asarray(v)


def _scalar(ctx, node, name: str, what: str):
    v = _known(ctx, node, name, what)
    if v.size != 1:
        raise ModelcError(f"{node.where()}: its {what} ({name!r}) has {v.size} values, expected one")
    return v.reshape(-1)[0]


def alias_output(ctx, src: str, dst: str):
    if not dst:
        return
    if src in ctx.sequences:
        ctx.sequences[dst] = list(ctx.sequences[src])
    else:
        ctx.alias(src, dst)


def _defined(g: onnx.GraphProto) -> set:
    """Names a (sub)graph defines: its inputs, initializers and node outputs, nested ones too."""
    names = {i.name for i in g.input} | {t.name for t in g.initializer}
    for n in g.node:
        names.update(o for o in n.output if o)
        for a in n.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                names |= _defined(a.g)
    return names


def _rename(g: onnx.GraphProto, mapping: dict):
    """Rename, in place, every reference to a key of `mapping` in `g` and its nested graphs."""
    for vi in list(g.input) + list(g.output):
        vi.name = mapping.get(vi.name, vi.name)
    for t in g.initializer:
        t.name = mapping.get(t.name, t.name)
    for n in g.node:
        n.input[:] = [mapping.get(x, x) if x else x for x in n.input]
        n.output[:] = [mapping.get(x, x) if x else x for x in n.output]
        for a in n.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                _rename(a.g, mapping)


def inline(ctx, node, g: onnx.GraphProto, bound: dict, tag: str) -> list:
    """Import the nodes of subgraph `g` of `node` with its inputs bound to outer tensors (or
    sequences); returns the names of its outputs. Every name `g` defines gets a fresh one."""
    if len(g.input) != len(bound):
        raise ModelcError(f"{node.where()}: its subgraph {g.name!r} takes {len(g.input)} inputs, "
                          f"{len(bound)} are given")
    mapping = {}
    for name in sorted(_defined(g)):
        mapping[name] = ctx.fresh(f"{name}{tag}")
    mapping.update({i.name: bound[i.name] for i in g.input})
    body = onnx.GraphProto()
    body.CopyFrom(g)
    _rename(body, mapping)
    for t in body.initializer:
        ctx.add_initializer(t)
    for i, n in enumerate(body.node):
        ctx.import_node(n, i)
    return [o.name for o in body.output]


@converter("If", since=1, away=True)
def if_(ctx, node):
    cond = bool(_scalar(ctx, node, node.inputs[0], "condition"))
    branch = node.attrs["then_branch" if cond else "else_branch"]
    outs = inline(ctx, node, branch, {}, f"#{node.name}")
    if len(outs) != len(node.outputs):
        raise ModelcError(f"{node.where()}: its taken branch has {len(outs)} outputs, the node {len(node.outputs)}")
    for src, dst in zip(outs, node.outputs):
        alias_output(ctx, src, dst)


@converter("Loop", since=1, away=True)
def loop(ctx, node):
    ins = node.inputs + [""] * (2 - len(node.inputs))
    trips = int(_scalar(ctx, node, ins[0], "trip count")) if ins[0] else None
    cond = bool(_scalar(ctx, node, ins[1], "condition")) if ins[1] else True
    if trips is None and not ins[1]:
        raise ModelcError(f"{node.where()} has neither a trip count nor a condition: it never ends")
    body = node.attrs["body"]
    carried = list(node.inputs[2:])
    n = len(carried)
    if len(body.output) < 1 + n:
        raise ModelcError(f"{node.where()}: its body has {len(body.output)} outputs, fewer than the "
                          f"condition and {n} loop-carried values")
    scans = [[] for _ in range(len(body.output) - 1 - n)]
    size = sum(1 for _ in all_nodes(body))
    i = 0
    while cond and (trips is None or i < trips):
        ctx.unrolled += size + 1        # (the iteration itself: a body of no nodes must end too)
        if ctx.unrolled > MAX_UNROLLED_NODES:
            raise ModelcError(f"{node.where()}: written out, its loops would exceed {MAX_UNROLLED_NODES} nodes "
                              f"(iteration {i}); modelc compiles static graphs")
        it = ctx.const(np.array(i, np.int64).reshape(_declared(body, 0)), f"{node.name}_iter{i}")
        c = ctx.const(np.array(True).reshape(_declared(body, 1)), f"{node.name}_cond{i}")
        bound = {body.input[0].name: it, body.input[1].name: c} if len(body.input) >= 2 else {}
        bound.update({b.name: v for b, v in zip(body.input[2:], carried)})
        outs = inline(ctx, node, body, bound, f"#{node.name}.{i}")
        cond = bool(_scalar(ctx, node, outs[0], "condition after an iteration"))
        carried = outs[1:1 + n]
        for s, o in zip(scans, outs[1 + n:]):
            s.append(o)
        i += 1
    for src, dst in zip(carried, node.outputs[:n]):
        alias_output(ctx, src, dst)
    axes = ctx.const(np.array([0], np.int64), f"{node.name}_axes")
    for parts, dst in zip(scans, node.outputs[n:]):
        if not dst:
            continue
        if not parts:
            raise ModelcError(f"{node.where()} runs no iteration, so its scan output {dst!r} has no shape")
        ctx.emit("Concat", [ctx.emit("Unsqueeze", [p, axes])[0] for p in parts], [dst], {"axis": 0})


@converter("Scan", since=9, away=True)
def scan(ctx, node):
    """A Scan over inputs of known length: its body written out once per element, as a Loop's is;
    the elements are Gathers along each scan axis, the scan outputs stacked back along theirs."""
    body, m = node.attrs["body"], int(node.attrs.get("num_scan_inputs", 0))
    n = len(node.inputs) - m
    if m < 1 or n < 0 or len(body.input) != n + m or len(body.output) < n:
        raise ModelcError(f"{node.where()}: {len(node.inputs)} inputs with num_scan_inputs={m} do not match its "
                          f"body's {len(body.input)} inputs and {len(body.output)} outputs")
    k = len(body.output) - n
    in_axes, in_dirs = _per(node, "scan_input_axes", m), _per(node, "scan_input_directions", m)
    out_axes, out_dirs = _per(node, "scan_output_axes", k), _per(node, "scan_output_directions", k)
    xs = node.inputs[n:]
    in_axes = [_axis(node, a, ctx.rank(x), x) for a, x in zip(in_axes, xs)]
    lengths = {ctx.shape(x)[a] for x, a in zip(xs, in_axes)}
    if len(lengths) != 1:
        raise ModelcError(f"{node.where()}: its scan inputs have different lengths {sorted(lengths)}")
    length = lengths.pop()
    size = sum(1 for _ in all_nodes(body))
    states, outs = list(node.inputs[:n]), [[] for _ in range(k)]
    for t in range(length):
        ctx.unrolled += size + 1
        if ctx.unrolled > MAX_UNROLLED_NODES:
            raise ModelcError(f"{node.where()}: written out, its loops would exceed {MAX_UNROLLED_NODES} nodes "
                              f"(element {t} of {length}); modelc compiles static graphs")
        bound = {b.name: v for b, v in zip(body.input, states)}
        for b, x, a, d in zip(body.input[n:], xs, in_axes, in_dirs):
            at = ctx.const(np.array(length - 1 - t if d else t, np.int64), f"{node.name}_at{t}")
            bound[b.name] = ctx.emit("Gather", [x, at], attrs={"axis": a})[0]
        res = inline(ctx, node, body, bound, f"#{node.name}.{t}")
        states = res[:n]
        for parts, o in zip(outs, res[n:]):
            parts.append(o)
    for src, dst in zip(states, node.outputs[:n]):
        alias_output(ctx, src, dst)
    for parts, a, d, dst in zip(outs, out_axes, out_dirs, node.outputs[n:]):
        if not dst:
            continue
        if not parts:
            raise ModelcError(f"{node.where()} scans no element, so its scan output {dst!r} has no shape")
        a = _axis(node, a, ctx.rank(parts[0]) + 1, dst)
        axes = ctx.const(np.array([a], np.int64), f"{node.name}_axes")
        ctx.emit("Concat", [ctx.emit("Unsqueeze", [p, axes])[0] for p in (parts[::-1] if d else parts)],
                 [dst], {"axis": a})


def _per(node, attr: str, count: int) -> list:
    v = [int(x) for x in node.attrs.get(attr, [0] * count)]
    if len(v) != count:
        raise ModelcError(f"{node.where()}: {attr} has {len(v)} values for {count} tensors")
    return v


def _axis(node, a: int, rank: int, name: str) -> int:
    try:
        return axis_index(a, rank)
    except ValueError as e:
        raise ModelcError(f"{node.where()}: {e} ({name!r})") from None


def _declared(body: onnx.GraphProto, k: int) -> tuple:
    """The iteration number and condition are scalars, but exporters declare them [1] in the body
    (TorchScript's): as onnxruntime does, they are given the rank the body declares."""
    if len(body.input) <= k:
        return ()
    t = body.input[k].type
    return (1,) if t.HasField("tensor_type") and t.tensor_type.HasField("shape") and \
        len(t.tensor_type.shape.dim) == 1 else ()


def all_nodes(g: onnx.GraphProto):
    """The graph's nodes and those of the subgraphs they hold (If branches, Loop bodies)."""
    for n in g.node:
        yield n
        for a in n.attribute:
            for sub in ([a.g] if a.type == onnx.AttributeProto.GRAPH else
                        list(a.graphs) if a.type == onnx.AttributeProto.GRAPHS else []):
                yield from all_nodes(sub)


# ---- sequences: lists of tensor names ------------------------------------------------------------

def _seq(ctx, node, k: int = 0) -> list:
    name = node.inputs[k]
    if name not in ctx.sequences:
        raise ModelcError(f"{node.where()}: input {name!r} is not a sequence")
    return list(ctx.sequences[name])


def _position(ctx, node, k: int, length: int, default: int, insert: bool = False) -> int:
    p = int(_scalar(ctx, node, node.inputs[k], "position")) if len(node.inputs) > k and node.inputs[k] else default
    hi = length if insert else length - 1
    if not -length <= p <= hi:
        raise ModelcError(f"{node.where()}: position {p} is out of range for a sequence of {length}")
    return p + length if p < 0 else p


@converter("SequenceEmpty", since=11, away=True)
def sequence_empty(ctx, node):
    ctx.sequences[node.outputs[0]] = []


@converter("SequenceConstruct", since=11, away=True)
def sequence_construct(ctx, node):
    ctx.sequences[node.outputs[0]] = list(node.inputs)


@converter("SequenceInsert", since=11, away=True)
def sequence_insert(ctx, node):
    seq = _seq(ctx, node)
    seq.insert(_position(ctx, node, 2, len(seq), len(seq), insert=True), node.inputs[1])
    ctx.sequences[node.outputs[0]] = seq


@converter("SequenceErase", since=11, away=True)
def sequence_erase(ctx, node):
    seq = _seq(ctx, node)
    if not seq:
        raise ModelcError(f"{node.where()} erases from an empty sequence")
    del seq[_position(ctx, node, 1, len(seq), len(seq) - 1)]
    ctx.sequences[node.outputs[0]] = seq


@converter("SequenceAt", since=11, away=True)
def sequence_at(ctx, node):
    seq = _seq(ctx, node)
    ctx.alias(seq[_position(ctx, node, 1, len(seq), 0)], node.outputs[0])


@converter("SequenceLength", since=11, away=True)
def sequence_length(ctx, node):
    ctx.graph.add_const(node.outputs[0], np.array(len(_seq(ctx, node)), np.int64))


@converter("ConcatFromSequence", since=11, away=True)
def concat_from_sequence(ctx, node):
    seq = _seq(ctx, node)
    if not seq:
        raise ModelcError(f"{node.where()} concatenates an empty sequence")
    axis = node.attrs["axis"]
    if node.attrs.get("new_axis", 0):
        axes = ctx.const(np.array([axis], np.int64), f"{node.name}_axes")
        seq = [ctx.emit("Unsqueeze", [t, axes])[0] for t in seq]
    ctx.emit("Concat", seq, node.outputs, {"axis": axis})


@converter("SplitToSequence", since=11, away=True)
def split_to_sequence(ctx, node):
    x = node.inputs[0]
    shape = ctx.shape(x)
    axis = node.attrs.get("axis", 0)
    if not -len(shape) <= axis < len(shape):
        raise ModelcError(f"{node.where()}: axis {axis} is out of range for rank {len(shape)}")
    axis %= len(shape)
    d = shape[axis]
    split = _known(ctx, node, node.inputs[1], "split").astype(np.int64) \
        if len(node.inputs) > 1 and node.inputs[1] else None
    if split is None:
        sizes = [1] * d
    elif split.ndim == 0:
        if split <= 0:
            raise ModelcError(f"{node.where()}: split {int(split)} must be positive")
        sizes = [min(int(split), d - k) for k in range(0, d, int(split))]
    else:
        sizes = split.tolist()
        if sum(sizes) != d or any(s < 0 for s in sizes):
            raise ModelcError(f"{node.where()}: split {sizes} does not add up to the axis's {d}")
    squeeze = split is None and not node.attrs.get("keepdims", 1)
    ax = ctx.const(np.array([axis], np.int64), f"{node.name}_axes")
    parts, start = [], 0
    for s in sizes:
        b = ctx.const(np.array([start], np.int64), f"{node.name}_starts")
        e = ctx.const(np.array([start + s], np.int64), f"{node.name}_ends")
        t = ctx.emit("Slice", [x, b, e, ax])[0]
        parts.append(ctx.emit("Squeeze", [t, ax])[0] if squeeze else t)
        start += s
    ctx.sequences[node.outputs[0]] = parts
