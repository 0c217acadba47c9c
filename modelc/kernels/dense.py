"""Dense (x[..., K] @ w[K, N] + b) with a fused elementwise epilogue: the register-tiled GEMM of
kernels/gemm.py, the weights packed once at compile time as [N/NR, K, NR], the tile chosen by
kernels/gemm_space.py's model of the target.
"""
from __future__ import annotations

import math

import numpy as np

from .codegen import anchor_operands, packed_args, packer
from .gemm import Gemm, epilogue_ok, gemm_source, pack_b, plain
from .gemm_space import default_gemm, gemm_space, knob_values
from .space import ConfigSpace
from .template import Kernel, Template, register
from .workload import Workload


@register
class Dense(Template):
    name = "dense"
    stores_in_place = True     # (tile_stores / gemm: every element stored once, after its read)

    def _dims(self, wl: Workload):
        x = wl.spec(wl.anchor.args[0])
        w = wl.spec(wl.anchor.args[1])
        K, N = w.shape
        M = math.prod(x.shape[:-1])
        return M, K, N, x

    def matches(self, wl: Workload) -> bool:
        a = wl.anchor
        if a.op != "Dense" or len(a.args) < 2:
            return False
        if not all(r.startswith("i") for r in a.args[:2]):
            return False
        x, w = wl.spec(a.args[0]), wl.spec(a.args[1])
        if not w.const or len(w.shape) != 2 or len(x.shape) < 1 or x.shape[-1] != w.shape[0]:
            return False
        if x.dtype != np.float32 or w.dtype != np.float32 or not plain(x) or w.layout:
            return False
        if len(a.args) > 2 and a.args[2]:
            b = a.args[2]
            if not b.startswith("i") or not wl.spec(b).const or wl.spec(b).shape != (w.shape[1],):
                return False
        if math.prod(x.shape[:-1]) == 0 or w.shape[0] == 0 or w.shape[1] == 0:
            return False
        return epilogue_ok(wl, tuple(x.shape[:-1]) + (w.shape[1],))

    def space(self, wl: Workload) -> ConfigSpace:
        M, K, N, _ = self._dims(wl)
        return gemm_space(M, K, N, runtime_b=False)

    def default_config(self, wl: Workload, space: ConfigSpace):
        M, K, N, _ = self._dims(wl)
        return default_gemm(wl, space, M, K, N, 1, runtime_b=False)

    def build(self, wl: Workload, cfg) -> Kernel:
        M, K, N, x = self._dims(wl)
        vals = knob_values(cfg)
        NR = vals["tile_n"]
        x_arg, w_arg, b_arg = anchor_operands(wl)
        y_strides = wl.anchor.attr("y_strides")
        g = Gemm(M=M, K=K, N=N, a=f"in{x_arg}", b="w", b_packed=True,
                 out_shape=tuple(x.shape[:-1]) + (N,), row_dims=tuple(x.shape[:-1]),
                 bias="bias" if b_arg is not None else None,
                 out_strides=tuple(y_strides) if y_strides is not None else None)
        args, dtypes = packed_args(wl, x_arg, b_arg is not None)
        src = gemm_source(wl, g, vals, args, dtypes)
        return Kernel(src, args, packer(w_arg, b_arg, lambda w: pack_b(w, NR)))
