"""Filter taps that only ever read padding leave the convolution.

A dilated convolution on a map smaller than its dilation (DeepLabV3's ASPP: 3x3 taps 24 and 36
pixels apart on a 14x14 map) multiplies most of its taps by the zero border for every output
pixel. Such a tap contributes nothing, so the filter is cut down to the taps that can touch the
input and the pads shrink by the taps removed: the ASPP branches become 1x1 convolutions (on an
EPYC they had run 8x onnxruntime's time, computing 9 taps and reading a 36-pixel halo). A side is
cut only as far as its pad covers, so pads stay non-negative and the output shape is unchanged.
"""
from __future__ import annotations

from ..ir import Graph
from ..kernels.conv_geometry import tap_range


def live_taps(size: int, out: int, k: int, s: int, d: int, pb: int, pe: int) -> tuple[int, int]:
    """The taps [t0, t1) of one axis worth keeping: every tap that reads the input at some output
    position, widened where cutting further would need a negative pad."""
    lo, hi = tap_range(size, k, s, d, pb, 0, out - 1)
    if hi <= lo:                     # the output is all bias: keep the filter as it is
        return 0, k
    return min(lo, pb // d), max(hi, k - pe // d)


def prune_dead_taps(graph: Graph) -> Graph:
    for node in graph.topo():
        if node.op_type != "Conv" or graph.value(node.inputs[1]) is None:
            continue
        x = graph.tensors[node.inputs[0]].shape
        y = graph.tensors[node.outputs[0]].shape
        w = graph.value(node.inputs[1])
        if x is None or y is None or len(x) < 3:
            continue
        a = node.attrs
        n = len(x) - 2
        pads, dil = list(a["pads"]), list(a["dilations"])
        if min(pads) < 0:                # (import rejects them; nothing here may make one valid)
            continue
        cuts = [live_taps(x[2 + i], y[2 + i], w.shape[2 + i], a["strides"][i], dil[i], pads[i], pads[n + i])
                for i in range(n)]
        if all((t0, t1) == (0, w.shape[2 + i]) for i, (t0, t1) in enumerate(cuts)):
            continue
        for i, (t0, t1) in enumerate(cuts):
            pads[i] -= t0 * dil[i]
            pads[n + i] -= (w.shape[2 + i] - t1) * dil[i]
            if t1 - t0 == 1:
                dil[i] = 1               # a single tap: the same key as an undilated filter
        cut = w[(slice(None), slice(None)) + tuple(slice(t0, t1) for t0, t1 in cuts)]
        new_w = graph.add_const(graph.fresh_name(f"{node.inputs[1]}_live"), cut.copy())
        graph.replace_input(node, node.inputs[1], new_w)
        a["pads"], a["dilations"] = pads, dil
        a["kernel_shape"] = list(cut.shape[2:])
    return graph
