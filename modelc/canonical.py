"""The canonical description of a fused group - its workload - and the key records file it under.

A workload is a JSON of the group's op pattern, attributes, input/output shapes, dtypes and layouts,
and the values of the small constants a kernel is generated for (shapes, axes, scalars) - never node
names or weight values, so the same layer has the same key in another model, process, day or
exporter. It sits below the passes (which ask a template whether it takes a group they would make)
and `extract` (which counts equal keys into tasks).
"""
from __future__ import annotations

import functools
import hashlib
import json

import numpy as np
import onnx

from .ir import Graph, Node

KEY_VERSION = 1
COMMUTATIVE = {"Add", "Mul", "Max", "Min", "Sum", "Mean", "And", "Or", "Xor", "Equal"}


@functools.lru_cache(maxsize=None)
def _schema_default(op: str, name: str):
    """The default ONNX declares for an attribute (in the newest schema, our canonical form)."""
    try:
        a = onnx.defs.get_schema(op).attributes.get(name)
    except Exception:
        return None
    if a is None or a.default_value.type == onnx.AttributeProto.UNDEFINED:
        return None
    return json.dumps(_jsonable(onnx.helper.get_attribute_value(a.default_value)))


def _jsonable(v):
    if isinstance(v, bytes):
        return v.decode()
    if isinstance(v, np.ndarray):
        return {"dtype": v.dtype.name, "shape": list(v.shape), "value": _jsonable(v.tolist())}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, (bool, np.bool_)):
        return int(v)
    if isinstance(v, (int, np.integer)):
        return int(v)
    if isinstance(v, (float, np.floating)):
        return float(np.float32(v)) if np.isfinite(v) else repr(float(v))
    return v


def _canonical_attrs(node: Node) -> dict:
    out = {}
    for k, v in sorted(node.attrs.items()):
        jv = _jsonable(v)
        if json.dumps(jv) != _schema_default(node.op_type, k):
            out[k] = jv
    return out


def workload_of(graph: Graph, node: Node) -> dict:
    """The canonical description of a Fused node (or of a single node, as its own group)."""
    sub = node.subgraph
    names: dict[str, str] = {}
    inputs = []
    for i, t in enumerate(node.inputs):
        names[(sub.inputs[i] if sub is not None else t)] = f"i{i}"
        src = graph.tensors[t]
        inputs.append({"shape": list(src.shape), "dtype": src.dtype.name, "const": src.is_const})
        if src.layout:
            inputs[-1]["layout"] = list(src.layout)
    nodes = sub.topo() if sub is not None else [node]
    tensors = sub.tensors if sub is not None else graph.tensors
    params = {}
    body = []
    for j, n in enumerate(nodes):
        args = []
        for t in n.inputs:
            if not t:
                args.append("")
            elif t in names:
                args.append(names[t])
            else:                                   # a constant inlined into the kernel
                p = f"p{len(params)}"
                names[t] = p
                params[p] = _jsonable(tensors[t].value)
                args.append(p)
        if n.op_type in COMMUTATIVE:
            # the chain value first, then by name: Add(a, b) and Add(b, a) are one workload
            args = sorted(args, key=lambda a: ({"v": 0, "i": 1, "p": 2}.get(a[:1], 3), a))
        for k, o in enumerate(n.outputs):
            if o:
                names[o] = f"v{j}" if len(n.outputs) == 1 else f"v{j}.{k}"
        body.append({"op": n.op_type, "attrs": _canonical_attrs(n), "args": args})
    outputs = []
    for k, o in enumerate(node.outputs):
        if o:
            t = graph.tensors[o]
            outputs.append({"shape": list(t.shape), "dtype": t.dtype.name,
                            "value": names.get((sub.outputs[k] if sub is not None else o))})
            if t.layout:
                outputs[-1]["layout"] = list(t.layout)
    return {"version": KEY_VERSION, "inputs": inputs, "ops": body, "params": params,
            "outputs": outputs}


def workload_key(workload: dict) -> str:
    text = json.dumps(workload, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:24]
