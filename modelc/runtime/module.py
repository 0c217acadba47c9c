"""The executable module: generated kernels run in order over planned buffers.

A module is built from a *program* (plain data: the steps, each a workload with its template and
config, and the tensors) plus the model's constants. Kernels are regenerated from the program by
the templates and loaded from the kernel cache, so `save` writes only data (JSON and arrays in an
.npz, never a pickle or source code) and `load` compiles nothing that is already cached.
"""
from __future__ import annotations

import contextlib
import functools
import io
import json
import os
import statistics
import threading
import time
import zipfile
import zlib

import numpy as np

from ..errors import InputError, ModelcError
from ..kernels import cache, launch
from ..kernels import templates as _templates  # noqa: F401  (registers the templates)
from ..kernels.fallback import why as fallback_why
from ..kernels.layout import logical_view, physical_size, same_as_plain, to_physical
from ..kernels.template import get as get_template
from ..kernels.workload import Workload
from ..validate import DocumentError, check_program
from ..version import VERSION
from .. import memory
from .plan import concat_parts, in_place_inputs, plan_buffers
from .tail import Tail


def _launch_guard():
    """A lock around kernel launches when numba's threading layer is not thread-safe."""
    global _GUARD
    if _GUARD is None:
        import numba
        try:
            layer = numba.threading_layer()
        except ValueError:          # no parallel kernel has run yet: serialise until one has
            return _WORKQUEUE_LOCK
        _GUARD = _WORKQUEUE_LOCK if layer == "workqueue" else contextlib.nullcontext()
    return _GUARD


_GUARD = None
_TICK: list = []


def _tick_seconds(counter) -> float | None:
    """Seconds per tick of the cycle counter, measured once against perf_counter (None where the
    CPU has no counter LLVM can read, and profiles fall back to timing each kernel from Python)."""
    if not _TICK:
        counter()
        ticks = []
        for _ in range(5):      # the median of five: one window once read 1000x off on a busy VM
            t0, c0 = time.perf_counter(), counter()
            while time.perf_counter() - t0 < 0.005:
                pass
            t1, c1 = time.perf_counter(), counter()
            ticks.append((t1 - t0) / (c1 - c0) if c1 > c0 else None)
        good = sorted(t for t in ticks if t is not None)
        _TICK.append(good[len(good) // 2] if len(good) >= 3 else None)
    return _TICK[0]

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


class _Context:
    """One caller's buffers, with the kernels bound to them.

    Kernels are bound to buffer addresses once (launch.py), so two calls running at the same time
    need two sets of buffers: each concurrent `run` takes a context of its own from the module's
    pool, as each onnxruntime `run` allocates its own intermediate tensors. Weights and compiled
    kernels are shared; a context costs the module's planned activation memory.
    """

    def __init__(self, mod: "Module"):
        plan = mod.plan
        self.buffers = [np.zeros(size, dt) for size, dt in plan.buffers]

        def buf(name):
            if name in mod._const_arrays:
                return mod._const_arrays[name]
            whole = self.buffers[plan.tensor_buffer[name]]
            if name not in plan.tensor_offset:
                return whole
            t = mod._tensors[name]           # a Concat's input: its stretch of the result's buffer
            off = plan.tensor_offset[name]
            return whole[off:off + physical_size(t["shape"], tuple(t["layout"]) if t["layout"] else None)]

        self.calls = []
        for s, k, fn, packed in mod._bound:
            args, shared = [], []
            for a in k.args:
                if a.startswith("out"):
                    args.append(buf(s["outputs"][int(a[3:])]))
                elif a.startswith("in"):
                    t = s["inputs"][int(a[2:])]
                    if len(s["outputs"]) == 1 and plan.in_place.get(s["outputs"][0]) == t:
                        shared.append(len(args))        # the residual whose buffer the output took
                    args.append(buf(t))
                else:
                    args.append(packed[a])
            # a generated kernel is bound to its buffers once; a fallback is a Python function
            self.calls.append(fn.bind(args, shared=shared) if k.source is not None else functools.partial(fn, *args))
        self.program = _sequences(self.calls)
        self.inputs = [buf(i["name"]) for i in mod.input_specs]
        self.home = [b.ctypes.data for b in self.inputs]
        self.array = buf                   # a tensor's memory (a stretch of a buffer, for a Concat's input)
        # each output read in logical order, made once: what `run` does after the kernels is one
        # copy per output (the Python there runs on caches the kernels have just emptied: its few
        # lookups and calls cost 0.14 ms on MobileNetV2's 4.6, AMD EPYC Zen 4)
        self.outputs = []
        for o in mod.program["outputs"]:
            t = mod._tensors[o["name"]]
            if not t["const"]:
                self.outputs.append((o["name"], logical_view(buf(o["name"]), tuple(o["shape"]),
                                                             tuple(t["layout"]) if t["layout"] else None),
                                     tuple(o["shape"])))
        outputs = {plan.tensor_buffer.get(o["name"]) for o in mod.program["outputs"]}
        self.slots = [_pointer_slots(self.program, b) if plan.tensor_buffer[i["name"]] not in outputs else None
                      for i, b in zip(mod.input_specs, self.inputs)]

    def feed(self, xs: list, bind: bool = True):
        """Put the inputs where the kernels read them. A C-contiguous aligned array is bound in
        place: its address goes into the kernels' argument words, as onnxruntime binds a caller's
        CPU tensor: copying MobileNetV2's 600 KB image was most of what `run` added to its kernels
        (0.06-0.10 of 0.11 ms, AMD EPYC Zen 4). Kernels only read it: the planner never gives
        an input's buffer to another tensor, and `_pointer_slots` refuses a kernel writing it.
        Any other array is copied into the context's own buffer (the words then point there)."""
        for x, buf, slots in zip(xs, self.inputs, self.slots):
            inplace = bind and slots is not None and x.flags.c_contiguous and x.flags.aligned
            addr = x.ctypes.data if inplace else buf.ctypes.data
            for words, k in slots or ():
                words[k] = addr
            if not inplace:
                np.copyto(buf.reshape(x.shape), x)

    def execute(self):
        """Run the kernels once, in order."""
        with _launch_guard():
            for call in self.program:
                call()

    def unbind(self):
        """Point the argument words back at the context's own buffers: a caller's array may be
        freed once `run` returns, and nothing may read it after."""
        for addr, slots in zip(self.home, self.slots):
            for words, k in slots or ():
                words[k] = addr


def _pointer_slots(program: list, buf: np.ndarray) -> list | None:
    """Every argument word that holds `buf`'s address ([(word array, index)]: each bound kernel's
    own table and its sequence's copy), or None when the buffer is reached another way (a Python
    fallback holds the array, a kernel a view of part of it) or written by a kernel."""
    slots = []
    for call in program:
        kernels = call.calls if isinstance(call, launch.Sequence) else [call]
        for j, bk in enumerate(kernels):
            if not isinstance(bk, launch.BoundKernel):
                if any(isinstance(a, np.ndarray) and np.may_share_memory(a, buf) for a in call.args):
                    return None
                continue
            for k, a in enumerate(bk.arrays):
                if a is buf and k not in bk.kernel.outputs:
                    slots.append((bk.table, 2 * k))
                    if isinstance(call, launch.Sequence):
                        slots.append((call.words, int(call.starts[j]) + 2 * k))
                elif np.may_share_memory(a, buf):
                    return None
    return slots


# numba's workqueue threading layer (used where neither OpenMP nor TBB is installed) aborts the
# process when two threads launch parallel kernels at once; the others are thread-safe
_WORKQUEUE_LOCK = threading.Lock()


class Module:
    def __init__(self, program: dict, constants: dict, jobs: int | None = None, progress=None, tail=None):
        if not isinstance(program, dict) or program.get("format") != FORMAT_VERSION:
            fmt = program.get("format") if isinstance(program, dict) else None
            raise ModelcError(f"module format {fmt} is not supported "
                              f"(this modelc reads format {FORMAT_VERSION})")
        # the program decides what source is generated: nothing is built before it is checked
        configs = check_program(program, constants)
        self.program = program
        self.constants = constants
        self.input_specs = program["inputs"]
        self.output_specs = program["outputs"]
        tensors = program["tensors"]
        steps = program["steps"]
        views = [_is_view(s, tensors) for s in steps]
        ends = [i["name"] for i in self.input_specs] + [o["name"] for o in self.output_specs]
        parts, merged = concat_parts(steps, tensors, views, set(ends))

        data = {n: (t["shape"], t["dtype"], tuple(t["layout"]) if t["layout"] else None)
                for n, t in tensors.items() if not t["const"]}
        in_place = in_place_inputs(steps, tensors, views, lambda s: get_template(s["template"]).stores_in_place)
        plan = plan_buffers([(s["inputs"], s["outputs"], v) for s, v in zip(steps, views)], data,
                            [i["name"] for i in self.input_specs], [o["name"] for o in self.output_specs],
                            parts, in_place)
        views = [v or i in merged for i, v in enumerate(views)]     # those Concats run no kernel
        self.plan = plan
        holds = {}
        for n, b in sorted(plan.tensor_buffer.items()):
            holds.setdefault(b, n)
        memory.check({f"buffer of {holds.get(k, '?')}": size * dt.itemsize
                      for k, (size, dt) in enumerate(plan.buffers)},
                     f"module {program['name']!r}")

        built = [(s, get_template(s["template"]).build(Workload(s["workload"]), cfg))
                 for s, v, cfg in zip(steps, views, configs) if not v]
        sources = [k.source for _, k in built if k.source is not None]
        names = [f"op {s['pattern']} ({s.get('desc', '')}) of the node writing {', '.join(map(repr, s['outputs']))}"
                 for s, k in built if k.source is not None]
        fns = iter(cache.compile_all(sources, jobs=jobs, progress=progress, names=names))
        self.fallbacks = [s["pattern"] for s, k in built if k.source is None]
        # (group, why) of each group that runs the numpy reference instead of a generated kernel
        self.fallback_reasons = [(s["desc"], fallback_why(Workload(s["workload"])))
                                 for s, k in built if k.source is None]

        # constants a kernel reads directly (most reach it packed instead); kernels take writable
        # arrays, and constants may be read-only views
        direct = {s["inputs"][int(a[2:])] for s, k in built for a in k.args if a.startswith("in")}
        self._const_arrays = {
            n: np.require(to_physical(constants[n].astype(t["dtype"], copy=False),
                                      tuple(t["layout"]) if t["layout"] else None), requirements=["C", "W"])
            for n, t in tensors.items() if t["const"] and n in direct}
        self._bound = []
        self.step_names = []
        self._step_index = [i for i, v in enumerate(views) if not v]     # the program step of each kernel
        for s, k in built:
            fn = k.python if k.source is None else next(fns)
            consts = {i: constants[n] for i, n in enumerate(s["inputs"]) if tensors[n]["const"]}
            packed = {a: np.require(v, requirements=["C", "W"]) for a, v in (k.pack(consts) if k.pack else {}).items()}
            self._bound.append((s, k, fn, packed))
            self.step_names.append(s["pattern"])
        self._in = [(i["name"], tuple(i["shape"]), np.dtype(i["dtype"])) for i in self.input_specs]
        self._out = [(o["name"], tuple(o["shape"]), o) for o in self.output_specs]
        self._tensors = tensors
        self.tail = _bind_tail(program, tail)
        self.output_specs = self._final_specs()
        self._pool = threading.Condition()
        self._free = [_Context(self)]
        self._contexts = 1

    def _acquire(self) -> _Context:
        """A free buffer set, or a new one while memory allows; else wait for one to be released."""
        with self._pool:
            while not self._free:
                if memory.available_bytes() > 2 * self.plan.planned_bytes:
                    self._contexts += 1
                    break
                self._pool.wait()
            else:
                return self._free.pop()
        try:
            return _Context(self)
        except MemoryError:
            with self._pool:
                self._contexts -= 1
            raise memory.OutOfMemoryError(f"no memory for another set of {self.plan.planned_bytes} "
                                          "bytes of activation buffers") from None

    def _release(self, ctx: _Context):
        with self._pool:
            self._free.append(ctx)
            self._pool.notify()

    # ---- running --------------------------------------------------------------------------------
    def run(self, feeds: dict) -> dict:
        """Outputs for `feeds` ({input name: array}), as {output name: array}.

        Safe to call from several threads at once: each concurrent call runs in buffers of its own.
        """
        xs = self._inputs(feeds)
        ctx = self._acquire()
        try:
            ctx.feed(xs)
            ctx.execute()
            got = {name: view.copy().reshape(shape) for name, view, shape in ctx.outputs}
        finally:
            ctx.unbind()
            self._release(ctx)
        if len(got) != len(self._out):
            got = {name: got[name] if name in got else np.array(self.constants[name]) for name, *_ in self._out}
        if self.tail is None:
            return got
        made = self.tail.run({**dict(zip((n for n, *_ in self._in), xs)), **got})
        return {name: made[name] if name in made else got[name] for name in self.program["tail"]["model_outputs"]}

    def _final_specs(self) -> list:
        """The model's outputs: the compiled part's, and the tail's (shape decided by the data: None)."""
        if self.tail is None:
            return self.program["outputs"]
        mine = {o["name"]: o for o in self.program["outputs"]}
        theirs = {o["name"]: {"name": o["name"], "shape": None, "dtype": o["dtype"]}
                  for o in self.program["tail"]["outputs"]}
        return [mine.get(n) or theirs[n] for n in self.program["tail"]["model_outputs"]]

    def _inputs(self, feeds: dict) -> list:
        """The input arrays of `feeds`, in the model's order, checked (an InputError names the problem)."""
        if isinstance(feeds, dict) and len(feeds) == len(self._in):      # the usual call, checked in one pass
            xs = [feeds.get(name) for name, *_ in self._in]
            if all(type(x) is np.ndarray and x.shape == shape and x.dtype == dtype
                   for x, (_, shape, dtype) in zip(xs, self._in)):
                return xs
        names = [n for n, *_ in self._in]
        if not isinstance(feeds, dict):
            raise InputError(f"feeds must be a dict of input name -> array; the model's inputs are {names}")
        unknown = sorted(set(feeds) - set(names), key=str)
        if unknown:
            raise InputError(f"unknown input(s) {unknown}; the model's inputs are {names}")
        xs = []
        for name, shape, dtype in self._in:
            if name not in feeds:
                raise InputError(f"missing input {name!r}; the model's inputs are {names}")
            x = np.asarray(feeds[name])
            if x.shape != shape:
                raise InputError(f"input {name!r} has shape {list(x.shape)}, expected {list(shape)}")
            if x.dtype != dtype:
                raise InputError(f"input {name!r} has dtype {x.dtype}, expected {dtype}")
            xs.append(x)
        return xs

    def __call__(self, *args, **kwargs):
        """`module(x)` for a single-input model, or keyword inputs; returns the first output."""
        if args and len(args) > len(self._in):
            raise InputError(f"the model takes {len(self._in)} input(s), got {len(args)}")
        feeds = {n: a for (n, *_), a in zip(self._in, args)}
        feeds.update(kwargs)
        res = self.run(feeds)
        return next(iter(res.values())) if len(res) == 1 else res

    def benchmark(self, number: int = 10, repeat: int = 10, feeds: dict | None = None) -> dict:
        """Latency statistics in milliseconds over `repeat` runs of `number` calls each."""
        if feeds is None:
            rng = np.random.default_rng(0)
            feeds = {n: rng.standard_normal(s).astype(d) for n, s, d in self._in}
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

    def profile(self, repeat: int = 10, feeds: dict | None = None) -> list:
        """Each kernel's median milliseconds where it runs: the module's own sequence, stamped by the
        CPU's cycle counter after every kernel, so each is timed after its real predecessor with the
        caches as an inference leaves them (timed one Python call at a time, MobileNetV2's kernels
        summed to 1.27x the module's latency). One dict per kernel, in run order: its program step's
        index, pattern, description, template and `ms` (views run no kernel and are not listed)."""
        steps = self.program["steps"]
        return [{"step": i, "pattern": steps[i]["pattern"], "desc": steps[i].get("desc", ""),
                 "template": steps[i]["template"], "ms": statistics.median(ts)}
                for i, ts in zip(self._step_index, self.stamped_runs(repeat, feeds))]

    def stamped_runs(self, repeat: int, feeds: dict | None = None) -> list:
        """Each kernel's milliseconds in each of `repeat` runs, in run order (`profile`'s samples;
        `_step_index` names their program steps)."""
        xs = self._inputs(feeds) if feeds is not None else None
        run_profiled, counter = cache.profiled_sequence_runner()
        tick = _tick_seconds(counter)
        ctx = self._acquire()
        try:
            if xs is not None:
                ctx.feed(xs, bind=False)      # the buffers hold this input's values while kernels are timed
                ctx.execute()
            times = [[] for _ in ctx.calls]
            for _ in range(repeat):
                k = 0
                with _launch_guard():
                    for call in ctx.program:
                        if isinstance(call, launch.Sequence) and tick:
                            for t in call.stamped(run_profiled):
                                times[k].append(t * tick * 1e3)
                                k += 1
                            continue
                        for c in (call.calls if isinstance(call, launch.Sequence) else [call]):
                            t0 = time.perf_counter()
                            c()
                            times[k].append((time.perf_counter() - t0) * 1e3)
                            k += 1
        finally:
            self._release(ctx)
        return times

    def memory_report(self) -> dict:
        return {"planned_bytes": self.plan.planned_bytes, "one_buffer_per_tensor_bytes": self.plan.naive_bytes,
                "buffers": len(self.plan.buffers), "contexts": self._contexts}

    # ---- persistence ----------------------------------------------------------------------------
    def save(self, path: str):
        """Write the module as data: program JSON and constants in one .npz-style zip."""
        manifest = self.program
        tmp = f"{path}.tmp"
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
            z.writestr("program.json", json.dumps(manifest))
            for i, (name, value) in enumerate(sorted(self.constants.items())):
                bio = io.BytesIO()
                np.lib.format.write_array(bio, np.asarray(value), allow_pickle=False)
                z.writestr(f"const/{i}.npy", bio.getvalue())
            z.writestr("const/names.json", json.dumps(sorted(self.constants)))
            if self.tail is not None:
                z.writestr("tail.onnx", self.tail.bytes())
        os.replace(tmp, path)


def _bind_tail(program: dict, tail):
    """The tail (a Tail, or a saved module's ONNX bytes) checked against the program's description."""
    if "tail" not in program:
        if tail is not None:
            raise DocumentError("the module has a data-dependent tail but its program does not describe one")
        return None
    if tail is None:
        raise DocumentError("the module's program describes a data-dependent tail, but it holds none")
    if not isinstance(tail, Tail):
        tail = Tail(tail, where="the module's data-dependent tail (tail.onnx)")
    if tail.interface() != {k: program["tail"][k] for k in ("inputs", "outputs")}:
        raise DocumentError("the module's data-dependent tail takes or gives other tensors (or dtypes) "
                            "than its program says")
    return tail


def load(path: str, jobs: int | None = None) -> Module:
    """Read a module written by `Module.save`. The file is untrusted data: its size is checked
    before it is unpacked, and its program is validated (validate.py) before any kernel is built."""
    try:
        with zipfile.ZipFile(path) as z:
            memory.check({i.filename: i.file_size for i in z.infolist()}, f"module file {path!r}")
            program = json.loads(z.read("program.json"))
            names = json.loads(z.read("const/names.json"))
            if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
                raise DocumentError("const/names.json: expected a list of tensor names")
            consts = {n: np.lib.format.read_array(io.BytesIO(z.read(f"const/{i}.npy")), allow_pickle=False)
                      for i, n in enumerate(names)}
            tail = z.read("tail.onnx") if "tail.onnx" in z.namelist() else None
    except FileNotFoundError:
        raise ModelcError(f"module file {path!r} does not exist") from None
    except DocumentError as e:
        raise DocumentError(f"{path!r}: {e}") from None
    except (OSError, zipfile.BadZipFile, KeyError, ValueError, EOFError, RecursionError, zlib.error,
            NotImplementedError, UnicodeDecodeError) as e:
        raise ModelcError(f"{path!r} is not a modelc module: {type(e).__name__}: {e}") from None
    if not isinstance(program, dict) or program.get("format") != FORMAT_VERSION:
        fmt = program.get("format") if isinstance(program, dict) else None
        raise ModelcError(f"{path!r} has module format {fmt}; this modelc "
                          f"({VERSION}) reads format {FORMAT_VERSION}")
    try:
        return Module(program, consts, jobs=jobs, tail=tail)
    except DocumentError as e:
        raise DocumentError(f"{path!r}: {e}") from None
