"""ONNX import: ModelProto -> Graph, with every tensor's static shape known.

Steps, top to bottom: load and check the model, inline local functions, bind input shapes (the
`shape=` override resolves symbolic dims), list every unsupported op at once, then convert node by
node in topological order, inferring each node's output shapes as it is added so that converters
can use them. Finally ONNX's own shape inference is compared with ours on every tensor where both
are static, so a disagreement surfaces at import rather than as a wrong answer later.
"""
from __future__ import annotations

import math
import operator
import os
import warnings

import numpy as np
import onnx
from onnx import helper, numpy_helper, shape_inference

from .. import ops
from ..errors import DynamicError, ModelcError, ModelLoadError, ShapeError, UnsupportedOpError
from ..ir import Graph, Node, Tensor
from . import converters as conv
from . import functions, qdq
from . import legacy  # noqa: F401  (registers the opset converters)
from .control_flow import all_nodes
from .experimental import EXPERIMENTAL
from .quantized_contrib import CONTRIB_DOMAIN, CONTRIB_OPS
from .tail import TAIL_OPS, TailBuilder
from .validate import check_node, check_text, check_types, schema

ONNX_DOMAINS = ("", "ai.onnx")
# a tensor larger than this is a malformed model, not a big one (the memory check sees the rest)
MAX_DIM, MAX_ELEMENTS = 2 ** 40, 2 ** 50
WINDOW_OPS = {"Conv", "ConvTranspose", "ConvInteger", "QLinearConv", "MaxPool", "AveragePool", "LpPool",
              "MaxUnpool", "DeformConv"}
WINDOW_LISTS = {"strides", "pads", "dilations", "output_padding", "output_shape"}


def load_model(model) -> onnx.ModelProto:
    """Accept a path, bytes or ModelProto; raise ModelLoadError for anything unreadable."""
    if isinstance(model, onnx.ModelProto):
        return model
    if isinstance(model, (bytes, bytearray)):
        try:
            proto = onnx.load_from_string(bytes(model))
        except Exception as e:
            raise ModelLoadError(f"cannot parse ONNX model from bytes: {e}") from None
        if not proto.graph.node and not proto.graph.output:
            raise ModelLoadError(f"the {len(model)} bytes hold no ONNX graph (empty, truncated or "
                                 "not an ONNX model)")
        return proto
    path = os.fspath(model)
    if not os.path.exists(path):
        raise ModelLoadError(f"model file {path!r} does not exist")
    try:
        proto = onnx.load(path)
    except Exception as e:
        why = str(e) if type(e).__name__ in ("DecodeError", "ValidationError") else f"{type(e).__name__}: {e}"
        raise ModelLoadError(f"{path!r} is not a readable ONNX model: {why}") from None
    if not proto.graph.node and not proto.graph.output:
        raise ModelLoadError(f"{path!r} holds no ONNX graph (empty or not an ONNX file)")
    return proto


def model_opset(proto: onnx.ModelProto) -> int:
    for imp in proto.opset_import:
        if imp.domain in ONNX_DOMAINS:
            return int(imp.version)
    return 1 if proto.ir_version < 3 else onnx.defs.onnx_opset_version()


def decode_attr(a: onnx.AttributeProto):
    v = helper.get_attribute_value(a)
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    if isinstance(v, onnx.TensorProto):
        return numpy_helper.to_array(v)
    if isinstance(v, onnx.SparseTensorProto):
        return _sparse_to_dense(v)
    if isinstance(v, (list, tuple)):
        return [x.decode("utf-8", "replace") if isinstance(x, bytes) else
                numpy_helper.to_array(x) if isinstance(x, onnx.TensorProto) else x for x in v]
    return v


def _sparse_to_dense(sp: onnx.SparseTensorProto) -> np.ndarray:
    values = numpy_helper.to_array(sp.values)
    idx = numpy_helper.to_array(sp.indices)
    dense = np.zeros(tuple(sp.dims), dtype=values.dtype)
    if idx.ndim == 1:
        dense.reshape(-1)[idx] = values
    else:
        dense[tuple(idx.T)] = values
    return dense


def _elem_name(elem_type: int) -> str:
    try:
        return onnx.TensorProto.DataType.Name(elem_type)
    except ValueError:
        return f"#{elem_type}"


def _np_dtype(elem_type: int, where: str):
    try:
        return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type))
    except Exception:
        name = _elem_name(elem_type) if elem_type else "undefined"
        raise ModelcError(f"{where} has element type {name}, which modelc does not support") from None


class Context:
    """What converters see: the graph being built, the opset, and shapes known so far."""

    def __init__(self, graph: Graph, opset: int):
        self.graph = graph
        self.opset = opset
        self.known: dict[str, np.ndarray] = {}   # values computable at import (not constants)
        self.current: Node | None = None
        # ONNX sequences, all resolved at import (control_flow.py): name -> its tensors' names
        self.sequences: dict[str, list[str]] = {}
        self.unrolled = 0                        # nodes Loops have written out so far
        self.reserved: set[str] = set()          # every name the model itself uses
        self._used: set[str] = set()

    def fresh(self, hint: str) -> str:
        """A tensor name used nowhere: not in the graph, not among the model's own names."""
        name, k = hint, 0
        while name in self.graph.tensors or name in self.graph.nx or name in self.reserved or \
                name in self.sequences:
            k += 1
            name = f"{hint}_{k}"
        self.reserved.add(name)
        return name

    def add_initializer(self, init: onnx.TensorProto):
        self.graph.add_const(init.name, _initializer(init))

    def import_node(self, n: onnx.NodeProto, index: int):
        """Check one ONNX node and convert it into canonical nodes (also those of an inlined If
        branch or an unrolled Loop body, control_flow.py)."""
        graph = self.graph
        base = n.name or f"{n.op_type}_{index}"
        name = base if base not in self._used else graph.fresh_name(base)
        self._used.add(name)
        check_node(n, index, self.opset)
        # consumed_inputs (opsets < 6) was a memory hint with no effect on the result
        attrs = {a.name: decode_attr(a) for a in n.attribute if a.name != "consumed_inputs"}
        if n.op_type in WINDOW_OPS:   # an empty list is the default, as onnxruntime reads it
            attrs = {k: v for k, v in attrs.items() if not (k in WINDOW_LISTS and v == [])}
        node = Node(name, n.op_type, list(n.input), list(n.output), attrs, onnx_name=n.name or name)
        for inp in node.inputs:
            if inp and inp not in graph.tensors and inp not in self.sequences:
                raise ModelLoadError(f"{node.where()} reads tensor {inp!r}, which is neither a graph "
                                     "input, an initializer nor the output of an earlier node "
                                     "(the nodes may not be in topological order)")
        check_types(n, index, self.opset, [graph.tensors[t].dtype if t in graph.tensors else None
                                           for t in node.inputs])
        if n.op_type in TAIL_OPS and n.op_type not in ops.REGISTRY and n.domain in ONNX_DOMAINS:
            # (in an If's branch or a Loop's body too: the whole node goes to the tail)
            raise DynamicError(f"{node.where()} decides its output's shape from the data")
        outer, self.current = self.current, node
        if functions.expands(n.op_type, n.domain, self.opset):
            functions.expand(self, n, node)
        else:
            conv.lookup(n.op_type, self.opset)(self, node)
        self.current = outer
        for out in node.outputs:
            if out and out not in self.sequences and (out not in graph.tensors or graph.tensors[out].shape is None):
                raise ModelcError(f"{node.where()}: the converter did not produce output {out!r}")

    # queries
    def tensor(self, name) -> Tensor:
        return self.graph.tensor(name)

    def shape(self, name) -> tuple:
        return self.graph.tensor(name).shape

    def rank(self, name) -> int:
        return len(self.shape(name))

    def dtype(self, name):
        return self.graph.tensor(name).dtype

    def value(self, name):
        """The value of a constant, or of a tensor computable from shapes alone; else None."""
        if not name:
            return None
        v = self.graph.value(name)
        return v if v is not None else self.known.get(name)

    # construction
    def const(self, value, hint="const") -> str:
        return self.graph.add_const(self.graph.fresh_name(hint), np.asarray(value))

    def emit(self, op_type: str, inputs, outputs=None, attrs=None, n_outputs=1) -> list[str]:
        """Add a canonical node; returns its output tensor names (fresh ones unless given)."""
        base = self.current.name if self.current is not None else op_type
        if outputs is None:
            outputs = [self.graph.fresh_name(f"{base}_{op_type.lower()}{k if n_outputs > 1 else ''}")
                       for k in range(n_outputs)]
        node = Node(self.graph.fresh_name(base), op_type, list(inputs), list(outputs),
                    dict(attrs or {}), onnx_name=self.current.onnx_name if self.current else "")
        self._add(node)
        return list(outputs)

    def emit_node(self, node: Node):
        """Add `node` as it is (canonical already)."""
        self._add(node)

    def alias(self, src: str, dst: str):
        """Make tensor `dst` (a node output in the model) equal to `src`, via Identity."""
        self.emit("Identity", [src], [dst])

    def _add(self, node: Node):
        if node.op_type not in ops.REGISTRY:
            raise UnsupportedOpError({node.op_type: [node.onnx_name or node.name]})
        ins = []
        for i in node.inputs:
            if not i:
                ins.append(None)
                continue
            t = self.graph.tensor(i)
            if t.shape is None:
                raise ShapeError(f"{node.where()} reads {i!r}, whose shape is unknown")
            ins.append(t if t.value is not None or i not in self.known else
                       Tensor(t.name, t.shape, t.dtype, self.known[i]))
        outs = ops.infer(node, ins)
        for o in outs:
            if o.shape is not None and (any(d > MAX_DIM for d in o.shape) or
                                        math.prod(o.shape) > MAX_ELEMENTS):
                raise ShapeError(f"{node.where()}: output {o.name!r} would have shape {list(o.shape)}, "
                                 f"more elements than modelc can address (at most {MAX_ELEMENTS:.2e})")
        self.graph.add_node(node)
        for o in outs:
            if not o.name:
                continue
            t = self.graph.tensors[o.name]
            t.shape, t.dtype = o.shape, o.dtype
            if o.value is not None:
                self.known[o.name] = o.value


def from_onnx(model, shape: dict | None = None, check: bool = True,
              default_batch: int | None = None) -> Graph:
    """Import an ONNX model (path, bytes or ModelProto) into a shape-annotated Graph.

    `shape` maps input names to concrete shapes; it is required for inputs with symbolic or
    unknown dimensions (dynamic batch) and must keep each input's rank. `default_batch`, if given,
    binds a symbolic *leading* dimension of an input that `shape` does not name (the batch of an
    exported model) - the command line uses 1.
    """
    proto = load_model(model)
    check_text(proto)
    if not proto.graph.output:
        raise ModelLoadError(f"graph {proto.graph.name!r} declares no outputs (a truncated or "
                             "incomplete model?)")
    if proto.functions:
        try:
            proto = onnx.inliner.inline_local_functions(proto)
        except Exception as e:
            raise ModelLoadError(f"cannot inline the model's local functions: {e}") from None
    if check:
        try:
            onnx.checker.check_model(proto)
        except Exception as e:   # the checker is advice only: modelc's own checks follow
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            warnings.warn(f"onnx.checker rejects the model ({first}); importing anyway", stacklevel=2)
    opset = model_opset(proto)
    g = proto.graph
    _check_supported(g, opset)
    for i, n in enumerate(g.node):
        check_node(n, i, opset)
    proto = qdq.fuse_groups(proto)     # (after the checks: their errors name the model's own nodes)
    g = proto.graph
    graph = Graph(g.name or "graph")
    graph.opset = opset
    ctx = Context(graph, opset)
    ctx.reserved = {i.name for i in g.input} | {t.name for t in g.initializer} | \
        {x for n in all_nodes(g) for x in list(n.input) + list(n.output) if x}

    init_names = set()
    for init in g.initializer:
        graph.add_const(init.name, _initializer(init))
        init_names.add(init.name)
    for sp in g.sparse_initializer:
        try:
            graph.add_const(sp.values.name, _sparse_to_dense(sp))
        except Exception as e:
            raise ModelLoadError(f"sparse initializer {sp.values.name!r} is malformed: {e}") from None
        init_names.add(sp.values.name)

    for inp in g.input:       # an initializer also listed as an input (a default the caller
        if inp.name in init_names:   # may not override here) must match its declaration
            dims, value = _static_dims(inp), graph.tensors[inp.name].value
            if dims is not None and tuple(dims) != tuple(value.shape):
                raise ModelLoadError(f"initializer {inp.name!r} has shape {list(value.shape)}, but the "
                                     f"graph input of that name declares {dims}")
    bound = _bind_inputs(g, init_names, shape or {}, default_batch)
    for name, (shp, dtype) in bound.items():
        graph.add_tensor(name, shp, dtype)
        graph.inputs.append(name)

    tail = TailBuilder()
    for i, n in enumerate(g.node):
        if tail.takes(n):
            tail.add(n)
            continue
        try:
            ctx.import_node(n, i)
        except DynamicError as e:
            tail.add(n, " ".join(str(e).split()))

    for out in g.output:
        if out.name in tail.produced:
            continue
        if out.name in ctx.sequences:
            raise ModelcError(f"graph output {out.name!r} is a sequence; modelc's modules return tensors")
        if out.name not in graph.tensors:
            raise ModelLoadError(f"graph output {out.name!r} is not produced by any node")
        graph.outputs.append(out.name)
    if tail.nodes:
        tail.attach(ctx, proto)
    _compare_with_onnx_inference(proto, bound, graph, skip=tail.produced)
    return graph


def _initializer(init: onnx.TensorProto) -> np.ndarray:
    """An initializer's value; its declared dims must match its data."""
    where = f"initializer {init.name!r}"
    if any(d < 0 for d in init.dims):
        raise ModelLoadError(f"{where} has a negative dimension in its shape {list(init.dims)}")
    if init.data_location == onnx.TensorProto.EXTERNAL:
        raise ModelLoadError(f"{where} keeps its data in an external file; load the model from its "
                             "path (with its data files next to it)")
    dtype = _np_dtype(init.data_type, where)
    if dtype.kind not in "biuf":
        raise ModelcError(f"{where} has element type "
                          f"{_elem_name(init.data_type)}, which modelc does not support")
    try:
        value = numpy_helper.to_array(init)
    except Exception:
        raise ModelLoadError(f"{where} is malformed: its data does not fill its declared shape "
                             f"{list(init.dims)} of {_elem_name(init.data_type)}") from None
    if tuple(value.shape) != tuple(init.dims):
        raise ModelLoadError(f"{where} has {value.size} values for its declared shape {list(init.dims)}")
    return value


def _check_supported(g: onnx.GraphProto, opset: int):
    """Raise one error listing every op type the model uses that modelc cannot import."""
    missing: dict[str, list[str]] = {}
    for i, n in enumerate(all_nodes(g)):
        if n.domain == CONTRIB_DOMAIN and n.op_type in CONTRIB_OPS:
            continue      # onnxruntime's quantized ops (quantized_contrib.py)
        if n.domain not in ONNX_DOMAINS:
            key = f"{n.domain}.{n.op_type}"
        elif (n.op_type in ops.REGISTRY or n.op_type in conv.CONVERTED_AWAY or n.op_type in TAIL_OPS) and \
                (schema(n.op_type, n.domain, opset) is not None or n.op_type in EXPERIMENTAL):
            continue      # (internal ops such as Dense are modelc's, not ONNX's)
        elif functions.expands(n.op_type, n.domain, opset):
            continue      # imported as the body of ops ONNX defines for it
        else:
            key = n.op_type
        missing.setdefault(key, []).append(n.name or f"#{i}")
    if missing:
        raise UnsupportedOpError(missing)


def _bind_inputs(g: onnx.GraphProto, init_names: set, override: dict, default_batch=None) -> dict:
    """Concrete (shape, dtype) of every real graph input (initializers listed as inputs excluded)."""
    real = [i for i in g.input if i.name not in init_names]
    names = [i.name for i in real]
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise ModelLoadError(f"graph input(s) {dup} are listed more than once")
    if not isinstance(override, dict):
        raise ShapeError(f"shape= must map input names to shapes, got {type(override).__name__}")
    for k in override:
        if k not in names:
            raise ShapeError(f"shape override for {k!r}, but the model's inputs are {names}")
    bound = {}
    for inp in real:
        tt = inp.type.tensor_type
        if not inp.type.HasField("tensor_type"):
            raise ModelcError(f"graph input {inp.name!r} is not a tensor (sequence or map inputs "
                              "are not supported)")
        dtype = _np_dtype(tt.elem_type, f"graph input {inp.name!r}")
        if dtype.kind not in "biuf":
            raise ModelcError(f"graph input {inp.name!r} has element type "
                              f"{_elem_name(tt.elem_type)}, which modelc does not support")
        dims = [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?")
                for d in tt.shape.dim] if tt.HasField("shape") else None
        if inp.name in override:
            if isinstance(override[inp.name], (str, bytes)) or not hasattr(override[inp.name], "__iter__"):
                raise ShapeError(f"shape override {override[inp.name]!r} for input {inp.name!r} is not "
                                 "a list of integers")
            try:
                shp = tuple(int(operator.index(d)) for d in override[inp.name])
            except TypeError:
                raise ShapeError(f"shape override {override[inp.name]!r} for input {inp.name!r} is not "
                                 "a sequence of integers") from None
            if dims is not None and len(dims) != len(shp):
                raise ShapeError(f"shape override {list(shp)} for input {inp.name!r} has rank "
                                 f"{len(shp)}, but the model declares rank {len(dims)} ({dims})")
            if dims is not None:
                for d, s in zip(dims, shp):
                    if isinstance(d, int) and d > 0 and d != s:
                        raise ShapeError(f"shape override {list(shp)} for input {inp.name!r} "
                                         f"contradicts its static shape {dims}")
            if any(s < 0 for s in shp):
                raise ShapeError(f"shape override {list(shp)} for input {inp.name!r} has a "
                                 "negative dimension")
        else:
            if default_batch and dims and not (isinstance(dims[0], int) and dims[0] > 0):
                dims = [default_batch] + dims[1:]
            hint = f"pass concrete shapes, e.g. shape={{{inp.name!r}: (1, ...)}}"
            if dims is not None and any(isinstance(d, int) and d < 0 for d in dims):
                raise ShapeError(f"input {inp.name!r} declares shape {dims} with a negative dimension; "
                                 f"if it stands for an unknown size, {hint}")
            if dims is None or any(not isinstance(d, int) for d in dims):
                raise ShapeError(
                    f"input {inp.name!r} has shape {dims} with unknown dimensions; pass concrete "
                    f"shapes, e.g. shape={{{inp.name!r}: (1, ...)}}")
            shp = tuple(dims)
        if any(d > MAX_DIM for d in shp) or math.prod(shp) > MAX_ELEMENTS:
            raise ShapeError(f"input {inp.name!r} has shape {list(shp)}, more elements than modelc can "
                             f"address (at most {MAX_ELEMENTS:.2e})")
        bound[inp.name] = (shp, dtype)
    return bound


def _static_dims(vi):
    if not vi.type.HasField("tensor_type") or not vi.type.tensor_type.HasField("shape"):
        return None
    dims = [d.dim_value if d.HasField("dim_value") else None for d in vi.type.tensor_type.shape.dim]
    return None if None in dims else dims


def _compare_with_onnx_inference(proto, bound: dict, graph: Graph, skip=frozenset()):
    declared = set()
    for out in proto.graph.output:
        if out.name in skip:
            continue
        t = graph.tensors.get(out.name)
        et = out.type.tensor_type.elem_type if out.type.HasField("tensor_type") else 0
        if t is not None and t.dtype is not None and et:
            try:
                same = np.dtype(helper.tensor_dtype_to_np_dtype(et)) == t.dtype
            except Exception:
                same = False
            if not same:
                raise ModelLoadError(f"graph output {out.name!r}: the model declares element type "
                                     f"{_elem_name(et)}, but its nodes compute "
                                     f"{t.dtype}")
        dims = _static_dims(out)
        if dims is None or t is None or t.shape is None:
            continue
        declared.add(out.name)
        if tuple(dims) != tuple(t.shape):
            raise ShapeError(f"graph output {out.name!r}: the model declares shape {dims}, but its "
                             f"inputs give {list(t.shape)}")
    m = onnx.ModelProto()
    m.CopyFrom(proto)
    m.ir_version = max(m.ir_version, 4)   # ONNX's inference ignores initializers not inputs before IR 4
    for n in m.graph.node:      # pads given with an auto_pad are ignored, as onnxruntime ignores them
        if any(a.name == "auto_pad" and a.s not in (b"", b"NOTSET") for a in n.attribute):
            for i in [i for i, a in enumerate(n.attribute) if a.name == "pads"][::-1]:
                del n.attribute[i]
        if n.op_type == "STFT" and not any(a.name == "onesided" for a in n.attribute):   # ONNX's inference
            n.attribute.append(helper.make_attribute("onesided", 1))   # reads its default 1 as 0 (ort: 1)
    for inp in m.graph.input:
        if inp.name in bound:
            shp = bound[inp.name][0]
            dims = inp.type.tensor_type.shape.dim
            del dims[:]
            for s in shp:
                dims.add().dim_value = s
    try:
        inferred = shape_inference.infer_shapes(m, check_type=False, strict_mode=False,
                                                data_prop=True)
    except Exception:
        return   # ONNX's inference has gaps; ours is authoritative, this is only a cross-check
    for vi in list(inferred.graph.value_info) + list(inferred.graph.output):
        if vi.name in declared or vi.name in skip:
            continue
        t = graph.tensors.get(vi.name)
        if t is None or t.shape is None or not vi.type.HasField("tensor_type"):
            continue
        tt = vi.type.tensor_type
        if not tt.HasField("shape"):
            continue
        dims = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]
        if None in dims:
            continue
        if tuple(dims) != tuple(t.shape):
            raise ShapeError(f"tensor {vi.name!r}: modelc infers shape {list(t.shape)} but ONNX shape "
                             f"inference says {dims}")
