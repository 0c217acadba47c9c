"""The executable module: generated kernels run in order over planned buffers.

A module is built from a *program* (plain data: the steps, each a workload with its template and
config, and the tensors) plus the model's constants. Kernels are regenerated from the program by
the templates and loaded from the kernel cache, so `save` writes only data (JSON and arrays in an
.npz, never a pickle or source code) and `load` compiles nothing that is already cached.
"""
from __future__ import annotations

import functools
import io
import json
import os
import statistics
import time
import zipfile

import numpy as np

from .. import __version__
from ..errors import InputError, ModelcError
from ..kernels import cache, launch
from ..kernels import templates as _templates  # noqa: F401  (registers the templates)
from ..kernels.layout import from_physical, physical_size, same_as_plain, to_physical
from ..kernels.template import get as get_template
from ..kernels.workload import Workload
from .plan import plan_buffers

FORMAT_VERSION = 1


def _is_view(step: dict, tensors: dict) -> bool:
    """A reshape of a plain tensor into a plain tensor needs no kernel: it shares the buffer."""
    wl = step["workload"]
    if [o["op"] for o in wl["ops"]] not in (["Reshape"], ["Identity"]) or len(step["inputs"]) < 1:
        return False
    src, dst = tensors[step["inputs"][0]], tensors[step["outputs"][0]]
    if src.get("const") or src["dtype"] != dst["dtype"]:
        return False
    return same_as_plain(src["shape"], src["layout"]) and same_as_plain(dst["shape"], dst["layout"])


def _sequences(calls: list) -> list:
    """The calls with each stretch of two or more generated kernels run as one native call."""
    out, run = [], []

    def flush():
        if len(run) > 1:
            out.append(launch.Sequence(run, cache.sequence_runner()))
        else:
            out.extend(run)
        run.clear()

    for c in calls:
        if isinstance(c, launch.BoundKernel) and c.table.size <= launch.MAX_WORDS:
            run.append(c)
        else:
            flush()
            out.append(c)
    flush()
    return out


class Module:
    def __init__(self, program: dict, constants: dict, jobs: int | None = None, progress=None):
        if program.get("format") != FORMAT_VERSION:
            raise ModelcError(f"module format {program.get('format')} is not supported "
                              f"(this modelc reads format {FORMAT_VERSION})")
        self.program = program
        self.constants = constants
        self.input_specs = program["inputs"]
        self.output_specs = program["outputs"]
        tensors = program["tensors"]
        steps = program["steps"]
        for s in steps:
            s["view"] = _is_view(s, tensors)

        kernels = []
        for s in steps:
            if s["view"]:
                kernels.append(None)
                continue
            wl = Workload(s["workload"])
            tpl = get_template(s["template"])
            sp = tpl.space(wl)
            cfg = sp.from_values(s["config"]) if s["config"] is not None else tpl.default_config(wl, sp)
            kernels.append(tpl.build(wl, cfg))
        sources = [k.source for k in kernels if k is not None and k.source is not None]
        names = [f"op {s['pattern']} ({s.get('desc', '')}) of the node writing {', '.join(map(repr, s['outputs']))}"
                 for s, k in zip(steps, kernels) if k is not None and k.source is not None]
        fns = iter(cache.compile_all(sources, jobs=jobs, progress=progress, names=names))
        self.fallbacks = [s["pattern"] for s, k in zip(steps, kernels) if k is not None and k.source is None]

        data = {n: (t["shape"], t["dtype"], tuple(t["layout"]) if t["layout"] else None)
                for n, t in tensors.items() if not t.get("const")}
        plan = plan_buffers([(s["inputs"], s["outputs"], s["view"]) for s in steps], data,
                            [i["name"] for i in self.input_specs], [o["name"] for o in self.output_specs])
        self.plan = plan
        self._buffers = [np.zeros(size, dt) for size, dt in plan.buffers]

        def buf(name):
            t = tensors[name]
            if t.get("const"):      # kernels take writable arrays; constants may be read-only views
                return np.require(to_physical(constants[name].astype(t["dtype"], copy=False),
                                              tuple(t["layout"]) if t["layout"] else None),
                                  requirements=["C", "W"])
            return self._buffers[plan.tensor_buffer[name]]

        self._calls = []
        self.step_names = []
        for s, k in zip(steps, kernels):
            if k is None:
                continue
            fn = k.python if k.source is None else next(fns)
            consts = {i: constants[n] for i, n in enumerate(s["inputs"]) if tensors[n].get("const")}
            packed = k.pack(consts) if k.pack else {}
            args = []
            for a in k.args:
                if a.startswith("out"):
                    args.append(buf(s["outputs"][int(a[3:])]))
                elif a.startswith("in"):
                    args.append(buf(s["inputs"][int(a[2:])]))
                else:
                    args.append(np.require(packed[a], requirements=["C", "W"]))
            # a generated kernel is bound to its buffers once; a fallback is a Python function
            self._calls.append(fn.bind(args) if k.source is not None else functools.partial(fn, *args))
            self.step_names.append(s["pattern"])
        self._program = _sequences(self._calls)
        self._in = [(i["name"], tuple(i["shape"]), np.dtype(i["dtype"]), buf(i["name"]))
                    for i in self.input_specs]
        self._out = [(o["name"], tuple(o["shape"]), o) for o in self.output_specs]
        self._tensors = tensors

    # ---- running --------------------------------------------------------------------------------
    def run(self, feeds: dict) -> dict:
        """Outputs for `feeds` ({input name: array}), as {output name: array}."""
        names = [n for n, *_ in self._in]
        unknown = sorted(set(feeds) - set(names))
        if unknown:
            raise InputError(f"unknown input(s) {unknown}; the model's inputs are {names}")
        for name, shape, dtype, buf in self._in:
            if name not in feeds:
                raise InputError(f"missing input {name!r}; the model's inputs are {names}")
            x = np.asarray(feeds[name])
            if x.shape != shape:
                raise InputError(f"input {name!r} has shape {list(x.shape)}, expected {list(shape)}")
            if x.dtype != dtype:
                raise InputError(f"input {name!r} has dtype {x.dtype}, expected {dtype}")
            np.copyto(buf.reshape(shape), x)
        for call in self._program:
            call()
        out = {}
        for name, shape, spec in self._out:
            t = self._tensors[name]
            if t.get("const"):
                out[name] = np.array(self.constants[name])
            else:
                out[name] = from_physical(self._buffers[self.plan.tensor_buffer[name]], shape,
                                          tuple(t["layout"]) if t["layout"] else None).copy()
        return out

    def __call__(self, *args, **kwargs):
        """`module(x)` for a single-input model, or keyword inputs; returns the first output."""
        if args and len(args) > len(self._in):
            raise InputError(f"the model takes {len(self._in)} input(s), got {len(args)}")
        feeds = {n: a for (n, *_), a in zip(self._in, args)}
        feeds.update(kwargs)
        res = self.run(feeds)
        return res[self._out[0][0]] if len(self._out) == 1 else res

    def benchmark(self, number: int = 10, repeat: int = 10, feeds: dict | None = None) -> dict:
        """Latency statistics in milliseconds over `repeat` runs of `number` calls each."""
        if feeds is None:
            rng = np.random.default_rng(0)
            feeds = {n: rng.standard_normal(s).astype(d) for n, s, d, _ in self._in}
        self.run(feeds)
        times = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            for _ in range(number):
                self.run(feeds)
            times.append((time.perf_counter() - t0) / number * 1e3)
        return {"median_ms": statistics.median(times), "mean_ms": statistics.fmean(times),
                "min_ms": min(times), "max_ms": max(times),
                "std_ms": statistics.pstdev(times), "number": number, "repeat": repeat}

    def profile(self, repeat: int = 10) -> list:
        """Median milliseconds of each kernel, in run order: where the time goes."""
        times = [[] for _ in self._calls]
        for _ in range(repeat):
            for k, call in enumerate(self._calls):
                t0 = time.perf_counter()
                call()
                times[k].append((time.perf_counter() - t0) * 1e3)
        return [(name, statistics.median(ts)) for name, ts in zip(self.step_names, times)]

    def memory_report(self) -> dict:
        return {"planned_bytes": self.plan.planned_bytes, "one_buffer_per_tensor_bytes": self.plan.naive_bytes,
                "buffers": len(self.plan.buffers)}

    # ---- persistence ----------------------------------------------------------------------------
    def save(self, path: str):
        """Write the module as data: program JSON and constants in one .npz-style zip."""
        manifest = {k: v for k, v in self.program.items()}
        manifest["steps"] = [{k: v for k, v in s.items() if k != "view"} for s in self.program["steps"]]
        tmp = f"{path}.tmp"
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
            z.writestr("program.json", json.dumps(manifest))
            for i, (name, value) in enumerate(sorted(self.constants.items())):
                bio = io.BytesIO()
                np.lib.format.write_array(bio, np.asarray(value), allow_pickle=False)
                z.writestr(f"const/{i}.npy", bio.getvalue())
            z.writestr("const/names.json", json.dumps(sorted(self.constants)))
        os.replace(tmp, path)


def load(path: str, jobs: int | None = None) -> Module:
    """Read a module written by `Module.save` (its format version is checked)."""
    try:
        with zipfile.ZipFile(path) as z:
            program = json.loads(z.read("program.json"))
            names = json.loads(z.read("const/names.json"))
            consts = {n: np.lib.format.read_array(io.BytesIO(z.read(f"const/{i}.npy")), allow_pickle=False)
                      for i, n in enumerate(names)}
    except FileNotFoundError:
        raise ModelcError(f"module file {path!r} does not exist") from None
    except (zipfile.BadZipFile, KeyError, ValueError) as e:
        raise ModelcError(f"{path!r} is not a modelc module: {e}") from None
    if program.get("format") != FORMAT_VERSION:
        raise ModelcError(f"{path!r} has module format {program.get('format')}; this modelc "
                          f"({__version__}) reads format {FORMAT_VERSION}")
    return Module(program, consts, jobs=jobs)
