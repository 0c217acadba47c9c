"""Pools the 2-d template (pool.py) leaves: MaxPool / AveragePool / LpPool of any spatial rank, any
pads (auto_pad, ceil_mode overhang, pads as large as the window), integer MaxPool, and MaxPool's
Indices output (storage_order 0 or 1).

Plain NC<spatial> layout. One parallel loop over output elements (tasks of `rows_per_task`); each
element walks its window with explicit bounds per spatial axis, so nothing outside the input is read
and padding never enters a max. AveragePool divides by the count of real taps, or of taps inside the
padded input (count_include_pad; the ceil-mode overhang is never counted), in float64; LpPool is
(sum |x|^p)^(1/p) over the real taps, in float64, as the reference computes it. MaxPool keeps the
first tap (row-major) that holds the maximum, the index ONNX and the reference report.
"""
from __future__ import annotations

import math

import numpy as np

from ..ops.window import window_geometry
from .expr import ctor, lit
from .rows import default_rows, define_rows, knob_values, store
from .space import ConfigSpace
from .template import Kernel, Template, chain_ok, epilogue_inputs, parallel_loop, register, source
from .workload import Workload

OPS = ("MaxPool", "AveragePool", "LpPool")


def _geo(wl: Workload):
    a = wl.anchor
    x = wl.spec(a.args[0])
    at = a.attrs
    return x.shape, window_geometry(tuple(x.shape[2:]), at.get("kernel_shape"), at.get("strides"),
                                    at.get("dilations"), at.get("pads"), at.get("auto_pad", "NOTSET") or "NOTSET",
                                    int(at.get("ceil_mode", 0)))


def _outputs_mode(wl: Workload):
    """'chain' (one output, any elementwise epilogue) or a list of MaxPool result positions (0 =
    values, 1 = indices) per workload output; None when neither."""
    if chain_ok(wl):
        return "chain"
    a = wl.anchor
    if a.op != "MaxPool" or wl.epilogue:
        return None
    pos = []
    for v in wl.output_values:
        if v not in ("v0.0", "v0.1"):
            return None
        pos.append(int(v[-1]))
    return pos if len(set(pos)) == len(pos) else None


def _windows_touch_input(geo, spatial) -> bool:
    """Every window holds at least one input element (on each axis, some tap inside)."""
    for d, n in enumerate(spatial):
        for o in range(geo.out[d]):
            s = o * geo.strides[d] - geo.begin[d]
            if not any(0 <= s + k * geo.dilations[d] < n for k in range(geo.kernel[d])):
                return False
    return True


@register
class PoolNd(Template):
    name = "pool_nd"
    priority = 5          # after the 2-d template, which handles its forms faster

    def matches(self, wl: Workload) -> bool:
        a = wl.anchor
        if a.op not in OPS or not a.args[0].startswith("i"):
            return False
        x = wl.spec(a.args[0])
        if x.layout is not None or any(o.layout is not None for o in wl.outputs) or len(x.shape) < 3:
            return False
        if a.op == "MaxPool":
            if x.dtype.kind not in "iuf":
                return False
        elif x.dtype not in (np.float32, np.float64):
            return False
        mode = _outputs_mode(wl)
        if mode is None:
            return False
        if mode == "chain" and wl.epilogue == [] and wl.outputs[0].dtype != x.dtype:
            return False
        if a.op == "LpPool" and int(a.attrs.get("p", 2)) < 1:
            return False
        try:
            _shape, geo = _geo(wl)
        except (ValueError, TypeError):
            return False
        if mode != "chain" and 1 in mode and not _windows_touch_input(geo, x.shape[2:]):
            return False          # a window all in padding: its index would be a padding position
        return x.size > 0 and all(o > 0 for o in geo.out)

    def space(self, wl: Workload) -> ConfigSpace:
        sp = ConfigSpace()
        if _by_rows(wl):                  # an item per output row: only whether to use threads
            sp.define_annotate("parallel", [True, False])
        else:
            define_rows(sp, wl.outputs[0].size)
        return sp

    def default_config(self, wl: Workload, space: ConfigSpace):
        _shape, geo = _geo(wl)
        work = wl.outputs[0].size * math.prod(geo.kernel)
        rows = _by_rows(wl)
        vals = default_rows(wl.outputs[0].size // 64 or 1, work, [1] if rows else knob_values(space, "rows_per_task"))
        if rows:
            del vals["rows_per_task"]
        return space.from_values(vals)

    def build(self, wl: Workload, cfg) -> Kernel:
        if _by_rows(wl):
            return _plane_kernel(wl, cfg) if _separable(wl) else _row_kernel(wl, cfg)
        a = wl.anchor
        shape, geo = _geo(wl)
        x = wl.spec(a.args[0])
        dt = x.dtype
        T = ctor(dt)
        x_arg = int(a.args[0][1:])
        X = f"in{x_arg}"
        nd = len(geo.out)
        sp = shape[2:]
        P = math.prod(sp)
        st = [math.prod(sp[d + 1:]) for d in range(nd)]
        out_sp = geo.out
        total = shape[0] * shape[1] * math.prod(out_sp)
        RPT = cfg["rows_per_task"]
        nt = -(-total // RPT)
        mode = _outputs_mode(wl)
        op = a.op
        body = [parallel_loop("it", nt),
                f"    for o in range(it * {RPT}, min(it * {RPT} + {RPT}, {total})):",
                "        q = o"]
        ind = "        "
        for d in reversed(range(nd)):
            body += [f"{ind}o{d} = q % {out_sp[d]}", f"{ind}q = q // {out_sp[d]}"]
        body += [f"{ind}xb = q * {P}"]
        for d in range(nd):
            body += [f"{ind}s{d} = o{d} * {geo.strides[d]} - {geo.begin[d]}"]
        if op == "MaxPool":
            low = lit(-np.inf if dt.kind == "f" else np.iinfo(dt).min, dt)
            body += [f"{ind}acc = {low}", f"{ind}bi = -1"]
        else:
            body += [f"{ind}acc = np.float64(0)"]
        if op == "AveragePool":
            inc = bool(int(a.attrs.get("count_include_pad", 0)))
            body += [f"{ind}cnt = 1"]
            for d in range(nd):
                body += _count_taps(ind, f"s{d}", geo, d, sp[d], inc) + [f"{ind}cnt *= c"]
        # the window: nested loops over the taps inside the input
        loops, ind, off = _leading_taps(ind, geo, sp, nd, lambda d: f"s{d}")
        body += loops
        body += [f"{ind}v = {X}[np.uintp({off})]"]
        if op == "MaxPool":
            body += [f"{ind}if bi < 0 or v > acc:", f"{ind}    acc = v",
                     f"{ind}    bi = {' + '.join(f'i{d} * {st[d]}' for d in range(nd))}"]
            if int(a.attrs.get("storage_order", 0)):
                cm = [math.prod(sp[:d]) for d in range(nd)]
                body[-1] = f"{ind}    bi = {' + '.join(f'i{d} * {cm[d]}' for d in range(nd))}"
        elif op == "AveragePool":
            body += [f"{ind}acc += np.float64(v)"]
        else:
            p = int(a.attrs.get("p", 2))
            av = "abs(np.float64(v))"
            term = {1: av, 2: "np.float64(v) * np.float64(v)"}.get(p, f"{av} ** {p}")
            body += [f"{ind}acc += {term}"]
        ind = "        "
        if op == "AveragePool":
            val = f"{T}(acc / np.float64(cnt))"
        elif op == "LpPool":
            p = int(a.attrs.get("p", 2))
            val = f"{T}(math.sqrt(acc))" if p == 2 else f"{T}(acc)" if p == 1 else \
                f"{T}(acc ** {lit(1.0 / p, np.float64)})"
        else:
            val = "acc"
        if mode == "chain":
            body += store(wl, ind, val, "o")
            args = ["out0", X] + [f"in{k}" for k in epilogue_inputs(wl.epilogue) if k != x_arg]
            dtypes = [wl.outputs[0].dtype] + [wl.inputs[int(n[2:])].dtype for n in args[1:]]
        else:
            for k, pos in enumerate(mode):
                v = val if pos == 0 else f"np.int64(bi + q * {P})"
                body += [f"{ind}out{k}[np.uintp(o)] = {v}"]
            args = [f"out{k}" for k in range(len(mode))] + [X]
            dtypes = [wl.outputs[k].dtype for k in range(len(mode))] + [dt]
        return Kernel(source(args, dtypes, body, parallel=cfg["parallel"]), args)


def _count_taps(ind: str, start: str, geo, d: int, size: int, include_pad: bool) -> list:
    """`c` = the window's taps along axis d (first at `start`) inside the input, or inside the padded
    input (count_include_pad; the ceil-mode overhang is never counted)."""
    lo, hi = (-geo.begin[d], size + geo.end[d]) if include_pad else (0, size)
    return [f"{ind}c = 0",
            f"{ind}for k in range({geo.kernel[d]}):",
            f"{ind}    i = {start} + k * {geo.dilations[d]}",
            f"{ind}    if i >= {lo} and i < {hi}:",
            f"{ind}        c += 1"]


def _by_rows(wl: Workload) -> bool:
    """Float MaxPool (values only) and AveragePool: a row of outputs per item, each tap of the
    window's last axis a run of loads along the input row (S3D's 3x3x3 max pools on plain 3-d maps
    ran a branch per tap and element: 41-55 ms where onnxruntime takes 0.8-1.5, AMD EPYC Zen 4)."""
    a = wl.anchor
    return a.op in ("MaxPool", "AveragePool") and _outputs_mode(wl) == "chain" and \
        wl.spec(a.args[0]).dtype in (np.float32, np.float64)


PLANE_MAX = 32768        # elements of a map plane staged on a thread's stack (128 KB of float32)


def _separable(wl: Workload) -> bool:
    """MaxPool over 3 or more spatial axes whose map plane fits on the stack: the max of a
    box is the max along each axis in turn. S3D's 3x3x3 pools read each input 27 times a row at
    a time (2.4-10x OpenVINO's time, Xeon): a plane's leading-axis taps are now combined over the
    whole plane, its rows' taps over a row, the columns' along it, each a contiguous run."""
    shape, geo = _geo(wl)
    return wl.anchor.op == "MaxPool" and len(geo.out) >= 3 and math.prod(shape[-2:]) <= PLANE_MAX


def _max_into(ind: str, dst: str, src: str, n: int, first: str) -> list:
    """dst[0:n] = src[0:n] when `first`, else the elementwise max (NaN wins, as numpy's maximum)."""
    return [f"{ind}if {first}:",
            f"{ind}    for e in range({n}):",
            f"{ind}        {dst.format('e')} = {src.format('e')}",
            f"{ind}else:",
            f"{ind}    for e in range({n}):",
            f"{ind}        v = {src.format('e')}",
            f"{ind}        m = {dst.format('e')}",
            f"{ind}        {dst.format('e')} = v if v > m or v != v else m"]


def _leading_taps(ind: str, geo, sp, axes: int, origin=None) -> tuple[list, str, str]:
    """Nested loops over the taps of the first `axes` spatial axes that lie inside the input
    (output index o{d}, tap i{d}; `origin(d)`: the window's first tap, if held in a variable): the
    lines, the inner indent and the input offset from `xb`."""
    st = [math.prod(sp[d + 1:]) for d in range(len(sp))]
    lines, off = [], "xb"
    for d in range(axes):
        start = origin(d) if origin else f"o{d} * {geo.strides[d]} - {geo.begin[d]}"
        lines += [f"{ind}for k{d} in range({geo.kernel[d]}):",
                  f"{ind}    i{d} = {start} + k{d} * {geo.dilations[d]}",
                  f"{ind}    if i{d} >= 0 and i{d} < {sp[d]}:"]
        ind += "        "
        off += f" + i{d} * {st[d]}"
    return lines, ind, off


def _chain_kernel(wl: Workload, x_arg: int, body: list, cfg) -> Kernel:
    """The kernel of a pool whose one output runs the workload's epilogue (`store`)."""
    args = ["out0", f"in{x_arg}"] + [f"in{k}" for k in epilogue_inputs(wl.epilogue) if k != x_arg]
    dtypes = [wl.outputs[0].dtype] + [wl.inputs[int(n[2:])].dtype for n in args[1:]]
    return Kernel(source(args, dtypes, body, parallel=cfg["parallel"]), args)


def _plane_kernel(wl: Workload, cfg) -> Kernel:
    """An item per output plane: the leading axes' taps into a plane, each output row's row taps
    into a row padded with -inf (the column taps' pads and ceil-mode overhang), then the columns."""
    a = wl.anchor
    shape, geo = _geo(wl)
    x = wl.spec(a.args[0])
    dt = x.dtype
    x_arg = int(a.args[0][1:])
    X = f"in{x_arg}"
    nd = len(geo.out)
    sp = shape[2:]
    out_sp = geo.out
    H, W = sp[-2:]
    OH, OW = out_sp[-2:]
    HW = H * W
    sh, dh, bh, KH = geo.strides[-2], geo.dilations[-2], geo.begin[-2], geo.kernel[-2]
    sw, dw, bw, KW = geo.strides[-1], geo.dilations[-1], geo.begin[-1], geo.kernel[-1]
    right = max(0, (OW - 1) * sw + (KW - 1) * dw - bw - (W - 1))
    RW = bw + W + right
    low = lit(-np.inf, dt)
    T = ctor(dt)
    planes = shape[0] * shape[1] * math.prod(out_sp[:-2])
    body = [parallel_loop("it", planes), "    q = it"]
    ind = "    "
    for d in reversed(range(nd - 2)):
        body += [f"{ind}o{d} = q % {out_sp[d]}", f"{ind}q = q // {out_sp[d]}"]
    one = math.prod(geo.kernel[:-2]) == 1        # S3D's 1 x 3 x 3 pools: the input's plane is read
    body += [f"{ind}xb = q * {math.prod(sp)}",
             f"{ind}rp = carray(stack_empty({RW}, {T}), {RW})",
             f"{ind}for e in range({bw}):",
             f"{ind}    rp[np.uintp(e)] = {low}",
             f"{ind}for e in range({bw + W}, {RW}):",
             f"{ind}    rp[np.uintp(e)] = {low}"]
    if not one:
        body += [f"{ind}plane = carray(stack_empty({HW}, {T}), {HW})"]
    body += [f"{ind}nv = 0"]
    loops, ind, off = _leading_taps(ind, geo, sp, nd - 2)
    body += loops + [f"{ind}pb = {off}"]
    if not one:
        body += _max_into(ind, "plane[np.uintp({})]", X + "[np.uintp(pb + {})]", HW, "nv == 0")
    body += [f"{ind}nv += 1"]
    ind = "    "
    src = X + "[np.uintp(pb + rb + {})]" if one else "plane[np.uintp(rb + {})]"
    if not one:
        body += [f"{ind}if nv == 0:",
                 f"{ind}    for e in range({HW}):",
                 f"{ind}        plane[np.uintp(e)] = {low}"]
    else:
        body += [f"{ind}if nv == 0:",
                 f"{ind}    pb = 0"]
    body += [
             f"{ind}for oh in range({OH}):",
             f"{ind}    nh = 0",
             f"{ind}    for kh in range({KH}):",
             f"{ind}        ih = oh * {sh} - {bh} + kh * {dh}",
             f"{ind}        if ih >= 0 and ih < {H}{' and nv > 0' if one else ''}:",
             f"{ind}            rb = ih * {W}"]
    body += _max_into(ind + "            ", f"rp[np.uintp({bw} + {{}})]", src, W, "nh == 0")
    body += [f"{ind}            nh += 1",
             f"{ind}    if nh == 0:",
             f"{ind}        for e in range({W}):",
             f"{ind}            rp[np.uintp({bw} + e)] = {low}",
             f"{ind}    for ow in range({OW}):",
             f"{ind}        c = ow * {sw}",
             f"{ind}        m = rp[np.uintp(c)]"]
    for kw in range(1, KW):
        body += [f"{ind}        v = rp[np.uintp(c + {kw * dw})]",
                 f"{ind}        m = v if v > m or v != v else m"]
    body += [f"{ind}        o = (it * {OH} + oh) * {OW} + ow"]
    body += store(wl, ind + "        ", "m", "o")
    return _chain_kernel(wl, x_arg, body, cfg)


def _row_kernel(wl: Workload, cfg) -> Kernel:
    a = wl.anchor
    shape, geo = _geo(wl)
    x = wl.spec(a.args[0])
    dt = x.dtype
    x_arg = int(a.args[0][1:])
    X = f"in{x_arg}"
    nd = len(geo.out)
    sp = shape[2:]
    out_sp = geo.out
    OW, W = out_sp[-1], sp[-1]
    s, dl, b = geo.strides[-1], geo.dilations[-1], geo.begin[-1]
    rows = shape[0] * shape[1] * math.prod(out_sp[:-1])
    mx = a.op == "MaxPool"
    acc_t = ctor(dt) if mx else "np.float64"
    body = [parallel_loop("it", rows), "    q = it"]
    ind = "    "
    for d in reversed(range(nd - 1)):
        body += [f"{ind}o{d} = q % {out_sp[d]}", f"{ind}q = q // {out_sp[d]}"]
    body += [f"{ind}xb = q * {math.prod(sp)}",
             f"{ind}acc = carray(stack_empty({OW}, {acc_t}), {OW})",
             f"{ind}for ow in range({OW}):",
             f"{ind}    acc[np.uintp(ow)] = {lit(-np.inf, dt) if mx else 'np.float64(0)'}"]
    inc = bool(int(a.attrs.get("count_include_pad", 0)))
    if not mx:                              # taps counted per leading axis, then along the row
        body += [f"{ind}cnt = 1"]
        for d in range(nd - 1):
            body += _count_taps(ind, f"o{d} * {geo.strides[d]} - {geo.begin[d]}", geo, d, sp[d], inc) + \
                [f"{ind}cnt *= c"]
    loops, ind, off = _leading_taps(ind, geo, sp, nd - 1)
    body += loops + [f"{ind}rb = {off}"]
    for kl in range(geo.kernel[-1]):        # the outputs whose tap kl lies in the row: constants
        lo = max(0, -((kl * dl - b) // s))
        hi = min(OW, (W - 1 + b - kl * dl) // s + 1)
        if hi <= lo:
            continue
        body += [f"{ind}xo = rb + {kl * dl - b}",
                 f"{ind}for ow in range({lo}, {hi}):",
                 f"{ind}    v = {X}[np.uintp(xo + ow * {s})]"]
        if mx:                              # NaN wins, as numpy's maximum (the reference)
            body += [f"{ind}    m = acc[np.uintp(ow)]",
                     f"{ind}    acc[np.uintp(ow)] = v if v > m or v != v else m"]
        else:
            body += [f"{ind}    acc[np.uintp(ow)] += np.float64(v)"]
    ind = "    "
    body += [f"{ind}for ow in range({OW}):",
             f"{ind}    o = it * {OW} + ow"]
    if mx:
        val = "acc[np.uintp(ow)]"
    else:
        body += _count_taps(ind + "    ", f"ow * {s} - {b}", geo, nd - 1, W, inc)
        val = f"{ctor(dt)}(acc[np.uintp(ow)] / np.float64(cnt * c))"
    body += store(wl, ind + "    ", val, "o")
    return _chain_kernel(wl, x_arg, body, cfg)
