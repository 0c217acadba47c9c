"""Graph passes, each `Graph -> Graph`, and the pipeline that runs them in order."""
from __future__ import annotations

from ..ir import Graph
from .byte_inputs import byte_inputs
from .canonicalize import canonicalize
from .conv_views import convs_as_2d
from .cse import eliminate_common_subexpressions
from .dce import eliminate_dead_code
from .dead_taps import prune_dead_taps
from .dense import to_dense
from .einsum import lower_einsum
from .fold_batchnorm import fold_batchnorm
from .fold_constants import fold_constants
from .fuse import fuse
from .matmul_scale import move_matmul_scales
from .matmul_views import fold_matmul_views
from .merge_dense import merge_sibling_dense
from .norms import lower_norms
from .patterns import recognise_patterns
from .scale_conv import scale_into_conv
from .simplify import simplify

# the order matters: folding first exposes constant shapes and weights to every later pass;
# simplification removes identities that would hide patterns; fusion comes last
PIPELINE = [
    fold_constants,
    lower_einsum,
    simplify,
    canonicalize,
    prune_dead_taps,
    fold_batchnorm,
    recognise_patterns,
    lower_norms,
    to_dense,
    scale_into_conv,
    convs_as_2d,                # after the folds into a conv's weights (BatchNorm, scales)
    merge_sibling_dense,
    move_matmul_scales,         # before the views: a scaled operand is no view
    fold_matmul_views,
    eliminate_common_subexpressions,
    eliminate_dead_code,
    byte_inputs,                # after CSE (which would merge its casts back to float into one) and
    eliminate_dead_code,        # DCE (dead readers would look like readers)
]


def optimize(graph: Graph, fuse_ops: bool = True, verify: bool = False) -> Graph:
    """Run the pass pipeline on a copy of `graph` (and fusion, unless `fuse_ops` is False)."""
    graph = graph.copy()
    for p in PIPELINE + ([fuse] if fuse_ops else []):
        graph = p(graph)
        if verify:
            graph.verify()
    return graph


__all__ = ["PIPELINE", "optimize", "fuse"] + [p.__name__ for p in PIPELINE]
