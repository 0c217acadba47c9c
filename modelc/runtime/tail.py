"""The data-dependent tail of a model, run by ONNX's reference evaluator.

A detection network ends in box filtering: NonZero over the scores, NonMaxSuppression, a TopK of as
many boxes as are left, an If on whether any is. The number of boxes is known only while the model
runs, so no kernel can be generated for these nodes or for anything that reads their results. The
importer (frontend/tail.py) compiles everything before them and keeps these nodes as they are in the
model: a plain ONNX graph whose inputs are the compiled part's results. It runs on
`onnx.reference.ReferenceEvaluator` (ONNX's own executable definition of every op), with modelc's
versions of the ops its Python loops make slow here (FAST_OPS: NonMaxSuppression and RoiAlign by
numba, TopK, GatherND, ScatterElements, Conv on modelc's numpy ops). The backbone, where the time
goes, runs compiled; the tail is the boxes' bookkeeping.

A tail may come from a saved module: it is checked (ONNX's own ops on tensors only) and its evaluator
built before it is run, and each thread runs its own evaluator.
"""
from __future__ import annotations

import functools
import threading

import numpy as np
import onnx
from onnx import helper
from onnx.reference import ReferenceEvaluator
from onnx.reference.op_run import OpRun
from onnx.reference.ops.op_loop import Loop as _ReferenceLoop

from ..errors import ModelcError, UnsupportedOpError
from ..memory import OutOfMemoryError
from ..ops.conv import conv, conv_transpose
from ..ops.gather import gather_nd, scatter_elements, topk
from ..schema import DocumentError

DOMAINS = ("", "ai.onnx")


class NonMaxSuppression(OpRun):
    """ONNX's greedy selection as onnxruntime computes it (each candidate, best score first and the
    lower index among equal scores, against the boxes selected so far, in the boxes' precision),
    compiled once by numba: in Python, SSDlite's 27,000 candidates took seconds."""

    def _run(self, boxes, scores, max_output_boxes_per_class=None, iou_threshold=None,
             score_threshold=None, center_point_box=None):
        limit = int(_scalar(max_output_boxes_per_class, 0))
        if limit <= 0 or boxes.size == 0:
            return (np.empty((0, 3), np.int64),)
        center = center_point_box if center_point_box is not None else self.center_point_box
        boxes = np.ascontiguousarray(boxes)
        dt = boxes.dtype.type
        if center:
            half = boxes[..., 2:4] / dt(2)
            lo, hi = boxes[..., 0:2] - half, boxes[..., 0:2] + half
        else:
            a, b = boxes[..., 0:2], boxes[..., 2:4]
            lo, hi = np.minimum(a, b), np.maximum(a, b)
        areas = (hi[..., 0] - lo[..., 0]) * (hi[..., 1] - lo[..., 1])
        iou = dt(_scalar(iou_threshold, 0.0))
        threshold = _scalar(score_threshold, None)
        if threshold is not None:
            threshold = scores.dtype.type(threshold)
        found = []
        for b in range(scores.shape[0]):
            lo_b, hi_b, areas_b = (np.ascontiguousarray(v[b]) for v in (lo, hi, areas))
            for c in range(scores.shape[1]):
                s = scores[b, c]
                cand = np.flatnonzero(s > threshold) if threshold is not None else np.arange(s.shape[0])
                order = cand[np.argsort(-s[cand], kind="stable")]
                picked = _select()(lo_b, hi_b, areas_b, order, limit, iou)
                if picked.size:
                    found.append(np.stack([np.full(picked.size, b), np.full(picked.size, c), picked], axis=1))
        return (np.concatenate(found).astype(np.int64) if found else np.empty((0, 3), np.int64),)


def _scalar(x, default):
    return np.asarray(x).reshape(-1)[0] if x is not None and np.asarray(x).size else default


@functools.cache
def _select():
    """The selection loop, compiled on first use (about a second, once per process). Selected boxes
    are kept in buckets along x as wide as the widest candidate, so a candidate is compared only
    with the selected boxes that can overlap it (torchvision offsets each class's boxes apart to run
    all classes as one: SSDlite's 5,760 selected boxes of 27,000 candidates); the buckets only skip
    pairs whose intersection is empty, so the selection is the same."""
    import numba

    @numba.njit(nogil=True, cache=False)
    def select(lo, hi, areas, order, limit, iou):
        n_all = order.size
        picked = np.empty(min(limit, n_all), np.int64)
        start, end, wide = np.inf, -np.inf, 0.0
        for i in range(n_all):
            j = order[i]
            start = min(start, float(lo[j, 1]))
            end = max(end, float(hi[j, 1]))
            wide = max(wide, float(hi[j, 1]) - float(lo[j, 1]))
        nb = 1
        width = 1.0
        if np.isfinite(start) and np.isfinite(end) and np.isfinite(wide) and end > start:
            width = max(wide, (end - start) / 4096.0, 1e-30)
            nb = min(int((end - start) / width) + 1, 4097)
        first = np.full(nb, -1, np.int64)
        after = np.empty(picked.size, np.int64)
        n = 0
        for i in range(n_all):
            if n >= limit:
                break
            j = order[i]
            b0, b1 = 0, nb - 1
            if nb > 1:
                b0 = max(int((float(lo[j, 1]) - width - start) / width) - 1, 0)
                b1 = min(int((float(hi[j, 1]) - start) / width) + 1, nb - 1)
            keep = True
            for bucket in range(b0, b1 + 1):
                q = first[bucket]
                while q >= 0 and keep:
                    k = picked[q]
                    q = after[q]
                    x0 = max(lo[j, 1], lo[k, 1])
                    x1 = min(hi[j, 1], hi[k, 1])
                    if x1 <= x0:
                        continue
                    y0 = max(lo[j, 0], lo[k, 0])
                    y1 = min(hi[j, 0], hi[k, 0])
                    if y1 <= y0:
                        continue
                    inter = (x1 - x0) * (y1 - y0)
                    if inter <= 0 or areas[j] <= 0 or areas[k] <= 0:
                        continue
                    union = areas[j] + areas[k] - inter
                    if union > 0 and inter / union > iou:
                        keep = False
                if not keep:
                    break
            if keep:
                picked[n] = j
                bucket = 0
                if nb > 1:
                    bucket = min(max(int((float(lo[j, 1]) - start) / width), 0), nb - 1)
                after[n] = first[bucket]
                first[bucket] = n
                n += 1
        return picked[:n]
    return select


class GatherND(OpRun):
    """modelc's own (one numpy index) for the reference's Python loop over the index tuples."""

    def _run(self, data, indices, batch_dims=None):
        return (gather_nd(data, indices, batch_dims=int(batch_dims if batch_dims is not None
                                                        else self.batch_dims or 0)),)


class RoiAlign(OpRun):
    """onnxruntime's RoiAlign (its sample points, clamping and float32 arithmetic, its max mode),
    compiled once by numba over a channels-last copy of the map, so each sample's four corners are
    read as vectors of channels (the reference's Python loops took 0.5 ms a region)."""

    def _run(self, X, rois, batch_indices, coordinate_transformation_mode=None, mode=None,
             output_height=None, output_width=None, sampling_ratio=None, spatial_scale=None):
        mode = mode or self.mode
        # before opset 16 RoiAlign had no such attribute and did not shift by half a pixel
        modern = self.run_params.get("opsets", {}).get("", 16) >= 16
        half = modern and (coordinate_transformation_mode or self.coordinate_transformation_mode) == "half_pixel"
        oh, ow = int(output_height or self.output_height), int(output_width or self.output_width)
        ratio = int(sampling_ratio if sampling_ratio is not None else self.sampling_ratio)
        scale = spatial_scale if spatial_scale is not None else self.spatial_scale
        dt = X.dtype.type
        n, c = rois.shape[0], X.shape[1]
        if n == 0 or c == 0:
            return (np.zeros((n, c, oh, ow), X.dtype),)
        batch = np.asarray(batch_indices, np.int64).reshape(-1)
        if batch.size != n or batch.min() < 0 or batch.max() >= X.shape[0]:
            raise ValueError(f"batch_indices {batch.tolist()[:8]} do not name images of X {list(X.shape)}")
        maps = np.ascontiguousarray(X.transpose(0, 2, 3, 1))
        out = np.empty((n, oh, ow, c), X.dtype)
        _roi_align()(maps, np.ascontiguousarray(rois, X.dtype), batch, out, dt(scale),
                     dt(0.5 if half else 0.0), not half, ratio, mode == "max")
        return (out.transpose(0, 3, 1, 2).copy(),)


@functools.cache
def _roi_align():
    import numba

    @numba.njit(nogil=True, cache=False)
    def roi_align(maps, rois, batch, out, scale, offset, at_least_one, ratio, use_max):
        n, oh, ow, c = out.shape
        h, w = maps.shape[1], maps.shape[2]
        one, zero = scale / scale, scale - scale
        half = one / (one + one)
        acc = np.empty(c, maps.dtype)
        for r in range(n):
            img = maps[batch[r]]
            x0 = rois[r, 0] * scale - offset
            y0 = rois[r, 1] * scale - offset
            rw = rois[r, 2] * scale - offset - x0
            rh = rois[r, 3] * scale - offset - y0
            if at_least_one:
                rw = max(rw, one)
                rh = max(rh, one)
            bh = rh / (one * oh)
            bw = rw / (one * ow)
            gh = ratio if ratio > 0 else int(np.ceil(rh / (one * oh)))
            gw = ratio if ratio > 0 else int(np.ceil(rw / (one * ow)))
            count = one * max(gh * gw, 1)
            for ph in range(oh):
                for pw in range(ow):
                    for k in range(c):
                        acc[k] = -np.inf if use_max else zero
                    for iy in range(gh):
                        y = y0 + (one * ph) * bh + (one * iy + half) * bh / (one * gh)
                        for ix in range(gw):
                            x = x0 + (one * pw) * bw + (one * ix + half) * bw / (one * gw)
                            if y < -one or y > one * h or x < -one or x > one * w:
                                if use_max:
                                    for k in range(c):
                                        acc[k] = max(acc[k], zero)
                                continue
                            yy = max(y, zero)
                            xx = max(x, zero)
                            yl = int(yy)
                            xl = int(xx)
                            if yl >= h - 1:
                                yl = yh = h - 1
                                yy = one * yl
                            else:
                                yh = yl + 1
                            if xl >= w - 1:
                                xl = xh = w - 1
                                xx = one * xl
                            else:
                                xh = xl + 1
                            ly = yy - yl
                            lx = xx - xl
                            hy = one - ly
                            hx = one - lx
                            w1, w2, w3, w4 = hy * hx, hy * lx, ly * hx, ly * lx
                            if use_max:
                                for k in range(c):
                                    acc[k] = max(acc[k], max(max(max(w1 * img[yl, xl, k], w2 * img[yl, xh, k]),
                                                                 w3 * img[yh, xl, k]), w4 * img[yh, xh, k]))
                            else:
                                for k in range(c):
                                    acc[k] += (w1 * img[yl, xl, k] + w2 * img[yl, xh, k] +
                                               w3 * img[yh, xl, k] + w4 * img[yh, xh, k])
                    for k in range(c):
                        out[r, ph, pw, k] = acc[k] if use_max else acc[k] / count
    return roi_align


class Flatten(OpRun):
    """ONNX's reference reshapes to (rows, -1), which numpy refuses when no box is left (rows 0)."""

    def _run(self, x, axis=None):
        axis = int(axis if axis is not None else self.axis)
        axis = axis + x.ndim if axis < 0 else axis
        return (x.reshape(int(np.prod(x.shape[:axis], dtype=np.int64)),
                          int(np.prod(x.shape[axis:], dtype=np.int64))),)


class ScatterElements(OpRun):
    """modelc's own (one numpy index) for the reference's loop over every element. Where the indices
    only vary along the axis, as torchvision's MultiScaleRoIAlign writes each level's regions back
    in place, whole slices are copied (Faster R-CNN: 19 ms -> 1 ms a run)."""

    def _run(self, data, indices, updates, axis=None, reduction=None):
        axis = int(axis if axis is not None else self.axis)
        reduction = reduction or getattr(self, "reduction", None) or "none"
        a = axis + data.ndim if axis < 0 else axis
        if reduction == "none" and indices.shape == updates.shape == data.shape[:a] + indices.shape[a:a + 1] + \
                data.shape[a + 1:] and data.ndim > 1:
            rows = indices[tuple(slice(None) if j == a else slice(0, 1) for j in range(indices.ndim))]
            if np.array_equal(np.broadcast_to(rows, indices.shape), indices):
                rows = rows.reshape(-1).astype(np.int64)
                if rows.size and (rows.min() < -data.shape[a] or rows.max() >= data.shape[a]):
                    raise ValueError(f"index out of bounds for axis {a} of size {data.shape[a]}")
                out = data.copy()
                np.moveaxis(out, a, 0)[rows] = np.moveaxis(updates, a, 0)
                return (out,)
        return (scatter_elements(data, indices, updates, axis=axis, reduction=reduction),)


class _ModelcOp(OpRun):
    """An op run by modelc's own numpy implementation (ops/), with the node's ONNX attributes."""
    fn = None

    def _run(self, *inputs, **_):
        attrs = getattr(self, "_attrs", None)
        if attrs is None:
            attrs = self._attrs = {a.name: _attr(a) for a in self.onnx_node.attribute}
        out = type(self).fn(*inputs, **attrs)
        return out if isinstance(out, tuple) else (out,)


def _attr(a):
    v = helper.get_attribute_value(a)
    return v.decode() if isinstance(v, bytes) else list(v) if isinstance(v, (list, tuple)) else v


class Conv(_ModelcOp):
    """im2col and one matmul: a Mask R-CNN's mask head convolves every detected box's features,
    which the reference's loops would take minutes for."""
    fn = staticmethod(conv)


class ConvTranspose(_ModelcOp):
    """As Conv (and the reference's fails on an empty batch: no box detected)."""
    fn = staticmethod(conv_transpose)


class TopK(_ModelcOp):
    """A partition instead of the reference's sort of everything (RetinaNet: 98 ms -> a few)."""
    fn = staticmethod(topk)


class Loop(_ReferenceLoop):
    """The reference stacks each iteration's scan outputs with vstack, which turns a scalar's into a
    column ([n, 1] where ONNX says [n]): they are stacked again from the iterations' values."""

    def __init__(self, onnx_node, run_params):
        super().__init__(onnx_node, run_params)
        body = self._run_body      # set per instance, from the body attribute

        def recorded(*args, **kwargs):
            outs = body(*args, **kwargs)
            if self.K:
                self._scans.append([np.asarray(o) for o in outs[-self.K:]])
            return outs
        self._run_body = recorded

    def _run(self, M, cond, *args, **kwargs):
        if cond is None:            # an omitted condition is true (the reference runs no iteration)
            cond = np.array(True)
        if (M is not None and int(_scalar(M, 0)) <= 0) or not bool(_scalar(cond, True)):
            # no iteration: the loop-carried values as given, empty scan outputs (the reference's
            # vstack of nothing fails)
            scans = [np.empty((0,), _elem_dtype(o) or np.float32) for o in self.body.onnx_graph_.output[1 + self.N:]]
            return tuple(list(args[:self.N]) + scans)
        self._scans = []
        res = list(super()._run(M, cond, *args, **kwargs))
        if self._scans:
            for k in range(self.K):
                res[self.N + k] = np.stack([it[k] for it in self._scans])
        self._scans = []
        return tuple(res)


FAST_OPS = [NonMaxSuppression, GatherND, RoiAlign, Flatten, ScatterElements, Loop, Conv, ConvTranspose, TopK]
for _cls in FAST_OPS:
    _cls.op_domain = ""


class Tail:
    """An ONNX graph of the model's last nodes, run on the compiled part's results."""

    def __init__(self, model: onnx.ModelProto | bytes, where: str = "the data-dependent tail"):
        if isinstance(model, (bytes, bytearray)):
            try:
                model = onnx.load_from_string(bytes(model))
            except Exception as e:
                raise DocumentError(f"{where} is not an ONNX model: {e}") from None
        self.model, self.where = model, where
        _check(model, where)
        self.inputs = [i.name for i in model.graph.input]
        self.outputs = [o.name for o in model.graph.output]
        self.dtypes = {o.name: _elem_dtype(o) for o in model.graph.output}
        self.node_count = len(model.graph.node)
        self.starts: list = []      # (node, why) where the importer began it, for reports
        self._local = threading.local()
        self._evaluator()          # built once here: an op the evaluator lacks fails now, not mid-run

    def bytes(self) -> bytes:
        return self.model.SerializeToString()

    def interface(self) -> dict:
        """What a module's program says of its tail (and checks a saved tail against)."""
        return {"inputs": list(self.inputs),
                "outputs": [{"name": n, "dtype": d.name if d is not None else None} for n, d in self.dtypes.items()]}

    def _evaluator(self) -> ReferenceEvaluator:
        ev = getattr(self._local, "ev", None)
        if ev is None:
            try:
                ev = ReferenceEvaluator(self.model, new_ops=FAST_OPS)
            except Exception as e:
                raise ModelcError(f"{self.where}: ONNX's reference evaluator cannot run it: "
                                  f"{type(e).__name__}: {e}") from None
            self._local.ev = ev
        return ev

    def run(self, values: dict) -> dict:
        """The tail's outputs, {name: array}, from `values` of its inputs."""
        ev = self._evaluator()
        try:
            with np.errstate(all="ignore"):     # overflow to inf is IEEE's answer, as in the kernels
                got = ev.run(None, {n: values[n] for n in self.inputs})
        except MemoryError:
            raise OutOfMemoryError(f"{self.where} ran out of memory (a shape its data decided)") from None
        except ModelcError:
            raise
        except Exception as e:
            raise ModelcError(f"{self.where} failed in ONNX's reference evaluator: "
                              f"{type(e).__name__}: {e}") from None
        out = {}
        for name, v in zip(self.outputs, got):
            v = np.asarray(v)
            want = self.dtypes[name]
            if want is not None and v.dtype != want:
                raise ModelcError(f"{self.where}: output {name!r} came out as {v.dtype}, the model "
                                  f"declares {want}")
            out[name] = v
        return out


def _elem_dtype(vi):
    et = vi.type.tensor_type.elem_type if vi.type.HasField("tensor_type") else 0
    return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(et)) if et else None


def _check(model: onnx.ModelProto, where: str):
    """A tail is data: ONNX's own ops on tensors (the evaluator, built next, refuses a malformed
    graph; onnx's checker, advice only for models, is advice only here too)."""
    if any(f for f in model.functions):
        raise DocumentError(f"{where} holds local functions; a tail holds plain nodes")
    for imp in model.opset_import:
        if imp.domain not in DOMAINS:
            raise DocumentError(f"{where} imports domain {imp.domain!r}; a tail runs ONNX's own ops only")
    from ..frontend.control_flow import all_nodes
    others = {}
    for i, n in enumerate(all_nodes(model.graph)):
        if n.domain not in DOMAINS:
            others.setdefault(f"{n.domain}.{n.op_type}", []).append(n.name or f"#{i}")
    if others:
        raise UnsupportedOpError(others)
    for vi in list(model.graph.input) + list(model.graph.output):
        if vi.type.WhichOneof("value") not in (None, "tensor_type"):
            raise DocumentError(f"{where}: {vi.name!r} is not a tensor")
