"""Buffer planning by liveness: tensors whose lifetimes do not overlap share one buffer.

Steps run in a fixed order, so each tensor lives from the step that writes it to the last step
that reads it. A buffer is reused only for a tensor of exactly the same physical size and dtype
and, when it has a zero halo that convolutions read as padding, exactly the same shape and
layout - kernels write only the interior, so the halo of such a buffer stays zero forever.
A view (a reshape of a plain tensor) shares its source's buffer, extending its lifetime, and the
inputs of a Concat that copies nothing (`concat_parts`) live in stretches of its result's buffer.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..kernels.layout import physical_size


@dataclass
class BufferPlan:
    tensor_buffer: dict        # tensor name -> buffer index
    buffers: list              # (size, dtype) per buffer
    naive_bytes: int           # one buffer per tensor
    planned_bytes: int
    tensor_offset: dict = field(default_factory=dict)   # tensor name -> first element in its buffer (else 0)
    in_place: dict = field(default_factory=dict)        # output -> the epilogue input whose buffer it took


def concat_parts(steps: list, tensors: dict, views: list, pinned: set) -> tuple[dict, set]:
    """Concats whose inputs the kernels producing them can write in place: ({input: (result,
    element offset)}, the indices of those Concat steps, which then copy nothing).

    Along the channels of one image, each input of a Concat is a contiguous stretch of its result,
    in the plain layout (everything before the axis has extent 1) and in the blocked one (channel
    blocks are outermost) when every input has the result's block and halo and whole blocks of
    channels; a halo is then where the result's is, and stays zero. SqueezeNet's fire modules spent
    8% of the model copying their two branches together. An input joins one Concat at most, and must
    be written by a kernel (not a view, not another such Concat, not a model input or output).
    """
    producer = {}
    for i, s in enumerate(steps):
        for t in s["outputs"]:
            producer[t] = i
    parts, merged, taken = {}, set(), set()
    for i, s in enumerate(steps):
        ops = s["workload"]["ops"]
        if [o["op"] for o in ops] != ["Concat"] or len(s["outputs"]) != 1 or views[i]:
            continue
        out = tensors[s["outputs"][0]]
        shape, layout = list(out["shape"]), tuple(out["layout"]) if out["layout"] else None
        axis = int(ops[0]["attrs"].get("axis", 0)) % max(len(shape), 1)
        ins = s["inputs"]
        if blocked := layout is not None:
            ok = len(shape) == 4 and axis == 1 and shape[0] == 1
        else:
            ok = int(np.prod(shape[:axis], dtype=np.int64)) == 1
        ok = ok and len(set(ins)) == len(ins) and physical_size(shape, layout) > 0
        for t in ins:
            x = tensors.get(t)
            j = producer.get(t)
            ok = ok and x is not None and not x["const"] and t not in pinned and t not in taken \
                and j is not None and j < i and not views[j] and j not in merged \
                and x["dtype"] == out["dtype"] and physical_size(x["shape"], x["layout"]) > 0 \
                and (tuple(x["layout"]) if x["layout"] else None) == layout \
                and (not blocked or x["shape"][1] % layout[0] == 0)
        if not ok or sum(physical_size(tensors[t]["shape"], layout) for t in ins) != physical_size(shape, layout):
            continue
        offset = 0
        for t in ins:
            parts[t] = (s["outputs"][0], offset)
            offset += physical_size(tensors[t]["shape"], layout)
        taken.update(ins)
        merged.add(i)
    return parts, merged


def in_place_inputs(steps: list, tensors: dict, views: list, stores_in_place) -> dict:
    """{step index: input} where the step's output may take the buffer of an input that only its
    epilogue reads, element by element at the output's own index (a residual added to a conv's sums:
    same shape, dtype and layout), if the step is that input's last use (`plan_buffers` checks):
    the output's lines are then the ones the kernel has just read, not a cold buffer's, as
    onnxruntime's convs sum into the residual's buffer. `stores_in_place(step)`: whether the step's
    kernel reads each such element only right before storing that element of the output, once."""
    found = {}
    for i, s in enumerate(steps):
        if views[i] or len(s["outputs"]) != 1 or not stores_in_place(s):
            continue
        ops = s["workload"]["ops"]
        out = tensors[s["outputs"][0]]
        anchor = {s["inputs"][int(a[1:])] for a in ops[0]["args"] if isinstance(a, str) and a.startswith("i")}
        for t in s["inputs"]:
            x = tensors.get(t)
            if x is None or x["const"] or t in anchor:
                continue
            if (list(x["shape"]), x["dtype"], x["layout"]) == (list(out["shape"]), out["dtype"], out["layout"]):
                found[i] = t
                break
    return found


def plan_buffers(steps: list, tensors: dict, inputs: list, outputs: list, parts: dict | None = None,
                 in_place: dict | None = None) -> BufferPlan:
    """steps: (input names, output names, alias) in run order; tensors: name -> (shape, dtype, layout);
    parts: Concat inputs written in place ({input: (the Concat's result, element offset)});
    in_place: {step index: an input whose buffer the step's output may take (`in_place_inputs`)}."""
    parts, in_place = parts or {}, in_place or {}
    base = {t: out for t, (out, _) in parts.items()}    # view or part -> the tensor that owns its memory
    views = set()
    last_use = {}
    for i, (ins, outs, alias) in enumerate(steps):
        if alias:
            base[outs[0]] = base.get(ins[0], ins[0])
            views.add(outs[0])
        for t in ins:
            if t in tensors:
                last_use[base.get(t, t)] = i
        for t in outs:
            last_use.setdefault(base.get(t, t), i)
    pinned = set(inputs) | {base.get(o, o) for o in outputs}

    def key(name):
        shape, dtype, layout = tensors[name]
        size = physical_size(shape, layout)
        halo = bool(layout and layout[1])
        return (size, np.dtype(dtype).str, tuple(shape) if halo else None, tuple(layout) if halo else None)

    free: dict = {}
    assign, buffers, offsets, donated = {}, [], {}, {}

    def new_buffer(name):
        shape, dtype, layout = tensors[name]
        buffers.append((physical_size(shape, layout), np.dtype(dtype)))
        return len(buffers) - 1

    for name in inputs:
        assign[name] = new_buffer(name)
    for i, (ins, outs, alias) in enumerate(steps):
        for t in outs:
            if not t or alias:
                continue
            if t in parts:                      # the Concat's result is allocated by its first part
                owner, off = parts[t]
                if owner not in assign:
                    pool = free.get(key(owner))
                    assign[owner] = pool.pop() if pool and owner not in pinned else new_buffer(owner)
                assign[t], offsets[t] = assign[owner], off
                continue
            if t in assign:                     # a Concat whose parts were written in place
                continue
            r = in_place.get(i)
            if r is not None and r in assign and base.get(r, r) == r and r not in views and r not in parts \
                    and r not in offsets and last_use.get(r) == i and r not in pinned and t not in pinned \
                    and key(r) == key(t):
                assign[t] = assign[r]           # the output takes its residual's buffer
                donated[t] = r
                continue
            k = key(t)
            pool = free.get(k)
            assign[t] = pool.pop() if pool and t not in pinned else new_buffer(t)
        for t in outs:
            if alias and t:
                assign[t] = assign[base[t]]
                if ins[0] in offsets:           # a view of a Concat's input: at that input's offset
                    offsets[t] = offsets[ins[0]]
        released = {base.get(t, t) for t in ins + outs if t in assign}
        for t in released:
            if last_use.get(t) == i and t not in pinned and t not in donated.values():
                free.setdefault(key(t), []).append(assign[t])
    naive = sum(physical_size(s, lay) * np.dtype(d).itemsize for n, (s, d, lay) in tensors.items()
                if n in assign and n not in views)
    planned = sum(size * dt.itemsize for size, dt in buffers)
    return BufferPlan(assign, buffers, naive, planned, offsets, donated)
