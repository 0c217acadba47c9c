"""Buffer planning by liveness: tensors whose lifetimes do not overlap share one buffer.

Steps run in a fixed order, so each tensor lives from the step that writes it to the last step
that reads it. A buffer is reused only for a tensor of exactly the same physical size and dtype
and, when it has a zero halo that convolutions read as padding, exactly the same shape and
layout - kernels write only the interior, so the halo of such a buffer stays zero forever.
A view (a reshape of a plain tensor) shares its source's buffer, extending its lifetime.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..kernels.layout import physical_size


@dataclass
class BufferPlan:
    tensor_buffer: dict        # tensor name -> buffer index
    buffers: list              # (size, dtype) per buffer
    naive_bytes: int           # one buffer per tensor
    planned_bytes: int


def plan_buffers(steps: list, tensors: dict, inputs: list, outputs: list) -> BufferPlan:
    """steps: (input names, output names, alias) in run order; tensors: name -> (shape, dtype, layout)."""
    base = {}                                   # view -> the tensor that owns its memory
    last_use = {}
    for i, (ins, outs, alias) in enumerate(steps):
        if alias:
            base[outs[0]] = base.get(ins[0], ins[0])
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
    assign, buffers = {}, []

    def new_buffer(name):
        shape, dtype, layout = tensors[name]
        buffers.append((physical_size(shape, layout), np.dtype(dtype)))
        return len(buffers) - 1

    for name in inputs:
        assign[name] = new_buffer(name)
    for i, (ins, outs, alias) in enumerate(steps):
        for t in outs:
            if not t:
                continue
            if alias:
                continue
            k = key(t)
            pool = free.get(k)
            assign[t] = pool.pop() if pool and t not in pinned else new_buffer(t)
        for t in outs:
            if alias and t:
                assign[t] = assign[base[t]]
        released = {base.get(t, t) for t in ins + outs if t in assign}
        for t in released:
            if last_use.get(t) == i and t not in pinned:
                free.setdefault(key(t), []).append(assign[t])
    naive = sum(physical_size(s, lay) * np.dtype(d).itemsize for n, (s, d, lay) in tensors.items()
                if n in assign and n not in base)
    planned = sum(size * dt.itemsize for size, dt in buffers)
    return BufferPlan(assign, buffers, naive, planned)
