"""Structural checks of an ONNX model before import, as onnxruntime makes them when it loads one.

A model is untrusted input. Before any converter or shape rule sees a node, its text fields must be
text, and its attributes and inputs must fit the operator's ONNX schema for the model's opset: no
attribute the operator does not define, every attribute of the declared type, required attributes
and inputs present, and no more inputs or outputs than the operator takes. Each failure is a
`ModelLoadError` that names the node, the op and the attribute or input at fault; converters and
shape rules can then rely on the form of what they read.
"""
from __future__ import annotations

import onnx
from onnx import AttributeProto, defs

from ..errors import ModelLoadError

ONNX_DOMAINS = ("", "ai.onnx")
_OPTIONAL = defs.OpSchema.FormalParameterOption.Optional
_VARIADIC = defs.OpSchema.FormalParameterOption.Variadic


# INT attributes that are flags: onnxruntime reads some as `!= 0` and others as `== 1`, so a value
# other than 0 and 1 (largest=-1) means different things to different runtimes; it is refused
FLAGS = {"keepdims", "transA", "transB", "ceil_mode", "count_include_pad", "largest", "sorted",
         "allowzero", "noop_with_empty_axes", "select_last_index", "exclusive", "reverse", "upper",
         "detect_negative", "detect_positive", "training_mode", "is_test", "broadcast",
         "storage_order", "center_point_box", "fmod", "new_axis", "layout"}


def _type_name(t) -> str:
    return AttributeProto.AttributeType.Name(int(t)) if int(t) in AttributeProto.AttributeType.values() \
        else str(int(t))


def check_text(proto: onnx.ModelProto):
    """Every name in the model is text: protobuf hands malformed UTF-8 back as bytes."""
    def bad(where):
        raise ModelLoadError(f"the model is malformed: {where} is not valid UTF-8 text")

    for imp in proto.opset_import:
        if not isinstance(imp.domain, str):
            bad("an opset_import domain")
    g = proto.graph
    if not isinstance(g.name, str):
        bad("the graph name")
    for kind, vis in (("graph input", g.input), ("graph output", g.output), ("value_info", g.value_info)):
        for k, vi in enumerate(vis):
            if not isinstance(vi.name, str):
                bad(f"the name of {kind} #{k}")
            tt = vi.type.tensor_type if vi.type.HasField("tensor_type") else None
            if tt is not None and tt.HasField("shape"):
                for d in tt.shape.dim:
                    if not isinstance(d.dim_param, str):
                        bad(f"a symbolic dimension of {kind} {vi.name!r}")
    for k, init in enumerate(g.initializer):
        if not isinstance(init.name, str):
            bad(f"the name of initializer #{k}")
    for k, sp in enumerate(g.sparse_initializer):
        if not isinstance(sp.values.name, str):
            bad(f"the name of sparse initializer #{k}")
    for k, n in enumerate(g.node):
        for field in ("name", "op_type", "domain"):
            if not isinstance(getattr(n, field), str):
                bad(f"the {field} of node #{k}")
        for j, t in enumerate(n.input):
            if not isinstance(t, str):
                bad(f"input {j} of node #{k} ({n.op_type!r})")
        for j, t in enumerate(n.output):
            if not isinstance(t, str):
                bad(f"output {j} of node #{k} ({n.op_type!r})")
        for a in n.attribute:
            if not isinstance(a.name, str):
                bad(f"an attribute name of node #{k} ({n.op_type!r})")


def schema(op_type: str, domain: str, opset: int):
    """The ONNX schema of an op at `opset` (its newest if the op came later), or None."""
    domain = "" if domain in ONNX_DOMAINS else domain
    if not defs.has(op_type, domain):
        return None
    try:
        return defs.get_schema(op_type, max(int(opset), 1), domain)
    except defs.SchemaError:
        return defs.get_schema(op_type, domain)   # newer than the model's opset: its first form


def check_node(n: onnx.NodeProto, index: int, opset: int):
    """Raise ModelLoadError unless node `n`'s attributes, inputs and outputs fit its schema."""
    s = schema(n.op_type, n.domain, opset)
    if s is None:
        from .quantized_contrib import CONTRIB_DOMAIN, CONTRIB_OPS, check_contrib
        if n.domain == CONTRIB_DOMAIN and n.op_type in CONTRIB_OPS:
            check_contrib(n, index)
        return
    where = f"node {n.name or '#' + str(index)!r} ({n.op_type})"
    seen = set()
    for a in n.attribute:
        if a.name in seen:
            raise ModelLoadError(f"{where} has attribute {a.name!r} twice")
        seen.add(a.name)
        if a.name == "consumed_inputs":      # a memory hint of opsets < 6, ignored on import
            continue
        decl = s.attributes.get(a.name)
        if decl is None:
            known = ", ".join(sorted(s.attributes)) or "none"
            raise ModelLoadError(f"{where} has attribute {a.name!r}, which {n.op_type} (opset "
                                 f"{s.since_version}) does not define (its attributes: {known})")
        if a.ref_attr_name:
            raise ModelLoadError(f"{where}: attribute {a.name!r} refers to a function attribute "
                                 f"{a.ref_attr_name!r} outside a function")
        if int(a.type) != int(decl.type):
            raise ModelLoadError(f"{where}: attribute {a.name!r} is of type {_type_name(a.type)}, "
                                 f"expected {_type_name(decl.type)}")
        if a.name in FLAGS and a.type == AttributeProto.INT and a.i not in (0, 1):
            raise ModelLoadError(f"{where}: attribute {a.name!r} = {a.i}, expected 0 or 1")
    for name, decl in s.attributes.items():
        if decl.required and name not in seen:
            raise ModelLoadError(f"{where} lacks the required attribute {name!r}")

    ins = list(n.input)
    if len(ins) > s.max_input:
        raise ModelLoadError(f"{where} has {len(ins)} inputs; {n.op_type} takes at most {s.max_input}")
    formals = list(s.inputs)
    for j, formal in enumerate(formals):
        given = ins[j] if j < len(ins) else ""
        if formal.option == _OPTIONAL:
            continue
        if formal.option == _VARIADIC:
            rest = ins[j:]
            if len(rest) < formal.min_arity or "" in rest:
                raise ModelLoadError(f"{where} needs at least {max(formal.min_arity, 1)} "
                                     f"non-empty input(s) for {formal.name!r}, got {rest}")
            break
        if not given:
            raise ModelLoadError(f"{where} lacks its required input {j} ({formal.name!r})")

    outs = list(n.output)
    if not s.min_output <= len(outs) <= s.max_output:
        takes = (str(s.min_output) if s.min_output == s.max_output else
                 f"{s.min_output} to {s.max_output}")
        raise ModelLoadError(f"{where} has {len(outs)} outputs; {n.op_type} has {takes}")
    for j, formal in enumerate(s.outputs[:len(outs)]):
        if formal.option != _OPTIONAL and formal.option != _VARIADIC and not outs[j]:
            raise ModelLoadError(f"{where} leaves its required output {j} ({formal.name!r}) unnamed")
    if not any(outs):
        raise ModelLoadError(f"{where} names none of its outputs")


# schemas whose type constraints contradict their own documentation (Tile-1 types `tiles` and
# `axis` as T, the data's float type, though they are int64 scalars)
MISTYPED = {("Tile", 1)}


def _type_str(dtype) -> str:
    try:
        return f"tensor({onnx.TensorProto.DataType.Name(onnx.helper.np_dtype_to_tensor_dtype(dtype)).lower()})"
    except Exception:
        return f"tensor({dtype})"


def check_types(n: onnx.NodeProto, index: int, opset: int, dtypes: list):
    """Raise ModelLoadError unless the input element types fit the schema's type constraints:
    each allowed for its type parameter, and inputs sharing a parameter (Add's A and B) equal."""
    s = schema(n.op_type, n.domain, opset)
    if s is None or (s.name, s.since_version) in MISTYPED:
        return
    where = f"node {n.name or '#' + str(index)!r} ({n.op_type})"
    allowed = {tc.type_param_str: set(tc.allowed_type_strs) for tc in s.type_constraints}
    bound: dict[str, tuple] = {}
    formals = list(s.inputs)
    for j, dtype in enumerate(dtypes):
        if dtype is None or not formals:
            continue
        formal = formals[min(j, len(formals) - 1)]
        if j >= len(formals) and formal.option != _VARIADIC:
            continue
        ts = _type_str(dtype)
        param = formal.type_str
        ok = allowed.get(param, {param})
        if ts not in ok:
            raise ModelLoadError(f"{where}: input {j} ({n.input[j]!r}) is {ts}, which {n.op_type} "
                                 f"does not take for {formal.name!r} (it takes {', '.join(sorted(ok))})")
        if param in allowed:
            if formal.option == _VARIADIC and not formal.is_homogeneous:
                continue
            if param in bound and bound[param][1] != ts:
                k, other = bound[param]
                raise ModelLoadError(f"{where}: inputs {k} ({n.input[k]!r}) and {j} ({n.input[j]!r}) "
                                     f"must have one element type, got {other} and {ts}")
            bound.setdefault(param, (j, ts))
