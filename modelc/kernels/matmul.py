"""MatMul with numpy semantics (batched, broadcast batch dims, 1-d operands) and a fused epilogue.

Both operands are usually runtime tensors (attention: Q @ K^T, then a scale; P @ V). The kernel
is the register-tiled GEMM of kernels/gemm.py run over (batch x M tiles x N tiles); the right
operand is read in place (NR contiguous columns per k) or, with knob pack_b, first copied per work
item into a [K, NR] panel on the stack (zero-padded past N) that the item's m_group M tiles then
share. A constant 2-d right operand (which the passes normally turn into Dense) is packed once at
compile time as [N/NR, K, NR], exactly as Dense does. A 1-d operand is a matrix of one row (A)
or one column (B); the output is stored in the same memory order, so only the epilogue's
indices differ.
"""
from __future__ import annotations

import math

import numpy as np

from .. import target
from ..ops.internal import check_view
from ..ops.linalg import matmul_shape
from .codegen import packer
from .gemm import Gemm, epilogue_ok, gemm_source, pack_b, plain
from .gemm_space import MAX_PANEL_BYTES, default_gemm, gemm_space, knob_values
from .space import ConfigSpace
from .template import Kernel, Template, epilogue_inputs, register
from .workload import Workload


def _views(wl: Workload):
    """A StridedMatMul's operand views ((shape, strides) of A and B), or None for a MatMul."""
    op = wl.anchor
    if op.op != "StridedMatMul":
        return None
    return tuple(check_view(wl.spec(op.args[i]), op.attrs[f"{s}_shape"], op.attrs[f"{s}_strides"], s.upper(),
                            op.attrs.get(f"{s}_offset", 0)) for i, s in enumerate("ab"))


def _dims(wl: Workload):
    a, b = wl.spec(wl.anchor.args[0]), wl.spec(wl.anchor.args[1])
    sa, sb = tuple(a.shape), tuple(b.shape)
    views = _views(wl)
    if views is not None:
        (sa, a_st), (sb, b_st) = views
    out = matmul_shape(sa, sb)
    M = 1 if len(sa) == 1 else sa[-2]
    K = sa[-1]
    N = 1 if len(sb) == 1 else sb[-1]
    a_batch = sa[:-2] if len(sa) > 2 else ()
    b_batch = sb[:-2] if len(sb) > 2 else ()
    nb = max(len(a_batch), len(b_batch))
    batch = tuple(out[:nb])
    packed = b.const and len(sb) == 2 and views is None
    return dict(M=M, K=K, N=N, batch=batch, a_batch=a_batch, b_batch=b_batch, out=out,
                a1=len(sa) == 1, b1=len(sb) == 1, packed=packed,
                a_strides=a_st if views else None, b_strides=b_st if views else None)


@register
class BatchMatMul(Template):
    name = "batch_matmul"

    def matches(self, wl: Workload) -> bool:
        op = wl.anchor
        if op.op not in ("MatMul", "StridedMatMul") or len(op.args) != 2 or \
                not all(r.startswith("i") for r in op.args):
            return False
        a, b = wl.spec(op.args[0]), wl.spec(op.args[1])
        if a.dtype != np.float32 or b.dtype != np.float32 or not (plain(a) and plain(b)):
            return False
        if len(a.shape) < 1 or len(b.shape) < 1:
            return False
        try:
            d = _dims(wl)
        except (ValueError, KeyError, TypeError):
            return False
        out = d["out"]
        if 0 in out or d["K"] == 0:
            return False
        lanes = target.current().lanes(4)
        if not d["packed"] and d["N"] > lanes and d["N"] % lanes and d["K"] * lanes * 4 > MAX_PANEL_BYTES:
            return False                    # ragged N needs a packed panel, too big for the stack
        if d["b_strides"] is not None and d["b_strides"][-1] not in (0, 1):
            return False                    # B's columns apart (passes/matmul_views.py keeps those)
        return epilogue_ok(wl, out)

    def space(self, wl: Workload) -> ConfigSpace:
        d = _dims(wl)
        return gemm_space(d["M"], d["K"], d["N"], runtime_b=not d["packed"],
                          viewed=d["a_strides"] is not None)

    def default_config(self, wl: Workload, space: ConfigSpace):
        d = _dims(wl)
        return default_gemm(wl, space, d["M"], d["K"], d["N"], math.prod(d["batch"]),
                            runtime_b=not d["packed"], viewed=d["a_strides"] is not None)

    def build(self, wl: Workload, cfg) -> Kernel:
        d = _dims(wl)
        op = wl.anchor
        vals = knob_values(cfg)
        M, K, N = d["M"], d["K"], d["N"]
        NR = vals["tile_n"]
        a_arg, b_arg = int(op.args[0][1:]), int(op.args[1][1:])
        same = a_arg == b_arg
        bname = "w" if d["packed"] else f"in{b_arg}"
        g = Gemm(M=M, K=K, N=N, a=f"in{a_arg}", b=bname, b_packed=d["packed"], out_shape=d["out"],
                 batch=d["batch"], a_batch=d["a_batch"], b_batch=d["b_batch"],
                 row_dims=() if d["a1"] else (M,), col_dims=() if d["b1"] else (N,),
                 a_strides=d["a_strides"], b_strides=d["b_strides"],
                 a_offset=op.attrs.get("a_offset", 0), b_offset=op.attrs.get("b_offset", 0),
                 out_strides=tuple(op.attrs["y_strides"]) if "y_strides" in op.attrs else None)
        args = ["out0", f"in{a_arg}"] + ([] if same and not d["packed"] else [bname])
        args += [f"in{k}" for k in epilogue_inputs(wl.epilogue) if f"in{k}" not in args]
        dtypes = [np.float32 if s in ("out0", "w") else wl.inputs[int(s[2:])].dtype for s in args]
        src = gemm_source(wl, g, vals, args, dtypes)
        pack = packer(b_arg, None, lambda w: pack_b(w, NR)) if d["packed"] else None
        return Kernel(src, args, pack)
