"""A te kernel's document as the measurement and tuning machinery reads a workload.

The templates' workloads (kernels/workload.py) describe fused ONNX ops; a te kernel is described by
its document (document.py). This view gives it the same face - input and output specs, seeded
inputs, the reference outputs (numpy's evaluation of the declaration) - so the measurer, the
records, the cost model and the task scheduler serve te kernels unchanged.
"""
from __future__ import annotations

import numpy as np

from ..kernels.workload import TensorSpec, Workload
from .document import from_document


class TeWorkload:
    ops: list = []                     # no ONNX ops: nothing is fused by name
    params: dict = {}

    def __init__(self, doc: dict):
        self.json = doc
        self.dag, self.plan = from_document(doc)
        self.inputs = [TensorSpec(tuple(t.shape), np.dtype(t.dtype)) for t in self.dag.inputs]
        self.outputs = [TensorSpec(tuple(t.shape), np.dtype(t.dtype)) for t in self.dag.outputs]

    random_inputs = Workload.random_inputs  # floats of order one, small integers (no constants)

    def integer_inputs(self) -> dict:
        """None of a declared computation's inputs hold a quantized op's integers."""
        return {}

    def reference(self, inputs: list) -> list:
        out = self.dag.evaluate(*inputs)
        return list(out) if isinstance(out, tuple) else [out]


def is_document(doc) -> bool:
    return isinstance(doc, dict) and "te" in doc


def view(doc: dict):
    """The workload of a document: a te kernel's, or an ONNX-ops workload (kernels/workload.py)."""
    return TeWorkload(doc) if is_document(doc) else Workload(doc)
