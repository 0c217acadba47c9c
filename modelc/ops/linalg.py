"""Linear algebra: MatMul (numpy semantics), Gemm, Einsum.

Float16 is multiplied in float32 and cast back; integer products keep their dtype as ONNX says.
"""
from __future__ import annotations

import re

import numpy as np

from .registry import Kind, broadcast_shape, register


def _work_dtype(dtype):
    return np.float32 if np.dtype(dtype) == np.float16 else np.dtype(dtype)


def matmul_shape(a: tuple, b: tuple) -> tuple:
    """numpy.matmul's output shape: 1-D operands are promoted then squeezed, batches broadcast."""
    if len(a) == 0 or len(b) == 0:
        raise ValueError("MatMul operands must have rank >= 1")
    a2 = (1,) + tuple(a) if len(a) == 1 else tuple(a)
    b2 = tuple(b) + (1,) if len(b) == 1 else tuple(b)
    if a2[-1] != b2[-2]:
        raise ValueError(f"inner dimensions differ: {list(a)} @ {list(b)}")
    batch = broadcast_shape(a2[:-2], b2[:-2], where="MatMul batch dimensions")
    out = batch + (a2[-2], b2[-1])
    if len(a) == 1:
        out = out[:-2] + out[-1:]
    if len(b) == 1:
        out = out[:-1]
    return out


def _matmul_infer(a, b, *, exact=0, x_min=None):
    return matmul_shape(a.shape, b.shape), a.dtype


@register("MatMul", Kind.OUT_ELEMWISE_FUSABLE, infer=_matmul_infer)
def matmul(a, b, *, exact=0, x_min=None):
    """(`exact` and `x_min`: a quantized product's, as on Conv: ops/conv.py)"""
    wt = _work_dtype(a.dtype)
    return np.matmul(a.astype(wt, copy=False), b.astype(wt, copy=False)).astype(a.dtype, copy=False)


def _gemm_dims(a, b, trans_a, trans_b):
    if len(a) != 2 or len(b) != 2:
        raise ValueError(f"Gemm operands must be 2-D, got {list(a)} and {list(b)}")
    m, k = (a[1], a[0]) if trans_a else tuple(a)
    k2, n = (b[1], b[0]) if trans_b else tuple(b)
    if k != k2:
        raise ValueError(f"inner dimensions differ: A{list(a)} (transA={trans_a}) and B{list(b)} "
                         f"(transB={trans_b})")
    return m, n


def _gemm_infer(a, b, c=None, *, alpha=1.0, beta=1.0, transA=0, transB=0, exact=0, x_min=None):
    m, n = _gemm_dims(a.shape, b.shape, transA, transB)
    if c is not None and broadcast_shape(c.shape, (m, n), where="Gemm C") != (m, n):
        raise ValueError(f"C of shape {list(c.shape)} does not broadcast to [{m}, {n}]")
    return (m, n), a.dtype


@register("Gemm", Kind.OUT_ELEMWISE_FUSABLE, infer=_gemm_infer)
def gemm(a, b, c=None, *, alpha=1.0, beta=1.0, transA=0, transB=0, exact=0, x_min=None):
    dtype, wt = a.dtype, _work_dtype(a.dtype)
    a = a.astype(wt, copy=False)
    b = b.astype(wt, copy=False)
    y = np.matmul(a.T if transA else a, b.T if transB else b)
    if alpha != 1.0:
        y = y * wt.type(alpha) if wt.kind == "f" else y * alpha
    if c is not None and beta != 0:
        y = y + (c.astype(wt) * wt.type(beta) if beta != 1.0 else c.astype(wt))
    return np.asarray(y).astype(dtype, copy=False)


# ---- Einsum ----------------------------------------------------------------------------------

def einsum_terms(equation: str, shapes: list) -> tuple[list, str]:
    """Explicit input terms (ellipses expanded to fresh upper-case letters) and the output term.

    Shared with passes/einsum.py, which rewrites two-operand Einsums into MatMuls from these terms."""
    eq = equation.replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(shapes):
        raise ValueError(f"equation {equation!r} has {len(terms)} operands, got {len(shapes)}")
    ell_rank = 0
    for t, s in zip(terms, shapes):
        if "..." in t:
            ell_rank = max(ell_rank, len(s) - (len(t) - 3))
    ell = "".join(chr(ord("A") + i) for i in range(ell_rank))
    expanded = []
    for t, s in zip(terms, shapes):
        if "..." in t:
            k = len(s) - (len(t) - 3)
            t = t.replace("...", ell[ell_rank - k:] if k else "")
        if not re.fullmatch(r"[a-zA-Z]*", t) or len(t) != len(s):
            raise ValueError(f"term {t!r} of {equation!r} does not match an operand of "
                             f"rank {len(s)}")
        expanded.append(t)
    if arrow:
        out = rhs.replace("...", ell)
    else:
        counts = {}
        for t in expanded:
            for ch in t:
                counts[ch] = counts.get(ch, 0) + 1
        out = ell + "".join(sorted(ch for ch, n in counts.items() if n == 1 and ch not in ell))
    return expanded, out


def _einsum_infer(*ins, equation):
    terms, out = einsum_terms(equation, [t.shape for t in ins])
    sizes: dict = {}
    for t, x in zip(terms, ins):
        for ch, d in zip(t, x.shape):
            prev = sizes.get(ch)
            if prev is None or prev == 1:
                sizes[ch] = d
            elif d != 1 and d != prev:
                raise ValueError(f"label {ch!r} has sizes {prev} and {d}")
    return tuple(sizes[ch] for ch in out), ins[0].dtype


@register("Einsum", Kind.OPAQUE, infer=_einsum_infer)
def einsum(*ins, equation):
    terms, out = einsum_terms(equation, [x.shape for x in ins])
    wt = _work_dtype(ins[0].dtype)
    expr = ",".join(terms) + "->" + out
    y = np.einsum(expr, *[x.astype(wt, copy=False) for x in ins], optimize=len(ins) > 2)
    return np.asarray(y).astype(ins[0].dtype, copy=False)
