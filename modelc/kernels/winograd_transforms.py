"""Winograd's F(m x m, 3 x 3) matrices, the source of their products, and the weight transform.

Why a module of its own: these are the algorithm's fixed algebra (Lavin & Gray, CVPR'16), shared by
the template's generated transforms and its weight packing; winograd.py chooses and generates.
"""
from __future__ import annotations

import zlib

import numpy as np

# F(m, 3) matrices (Lavin & Gray; interpolation points 0, +-1, +-2 and infinity for m = 4)
MATRICES = {
    2: dict(BT=[[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]],
            G=[[1, 0, 0], [.5, .5, .5], [.5, -.5, .5], [0, 0, 1]],
            AT=[[1, 1, 1, 0], [0, 1, -1, -1]]),
    4: dict(BT=[[4, 0, -5, 0, 1, 0], [0, -4, -4, 1, 1, 0], [0, 4, -4, -1, 1, 0],
                [0, -2, -1, 2, 1, 0], [0, 2, -1, -2, 1, 0], [0, 4, 0, -5, 0, 1]],
            G=[[1 / 4, 0, 0], [-1 / 6, -1 / 6, -1 / 6], [-1 / 6, 1 / 6, -1 / 6],
               [1 / 24, 1 / 12, 1 / 6], [1 / 24, -1 / 12, 1 / 6], [0, 0, 1]],
            AT=[[1, 1, 1, 1, 1, 0], [0, 1, -1, 2, -2, 0], [0, 1, 1, 4, 4, 0], [0, 1, -1, 8, -8, 1]]),
}


def lin_source(row, names) -> str:
    """sum(row[k] * names[k]) as float32 source, skipping zeros and unit multiplies."""
    terms = []
    for c, n in zip(row, names):
        if c == 0:
            continue
        if c == 1:
            terms.append(f"+ {n}")
        elif c == -1:
            terms.append(f"- {n}")
        else:
            terms.append(f"{'-' if c < 0 else '+'} np.float32({abs(float(c))!r}) * {n}")
    if not terms:
        return "np.float32(0.0)"
    s = " ".join(terms)
    return s[2:] if s.startswith("+ ") else "-" + s[2:]


_LAST_TRANSFORM: list = []       # [(key, U)]: the last transform, for the next candidate


def transformed_weights(w: np.ndarray, m: int) -> np.ndarray:
    """U = G g G^T of weights [K, C, 3, 3] for F(m x m, 3 x 3), as float32 [a, a, K, C] (computed in
    float64). A tuning run packs every candidate of a task from the same weights, and candidates
    differ only in how U is blocked: the last U is kept, found again by the weights' content (a
    CRC, 5 ms for 512 x 512 x 3 x 3) - the einsum was 0.09-0.18 s of such a candidate's 0.15 s run."""
    w = np.ascontiguousarray(w)
    key = (m, w.shape, w.dtype.str, zlib.crc32(w.view(np.uint8).reshape(-1)))
    for k, u in _LAST_TRANSFORM:
        if k == key:
            return u
    G = np.array(MATRICES[m]["G"], np.float64)
    u = np.einsum("ik,ockl,jl->ijoc", G, w.astype(np.float64), G).astype(np.float32)
    u.setflags(write=False)                 # shared by the candidates that read it
    _LAST_TRANSFORM[:] = [(key, u)]
    return u
