"""Parameter and multiply-accumulate counts of a model, for reports and benchmarks."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper, shape_inference

NOT_PARAMETERS = (".running_mean", ".running_var")


def count_params(model: onnx.ModelProto) -> int:
    """Learned parameters as torch counts them: float weights, without BatchNorm running
    statistics and without the shared constants (scalars, reshape shapes) of the graph."""
    return sum(int(np.prod(init.dims)) for init in model.graph.initializer
               if init.data_type == onnx.TensorProto.FLOAT and not init.name.startswith("const_")
               and not init.name.endswith(NOT_PARAMETERS))


def count_macs(model: onnx.ModelProto, batch: int = 1) -> int:
    """Multiply-accumulates of Conv, Gemm and MatMul (elementwise work is not counted)."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    for value in model.graph.input:
        for d in value.type.tensor_type.shape.dim:
            if d.dim_param:
                d.Clear()
                d.dim_value = batch
    shapes = _static_shapes(shape_inference.infer_shapes(model, strict_mode=True))
    inits = {i.name: numpy_helper.to_array(i).shape for i in model.graph.initializer}
    shapes.update(inits)
    total = 0
    for node in model.graph.node:
        out = shapes.get(node.output[0])
        if out is None:
            continue
        if node.op_type == "Conv":
            w = shapes[node.input[1]]
            total += int(np.prod(out)) * int(np.prod(w[1:]))
        elif node.op_type in ("Gemm", "MatMul"):
            a = shapes[node.input[0]]
            k = a[0] if node.op_type == "Gemm" and _attr(node, "transA") else a[-1]
            total += int(np.prod(out)) * int(k)
    return total


def _attr(node, name, default=0):
    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return default


def _static_shapes(model: onnx.ModelProto) -> dict:
    g = model.graph
    out = {}
    for v in list(g.input) + list(g.value_info) + list(g.output):
        dims = v.type.tensor_type.shape.dim
        if all(d.HasField("dim_value") for d in dims):
            out[v.name] = tuple(d.dim_value for d in dims)
    return out
