"""Ops that ONNX defines as a function of other ops, imported as that function's body.

ONNX gives some operators a body of simpler ops: Attention (which PyTorch's exporter emits for
scaled_dot_product_attention from opset 23), RMSNormalization and RotaryEmbedding (LLM-style
blocks), the NegativeLogLikelihood and SoftmaxCrossEntropy losses, CenterCropPad, AffineGrid.
Where modelc has no op of its own for one, the node is replaced by the body ONNX builds for it
(for most of these the body depends on the node's attributes and input types: a "context-dependent"
function), and the body's nodes are imported like the graph's own, under fresh names: they are
checked, shape-inferred, folded where their inputs are known, fused and compiled. This is what
onnxruntime does for function ops it has no kernel for; TVM's importer decomposes the same ops by
hand. The bodies come from the onnx package, never from the model, so nothing the model holds
becomes code; the node's attributes reach the body only as attribute values.
"""
from __future__ import annotations

import onnx
from onnx import helper

from .. import ops
from ..errors import ModelcError
from . import converters as conv
from .control_flow import alias_output, inline

ONNX_DOMAINS = ("", "ai.onnx")


def _schema(op_type: str, domain: str, opset: int):
    if domain not in ONNX_DOMAINS or op_type in ops.REGISTRY or op_type in conv.CONVERTED_AWAY:
        return None       # modelc's own op (or converter) is preferred to a body of small ones
    try:
        s = onnx.defs.get_schema(op_type, max(int(opset), 1), "")
    except Exception:
        return None
    return s if (s.has_function or s.has_context_dependent_function) else None


def expands(op_type: str, domain: str, opset: int) -> bool:
    """True if the op is imported as the body ONNX defines for it."""
    return _schema(op_type, domain, opset) is not None


def _body(ctx, n: onnx.NodeProto, node, s) -> onnx.FunctionProto:
    try:
        if s.has_context_dependent_function:
            versions = sorted(s.context_dependent_function_opset_versions) or [ctx.opset]
            types = [helper.make_tensor_type_proto(helper.np_dtype_to_tensor_dtype(ctx.dtype(i)),
                                                   list(ctx.shape(i))).SerializeToString()
                     if i else onnx.TypeProto().SerializeToString() for i in n.input]
            raw = s.get_context_dependent_function_with_opset_version(
                _version(versions, ctx.opset), n.SerializeToString(), types)
            f = onnx.FunctionProto()
            f.ParseFromString(raw)
        else:
            versions = sorted(s.function_opset_versions) or [ctx.opset]
            f = onnx.FunctionProto.FromString(s.get_function_with_opset_version(_version(versions, ctx.opset)))
    except Exception as e:
        raise ModelcError(f"{node.where()}: ONNX's definition of {n.op_type} as other ops cannot be "
                          f"built for this node: {str(e).strip().splitlines()[0] if str(e).strip() else e}") from None
    if not f.node:
        raise ModelcError(f"{node.where()}: ONNX's definition of {n.op_type} has no body for these "
                          "inputs and attributes")
    return f


def _version(versions: list, opset: int) -> int:
    fit = [v for v in versions if v <= opset]
    return fit[-1] if fit else versions[0]


def _bind_attributes(f: onnx.FunctionProto, n: onnx.NodeProto, s):
    """Replace each attribute reference in the body by the node's value, else the function's or
    the schema's default; a reference with none is dropped, so the inner op's own default applies."""
    given = {a.name: a for a in n.attribute}
    defaults = {name: a.default_value for name, a in s.attributes.items()
                if a.default_value.type != onnx.AttributeProto.UNDEFINED}
    defaults.update({a.name: a for a in f.attribute_proto})
    for inner in f.node:
        kept = []
        for a in inner.attribute:
            if a.ref_attr_name:
                src = given.get(a.ref_attr_name) or defaults.get(a.ref_attr_name)
                if src is None:
                    continue
                b = onnx.AttributeProto()
                b.CopyFrom(src)
                b.name = a.name
                kept.append(b)
            else:
                kept.append(a)
        del inner.attribute[:]
        inner.attribute.extend(kept)


def expand(ctx, n: onnx.NodeProto, node):
    """Import node `n` (modelc's `node`) as the nodes of ONNX's function body for it."""
    s = _schema(n.op_type, n.domain, ctx.opset)
    f = _body(ctx, n, node, s)
    _bind_attributes(f, n, s)
    if len(n.input) > len(f.input) or len(n.output) > len(f.output):
        raise ModelcError(f"{node.where()} has {len(n.input)} inputs and {len(n.output)} outputs; ONNX's "
                          f"definition of {n.op_type} takes at most {len(f.input)} and {len(f.output)}")
    g = helper.make_graph(list(f.node), f.name or n.op_type,
                          [helper.make_value_info(x, onnx.TypeProto()) for x in f.input],
                          [helper.make_value_info(x, onnx.TypeProto()) for x in f.output])
    for i, inner in enumerate(g.node):
        inner.name = f"{node.name}/{inner.name or inner.op_type + str(i)}"
    bound = {x: (n.input[k] if k < len(n.input) else "") for k, x in enumerate(f.input)}
    opset = next((int(o.version) for o in f.opset_import if o.domain in ONNX_DOMAINS), ctx.opset)
    outer, ctx.opset = ctx.opset, opset
    try:
        outs = inline(ctx, node, g, bound, f"#{node.name}")
    finally:
        ctx.opset = outer
    for src, dst in zip(outs, n.output):
        if dst and src not in ctx.graph.tensors:
            raise ModelcError(f"{node.where()}: ONNX's definition of {n.op_type} does not compute "
                              f"output {dst!r} for these inputs and attributes")
        alias_output(ctx, src, dst)
