"""Converters shared by all ops: Constant, and the per-family converter modules."""
from __future__ import annotations

import numpy as np

from ..errors import ModelcError
from .converters import converter
from . import (control_flow, convert_nn, convert_signal, convert_tensor, experimental, quantized,  # noqa: F401
               quantized_contrib, recurrent)  # (registration side effects)


@converter("Constant", away=True)
def constant(ctx, node):
    """A Constant node becomes a constant tensor; it never reaches the graph as an op."""
    attrs = node.attrs
    if len(attrs) != 1:
        raise ModelcError(f"{node.where()} must have exactly one value attribute, has {sorted(attrs)}")
    (key, value), = attrs.items()
    dtypes = {"value_float": np.float32, "value_floats": np.float32, "value_int": np.int64,
              "value_ints": np.int64}
    if key in ("value", "sparse_value"):
        arr = np.asarray(value)
    elif key in dtypes:
        arr = np.asarray(value, dtype=dtypes[key])
    else:
        raise ModelcError(f"{node.where()}: Constant attribute {key!r} is not supported")
    ctx.graph.add_const(node.outputs[0], arr)
