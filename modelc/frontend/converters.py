"""Per-op converters from any ONNX opset to modelc's canonical op forms.

Like TVM's relay frontend (`_impl_v1`, `_impl_v13`), each converter is registered with the opset
version from which it applies; the importer picks, for a model of opset O, the converter with the
largest `since <= O`. Ops without a converter pass through unchanged. A converter reads the node as
imported (attributes decoded) and emits canonical nodes through the context.
"""
from __future__ import annotations

from typing import Callable

CONVERTERS: dict[str, list[tuple[int, Callable]]] = {}

# ops that exist only in older opsets or only as import-time constructs: supported because a
# converter rewrites them, although the registry has no op of that name
CONVERTED_AWAY: set[str] = set()


def converter(op_type: str, since: int = 1, away: bool = False):
    """Register `fn(ctx, node)` converting `op_type` for model opsets >= `since`."""
    def deco(fn):
        CONVERTERS.setdefault(op_type, []).append((since, fn))
        CONVERTERS[op_type].sort(key=lambda p: p[0])
        if away:
            CONVERTED_AWAY.add(op_type)
        return fn
    return deco


def passthrough(ctx, node):
    ctx.emit_node(node)


def lookup(op_type: str, opset: int) -> Callable:
    chosen = passthrough
    for since, fn in CONVERTERS.get(op_type, ()):
        if since <= opset:
            chosen = fn
    return chosen
