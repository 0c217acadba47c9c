"""Scaffolding the kernel templates share when they write source: splitting the parallel item into
coordinates, shifting a last tile back, the argument list and packing of a kernel with packed
weights, and the defaults' tests of a tile's waste and of whether to run in parallel.

Each helper returns exactly the text the templates wrote by hand before, so sharing them left every
generated kernel byte-identical.
"""
from __future__ import annotations

import math
from typing import Callable

import numpy as np

from .. import target
from .template import Kernel, ParallelLoop, epilogue_inputs, parallel_loop, source
from .workload import Workload


class ParallelItem:
    """Coordinates of a flat parallel item (`for it in prange(...)`), innermost first.

    `loop` heads the parallel loop, `take` peels one coordinate off (`t = it % 7`,
    `rest = it // 7`), `last` the outermost two (`ko = rest % 4`, `n = rest // 4`). A template may
    write its own lines between calls.
    """

    def __init__(self, flat: str = "it", ind: str = "    "):
        self.flat, self.rest, self.ind = flat, flat, ind

    def loop(self, n: int) -> ParallelLoop:
        """The body's parallel loop over the `n` items (`for it in prange(n):`)."""
        return parallel_loop(self.flat, n)

    def take(self, name: str, extent: int, wrap: Callable[[str], str] | None = None) -> list:
        """`name` = the item modulo `extent` (`wrap(expr)` of it, e.g. a tile start)."""
        digit = f"{self.rest} % {extent}"
        lines = [f"{self.ind}{name} = {wrap(f'({digit})') if wrap else digit}",
                 f"{self.ind}rest = {self.rest} // {extent}"]
        self.rest = "rest"
        return lines

    def last(self, name: str, extent: int, outer: str) -> list:
        """`name` = the item modulo `extent`, `outer` = what is left."""
        return [f"{self.ind}{name} = {self.rest} % {extent}", f"{self.ind}{outer} = {self.rest} // {extent}"]


def shifted_start(start: str, extent, size) -> str:
    """The start of a tile of `size` along `extent` (an int, or an expression), as source: a tile
    that would pass the end is shifted back to end there, so it recomputes a few elements rather
    than branching in the inner loop."""
    last = extent - size if isinstance(extent, int) and isinstance(size, int) else f"{extent} - {size}"
    return f"min({start}, {last})"


def unravel_index(flat: str, dims: tuple, prefix: str) -> tuple[list, list]:
    """Lines computing the row-major indices of `flat` over `dims` (named prefix0, prefix1, ...;
    a dim of 1 gets none), and the index expressions."""
    lines, exprs = [], []
    total = math.prod(dims)
    for k, d in enumerate(dims):
        if d == 1:
            exprs.append("0")
            continue
        s = math.prod(dims[k + 1:])
        e = flat if s == 1 else f"({flat}) // {s}"
        if s * d < total:
            e = f"({e}) % {d}"
        lines.append(f"{prefix}{k} = {e}")
        exprs.append(f"{prefix}{k}")
    return lines, exprs


def row_waste(extent: int) -> Callable[[int], float]:
    """waste(t): the fraction of `extent` that tiles of size t compute past its end (they cover
    ceil(extent / t) * t): what default configs weigh against the tile size they aim for."""
    return lambda t: (-(-extent // t) * t - extent) / extent


# ---- kernels with packed weights ---------------------------------------------------------------

def packed_args(wl: Workload, x_arg: int, has_bias: bool, extra: list = ()) -> tuple[list, list]:
    """Arguments of a kernel reading input `x_arg` and weights (and a bias) packed at compile
    time: out0, in{x_arg}, w, [bias], then the anchor's `extra` inputs and the epilogue's other
    inputs; and their dtypes."""
    args = ["out0", f"in{x_arg}", "w"] + (["bias"] if has_bias else [])
    args += [f"in{k}" for k in sorted(set(extra) | set(epilogue_inputs(wl.epilogue))) if k != x_arg]
    fixed = 3 + has_bias
    dtypes = [wl.outputs[0].dtype] + [np.float32] * (fixed - 1) + [wl.inputs[int(a[2:])].dtype for a in args[fixed:]]
    return args, dtypes


def packer(w_arg: int, b_arg: int | None, pack_weights: Callable) -> Callable:
    """The `pack` of such a kernel: "w" = pack_weights(constant input w_arg) and "bias" = the
    constant input b_arg (if any), both flat float32."""
    def pack(consts):
        res = {"w": np.ascontiguousarray(pack_weights(consts[w_arg]), dtype=np.float32).reshape(-1)}
        if b_arg is not None:
            res["bias"] = np.ascontiguousarray(np.asarray(consts[b_arg], np.float32).reshape(-1))
        return res
    return pack


def anchor_operands(wl: Workload) -> tuple[int, int, int | None]:
    """Input indices of the anchor's data, weight and bias (None without one)."""
    a = wl.anchor.args
    has_bias = len(a) > 2 and bool(a[2])
    return int(a[0][1:]), int(a[1][1:]), int(a[2][1:]) if has_bias else None


def packed_kernel(wl: Workload, body: list, pack_weights: Callable, extra: list = (),
                  reassoc: bool = True) -> Kernel:
    """The kernel of `body` over the anchor's data input, its weight packed by `pack_weights`
    (and its bias), the anchor's `extra` run-time inputs and the epilogue's inputs."""
    x_arg, w_arg, b_arg = anchor_operands(wl)
    args, dtypes = packed_args(wl, x_arg, b_arg is not None, extra)
    return Kernel(source(args, dtypes, body, reassoc=reassoc), args, packer(w_arg, b_arg, pack_weights))


def worth_parallel(work: int, per_thread: int) -> bool:
    """Whether `work` is worth spreading over the target's threads: there are several, and each
    gets at least `per_thread` of it (below that, waking them costs more than it saves)."""
    threads = target.current().threads
    return threads > 1 and work >= per_thread * threads
