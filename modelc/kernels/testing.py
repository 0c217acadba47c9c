"""Build, run and check one kernel against the reference executor (tests and tuning use this)."""
from __future__ import annotations

import numpy as np

from . import cache
from .layout import from_physical, physical_size, to_physical
from .template import Kernel, Template
from .workload import Workload


def bind(wl: Workload, kernel: Kernel, inputs: list, packed: dict | None = None) -> tuple[list, list]:
    """The kernel's argument arrays for logical `inputs`, and the output buffers among them."""
    if packed is None:
        consts = {k: inputs[k] for k, t in enumerate(wl.inputs) if t.const}
        packed = kernel.pack(consts) if kernel.pack else {}
    outs = [np.zeros(physical_size(t.shape, t.layout), t.dtype) for t in wl.outputs]
    args = []
    for a in kernel.args:
        if a.startswith("out"):
            args.append(outs[int(a[3:])])
        elif a.startswith("in"):
            k = int(a[2:])
            args.append(to_physical(inputs[k], wl.inputs[k].layout))
        else:
            args.append(packed[a])
    return args, outs


def reference_outputs(wl: Workload, inputs: list) -> list:
    return wl.reference(inputs)


def max_rel_error(got: list, want: list) -> float:
    err = 0.0
    for g, w in zip(got, want):
        if w.dtype.kind in "biu":
            err = max(err, float(np.any(g != w)))
            continue
        scale = max(float(np.abs(w).max()) if w.size else 0.0, 1e-30)
        err = max(err, float(np.abs(g.astype(np.float64) - w).max()) / scale if w.size else 0.0)
    return err


def dtype_tolerance(dtypes, base: float) -> float:
    """`base` (relative to the output scale), or 4 epsilons of the least precise float among
    `dtypes` where that is coarser: a float16 kernel computes in float32 and rounds where the
    reference rounds, so it may differ from it by an ulp or two of float16 at the output's scale."""
    return max([base] + [4 * float(np.finfo(d).eps) for d in map(np.dtype, dtypes) if d.kind == "f"])


def tolerance(wl: Workload, base: float) -> float:
    """dtype_tolerance of the workload's outputs."""
    return dtype_tolerance((t.dtype for t in wl.outputs), base)


def run(wl: Workload, template: Template, cfg, inputs: list | None = None, seed: int = 0):
    """(logical outputs, reference outputs, compiled fn, args) of one kernel on seeded inputs."""
    kernel = template.build(wl, cfg)
    fn = cache.load(kernel.source)
    inputs = inputs if inputs is not None else wl.random_inputs(seed)
    args, outs = bind(wl, kernel, inputs)
    fn(*args)
    got = [from_physical(o, t.shape, t.layout) for o, t in zip(outs, wl.outputs)]
    return got, reference_outputs(wl, inputs), fn, args


def sampled_configs(template: Template, wl: Workload, valid: int, draws: int, seed: int) -> list:
    """The template's default config for `wl`, then the first `valid` valid ones of `draws` drawn
    at random from its space (seeded): a kernel checked under schedules tuning could pick."""
    space = template.space(wl)
    drawn = [space.get(int(i)) for i in np.random.default_rng(seed).permutation(len(space))[:draws]]
    return [template.default_config(wl, space)] + [c for c in drawn if space.is_valid(c)][:valid]


def stores_per_output(fn, args: list) -> np.ndarray:
    """How many of a kernel's items store each element of its first output: each item is run alone
    (the cfunc over [item, item + 1)) on an output full of NaN. More than one means two threads may
    race on an output (templates that shift edge tiles must leave it to one owner)."""
    import ctypes
    out = args[0]
    words = [v for a in args for v in (ctypes.c_void_p(a.ctypes.data), ctypes.c_ssize_t(a.size))]
    kernel = ctypes.CFUNCTYPE(None, *[type(w) for w in words], ctypes.c_ssize_t, ctypes.c_ssize_t)(fn.address)
    counts = np.zeros(out.size, np.int64)
    for item in range(fn.n_items):
        out[:] = np.nan
        kernel(*words, item, item + 1)
        counts += ~np.isnan(out)
    return counts
