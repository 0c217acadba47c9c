"""Saved modules and tuning logs are untrusted: a crafted field is refused by name before any
kernel source is generated, and a crafted log line is skipped with a counted warning."""
import copy
import glob
import io
import json
import os
import zipfile

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import modelc
from modelc.errors import ModelcError
from modelc.tune import records as R
from modelc.extract import workload_key

PAYLOADS = {"plain": "__import__('os').system('touch /tmp/modelc_pwned')",
            "newline": "1\nimport os\nos.system('touch /tmp/modelc_pwned')\n"}


def _model():
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((16, 8, 3, 3)).astype(np.float32) * 0.1, "w")
    half = numpy_helper.from_array(np.array(0.5, np.float32), "half")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], strides=[1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Flatten", ["r"], ["f"]),
             helper.make_node("Mul", ["f", "half"], ["m"]),
             helper.make_node("Softmax", ["m"], ["y"], axis=-1)]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 6, 6])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 576])], [w, half])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("mc") / "m.mc")
    mod = modelc.compile(_model())
    mod.save(path)
    with zipfile.ZipFile(path) as z:
        files = {n: z.read(n) for n in z.namelist()}
    return mod, json.loads(files["program.json"]), files


def _step(program, op):
    return next(s for s in program["steps"] if any(o["op"] == op for o in s["workload"]["ops"]))


def _conv(p):
    return _step(p, "Conv")


def _with_param(p):
    return next(s for s in p["steps"] if s["workload"]["params"])


# each crafts one field of the program; the name the error must give
FIELDS = {
    "shape": (lambda p, x: _conv(p)["workload"]["inputs"][0]["shape"].__setitem__(1, x), "shape[1]"),
    "arg": (lambda p, x: _conv(p)["workload"]["ops"][0]["args"].__setitem__(0, x), "args[0]"),
    "op": (lambda p, x: _conv(p)["workload"]["ops"][0].__setitem__("op", x), "ops[0].op"),
    "attr": (lambda p, x: _conv(p)["workload"]["ops"][0]["attrs"].__setitem__("strides", [x, 1]), "strides[0]"),
    "attr_name": (lambda p, x: _conv(p)["workload"]["ops"][0]["attrs"].__setitem__(x, 1), "attrs"),
    "dtype": (lambda p, x: _conv(p)["workload"]["outputs"][0].__setitem__("dtype", x), "dtype"),
    "param_name": (lambda p, x: _with_param(p)["workload"].__setitem__(
        "params", {x: v for v in _with_param(p)["workload"]["params"].values()}), "params"),
    "param_value": (lambda p, x: next(iter(_with_param(p)["workload"]["params"].values())).__setitem__("value", x),
                    "value"),
    "config": (lambda p, x: _conv(p).__setitem__("config", {"tile_ow": x}), "config"),
    "template": (lambda p, x: _conv(p).__setitem__("template", x), "template"),
    "tensor_shape": (lambda p, x: p["tensors"]["x"]["shape"].__setitem__(0, x), "shape[0]"),
    "layout": (lambda p, x: _conv(p)["workload"]["outputs"][0].__setitem__("layout", [x, 0]), "layout"),
}


def _write(files, program, path):
    with zipfile.ZipFile(path, "w") as z:
        for n, data in files.items():
            z.writestr(n, json.dumps(program) if n == "program.json" else data)


@pytest.mark.parametrize("payload", sorted(PAYLOADS))
@pytest.mark.parametrize("field", sorted(FIELDS))
def test_crafted_module_field_is_refused_before_codegen(saved, tmp_path, monkeypatch, field, payload):
    _, program, files = saved
    program = copy.deepcopy(program)
    edit, name = FIELDS[field]
    edit(program, PAYLOADS[payload])
    path = str(tmp_path / "crafted.mc")
    _write(files, program, path)
    monkeypatch.setenv("MODELC_CACHE_DIR", str(tmp_path / "cache"))
    with pytest.raises(ModelcError) as e:
        modelc.load(path)
    msg = str(e.value)
    assert name in msg and "crafted.mc" in msg, msg
    assert "\n" not in msg.split(":")[0]
    assert not glob.glob(str(tmp_path / "cache" / "kernels" / "k_*.py")), "a kernel file was written"
    assert not os.path.exists("/tmp/modelc_pwned")


def test_consistent_forgery_is_refused(saved, tmp_path):
    """A workload whose key was recomputed after an edit must still agree with the tensors the
    module allocates (kernels index their arrays unchecked)."""
    _, program, files = saved
    program = copy.deepcopy(program)
    s = _conv(program)
    s["workload"]["inputs"][0]["shape"][2] = 600          # the kernel would read past the buffer
    s["workload"]["outputs"][0]["shape"][2] = 600         # and type-checks: a 3x3 conv, padding 1
    s["key"] = workload_key(s["workload"])
    path = str(tmp_path / "forged.mc")
    _write(files, program, path)
    with pytest.raises(ModelcError, match="was built for"):
        modelc.load(path)


def test_untouched_module_loads_and_runs(saved, tmp_path):
    mod, program, files = saved
    path = str(tmp_path / "same.mc")
    _write(files, program, path)
    x = np.random.default_rng(1).standard_normal((1, 8, 6, 6)).astype(np.float32)
    assert np.array_equal(modelc.load(path)(x), mod(x))


@pytest.mark.parametrize("bad", ["names_not_list", "const_shape", "missing_const", "not_json", "deep"])
def test_crafted_module_container_is_refused(saved, tmp_path, bad):
    _, program, files = saved
    files = dict(files)
    if bad == "names_not_list":
        files["const/names.json"] = b'{"a": 1}'
    elif bad == "const_shape":
        bio = io.BytesIO()
        np.lib.format.write_array(bio, np.zeros((3, 3), np.float32))
        files["const/0.npy"] = bio.getvalue()
    elif bad == "missing_const":
        files["const/names.json"] = b"[]"
    elif bad == "not_json":
        files["program.json"] = b"{not json"
    elif bad == "deep":
        files["program.json"] = b"[" * 100000 + b"]" * 100000
    path = str(tmp_path / "bad.mc")
    with zipfile.ZipFile(path, "w") as z:
        for n, data in files.items():
            z.writestr(n, data)
    with pytest.raises(ModelcError):
        modelc.load(path)


# ---- tuning logs ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def record_line(saved):
    _, program, _ = saved
    s = _conv(program)
    rec = R.Record(s["key"], s["desc"], s["template"], {}, [1e-3], target=R.current_target(),
                   workload=s["workload"])
    from modelc.kernels.template import get
    from modelc.kernels.workload import Workload
    tpl = get(s["template"])
    wl = Workload(s["workload"])
    rec.config = tpl.default_config(wl, tpl.space(wl)).values
    return json.loads(rec.to_json())


LOG_FIELDS = {
    "shape": lambda d, x: d["workload"]["inputs"][0]["shape"].__setitem__(1, x),
    "arg": lambda d, x: d["workload"]["ops"][0]["args"].__setitem__(0, x),
    "op": lambda d, x: d["workload"]["ops"][0].__setitem__("op", x),
    "attr": lambda d, x: d["workload"]["ops"][0]["attrs"].__setitem__("pads", [x, 1, 1, 1]),
    "dtype": lambda d, x: d["workload"]["inputs"][0].__setitem__("dtype", x),
    "config": lambda d, x: d["config"].__setitem__("tile_ow", x),
    "config_name": lambda d, x: d["config"].__setitem__(x, 1),
    "template": lambda d, x: d.__setitem__("template", x),
    "key": lambda d, x: d.__setitem__("key", x),
    "costs": lambda d, x: d.__setitem__("costs", [x]),
}


@pytest.mark.parametrize("payload", sorted(PAYLOADS))
@pytest.mark.parametrize("field", sorted(LOG_FIELDS))
def test_crafted_log_line_is_skipped_with_a_warning(record_line, tmp_path, field, payload):
    bad = copy.deepcopy(record_line)
    LOG_FIELDS[field](bad, PAYLOADS[payload])
    log = tmp_path / "log.jsonl"
    log.write_text(json.dumps(record_line) + "\n" + json.dumps(bad) + "\n" + "{half a li\n")
    with pytest.warns(UserWarning, match=r"skipped 2 corrupt or foreign line\(s\)"):
        recs = R.load_records(str(log))
    assert len(recs) == 1 and recs[0].config == record_line["config"]


def test_record_config_must_be_a_candidate(record_line, tmp_path):
    """A config value of the right type that the template never offered (a register tile of 999)."""
    bad = copy.deepcopy(record_line)
    bad["config"]["tile_ow"] = 999
    bad["costs"] = [1e-9]
    log = tmp_path / "log.jsonl"
    log.write_text(json.dumps(bad) + "\n")
    with pytest.warns(UserWarning, match="not a candidate"):
        assert R.load_records(str(log)) == []


def _outside(step) -> dict:
    """Knob values each a candidate, but excluded together by the template's constraint."""
    from modelc.kernels.template import get
    from modelc.kernels.workload import Workload
    tpl = get(step["template"])
    space = tpl.space(Workload(step["workload"]))
    return next(c.values for c in map(space.get, range(len(space))) if not space.is_valid(c))


def test_record_config_outside_the_space_is_skipped(record_line, tmp_path):
    """Candidates the template's constraint excludes together (some would make the build divide
    by zero or ask for a stack the kernel cannot have) are refused like any foreign record."""
    bad = copy.deepcopy(record_line)
    bad["config"] = _outside(bad)
    bad["costs"] = [1e-9]
    log = tmp_path / "log.jsonl"
    log.write_text(json.dumps(record_line) + "\n" + json.dumps(bad) + "\n")
    with pytest.warns(UserWarning, match="outside template 'conv2d'"):
        recs = R.load_records(str(log))
    assert [r.config for r in recs] == [record_line["config"]]


def test_module_config_outside_the_space_runs_the_default(saved, tmp_path, monkeypatch):
    """A saved module's step whose config this version's space excludes (an older version's looser
    constraint, or a crafted one) is rebuilt with the template's default, and says so."""
    mod, program, files = saved
    program = copy.deepcopy(program)
    s = _conv(program)
    default = s["config"]
    s["config"] = _outside(s)
    assert s["config"] != default
    path = str(tmp_path / "older.mc")
    _write(files, program, path)
    monkeypatch.setenv("MODELC_CACHE_DIR", str(tmp_path / "cache"))
    with pytest.warns(UserWarning, match=r"steps\[\d+\]\.config: .* runs the template's default config"):
        loaded = modelc.load(path)
    x = np.random.default_rng(2).standard_normal((1, 8, 6, 6)).astype(np.float32)
    np.testing.assert_allclose(loaded(x), mod(x), rtol=1e-5, atol=1e-6 * float(np.abs(mod(x)).max()))
