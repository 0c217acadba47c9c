"""Validation of the documents modelc reads from outside: saved modules, tuning records, workloads.

Templates generate kernel source from a workload and a config, and a saved module or a shared
tuning log carries both. So each document is checked against a declared schema before anything is
generated from it: only ints where shapes, layouts, strides and axes are; dtypes and op names from
modelc's own tables; value references in modelc's own `i0 / p0 / v0.1` pattern; attribute strings
from a small character set. Then for consistency: a record's key is the hash of its workload; the
ops type-check and give the declared output shapes; the template matches the workload; every config
value is one of its knob's candidates; a module's tensors have the shapes its kernels were built
for (kernels index their arrays unchecked, so a smaller buffer would be read out of bounds).
Every refusal is a `DocumentError` that names the field.
"""
from __future__ import annotations

import math
import re
import warnings

import numpy as np

from .errors import ModelcError
from . import memory, target
from .schema import (DocumentError, check_int, check_shape, check_str,  # noqa: F401  (re-exported)
                     check_keys as _keys, check_list as _list, fail as _fail, is_int as _is_int, show as _show)


_REF = re.compile(r"[ip][0-9]{1,6}|v[0-9]{1,6}(\.[0-9]{1,3})?")
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
_ATTR_STR = re.compile(r"[A-Za-z0-9_,.> \-]{0,256}")   # words, Einsum equations
_KEY = re.compile(r"[0-9A-Za-z_.\-]{1,64}")      # modelc makes 24 hex digits
NONFINITE = ("nan", "inf", "-inf")
DTYPES = ("float32", "float64", "float16", "int8", "int16", "int32", "int64", "uint8", "uint16",
          "uint32", "uint64", "bool")
MAX_PARAM_ELEMENTS = 1 << 22


def check_dtype(v, path: str) -> str:
    return check_str(v, path, choices=DTYPES)


def check_layout(v, shape: tuple, path: str):
    if v is None:
        return None
    _list(v, path)
    if len(v) != 2 or len(shape) != 4:
        _fail(path, "a blocked layout is [block, halo] of a 4-d tensor")
    b = check_int(v[0], f"{path}[0]", 1, 1 << 16)
    check_int(v[1], f"{path}[1]", 0, 1 << 10)
    if shape[1] % b:
        _fail(path, f"block {b} does not divide the {shape[1]} channels")
    return tuple(v)


def _number(v, path: str):
    if isinstance(v, bool) or not (isinstance(v, (int, float)) or v in NONFINITE):
        _fail(path, f"expected a number, got {_show(v)}")
    if isinstance(v, float) and not math.isfinite(v):
        _fail(path, f"expected a finite number or one of {NONFINITE}, got {_show(v)}")


def _flat_numbers(v, depth: int, path: str, out: list):
    if depth == 0:
        _number(v, path)
        out.append(v)
        return
    for k, x in enumerate(_list(v, path)):
        _flat_numbers(x, depth - 1, f"{path}[{k}]", out)


def check_array(v, path: str):
    """An array as modelc writes it: {"dtype", "shape", "value"} with nested lists of numbers."""
    _keys(v, path, {"dtype", "shape", "value"})
    dt = check_dtype(v["dtype"], f"{path}.dtype")
    shape = check_shape(v["shape"], f"{path}.shape")
    n = math.prod(shape)
    if n > MAX_PARAM_ELEMENTS:
        _fail(f"{path}.shape", f"{list(shape)} is too large for an inlined constant")
    flat: list = []
    if isinstance(v["value"], list):
        _flat_numbers(v["value"], len(shape), f"{path}.value", flat)
    else:
        _flat_numbers(v["value"], 0, f"{path}.value", flat)
    if len(flat) != n or (shape and not isinstance(v["value"], list)):
        _fail(f"{path}.value", f"holds {len(flat)} numbers, its shape {list(shape)} needs {n}")
    try:
        np.array(v["value"], dtype=dt).reshape(shape)
    except (ValueError, TypeError, OverflowError) as e:
        _fail(f"{path}.value", f"is not an array of {dt}: {e}")


def check_attr(v, path: str):
    """An attribute value: a number, a short word, a list of those, or an array."""
    if isinstance(v, dict):
        return check_array(v, path)
    if isinstance(v, list):
        for k, x in enumerate(_list(v, path, 1 << 16)):
            if isinstance(x, str) and x not in NONFINITE:
                check_str(x, f"{path}[{k}]", _ATTR_STR)
            else:
                _number(x, f"{path}[{k}]")
        return
    if isinstance(v, str) and v not in NONFINITE:
        check_str(v, path, _ATTR_STR)
        return
    _number(v, path)


def _named(d, path: str, check_value, what: str):
    """An object of identifier keys (attributes, knobs), each value checked by `check_value`."""
    if not isinstance(d, dict):
        _fail(path, f"expected {what}")
    for name, v in d.items():
        check_str(name, path, _IDENT)
        check_value(v, f"{path}.{name}")


def check_knob_value(v, path: str, depth: int = 0):
    """A config value: a bool, number or short word, or a (nested) list of them. Whether it is one
    of the knob's candidates is checked against the template's space (`check_config`)."""
    if isinstance(v, list) and depth < 2:
        for k, x in enumerate(_list(v, path, 64)):
            check_knob_value(x, f"{path}[{k}]", depth + 1)
    elif isinstance(v, str):
        check_str(v, path, _ATTR_STR)
    elif not isinstance(v, bool):
        _number(v, path)


def check_workload(wl, path: str = "workload", key: str | None = None):
    """The schema of a workload, then its consistency (refs, shapes, types). With `key`, its hash:
    a workload whose key was checked before is the same text, and is not checked again (a model
    repeats its layers, a log its workloads)."""
    from . import ops as registry
    from .canonical import KEY_VERSION, workload_key
    if key is not None and key in _validated_keys:
        try:
            if workload_key(wl) == key:
                return
        except (TypeError, ValueError, RecursionError):
            pass                    # edited: the full check below names what is wrong
    if isinstance(wl, dict) and "te" in wl:       # a te kernel's document (te/document.py)
        from .te.document import from_document
        try:
            from_document(wl, path)
        except DocumentError:
            raise
        except ModelcError as e:
            raise DocumentError(f"{path}: {e}") from None
        except RecursionError:
            raise DocumentError(f"{path}: nested too deeply") from None
        if key is not None and workload_key(wl) != key:
            _fail(path, f"does not hash to its key {key!r} (edited or corrupt)")
        if key is not None:
            _validated_keys.add(key)
        return
    _keys(wl, path, {"version", "inputs", "ops", "params", "outputs"})
    if wl["version"] != KEY_VERSION or not _is_int(wl["version"]):
        _fail(f"{path}.version", f"workload version {_show(wl['version'])}; this modelc reads {KEY_VERSION}")
    n_in = len(_list(wl["inputs"], f"{path}.inputs", 4096))
    for k, t in enumerate(wl["inputs"]):
        p = f"{path}.inputs[{k}]"
        _keys(t, p, {"shape", "dtype", "const"}, {"layout"})
        shape = check_shape(t["shape"], f"{p}.shape")
        check_dtype(t["dtype"], f"{p}.dtype")
        if not isinstance(t["const"], bool):
            _fail(f"{p}.const", f"expected true or false, got {_show(t['const'])}")
        check_layout(t.get("layout"), shape, f"{p}.layout")
    params = wl["params"]
    if not isinstance(params, dict):
        _fail(f"{path}.params", "expected an object")
    for name, v in params.items():
        check_str(name, f"{path}.params", re.compile(r"p[0-9]{1,6}"))
        check_array(v, f"{path}.params.{name}")
    values = {f"i{k}" for k in range(n_in)} | set(params)
    for j, op in enumerate(_list(wl["ops"], f"{path}.ops", 4096)):
        p = f"{path}.ops[{j}]"
        _keys(op, p, {"op", "attrs", "args"})
        check_str(op["op"], f"{p}.op", choices=registry.REGISTRY)
        _named(op["attrs"], f"{p}.attrs", check_attr, "an object")
        for k, a in enumerate(_list(op["args"], f"{p}.args", 4096)):
            if a != "":
                check_str(a, f"{p}.args[{k}]", _REF)
                if a not in values and not (a[0] == "v" and int(a[1:].split(".")[0]) < j):
                    _fail(f"{p}.args[{k}]", f"{a!r} names no input, constant or earlier result")
    if not wl["ops"]:
        _fail(f"{path}.ops", "is empty")
    for k, t in enumerate(_list(wl["outputs"], f"{path}.outputs", 4096)):
        p = f"{path}.outputs[{k}]"
        _keys(t, p, {"shape", "dtype", "value"}, {"layout"})
        shape = check_shape(t["shape"], f"{p}.shape")
        check_dtype(t["dtype"], f"{p}.dtype")
        check_layout(t.get("layout"), shape, f"{p}.layout")
        if t["value"] is not None:
            check_str(t["value"], f"{p}.value", _REF)
    if key is not None and workload_key(wl) != key:
        _fail(path, f"does not hash to its key {key!r} (edited or corrupt)")
    _check_types(wl, path)
    if key is not None:
        _validated_keys.add(key)


def _check_types(wl: dict, path: str):
    """The ops type-check on the declared inputs and give the declared outputs."""
    from .kernels.workload import Workload
    sizes = {f"{path}.{side}[{k}]": math.prod(t["shape"]) * np.dtype(t["dtype"]).itemsize
             for side in ("inputs", "outputs") for k, t in enumerate(wl[side])}
    try:
        memory.check(sizes, path)
        g = Workload(wl).to_graph()
    except ModelcError as e:
        raise DocumentError(f"{path}: its ops do not type-check: {e}") from None
    except Exception as e:     # a crafted attribute a shape rule did not expect
        raise DocumentError(f"{path}: its ops do not type-check: {type(e).__name__}: {e}") from None
    for k, t in enumerate(wl["outputs"]):
        v = t["value"]
        if v is None:
            continue
        got = g.tensors.get(v)
        if got is None:
            _fail(f"{path}.outputs[{k}].value", f"{v!r} is not a value of the workload")
        if list(got.shape) != list(t["shape"]) or got.dtype.name != t["dtype"]:
            _fail(f"{path}.outputs[{k}]", f"declares {t['dtype']}{list(t['shape'])} but its ops give "
                                          f"{got.dtype.name}{list(got.shape)}")


def check_config(template: str, wl: dict, config, path: str, key: str | None = None):
    """The kernel config for `wl`: the template exists and matches, every value is a candidate.
    Returns the `Config` (the template's default for a None config). `key`, the workload's key,
    lets the template's space be built once for many configs."""
    check_str(template, f"{path}.template", _IDENT)
    if key is None:
        tpl, view, space = _space(template, wl, path)
    else:       # candidates follow the target's vectors: a space is the same for one target only
        at = (key, template, target.current())
        tpl, view, space = _spaces.get(at) or _spaces.setdefault(at, _space(template, wl, path))
    if config is None:
        from .kernels.template import valid_default
        return valid_default(tpl, view, space)
    if not isinstance(config, dict):
        _fail(f"{path}.config", f"expected an object of knob values, got {type(config).__name__}")
    for name in config:
        check_str(name, f"{path}.config", _IDENT)
    try:
        cfg = space.from_values(config)
    except ModelcError as e:
        raise DocumentError(f"{path}.config: {e}") from None
    if not _within(space, cfg):
        raise OutsideSpace(f"{path}.config: {config} is outside template {template!r}'s space for this "
                           f"workload: its knob values are candidates, but not together (a record "
                           f"from another modelc version, or a crafted one)")
    return cfg


class OutsideSpace(DocumentError):
    """Each knob value is a candidate, but the template's constraint excludes them together: the
    build may divide by zero or ask for a stack the kernel cannot have."""


def _within(space, cfg) -> bool:
    try:
        return space.is_valid(cfg)
    except Exception:       # a constraint that cannot judge a config does not admit it
        return False


_spaces: dict = {}          # (workload key, template, target) -> (template, workload view, config space)


def _space(template: str, wl: dict, path: str):
    from .kernels import templates as _templates  # noqa: F401  (registers the templates)
    from .kernels.template import get
    from .te.workload import view as as_view
    try:
        tpl = get(template)
    except ModelcError:
        _fail(f"{path}.template", f"unknown kernel template {template!r}")
    view = as_view(wl)
    try:
        if not tpl.matches(view):
            _fail(f"{path}.template", f"template {template!r} does not handle this workload")
        return tpl, view, tpl.space(view)
    except DocumentError:
        raise
    except Exception as e:
        raise DocumentError(f"{path}.template: {template!r} cannot build this workload: "
                            f"{type(e).__name__}: {e}") from None


def check_program(program, constants: dict, path: str = "module program") -> list:
    """A module's program: schema, every step's workload and config, tensors as the kernels need.
    Returns each step's `Config`."""
    _keys(program, path, {"format", "modelc", "name", "inputs", "outputs", "tensors", "steps"}, {"tail"})
    for f in ("modelc", "name"):
        check_str(program[f], f"{path}.{f}")
    tensors = program["tensors"]
    if not isinstance(tensors, dict):
        _fail(f"{path}.tensors", "expected an object")
    for name, t in tensors.items():
        p = f"{path}.tensors[{name!r}]"
        _keys(t, p, {"shape", "dtype", "layout", "const"})
        shape = check_shape(t["shape"], f"{p}.shape")
        check_dtype(t["dtype"], f"{p}.dtype")
        check_layout(t["layout"], shape, f"{p}.layout")
        if not isinstance(t["const"], bool):
            _fail(f"{p}.const", f"expected true or false, got {_show(t['const'])}")
        memory.check({name: math.prod(shape) * np.dtype(t["dtype"]).itemsize}, f"{p} ({t['dtype']}{list(shape)})")
        if t["const"]:
            c = constants.get(name)
            if not isinstance(c, np.ndarray):
                _fail(p, "is a constant but the module has no array for it")
            if list(c.shape) != list(shape) or c.dtype.name != t["dtype"]:
                _fail(p, f"declares {t['dtype']}{list(shape)} but its array is {c.dtype.name}{list(c.shape)}")
            if t["layout"] is not None:
                _fail(f"{p}.layout", "constants are stored plain")
    for side in ("inputs", "outputs"):
        for k, io in enumerate(_list(program[side], f"{path}.{side}", 4096)):
            p = f"{path}.{side}[{k}]"
            _keys(io, p, {"name", "shape", "dtype"})
            t = tensors.get(check_str(io["name"], f"{p}.name"))
            if t is None:
                _fail(f"{p}.name", f"{io['name']!r} is not in the tensor table")
            if io["shape"] != t["shape"] or io["dtype"] != t["dtype"]:
                _fail(p, "shape or dtype differs from the tensor table's")
    if not program["inputs"] and not program["outputs"] and "tail" not in program:
        _fail(path, "has no inputs and no outputs")
    configs = []
    written = {io["name"] for io in program["inputs"]} | {n for n, t in tensors.items() if t["const"]}
    for j, s in enumerate(_list(program["steps"], f"{path}.steps", 1 << 20)):
        p = f"{path}.steps[{j}]"
        _keys(s, p, {"key", "pattern", "desc", "template", "config", "workload", "inputs", "outputs"})
        check_str(s["key"], f"{p}.key", _KEY)
        check_str(s["pattern"], f"{p}.pattern")
        check_str(s["desc"], f"{p}.desc")
        check_workload(s["workload"], f"{p}.workload", key=s["key"])
        wl = s["workload"]
        for side in ("inputs", "outputs"):
            names = _list(s[side], f"{p}.{side}")
            if len(names) != len(wl[side]):
                _fail(f"{p}.{side}", f"lists {len(names)} tensors, the workload has {len(wl[side])}")
            for k, (name, spec) in enumerate(zip(names, wl[side])):
                q = f"{p}.{side}[{k}]"
                t = tensors.get(check_str(name, q))
                if t is None:
                    _fail(q, f"{name!r} is not in the tensor table")
                if (t["shape"], t["dtype"], t["layout"]) != (spec["shape"], spec["dtype"], spec.get("layout")):
                    _fail(q, f"tensor {name!r} is {t['dtype']}{t['shape']} layout {t['layout']}, the kernel "
                             f"was built for {spec['dtype']}{spec['shape']} layout {spec.get('layout')}")
                if side == "inputs" and bool(spec["const"]) != t["const"]:
                    _fail(q, f"tensor {name!r} const-ness differs from the workload's")
                if side == "inputs" and name not in written:
                    _fail(q, f"tensor {name!r} is read before any step writes it")
                if side == "outputs":
                    if name in written:
                        _fail(q, f"tensor {name!r} is written twice (or is an input or constant)")
                    written.add(name)
        try:
            configs.append(check_config(s["template"], wl, s["config"], p, key=s["key"]))
        except OutsideSpace as e:   # an older modelc's looser space: its kernel is rebuilt as this one's default
            warnings.warn(f"{e}; that step runs the template's default config instead", stacklevel=3)
            configs.append(check_config(s["template"], wl, None, p, key=s["key"]))
    for k, o in enumerate(program["outputs"]):
        if o["name"] not in written:
            _fail(f"{path}.outputs[{k}]", f"output {o['name']!r} is never written")
    if "tail" in program:
        check_tail(program["tail"], program, f"{path}.tail")
    return configs


def check_tail(tail, program: dict, path: str):
    """The data-dependent tail's interface: it reads the compiled part's inputs and outputs, and the
    model's outputs are the compiled part's or the tail's (the tail's graph is checked where it is
    loaded, runtime/tail.py)."""
    _keys(tail, path, {"inputs", "outputs", "model_outputs"})
    compiled = {io["name"] for io in program["inputs"]} | {io["name"] for io in program["outputs"]}
    for k, name in enumerate(_list(tail["inputs"], f"{path}.inputs", 1 << 16)):
        if check_str(name, f"{path}.inputs[{k}]") not in compiled:
            _fail(f"{path}.inputs[{k}]", f"{name!r} is neither an input nor an output of the compiled part")
    made = set()
    for k, o in enumerate(_list(tail["outputs"], f"{path}.outputs", 4096)):
        _keys(o, f"{path}.outputs[{k}]", {"name", "dtype"})
        made.add(check_str(o["name"], f"{path}.outputs[{k}].name"))
        if o["dtype"] is not None:
            check_dtype(o["dtype"], f"{path}.outputs[{k}].dtype")
    names = _list(tail["model_outputs"], f"{path}.model_outputs", 4096)
    for k, name in enumerate(names):
        if check_str(name, f"{path}.model_outputs[{k}]") not in made | compiled:
            _fail(f"{path}.model_outputs[{k}]", f"{name!r} is computed by neither part")
    if not names:
        _fail(f"{path}.model_outputs", "lists no outputs")


_RECORD_FIELDS = {"v", "key", "desc", "template", "config", "costs", "error", "error_msg", "target",
                  "workload", "time", "modelc", "weight", "context"}
RECORD_CONTEXTS = ("kernel", "module")      # timed alone (the tuner's trials), or where it runs in a module
_validated_keys: set = set()        # keys of workloads already checked (a key is the hash of its workload)


def check_record(d, path: str = "record", n_errors: int = 6):
    """A tuning record's schema; its workload is checked once per key (and must hash to it)."""
    _keys(d, path, {"v", "key", "template", "config", "costs", "error"}, _RECORD_FIELDS)
    check_str(d["key"], f"{path}.key", _KEY)
    check_str(d["template"], f"{path}.template", _IDENT)
    for f in ("desc", "error_msg", "modelc"):
        if f in d:
            check_str(d[f], f"{path}.{f}")
    _named(d["config"], f"{path}.config", check_knob_value, "an object of knob values")
    for k, c in enumerate(_list(d["costs"], f"{path}.costs", 4096)):
        if isinstance(c, bool) or not isinstance(c, (int, float)) or not (0 <= c < 1e9):
            _fail(f"{path}.costs[{k}]", f"expected a time in seconds, got {_show(c)}")
    check_int(d["error"], f"{path}.error", 0, n_errors - 1)
    if "weight" in d:
        check_int(d["weight"], f"{path}.weight", 1)
    if "context" in d and d["context"] not in RECORD_CONTEXTS:
        _fail(f"{path}.context", f"expected one of {', '.join(RECORD_CONTEXTS)}, got {_show(d['context'])}")
    if "time" in d and (isinstance(d["time"], bool) or not isinstance(d["time"], (int, float))):
        _fail(f"{path}.time", f"expected a number, got {_show(d['time'])}")
    target = d.get("target", {})
    if not isinstance(target, dict):
        _fail(f"{path}.target", "expected an object")
    for f, v in target.items():
        if f == "threads":
            check_int(v, f"{path}.target.threads", 1, 1 << 16)
        elif f == "isa":
            for k, x in enumerate(_list(v, f"{path}.target.isa", 256)):
                check_str(x, f"{path}.target.isa[{k}]", _ATTR_STR)
        else:
            check_str(v, f"{path}.target.{f}")
    if d.get("workload") is not None:
        check_workload(d["workload"], f"{path}.workload", key=d["key"])
