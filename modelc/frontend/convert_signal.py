"""DFT, STFT and MelWeightMatrix: spectral ops as products with constant matrices.

A DFT of a static length N along one axis is a product with N x N cosine and sine matrices (an FFT
would take N log N steps, but the dense kernel runs the product near the machine's peak, and audio
front-ends take frames of a few hundred samples). Truncation to `dft_length` reads fewer rows of
the matrices and zero padding adds none; a one-sided result keeps the first N // 2 + 1 columns; the
inverse of a one-sided spectrum (irfft) weighs each bin twice but the first and the Nyquist one, as
numpy's irfft, whose imaginary parts it ignores. STFT gathers its frames with a constant index,
applies its window and takes their one-sided DFT. MelWeightMatrix, whose inputs are scalars, is
computed at import by onnx's reference when they are constants. torch.stft and torch.fft.rfft export to these.
"""
from __future__ import annotations

import numpy as np
from onnx import helper

from ..errors import ModelcError, ShapeError
from ..ops.params import axis_index
from .convert_tensor import _ints_const
from .converters import converter


MAX_MATRIX = 1 << 26     # entries of a DFT matrix (a square one of 8,192) or of STFT's frame index


def _scalar(ctx, node, name, what):
    """The integer value of a constant scalar input, or a ShapeError naming it."""
    v = ctx.value(name)
    if v is None or np.asarray(v).size != 1:
        raise ShapeError(f"{node.where()}: its {what} {name!r} must be a constant scalar (the output's shape "
                         "depends on it)")
    return int(np.asarray(v).reshape(-1)[0])


def _matrix(ctx, node, m, dtype, hint):
    return ctx.const(np.ascontiguousarray(m.astype(dtype)), f"{node.name}_{hint}")


def _parts(ctx, node, x, complex_in):
    """The real and imaginary parts of x[..., 1 or 2] (None for a real signal), the last axis dropped."""
    r = ctx.rank(x)

    def part(k):
        s = ctx.emit("Slice", [x, _ints_const(ctx, node, [k], f"p{k}"), _ints_const(ctx, node, [k + 1], f"p{k}e"),
                               _ints_const(ctx, node, [r - 1], "last")])[0]
        return ctx.emit("Squeeze", [s, _ints_const(ctx, node, [r - 1], "last")])[0]
    return part(0), (part(1) if complex_in else None)


def dft(ctx, node, x, n, axis, inverse, onesided, outputs):
    """Emit the DFT of x[..., 1 or 2] along `axis` (of x, not its last) with length n into `outputs`."""
    r = ctx.rank(x)
    shape = ctx.shape(x)
    if r < 2 or shape[-1] not in (1, 2):
        raise ShapeError(f"{node.where()}: its input {x!r} has shape {list(shape)}; the last axis must hold "
                         "1 (real) or 2 (real, imaginary) values")
    a = axis % r
    if a == r - 1:
        raise ShapeError(f"{node.where()}: axis {axis} is the real/imaginary axis; the signal's axis must be another")
    if n < 1:
        raise ShapeError(f"{node.where()}: dft_length {n} is not a positive length")
    complex_in = shape[-1] == 2
    dtype = ctx.dtype(x)
    if not np.issubdtype(dtype, np.floating):
        raise ModelcError(f"{node.where()}: DFT of a {np.dtype(dtype).name} signal; it takes floats")
    length = shape[a]
    irfft = inverse and onesided
    if irfft:
        rows = min(length, n // 2 + 1)
        cols = n
    else:
        rows = min(length, n)
        cols = n // 2 + 1 if onesided else n
    if rows * cols > MAX_MATRIX:
        raise ShapeError(f"{node.where()}: a DFT of length {n} over {length} samples needs a {rows} x {cols} "
                         f"matrix; modelc's DFT matrices hold at most {MAX_MATRIX} entries")
    k = np.arange(rows, dtype=np.float64)[:, None]
    m = np.arange(cols, dtype=np.float64)[None, :]
    theta = 2 * np.pi * np.mod(k * m, n) / n
    cos, sin = np.cos(theta), np.sin(theta)
    re, im = _parts(ctx, node, x, complex_in)
    if length > rows:                                         # dft_length truncates the signal
        cut = [_ints_const(ctx, node, [v], h) for v, h in ((0, "zero"), (rows, "rows"), (a, "axis"))]
        re = ctx.emit("Slice", [re] + cut)[0]
        im = im and ctx.emit("Slice", [im] + cut)[0]
    perm = [d for d in range(r - 1) if d != a] + [a]          # the signal's axis last, for the products
    back = list(np.argsort(perm))
    re = ctx.emit("Transpose", [re], attrs={"perm": perm})[0]
    im = im and ctx.emit("Transpose", [im], attrs={"perm": perm})[0]
    mats: dict = {}                                           # each matrix one constant

    def prod(v, mat, hint):
        if hint not in mats:
            mats[hint] = _matrix(ctx, node, mat, dtype, hint)
        return ctx.emit("MatMul", [v, mats[hint]])[0]

    def join(parts):
        ys = [ctx.emit("Unsqueeze", [ctx.emit("Transpose", [p], attrs={"perm": back})[0],
                                     _ints_const(ctx, node, [r - 1], "last")])[0] for p in parts]
        if len(ys) == 1:
            ctx.emit("Identity", ys, outputs)
        else:
            ctx.emit("Concat", ys, outputs, {"axis": r - 1})

    if irfft:                       # numpy's irfft: each bin twice but the first and Nyquist, /n
        w = np.full((rows, 1), 2.0)
        w[0] = 1.0
        if n % 2 == 0 and rows > n // 2:
            w[n // 2] = 1.0
        out = prod(re, w * cos / n, "irfft_cos")
        if im is not None:
            out = ctx.emit("Sub", [out, prod(im, w * sin / n, "irfft_sin")])[0]
        join([out])
        return
    sign, scale = (1.0, 1.0 / n) if inverse else (-1.0, 1.0)
    # (re + i im)(cos + i sign sin) = re cos - sign im sin + i (im cos + sign re sin)
    out_re = prod(re, cos * scale, "cos")
    out_im = prod(re, sign * sin * scale, "sin")
    if im is not None:
        out_re = ctx.emit("Sub", [out_re, prod(im, sign * sin * scale, "sin")])[0]
        out_im = ctx.emit("Add", [out_im, prod(im, cos * scale, "cos")])[0]
    join([out_re, out_im])


def _dft_node(ctx, node, axis):
    ins = list(node.inputs) + [""] * 3
    x = ins[0]
    inverse = bool(int(node.attrs.get("inverse", 0)))
    onesided = bool(int(node.attrs.get("onesided", 0)))
    try:
        a = axis_index(axis, ctx.rank(x))
    except ValueError as e:
        raise ShapeError(f"{node.where()}: {e}") from None
    if ins[1]:
        n = _scalar(ctx, node, ins[1], "dft_length")
    else:
        n = 2 * (ctx.shape(x)[a] - 1) if inverse and onesided else ctx.shape(x)[a]
    dft(ctx, node, x, n, a, inverse, onesided, node.outputs)


@converter("DFT", since=17, away=True)
def dft_v17(ctx, node):
    _dft_node(ctx, node, int(node.attrs.get("axis", 1)))


@converter("DFT", since=20, away=True)
def dft_v20(ctx, node):
    ins = list(node.inputs) + [""] * 3
    _dft_node(ctx, node, _scalar(ctx, node, ins[2], "axis") if ins[2] else -2)


@converter("STFT", since=17, away=True)
def stft(ctx, node):
    ins = list(node.inputs) + [""] * 4
    x, step, window, length = ins[:4]
    shape = ctx.shape(x)
    if len(shape) != 3 or shape[-1] not in (1, 2):
        raise ShapeError(f"{node.where()}: its signal {x!r} has shape {list(shape)}, expected "
                         "[batch, samples, 1 or 2]")
    hop = _scalar(ctx, node, step, "frame_step")
    if window and ctx.rank(window) != 1:
        raise ShapeError(f"{node.where()}: its window {window!r} has shape {list(ctx.shape(window))}; it must be 1-d")
    n = _scalar(ctx, node, length, "frame_length") if length else \
        ctx.shape(window)[0] if window else shape[1]
    if window and ctx.shape(window)[0] != n:
        raise ShapeError(f"{node.where()}: its window has {ctx.shape(window)[0]} values, its frame_length is {n}")
    if hop < 1 or not 1 <= n <= shape[1]:
        raise ShapeError(f"{node.where()}: frame_step {hop} and frame_length {n} do not frame a signal of "
                         f"{shape[1]} samples")
    frames = 1 + (shape[1] - n) // hop
    if frames * n > MAX_MATRIX:
        raise ShapeError(f"{node.where()}: {frames} frames of {n} samples; modelc's STFT frames at most "
                         f"{MAX_MATRIX} samples in all")
    idx = np.arange(frames)[:, None] * hop + np.arange(n)[None, :]
    framed = ctx.emit("Gather", [x, ctx.const(idx.astype(np.int64), f"{node.name}_frames")], attrs={"axis": 1})[0]
    if window:
        w = ctx.emit("Reshape", [window, _ints_const(ctx, node, [1, 1, n, 1], "window_shape")])[0]
        framed = ctx.emit("Mul", [framed, w])[0]
    onesided = bool(int(node.attrs.get("onesided", 1)))
    dft(ctx, node, framed, n, 2, False, onesided, node.outputs)


@converter("MelWeightMatrix", since=17, away=True)
def mel_weight_matrix(ctx, node):
    """Its inputs are five scalars, constants in any model that exports it: onnx's reference computes it."""
    from onnx.reference import ReferenceEvaluator
    values = [ctx.value(i) for i in node.inputs]
    if any(v is None for v in values):
        raise ShapeError(f"{node.where()}: its inputs must be constants (its output's shape depends on them)")
    names = [f"i{k}" for k in range(len(values))]
    dtype = int(node.attrs.get("output_datatype", 1))
    graph = helper.make_graph(
        [helper.make_node("MelWeightMatrix", names, ["y"], output_datatype=dtype)], "mel",
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(np.asarray(v).dtype), np.shape(v))
         for n, v in zip(names, values)], [helper.make_tensor_value_info("y", dtype, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    try:
        (y,) = ReferenceEvaluator(model).run(None, {n: np.asarray(v) for n, v in zip(names, values)})
    except Exception as e:
        raise ModelcError(f"{node.where()}: {type(e).__name__}: {e}") from None
    ctx.emit("Identity", [ctx.const(np.asarray(y), f"{node.name}_mel")], node.outputs)
