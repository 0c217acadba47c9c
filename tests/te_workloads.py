"""Declarations for tests/test_te.py, each with the numpy formula it must equal (float64)."""
import math

import numpy as np

import modelc
from modelc import te


@modelc.register_workload
def matmul_add(N, L, M, dtype):
    A = te.placeholder((N, L), name="A", dtype=dtype)
    B = te.placeholder((L, M), name="B", dtype=dtype)
    C = te.placeholder((N, M), name="C", dtype=dtype)
    k = te.reduce_axis((0, L), name="k")
    matmul = te.compute((N, M), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="matmul",
                        attrs={"layout_free_placeholders": [B]})
    out = te.compute((N, M), lambda i, j: matmul[i, j] + C[i, j], name="out")
    return [A, B, C, out]


def np_matmul_add(a, b, c):
    return a @ b + c


def out_size(n, r, stride, pad, dil):
    return (n + 2 * pad - dil * (r - 1) - 1) // stride + 1


@modelc.register_workload
def conv2d(N, C, H, W, K, R, stride, pad, dil):
    """Padding by a condition inside the reduction, on the input's index expressions."""
    X = te.placeholder((N, C, H, W), name="X")
    Wt = te.placeholder((K, C, R, R), name="W")
    OH, OW = out_size(H, R, stride, pad, dil), out_size(W, R, stride, pad, dil)
    rc, ry, rx = te.reduce_axis((0, C), "rc"), te.reduce_axis((0, R), "ry"), te.reduce_axis((0, R), "rx")

    def f(n, k, y, x):
        h, w = y * stride + ry * dil - pad, x * stride + rx * dil - pad
        v = te.if_then_else(te.all(h >= 0, h < H, w >= 0, w < W), X[n, rc, h, w], 0.0)
        return te.sum(v * Wt[k, rc, ry, rx], axis=[rc, ry, rx])
    return [X, Wt, te.compute((N, K, OH, OW), f, name="conv")]


def np_conv2d(x, w, stride, pad, dil, depthwise=False):
    R = w.shape[2]
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    OH, OW = out_size(x.shape[2], R, stride, pad, dil), out_size(x.shape[3], R, stride, pad, dil)
    out = 0
    for ry in range(R):
        for rx in range(R):
            patch = xp[:, :, ry * dil:ry * dil + stride * (OH - 1) + 1:stride,
                       rx * dil:rx * dil + stride * (OW - 1) + 1:stride]
            if depthwise:
                out = out + patch * w[None, :, 0, ry, rx, None, None]
            else:
                out = out + np.einsum("nchw,kc->nkhw", patch, w[:, :, ry, rx])
    return out


@modelc.register_workload
def depthwise(N, C, H, W, R, stride, pad):
    """Padding as its own stage (inlined), conditions on the padded stage's axes."""
    X = te.placeholder((N, C, H, W), name="X")
    Wt = te.placeholder((C, 1, R, R), name="W")
    P = te.compute((N, C, H + 2 * pad, W + 2 * pad), lambda n, c, h, w: te.if_then_else(
        te.all(h >= pad, h < H + pad, w >= pad, w < W + pad), X[n, c, h - pad, w - pad], 0.0), name="pad")
    OH, OW = out_size(H, R, stride, pad, 1), out_size(W, R, stride, pad, 1)
    ry, rx = te.reduce_axis((0, R), "ry"), te.reduce_axis((0, R), "rx")
    out = te.compute((N, C, OH, OW), lambda n, c, y, x: te.sum(
        P[n, c, y * stride + ry, x * stride + rx] * Wt[c, 0, ry, rx], axis=[ry, rx]), name="dw")
    return [X, Wt, out]


@modelc.register_workload
def maxpool(N, C, H, W):
    X = te.placeholder((N, C, H, W), name="X")
    ry, rx = te.reduce_axis((0, 3), "ry"), te.reduce_axis((0, 3), "rx")
    OH, OW = out_size(H, 3, 2, 1, 1), out_size(W, 3, 2, 1, 1)

    def f(n, c, y, x):
        h, w = y * 2 + ry - 1, x * 2 + rx - 1
        return te.max(te.if_then_else(te.all(h >= 0, h < H, w >= 0, w < W), X[n, c, h, w], -math.inf),
                      axis=[ry, rx])
    return [X, te.compute((N, C, OH, OW), f, name="pool")]


def np_maxpool(x):
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)), constant_values=-np.inf)
    OH, OW = out_size(x.shape[2], 3, 2, 1, 1), out_size(x.shape[3], 3, 2, 1, 1)
    return np.max([xp[:, :, ry:ry + 2 * (OH - 1) + 1:2, rx:rx + 2 * (OW - 1) + 1:2]
                   for ry in range(3) for rx in range(3)], axis=0)


@modelc.register_workload
def softmax(N, D):
    X = te.placeholder((N, D), name="X")
    k1, k2 = te.reduce_axis((0, D), "k1"), te.reduce_axis((0, D), "k2")
    mx = te.compute((N,), lambda i: te.max(X[i, k1], axis=k1), name="maxelem")
    e = te.compute((N, D), lambda i, j: te.exp(X[i, j] - mx[i]), name="exp")
    s = te.compute((N,), lambda i: te.sum(e[i, k2], axis=k2), name="expsum")
    return [X, te.compute((N, D), lambda i, j: e[i, j] / s[i], name="softmax")]


def np_softmax(x):
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


@modelc.register_workload
def layer_norm(N, D, eps):
    X = te.placeholder((N, D), name="X")
    g, b = te.placeholder((D,), name="gamma"), te.placeholder((D,), name="beta")
    k1, k2 = te.reduce_axis((0, D), "k1"), te.reduce_axis((0, D), "k2")
    s = te.compute((N,), lambda i: te.sum(X[i, k1], axis=k1), name="sum")
    mean = te.compute((N,), lambda i: s[i] / float(D), name="mean")
    var = te.compute((N,), lambda i: te.sum((X[i, k2] - mean[i]) * (X[i, k2] - mean[i]), axis=k2), name="var")
    out = te.compute((N, D), lambda i, j: (X[i, j] - mean[i]) / te.sqrt(var[i] / float(D) + eps) * g[j] + b[j],
                     name="layer_norm")
    return [X, g, b, out]


def np_layer_norm(x, g, b, eps):
    m = x.mean(axis=1, keepdims=True)
    return (x - m) / np.sqrt(((x - m) ** 2).mean(axis=1, keepdims=True) + eps) * g + b


@modelc.register_workload
def conv1d(N, C, L, K, R, dil):
    X = te.placeholder((N, C, L), name="X")
    Wt = te.placeholder((K, C, R), name="W")
    rc, r = te.reduce_axis((0, C), "rc"), te.reduce_axis((0, R), "r")
    OL = L - dil * (R - 1)
    return [X, Wt, te.compute((N, K, OL), lambda n, k, x: te.sum(X[n, rc, x + r * dil] * Wt[k, rc, r], axis=[rc, r]),
                              name="conv1d")]


def np_conv1d(x, w, dil):
    R = w.shape[2]
    OL = x.shape[2] - dil * (R - 1)
    return sum(np.einsum("ncl,kc->nkl", x[:, :, r * dil:r * dil + OL], w[:, :, r]) for r in range(R))


@modelc.register_workload
def l2_normalize(N, D):
    X = te.placeholder((N, D), name="X")
    k = te.reduce_axis((0, D), "k")
    ss = te.compute((N,), lambda i: te.sum(X[i, k] * X[i, k], axis=k), name="sumsq")
    return [X, te.compute((N, D), lambda i, j: X[i, j] / te.sqrt(te.max(ss[i], 1e-12)), name="l2norm")]


def np_l2_normalize(x):
    return x / np.sqrt(np.maximum((x * x).sum(axis=1, keepdims=True), 1e-12))


@modelc.register_workload
def bmm_gelu(B, M, N, K):
    """A @ B^T per batch, with an exact GELU (erf) fused after the reduction."""
    A = te.placeholder((B, M, K), name="A")
    Bt = te.placeholder((B, N, K), name="B")
    k = te.reduce_axis((0, K), "k")
    mm = te.compute((B, M, N), lambda b, i, j: te.sum(A[b, i, k] * Bt[b, j, k], axis=k), name="bmm")
    return [A, Bt, te.compute((B, M, N), lambda b, i, j: 0.5 * mm[b, i, j] * (
        1.0 + te.erf(mm[b, i, j] * (1 / math.sqrt(2)))), name="gelu")]


def np_bmm_gelu(a, b):
    from math import erf
    mm = np.einsum("bik,bjk->bij", a, b)
    return 0.5 * mm * (1 + np.vectorize(erf)(mm / math.sqrt(2)))


@modelc.register_workload
def elementwise(N, M):
    """Every function, comparison, cast and integer index operator in one injective stage."""
    X = te.placeholder((N, M), name="X")
    Y = te.placeholder((N * M,), name="Y", dtype="float64")

    def f(i, j):
        x = X[i, j]
        flat = Y[(i * M + j) // M * M + (i * M + j) % M]
        v = te.if_then_else((x > 0.5) | (x < -1.0), te.exp(x), te.tanh(x)) + te.sigmoid(x) * te.abs(x)
        v = v + te.log(te.abs(x) + 1.0) + te.sqrt(te.abs(x)) + te.min(x, 0.25) - te.max(x, -0.25)
        v = v + te.cast("float32", (i * 3 + j) % 5) + te.erf(x) + flat.astype("float32")
        return te.if_then_else(te.all(i != j, x != 0.0), v, -v)
    return [X, Y, te.compute((N, M), f, name="mix")]


def np_elementwise(x, y):
    from math import erf
    N, M = x.shape
    i, j = np.indices((N, M))
    v = np.where((x > 0.5) | (x < -1.0), np.exp(x), np.tanh(x)) + 1 / (1 + np.exp(-x)) * np.abs(x)
    v = v + np.log(np.abs(x) + 1) + np.sqrt(np.abs(x)) + np.minimum(x, 0.25) - np.maximum(x, -0.25)
    v = v + (i * 3 + j) % 5 + np.vectorize(erf)(x) + y.reshape(N, M)
    return np.where((i != j) & (x != 0), v, -v)


@modelc.register_workload
def matmul_rownorm(N, L, M):
    """The reduction fused into its reader, which also reads a reduction declared after it."""
    A = te.placeholder((N, L), name="A")
    B = te.placeholder((L, M), name="B")
    k, k2 = te.reduce_axis((0, L), "k"), te.reduce_axis((0, L), "k2")
    mm = te.compute((N, M), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="mm")
    s = te.compute((N,), lambda i: te.sum(A[i, k2] * A[i, k2], axis=k2), name="s")
    return [A, B, te.compute((N, M), lambda i, j: mm[i, j] / (s[i] + 1.0), name="out")]


def np_matmul_rownorm(a, b):
    return a @ b / ((a * a).sum(axis=1, keepdims=True) + 1)
