"""The last resort for groups no template handles: the numpy reference, clearly marked.

It keeps a model with a rare op (TopK, NonMaxSuppression's neighbours, ScatterND ...) compiling
and correct, but it is not generated code: it cannot be tuned, and `compile` names every group
that runs it so the gap is visible. Each such op is a candidate for a template of its own.
"""
from __future__ import annotations

import numpy as np

from .. import reference
from .layout import from_physical, to_physical
from .template import Kernel, Template, register, unsupported_dtype
from .workload import Workload


def why(wl: Workload) -> str:
    """Why no generated kernel runs a group: the dtypes kernels do not take, or the op chain."""
    odd = unsupported_dtype(wl)
    if odd == "float16":
        from .. import target
        from ..te.groups import Unsupported, declare
        if not target.current().converts_half:
            return "float16 tensors have generated kernels only where the CPU converts float16 (F16C)"
        try:
            declare(wl)
        except Unsupported as e:
            return f"float16 groups run te kernels, and this one has no te declaration ({e})"
    if odd:
        return f"tensors of dtype {odd} have no generated kernels"
    return "no kernel template handles " + " -> ".join(o.op for o in wl.ops)


@register
class Fallback(Template):
    name = "reference"
    tunable = False
    priority = 100

    def matches(self, wl: Workload) -> bool:
        return True

    def build(self, wl: Workload, cfg) -> Kernel:
        graph = wl.to_graph()
        n_out = len(wl.outputs)
        args = [f"out{k}" for k in range(n_out)] + [f"in{k}" for k in range(len(wl.inputs))]

        def run(*arrays):
            outs, ins = arrays[:n_out], arrays[n_out:]
            feeds = {f"i{k}": from_physical(x, t.shape, t.layout) for k, (x, t) in
                     enumerate(zip(ins, wl.inputs))}
            res = reference.run(graph, feeds)
            for buf, name, t in zip(outs, graph.outputs, wl.outputs):
                buf[:] = to_physical(np.asarray(res[name], t.dtype), t.layout)

        return Kernel(None, args, None, python=run)
