"""3-d (and 1-d) convolutions that are 2-d ones over a view of their frames (or their line).

A Conv over [N, C, D, H, W] whose window and strides span only the frames (spatial kernel 1 x 1,
spatial stride 1, no spatial padding: R(2+1)D's and S3D's temporal convs, pointwise ones) is a 2-d
conv of kernel kt x 1 over the view [N, C, D, H * W]; one whose window spans no frames (1 x kh x kw,
frame stride 1, no frame padding) is a 2-d conv of each frame, over [N * D, C, H, W] (a transpose).
The 2-d templates run in the channel-blocked layout, where a broadcast input's next channel is the
next float (and Winograd's transforms apply); the 3-d one (`conv_generic`) reads plain maps, a
channel a whole volume apart. Alone (Measurer, Intel Xeon), S3D's 7 x 1 x 1 conv over 64 x 16 x 112
x 112 ran 14.9 ms as a 2-d conv against 36.8, a 256 -> 128 pointwise one over 8 x 28 x 28 1.25 against
2.43. Each now has its input copied into the blocked layout and its output out of it (the transpose,
and whatever elementwise ops follow, in that copy's injective kernel): whole, S3D ran 0.6 and R(2+1)D
0.7 of its time. Only where the layout's blocks are whole vectors or halves (`_blocks`). A 1-d conv,
ungrouped, of a vector of input channels or more, is a 2-d conv of kernel 1 x k over [N, C, 1, L].
Any other ungrouped 3-d conv (3 x 3 x 3, R3D's 3 x 7 x 7 stem) reads, for each output frame, kt input
frames: stacked as channels (a copy of kt times the input, in the kernel that copies into the blocked
layout) they make a 2-d conv of kh x kw over [N * OD, C * kt, H, W], which Winograd takes at stride 1:
MC3-18's 3 x 3 x 3 64 -> 64 convs on 16 x 56 x 56 13.5-18.7 ms against 27-38 on `conv_generic` at
the FMA peak, the copies 2-3.6 ms each; whole, R3D-18 and MC3-18 ran 0.72-0.87 of their time.
"""
from __future__ import annotations

import numpy as np

from .. import target
from ..ir import Graph, Node

_ATTRS = {"kernel_shape", "strides", "pads", "dilations", "group"}


def _blocks(channels: int) -> bool:
    """Whether the blocked layout has whole vectors (or halves) of these channels: R(2+1)D's 45, 230,
    460 and 921 would be blocks of 1 to 4, where the 2-d template ran 30x slower than the 3-d one."""
    lanes = target.current().lanes(4)
    return channels <= lanes or channels % (lanes // 2) == 0


def _convertible(graph: Graph, node: Node) -> bool:
    """A float32 Conv of a 5-d input with constant weights (and bias) and channels in whole blocks."""
    if node.op_type != "Conv" or not set(node.attrs) <= _ATTRS or len(node.inputs) < 2:
        return False
    x, y = graph.tensors[node.inputs[0]], graph.tensors[node.outputs[0]]
    w = graph.value(node.inputs[1])
    return x.shape is not None and y.shape is not None and len(x.shape) in (3, 5) and x.dtype == np.float32 and \
        all(x.shape) and all(y.shape) and w is not None and w.ndim == len(x.shape) and \
        _blocks(x.shape[1]) and _blocks(y.shape[1]) and \
        (len(node.inputs) < 3 or not node.inputs[2] or graph.value(node.inputs[2]) is not None)


def _line(graph: Graph, node: Node) -> bool:
    """A 1-d conv of a vector of input channels or more, ungrouped: a 2-d conv of kernel 1 x k over
    [N, C, 1, L]. A dilated 256 -> 256 conv over 4,000 steps ran 0.67-0.75 of its time so, 512 -> 512
    with stride 2 0.61-0.63; a depthwise one of 31 taps (a Conformer's) 1.6x slower, and wav2vec's
    stem (one channel, 10 taps, stride 5) 1.33x (Xeon): those stay 1-d."""
    x = graph.tensors[node.inputs[0]]
    return _convertible(graph, node) and len(x.shape) == 3 and int(node.attrs["group"]) == 1 and \
        x.shape[1] >= target.current().lanes(4)


def _temporal(graph: Graph, node: Node) -> bool:
    if not _convertible(graph, node) or len(graph.tensors[node.inputs[0]].shape) != 5:
        return False
    w, a = graph.value(node.inputs[1]), node.attrs
    pads = list(a["pads"])
    return list(w.shape[3:]) == [1, 1] and list(a["strides"][1:]) == [1, 1] and \
        pads[1:3] + pads[4:6] == [0, 0, 0, 0]


def _spatial(graph: Graph, node: Node) -> bool:
    """A 1 x kh x kw conv with frame stride 1 and no frame padding: a 2-d conv of each frame."""
    if not _convertible(graph, node) or len(graph.tensors[node.inputs[0]].shape) != 5:
        return False
    w, a = graph.value(node.inputs[1]), node.attrs
    return w.shape[2] == 1 and a["strides"][0] == 1 and a["pads"][0] == 0 and a["pads"][3] == 0


def _move(graph: Graph, op: str, src: str, shape, node: Node, hint: str, dst: str | None = None) -> str:
    """A Reshape (to `shape`) or a Transpose of frames and channels, from `src` into `dst` (new if None)."""
    if dst is None:
        dst = graph.fresh_name(f"{node.outputs[0]}_{hint}")
        graph.add_tensor(dst, tuple(shape), graph.tensors[src].dtype)
    if op == "Reshape":
        ins, attrs = [src, graph.add_const(graph.fresh_name(f"{node.name}_{hint}"), np.array(shape, np.int64))], {}
    else:
        ins, attrs = [src], {"perm": [0, 2, 1, 3, 4]}
    graph.add_node(Node(graph.fresh_name(f"{node.name}_{hint}"), op, ins, [dst], attrs, node.onnx_name),
                   graph.nx.nodes[node.name]["order"])
    return dst


def _as_2d(graph: Graph, node: Node, x4: str, w4, y4_shape, attrs: dict) -> str:
    """Replace `node` by a 2-d Conv of `x4` with weights `w4`; its output (new, `y4_shape`)."""
    order = graph.nx.nodes[node.name]["order"]
    y4 = graph.fresh_name(f"{node.outputs[0]}_2d")
    graph.add_tensor(y4, tuple(y4_shape), graph.tensors[x4].dtype)
    w4 = graph.add_const(graph.fresh_name(f"{node.inputs[1]}_2d"), w4)
    a = node.attrs
    attrs["group"] = int(a["group"])
    graph.remove_node(node.name, drop_outputs=False)
    graph.add_node(Node(node.name, "Conv", [x4, w4] + list(node.inputs[2:]), [y4], attrs, node.onnx_name), order)
    return y4


def _stackable(graph: Graph, node: Node) -> bool:
    """Any other ungrouped 3-d conv whose stacked channels (C x kt) make whole blocks."""
    return _convertible(graph, node) and len(graph.tensors[node.inputs[0]].shape) == 5 and \
        int(node.attrs["group"]) == 1 and \
        _blocks(graph.tensors[node.inputs[0]].shape[1] * graph.value(node.inputs[1]).shape[2])


def _stacked(graph: Graph, node: Node):
    """The kt frames each output frame reads (frame padding and strides by a Pad and Slices), stacked
    as channels c * kt + t, then a 2-d conv of kh x kw over [N * OD, C * kt, H, W]: the weights
    [K, C, kt, kh, kw] read as [K, C * kt, kh, kw]."""
    x, y = graph.tensors[node.inputs[0]], graph.tensors[node.outputs[0]]
    n, c, d, h, w = x.shape
    _, k, od, oh, ow = y.shape
    wt, a, out = graph.value(node.inputs[1]), node.attrs, node.outputs[0]
    kt, st, dt = int(wt.shape[2]), int(a["strides"][0]), int(a["dilations"][0])
    p0, p1 = int(a["pads"][0]), int(a["pads"][3])
    order = graph.nx.nodes[node.name]["order"]

    def add(op, ins, shape, hint, attrs=None, ints=()):
        dst = graph.fresh_name(f"{out}_{hint}")
        graph.add_tensor(dst, tuple(shape), x.dtype)
        ins = list(ins) + [graph.add_const(graph.fresh_name(f"{node.name}_{hint}"), np.array(v, np.int64))
                           for v in ints]
        graph.add_node(Node(graph.fresh_name(f"{node.name}_{hint}"), op, ins, [dst], attrs or {}, node.onnx_name),
                       order)
        return dst
    src = node.inputs[0]
    if p0 or p1:
        src = add("Pad", [src], (n, c, d + p0 + p1, h, w), "padded", ints=[[0, 0, p0, 0, 0, 0, 0, p1, 0, 0]])
    taps = [add("Unsqueeze", [add("Slice", [src], (n, c, od, h, w), f"tap{t}",
                                  ints=[[t * dt], [t * dt + st * (od - 1) + 1], [2], [st]])],
                (n, c, 1, od, h, w), f"tap{t}_", ints=[[2]]) for t in range(kt)]
    cat = add("Concat", taps, (n, c, kt, od, h, w), "taps", {"axis": 2})
    tr = add("Transpose", [cat], (n, od, c, kt, h, w), "ndct", {"perm": [0, 3, 1, 2, 4, 5]})
    x4 = _move(graph, "Reshape", tr, (n * od, c * kt, h, w), node, "stacked")
    attrs = {"kernel_shape": list(wt.shape[3:]), "strides": list(a["strides"][1:]),
             "pads": list(a["pads"][1:3]) + list(a["pads"][4:6]), "dilations": list(a["dilations"][1:])}
    y4 = _as_2d(graph, node, x4, wt.reshape(k, -1, *wt.shape[3:]), (n * od, k, oh, ow), attrs)
    r = _move(graph, "Reshape", y4, (n, od, k, oh, ow), node, "ndk")
    _move(graph, "Transpose", r, None, node, "volume", dst=out)


def convs_as_2d(graph: Graph) -> Graph:
    for node in graph.topo():
        if _line(graph, node):
            n, c, length = graph.tensors[node.inputs[0]].shape
            y, wt, a, out = graph.tensors[node.outputs[0]], graph.value(node.inputs[1]), node.attrs, node.outputs[0]
            x4 = _move(graph, "Reshape", node.inputs[0], (n, c, 1, length), node, "row")
            attrs = {"kernel_shape": [1, int(wt.shape[2])], "strides": [1, int(a["strides"][0])],
                     "pads": [0, int(a["pads"][0]), 0, int(a["pads"][1])], "dilations": [1, int(a["dilations"][0])]}
            y4 = _as_2d(graph, node, x4, wt[:, :, None], (n, y.shape[1], 1, y.shape[2]), attrs)
            _move(graph, "Reshape", y4, y.shape, node, "line", dst=out)
            continue
        temporal, spatial = _temporal(graph, node), _spatial(graph, node)
        if not temporal and not spatial:
            if _stackable(graph, node):
                _stacked(graph, node)
            continue
        x, y = graph.tensors[node.inputs[0]], graph.tensors[node.outputs[0]]
        n, c, d, h, w = x.shape
        _, k, od, oh, ow = y.shape
        wt, a, out = graph.value(node.inputs[1]), node.attrs, node.outputs[0]
        if temporal:            # [N, C, D, H * W], kernel kt x 1
            x4 = _move(graph, "Reshape", node.inputs[0], (n, c, d, h * w), node, "frames")
            attrs = {"kernel_shape": [int(wt.shape[2]), 1], "strides": [int(a["strides"][0]), 1],
                     "pads": [int(a["pads"][0]), 0, int(a["pads"][3]), 0], "dilations": [int(a["dilations"][0]), 1]}
            y4 = _as_2d(graph, node, x4, wt.reshape(wt.shape[:3] + (1,)), (n, k, od, h * w), attrs)
            _move(graph, "Reshape", y4, y.shape, node, "volume", dst=out)
        else:                   # [N * D, C, H, W], each frame an image
            t = _move(graph, "Transpose", node.inputs[0], (n, d, c, h, w), node, "ndc")
            x4 = _move(graph, "Reshape", t, (n * d, c, h, w), node, "images")
            attrs = {"kernel_shape": list(wt.shape[3:]), "strides": list(a["strides"][1:]),
                     "pads": list(a["pads"][1:3]) + list(a["pads"][4:6]), "dilations": list(a["dilations"][1:])}
            y4 = _as_2d(graph, node, x4, wt[:, :, 0], (n * d, k, oh, ow), attrs)
            r = _move(graph, "Reshape", y4, (n, d, k, oh, ow), node, "ndk")
            _move(graph, "Transpose", r, None, node, "volume", dst=out)
    return graph
