"""The index map of an injective group: the statements computing one output element from the
group's inputs.

Like tinygrad's views, every op of the group is an index map: the output index is turned into an
index of each input by walking the group backwards (a transpose permutes it, a reshape
re-linearises it, a slice scales and shifts it, a concat or pad branches on it, a gather reads it
from another input, broadcasting zeroes it); elementwise ops combine the values read.
"""
from __future__ import annotations

import numpy as np

from ..errors import ModelcError
from .expr import SUPPORTED as ELEMENTWISE
from .expr import emit, lit
from .layout import offset, strides
from .resize_map import resize_value
from .sample_map import grid_sample_value
from .template import broadcast_index
from .workload import Workload


def pad_axes(op, in_shape, params) -> list:
    """[(crop at the start, crop at the end, pad at the start, pad at the end)] per axis."""
    a = op.args
    pads = params[a[1]].tolist()
    r = len(in_shape)
    axes = params[a[3]].tolist() if len(a) > 3 and a[3] else list(range(r))
    begin, end = [0] * r, [0] * r
    for j, ax in enumerate(axes):
        begin[ax % r], end[ax % r] = pads[j], pads[len(axes) + j]
    return [(max(-b, 0), max(-e, 0), max(b, 0), max(e, 0)) for b, e in zip(begin, end)]


def pad_folds(op, wl) -> bool:
    """Reflect/edge/wrap need something to fold into on every padded axis."""
    shape = wl.spec(op.args[0]).shape
    return all(d - lo - hi > 0 or not (pb or pe)
               for d, (lo, hi, pb, pe) in zip(shape, pad_axes(op, shape, wl.params)))


def reshape_groups(in_shape, out_shape):
    """[(input axes, output axes)]: the shortest runs of axes of equal element counts, in order
    (a reshape of [1, 197, 1, 3, 768] to [197, 1, 2304]: ([0, 1], [0]), ([2], [1]), ([3, 4], [2]));
    axes of one element left at the end join the last run. None for an empty tensor."""
    if 0 in in_shape or 0 in out_shape:
        return None
    groups, i, j = [], 0, 0
    while i < len(in_shape) and j < len(out_shape):
        gi, gj, pi, pj = [i], [j], in_shape[i], out_shape[j]
        i, j = i + 1, j + 1
        while pi != pj:
            if (i if pi < pj else j) >= len(in_shape if pi < pj else out_shape):
                return None                       # (counts that differ: not a reshape)
            if pi < pj:
                gi.append(i)
                pi *= in_shape[i]
                i += 1
            else:
                gj.append(j)
                pj *= out_shape[j]
                j += 1
        groups.append((gi, gj))
    if groups:
        groups[-1][0].extend(range(i, len(in_shape)))
        groups[-1][1].extend(range(j, len(out_shape)))
    else:
        groups = [(list(range(len(in_shape))), list(range(len(out_shape))))]
    return groups


def joined(i) -> str:
    """An index as an expression: a blocked channel index (block, lane, size) is re-joined."""
    if isinstance(i, tuple):
        blk, lane, size = i
        return f"({blk}) * {size} + {lane}"
    return str(i)


class IndexMap:
    """Emits the statements computing one output element; returns expression names."""

    def __init__(self, wl: Workload):
        self.wl = wl
        self.producer = {}
        for op in wl.ops:
            self.producer[f"v{op.index}"] = (op, 0)
            for k in range(8):
                self.producer[f"v{op.index}.{k}"] = (op, k)
        self.n = 0
        self.params_used = set()
        self.tables = {}             # generated lookup arrays (Resize taps): name -> array
        self.parts = {}              # Concat op index -> the part this loop computes (injective.py)

    def fresh(self):
        self.n += 1
        return f"t{self.n}"

    def shape(self, ref):
        return self.wl.spec(ref).shape

    def value(self, ref: str, idx: list, lines: list, ind: str, memo: dict) -> str:
        key = (ref, tuple(map(str, idx)))
        if key in memo:
            return memo[key]
        out = self._value(ref, idx, lines, ind, memo)
        memo[key] = out
        return out

    def _reshaped(self, idx, in_shape, out_shape, lines, ind) -> list:
        """The input index of a reshape's output index `idx`, group by group (`reshape_groups`):
        an axis kept whole passes through, and only a group of axes that was split or merged is
        re-linearised, by divisions within the group. Re-linearising the whole index put a
        division by 2304 on every element of ViT-B/16's QKV split (197 x 2304 -> 3 x 197 x 768:
        0.63-0.77 ms a layer, onnxruntime 0.23), where the group (3, 768) <- (2304) reads
        contiguously along the inner loop."""
        groups = reshape_groups(in_shape, out_shape)
        if groups is None:                       # an empty tensor: the whole index as one group
            groups = [(list(range(len(in_shape))), list(range(len(out_shape))))]
        sub = ["0"] * len(in_shape)
        for gi, gj in groups:
            terms = [(idx[j], s) for j, s in zip(gj, strides([out_shape[j] for j in gj])) if out_shape[j] != 1]
            dims = [k for k in gi if in_shape[k] != 1]
            if not dims:
                continue
            if len(terms) == 1 and terms[0][1] == 1:
                lin = terms[0][0]
            elif not terms:
                lin = "0"
            else:
                lin = self.fresh()
                lines.append(f"{ind}{lin} = {' + '.join(f'({i}) * {s}' if s > 1 else f'({i})' for i, s in terms)}")
            if len(dims) == 1:
                sub[dims[0]] = lin
                continue
            for n, (k, s) in enumerate(zip(dims, strides([in_shape[k] for k in dims]))):
                q = f"({lin}) // {s}" if s > 1 else f"({lin})"
                sub[k] = q if n == 0 else f"{q} % {in_shape[k]}"     # the first is below its size
        return sub

    def _value(self, ref, idx, lines, ind, memo):
        wl = self.wl
        if ref.startswith("i"):
            k = int(ref[1:])
            t = wl.inputs[k]
            return f"in{k}[np.uintp({offset(t.shape, t.layout, idx)})]"
        if ref.startswith("p"):
            v = wl.params[ref]
            if v.size == 1:
                return lit(v, v.dtype)
            self.params_used.add(ref)
            return f"{ref}[np.uintp({offset(v.shape, None, idx)})]"
        op, slot = self.producer[ref]
        out_shape = self.shape(ref)
        dtype = self.wl.spec(ref).dtype
        a = op.args
        if op.op in ELEMENTWISE:
            exprs, consts = [], {}
            for pos, arg in enumerate(a):
                if not arg:
                    exprs.append("")
                    continue
                if arg.startswith("p") and wl.params[arg].size == 1:
                    consts[pos] = wl.params[arg].reshape(())
                sub = broadcast_index(self.shape(arg), out_shape, idx)
                exprs.append(self.value(arg, sub, lines, ind, memo))
            name = self.fresh()
            arg_dtypes = [self.wl.spec(arg).dtype if arg else None for arg in a]
            lines.append(f"{ind}{name} = {emit(op.op, exprs, op.attrs, dtype, consts, arg_dtypes)}")
            return name
        if op.op == "BatchNormalization":
            return self._batchnorm(op, idx, dtype, lines, ind, memo)
        x = a[0]
        in_shape = self.shape(x)
        if op.op not in ("Transpose", "Concat"):     # these carry a split channel index along
            idx = [joined(i) for i in idx]
        if op.op in ("Reshape", "Flatten", "Squeeze", "Unsqueeze"):
            return self.value(x, self._reshaped(idx, in_shape, out_shape, lines, ind), lines, ind, memo)
        if op.op == "Transpose":
            perm = op.attrs.get("perm") or list(range(len(in_shape)))[::-1]
            sub = [None] * len(in_shape)
            for k, p in enumerate(perm):
                sub[p] = idx[k]
            return self.value(x, sub, lines, ind, memo)
        if op.op in ("Expand",):
            return self.value(x, broadcast_index(in_shape, out_shape, idx), lines, ind, memo)
        if op.op == "Tile":
            return self.value(x, [f"({i}) % {d}" for i, d in zip(idx, in_shape)], lines, ind, memo)
        if op.op == "Slice":
            starts, ends = wl.params[a[1]], wl.params[a[2]]
            axes = wl.params[a[3]] if len(a) > 3 and a[3] else np.arange(len(starts))
            steps = wl.params[a[4]] if len(a) > 4 and a[4] else np.ones(len(starts), np.int64)
            sub = list(idx)
            for s, e, ax, st in zip(starts.tolist(), ends.tolist(), axes.tolist(), steps.tolist()):
                ax = ax % len(in_shape)
                r = range(in_shape[ax])[slice(s, e, st)]
                sub[ax] = f"{r.start} + ({idx[ax]}) * {r.step}" if r.step != 1 else f"{r.start} + {idx[ax]}"
            return self.value(x, sub, lines, ind, memo)
        if op.op == "Split":
            axis = op.attrs.get("axis", 0) % len(in_shape)
            sizes = self._split_sizes(op, in_shape, axis)
            sub = list(idx)
            sub[axis] = f"{sum(sizes[:slot])} + {idx[axis]}"
            return self.value(x, sub, lines, ind, memo)
        if op.op == "Concat" and op.index in self.parts:     # the loop runs over one part's blocks
            axis = op.attrs["axis"] % len(out_shape)
            j = self.parts[op.index]
            blk, lane, b = idx[axis]
            start = sum(self.shape(arg)[axis] for arg in a[:j])
            sub = list(idx)
            sub[axis] = (f"({blk}) - {start // b}" if start else blk, lane, b)
            return self.value(a[j], sub, lines, ind, memo)
        if op.op == "Concat":
            axis = op.attrs["axis"] % len(out_shape)
            ci = idx[axis]
            sizes = [self.shape(arg)[axis] for arg in a]
            if isinstance(ci, tuple) and any(n % ci[2] for n in sizes):
                idx = list(idx)
                idx[axis] = ci = joined(ci)
            name = self.fresh()
            lines.append(f"{ind}{name} = {lit(0, dtype)}")
            start = 0
            for j, arg in enumerate(a):
                size = self.shape(arg)[axis]
                if size == 0:
                    continue
                sub = list(idx)
                if isinstance(ci, tuple):      # blocked channels, every part whole blocks
                    blk, lane, b = ci
                    cond = f"{blk} < {(start + size) // b}"
                    sub[axis] = (f"{blk} - {start // b}" if start else blk, lane, b)
                else:
                    cond = f"{ci} < {start + size}"
                    sub[axis] = f"{ci} - {start}" if start else ci
                lines.append(f"{ind}{'if' if start == 0 else 'elif'} {cond}:")
                body = []
                v = self.value(arg, sub, body, ind + "    ", {})
                lines.extend(body)
                lines.append(f"{ind}    {name} = {v}")
                start += size
            return name
        if op.op == "Pad" and op.attrs.get("mode", "constant") != "constant":
            return self._pad_mode(op, x, in_shape, idx, lines, ind, memo)
        if op.op == "Pad":
            pads = wl.params[a[1]].tolist()
            r = len(in_shape)
            axes = wl.params[a[3]].tolist() if len(a) > 3 and a[3] else list(range(r))
            begin = [0] * r
            for j, ax in enumerate(axes):
                begin[ax % r] = pads[j]
            if len(a) > 2 and a[2] and not a[2].startswith("p"):    # a run-time pad value
                cval = self.value(a[2], ["0"] * len(self.shape(a[2])), lines, ind, memo) \
                    if self.wl.spec(a[2]).size else lit(0, dtype)
            else:
                cval = lit(wl.params[a[2]].reshape(()) if len(a) > 2 and a[2] and wl.params[a[2]].size
                           else np.zeros((), dtype), dtype)
            sub = [f"{i} - {b}" if b else str(i) for i, b in zip(idx, begin)]
            conds = [f"0 <= {s} < {d}" for s, d, b, e in zip(sub, in_shape, begin, out_shape)
                     if b or e != in_shape[sub.index(s)] + b]
            name = self.fresh()
            lines.append(f"{ind}{name} = {cval}")
            lines.append(f"{ind}if {' and '.join(conds) if conds else 'True'}:")
            body = []
            v = self.value(x, sub, body, ind + "    ", {})
            lines.extend(body)
            lines.append(f"{ind}    {name} = {v}")
            return name
        if op.op == "Gather":
            axis = op.attrs.get("axis", 0) % len(in_shape)
            ishape = self.shape(a[1])
            q = len(ishape)
            iv = self.fresh()
            index_expr = self.value(a[1], list(idx[axis:axis + q]), lines, ind, memo)
            self._clip(iv, index_expr, in_shape[axis], lines, ind)
            sub = list(idx[:axis]) + [iv] + list(idx[axis + q:])
            return self.value(x, sub, lines, ind, memo)
        if op.op == "GatherElements":
            axis = op.attrs.get("axis", 0) % len(in_shape)
            iv = self.fresh()
            self._clip(iv, self.value(a[1], list(idx), lines, ind, memo), in_shape[axis], lines, ind)
            sub = ["0" if d == 1 else i for i, d in zip(idx, in_shape)]   # broadcast, as the reference
            sub[axis] = iv
            return self.value(x, sub, lines, ind, memo)
        if op.op == "GatherND":
            b = op.attrs.get("batch_dims", 0)
            ishape = self.shape(a[1])
            q, k = len(ishape) - 1, ishape[-1]
            cols = []
            for j in range(k):
                iv = self.fresh()
                self._clip(iv, self.value(a[1], list(idx[:q]) + [str(j)], lines, ind, memo),
                           in_shape[b + j], lines, ind)
                cols.append(iv)
            return self.value(x, list(idx[:b]) + cols + list(idx[q:]), lines, ind, memo)
        if op.op == "Trilu":
            # triu keeps col - row >= k, tril keeps col - row <= k; k may be a run-time scalar
            kk = self.value(a[1], ["0"] * len(self.shape(a[1])), lines, ind, memo) \
                if len(a) > 1 and a[1] else "0"
            cmp = ">=" if op.attrs.get("upper", 1) else "<="
            name = self.fresh()
            lines.append(f"{ind}{name} = {lit(0, dtype)}")
            lines.append(f"{ind}if ({idx[-1]}) - ({idx[-2]}) {cmp} np.int64({kk}):")
            body = []
            v = self.value(x, list(idx), body, ind + "    ", {})
            lines.extend(body)
            lines.append(f"{ind}    {name} = {v}")
            return name
        if op.op == "EyeLike":
            return f"({lit(1, dtype)} if ({idx[1]}) - ({idx[0]}) == {int(op.attrs.get('k', 0))} " \
                   f"else {lit(0, dtype)})"
        if op.op == "OneHot":
            d = out_shape[op.attrs.get("axis", -1) % len(out_shape)]
            ax = op.attrs.get("axis", -1) % len(out_shape)
            iv = self.fresh()
            raw = self.value(x, list(idx[:ax]) + list(idx[ax + 1:]), lines, ind, memo)
            lines.append(f"{ind}{iv} = np.int64({raw})")
            lines.append(f"{ind}if {iv} < 0:")
            lines.append(f"{ind}    {iv} += {d}")
            off = self.value(a[2], ["0"], lines, ind, memo)
            on = self.value(a[2], ["1"], lines, ind, memo)
            return f"({on} if {iv} == {idx[ax]} else {off})"
        if op.op in ("DepthToSpace", "SpaceToDepth"):
            return self.value(x, self._blocks(op, in_shape, out_shape, idx), lines, ind, memo)
        if op.op == "Resize":
            return resize_value(self, op, x, in_shape, idx, dtype, lines, ind, memo)
        if op.op == "GridSample":
            return grid_sample_value(self, op, idx, dtype, lines, ind, memo)
        raise ModelcError(f"op {op.op} has no injective kernel")

    def _clip(self, iv, index_expr, dim, lines, ind):
        """`iv` = the index read, negative ones wrapped; one out of range (a run-time input) is
        clipped, as TVM's take(mode="clip"): never a read outside the buffer (constant indices
        are checked at import)."""
        lines.append(f"{ind}{iv} = np.int64({index_expr})")
        lines.append(f"{ind}if {iv} < 0:")
        lines.append(f"{ind}    {iv} += {dim}")
        lines.append(f"{ind}{iv} = min(max({iv}, 0), {dim - 1})")

    @staticmethod
    def _blocks(op, in_shape, out_shape, idx):
        """DepthToSpace / SpaceToDepth as index arithmetic (the reference's reshape + transpose)."""
        b = op.attrs["blocksize"]
        crd = op.attrs.get("mode", "DCR") == "CRD"
        n, c, y, x = idx
        if op.op == "DepthToSpace":
            cc = out_shape[1]
            b1, b2 = f"(({y}) % {b})", f"(({x}) % {b})"
            ch = f"({c}) * {b * b} + {b1} * {b} + {b2}" if crd else f"({b1} * {b} + {b2}) * {cc} + ({c})"
            return [n, ch, f"({y}) // {b}", f"({x}) // {b}"]
        ci = in_shape[1]
        if crd:
            src, b1, b2 = f"({c}) // {b * b}", f"((({c}) // {b}) % {b})", f"(({c}) % {b})"
        else:
            src, b1, b2 = f"(({c}) % {ci})", f"(({c}) // {b * ci})", f"((({c}) // {ci}) % {b})"
        return [n, src, f"({y}) * {b} + {b1}", f"({x}) * {b} + {b2}"]

    def _pad_mode(self, op, x, in_shape, idx, lines, ind, memo):
        """Pad reflect / edge / wrap: negative pads crop first (as the reference does), then each
        padded axis folds its index back into the cropped input."""
        mode = op.attrs["mode"]
        sub = list(idx)
        for ax, (lo, hi, pb, pe) in enumerate(pad_axes(op, in_shape, self.wl.params)):
            n = in_shape[ax] - lo - hi
            if not pb and not pe:
                if lo:
                    sub[ax] = f"{idx[ax]} + {lo}"
                continue
            j = self.fresh()
            lines.append(f"{ind}{j} = np.int64({idx[ax]}) - {pb}")
            if mode == "edge" or n == 1:
                lines.append(f"{ind}{j} = min(max({j}, 0), {n - 1})")
            elif mode == "wrap":
                lines.append(f"{ind}{j} = {j} % {n}")
            else:                                     # reflect: period 2n - 2, no edge repeated
                lines.append(f"{ind}{j} = {j} % {2 * n - 2}")
                lines.append(f"{ind}if {j} >= {n}:")
                lines.append(f"{ind}    {j} = {2 * n - 2} - {j}")
            sub[ax] = f"{j} + {lo}" if lo else j
        return self.value(x, sub, lines, ind, memo)

    def _batchnorm(self, op, idx, dtype, lines, ind, memo):
        """Inference BatchNormalization whose statistics are not constants (constant ones are
        folded into a Mul + Add): x * k + (bias - mean * k), k = scale / sqrt(var + epsilon),
        its parameters indexed by the channel, as the reference computes it."""
        x = self.value(op.args[0], idx, lines, ind, memo)
        c = [joined(idx[1])]
        scale, bias, mean, var = (self.value(r, c, lines, ind, memo) for r in op.args[1:5])
        k, name = self.fresh(), self.fresh()
        eps = lit(op.attrs.get("epsilon", 1e-5), dtype)
        lines.append(f"{ind}{k} = {scale} / math.sqrt({var} + {eps})")
        lines.append(f"{ind}{name} = {x} * {k} + ({bias} - {mean} * {k})")
        return name

    def _split_sizes(self, op, in_shape, axis):
        a = op.args
        if len(a) > 1 and a[1]:
            return self.wl.params[a[1]].tolist()
        n = op.attrs.get("num_outputs") or len([1 for o in self.wl.ops for r in o.args
                                                if r.startswith(f"v{op.index}.")]) or 1
        size = -(-in_shape[axis] // n)
        return [min(size, in_shape[axis] - k * size) for k in range(n)]
