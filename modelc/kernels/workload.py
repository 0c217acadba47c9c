"""A task's workload (the canonical JSON of `extract.workload_of`) as kernel templates read it.

Templates work from this description alone - never from the model graph - so a tuning worker can
rebuild any kernel from a log record, and a saved module regenerates its kernels from data.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..ir import Graph, Node

BYTES = (np.dtype(np.uint8), np.dtype(np.int8))      # what a quantized conv may read (`x_zero`) and store


@dataclass
class TensorSpec:
    shape: tuple
    dtype: np.dtype
    const: bool = False
    layout: tuple | None = None

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))


@dataclass
class Op:
    index: int
    op: str
    attrs: dict
    args: list          # "i3" (workload input), "p0" (inlined constant), "v2" / "v2.1" (op result), ""

    def attr(self, name, default=None):
        return self.attrs.get(name, default)


class Workload:
    def __init__(self, wl: dict):
        self.json = wl
        self.inputs = [TensorSpec(tuple(t["shape"]), np.dtype(t["dtype"]), t.get("const", False),
                                  tuple(t["layout"]) if t.get("layout") else None) for t in wl["inputs"]]
        self.outputs = [TensorSpec(tuple(t["shape"]), np.dtype(t["dtype"]), False,
                                   tuple(t["layout"]) if t.get("layout") else None) for t in wl["outputs"]]
        self.output_values = [t["value"] for t in wl["outputs"]]
        self.ops = [Op(i, o["op"], o["attrs"], list(o["args"])) for i, o in enumerate(wl["ops"])]
        self.params = {k: _from_json(v) for k, v in wl["params"].items()}

    @property
    def anchor(self) -> Op:
        return self.ops[0]

    @property
    def epilogue(self) -> list:
        return self.ops[1:]

    def spec(self, ref: str) -> TensorSpec:
        """Shape/dtype of any value named in op args."""
        if ref.startswith("i"):
            return self.inputs[int(ref[1:])]
        if ref.startswith("p"):
            v = self.params[ref]
            return TensorSpec(v.shape, v.dtype, True)
        return self.value_specs()[ref]

    def value_specs(self) -> dict:
        """Shape/dtype of every value the ops compute (by the shape rules; computed once)."""
        if not hasattr(self, "_vs"):
            g = self.to_graph()
            self._vs = {}
            for j, n in enumerate(g.topo()):
                for k, o in enumerate(n.outputs):
                    if o:
                        t = g.tensors[o]
                        self._vs[o] = TensorSpec(t.shape, t.dtype)
        return self._vs

    def to_graph(self) -> Graph:
        """The workload as a runnable graph (inputs i0.., constants p0..), for the reference."""
        from .. import ops as registry
        from ..ir import Tensor
        g = Graph("workload")
        for k, t in enumerate(self.inputs):
            g.add_tensor(f"i{k}", t.shape, t.dtype)
            g.inputs.append(f"i{k}")
        for k, v in self.params.items():
            g.add_const(k, v)
        for op in self.ops:
            outs = self._op_outputs(op)
            node = Node(f"n{op.index}", op.op, list(op.args), outs, dict(op.attrs))
            ins = [None if not a else g.tensors[a] for a in op.args]
            for t in registry.infer(node, [None if t is None else Tensor(t.name, t.shape, t.dtype, t.value)
                                           for t in ins]):
                g.add_tensor(t.name, t.shape, t.dtype)
            g.add_node(node)
        g.outputs = list(self.output_values)
        return g

    def _op_outputs(self, op: Op) -> list:
        prefix = f"v{op.index}"
        used = {v for o in self.ops for v in o.args} | set(self.output_values)
        multi = sorted(int(v.split(".")[1]) for v in used if v.startswith(prefix + "."))
        if not multi:
            return [prefix]
        return [f"{prefix}.{k}" if k in multi else "" for k in range(max(multi) + 1)]

    def reference(self, inputs: list) -> list:
        """The outputs of the reference executor for logical `inputs`."""
        from .. import reference
        g = self.to_graph()
        res = reference.run(g, {f"i{k}": x for k, x in enumerate(inputs)})
        return [res[o] for o in g.outputs]

    def integer_inputs(self) -> dict:
        """{input index: (low, high)} for the float inputs that hold integers in a quantized conv or
        product (the importer's `x_min` on an exact Conv or Dense: its centered 8-bit input, int8
        weights and an integer bias), which kernels rely on: conv2d_int8 packs such weights as int8.
        An input read as bytes (`x_zero`, passes/byte_inputs.py) holds its type's whole range."""
        a = self.anchor
        low = a.attr("x_min")
        if a.op not in ("Conv", "Dense") or not a.attr("exact", 0) or not isinstance(low, int) \
                or isinstance(low, bool) or not -255 <= low <= 0:
            return {}
        ranges = [(low, low + 255), (-128, 127), (-(1 << 16), 1 << 16)]
        if "x_zero" in a.attrs:         # the input is read as bytes q, the conv is of q - x_zero
            z, x = a.attrs["x_zero"], a.args[0]
            dt = self.inputs[int(x[1:])].dtype if x.startswith("i") else None
            if dt not in BYTES or not isinstance(z, int) or \
                    isinstance(z, bool) or low != int(np.iinfo(dt).min) - z:
                return {}
            ranges[0] = (int(np.iinfo(dt).min), int(np.iinfo(dt).max))
        return {int(x[1:]): r for x, r in zip(a.args, ranges) if x.startswith("i")}

    def random_inputs(self, seed: int = 0) -> list:
        """Seeded logical inputs (weights scaled like He init so values stay of order one)."""
        rng = np.random.default_rng(seed)
        out = []
        ints = self.integer_inputs()
        for k, t in enumerate(self.inputs):
            if k in ints:
                x = rng.integers(ints[k][0], ints[k][1] + 1, t.shape).astype(t.dtype)
            elif t.dtype.kind == "f":
                x = rng.standard_normal(t.shape).astype(t.dtype)
                if t.const and len(t.shape) > 1:
                    fan_in = int(np.prod(t.shape[1:])) if len(t.shape) == 4 else t.shape[0]
                    x *= np.sqrt(2.0 / max(fan_in, 1)).astype(t.dtype)
            elif t.dtype.kind == "b":
                x = rng.integers(0, 2, t.shape).astype(bool)
            else:
                x = rng.integers(0, 4, t.shape).astype(t.dtype)
            out.append(x)
        return out


def _from_json(v):
    if isinstance(v, dict) and "dtype" in v:
        return np.array(v["value"], dtype=v["dtype"]).reshape(v["shape"])
    return np.array(v)
