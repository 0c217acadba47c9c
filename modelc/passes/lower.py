"""`lower`: a model's graph as kernels see it - every pass, fusion and layout planning.

`compile` builds one kernel per fused group of this graph and `extract_tasks` files one task per
distinct group, so both must lower the same way: this is that one way.
"""
from __future__ import annotations

from ..errors import ModelcError
from ..ir import Graph
from ..kernels.template import FALLBACK_DTYPES, KERNEL_DTYPES
from . import optimize
from .fuse_depthwise import fuse_expand_depthwise
from .layout import plan_layouts


def lower(graph: Graph) -> Graph:
    """Graph passes, fusion and layout planning: the graph whose groups become kernels."""
    check_dtypes(graph)
    return fuse_expand_depthwise(plan_layouts(optimize(graph)))


def check_dtypes(graph: Graph):
    """Refuse, naming the tensor, its node and its dtype, a tensor neither generated kernels nor
    the numpy fallback compute (bfloat16, float8, int4, int2, float4, complex, string ...)."""
    ok = KERNEL_DTYPES | FALLBACK_DTYPES
    where = {}
    for node in graph.topo():
        for t in [*node.inputs, *node.outputs]:
            if t:
                where.setdefault(t, node.where())
    for t in [*where, *graph.inputs, *graph.outputs]:
        dt = graph.tensors[t].dtype
        if dt.name not in ok:
            raise ModelcError(f"tensor {t!r} of {where.get(t, 'the graph')} has dtype {dt.name}, "
                              f"which modelc cannot compile (it compiles {', '.join(sorted(ok))})")
