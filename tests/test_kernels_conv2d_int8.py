"""The integer dot-product conv and dense (VNNI's bytes, else int16 pairs): exact sums for every
knob in both forms, which CPUs and workloads they take, and the importer's note (`x_min`); quantized
models give onnxruntime's integers (the exact reference's where onnxruntime's uint8 x int8 products
saturate: integer_reference.py)."""
from dataclasses import replace

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import modelc
from modelc import target
from modelc.kernels import testing
from modelc.kernels.int_dot import dot_form
from modelc.kernels.template import get, select, untuned
from modelc.kernels.workload import Workload
from modelc.target import Target
from modelc.tune import records as R

from integer_reference import integer_outputs, onnxruntime_outputs
from workloads import conv2d_wl, dense_wl

INT8 = get("conv2d_int8")
DENSE8 = get("dense_int8")
HOST = Target.host()
needs_dot = pytest.mark.skipif(not HOST.int16_dot_lanes, reason="this CPU has no AVX2 (vpmaddwd)")
# the host without VNNI: quantized kernels on int16 pairs (runs wherever AVX2 does)
INT16 = replace(HOST, isa=tuple(f for f in HOST.isa if "vnni" not in f))

SPR = Target.from_features("sapphirerapids", "+avx,+avx2,+fma,+avx512f,+avx512bw,+avx512vl,+avx512vnni,+amx-int8")
ZEN4 = Target.from_features("znver4", "+avx,+avx2,+fma,+avx512f,+avx512bw,+avx512vl,+avx512vnni")
ZEN4_256 = Target.from_features("znver4", "+avx,+avx2,+fma,+avx512f,+avx512bw,+avx512vl,+avx512vnni,+prefer-256-bit")
ALDER = Target.from_features("alderlake", "+avx,+avx2,+fma,+avxvnni")
ZEN3 = Target.from_features("znver3", "+avx,+avx2,+fma")
SKX = Target.from_features("skylake-avx512", "+avx,+avx2,+fma,+avx512f,+avx512bw,+avx512vl")
SSE = Target.from_features("x86-64", "+sse4.1,+sse4.2")


@pytest.mark.parametrize("tg, vnni, pairs", [(SPR, 16, 16), (ZEN4, 16, 16), (ZEN4_256, 8, 8), (ALDER, 8, 8),
                                             (ZEN3, 0, 8), (SKX, 0, 16), (SSE, 0, 0)])
def test_dot_lanes_follow_the_cpu(tg, vnni, pairs):
    assert (tg.int8_dot_lanes, tg.int16_dot_lanes) == (vnni, pairs)


def quantized_wl(x_min=-128, **case):
    j = conv2d_wl(**case).json
    j["ops"][0]["attrs"].update(exact=1, x_min=x_min)
    return Workload(j)


def integer_inputs(wl, x_min, seed=0):
    """The centered input in [x_min, x_min + 255], int8 weights, an integer bias, a float residual."""
    rng = np.random.default_rng(seed)
    lows = {0: (x_min, x_min + 256), 1: (-128, 128), 2: (-5000, 5000)}
    return [rng.integers(*lows[k], t.shape).astype(np.float32) if k in lows and (k < 2 or t.const)
            else rng.standard_normal(t.shape).astype(np.float32) for k, t in enumerate(wl.inputs)]


CASES = [
    # odd sizes (last column, row and channel tiles shifted back), a residual add, halos
    (dict(C=16, H=10, W=9, K=40, k=3, s=1, p=1, hin=1, hout=1, residual=True), -128),
    # channels not a multiple of 4 (the patch's last bytes meet zero weights), Clip, no bias
    (dict(C=3, H=20, W=19, K=32, k=7, s=2, p=3, hin=3, hout=0, act="Clip", bias=False), 0),
    (dict(C=24, H=7, W=13, K=48, k=1, s=1, p=0, hin=0, hout=0), -37),
    (dict(C=64, H=15, W=15, K=128, k=3, s=2, p=1, hin=1, hout=0), -255),
    (dict(C=16, H=12, W=12, K=16, k=3, s=1, p=2, hin=2, hout=0, dil=2), -128),
]


def _run(wl, kernel, ins, owners=False):
    """(outputs, reference outputs) of a built kernel; with `owners`, checks that each output
    element is stored by one item (shifted tiles leave what they share to one owner: two threads
    never race on it)."""
    from modelc.kernels import cache
    from modelc.kernels.layout import from_physical
    fn = cache.load(kernel.source)
    args, outs = testing.bind(wl, kernel, ins)
    out = wl.outputs[0]
    if owners:
        assert (from_physical(testing.stores_per_output(fn, args), out.shape, out.layout) == 1).all()
    fn(*args)
    got = [from_physical(o, t.shape, t.layout) for o, t in zip(outs, wl.outputs)]
    return got, testing.reference_outputs(wl, ins)


def _knob_extremes(space, default, smallest=False):
    """Per knob, its largest value valid with the others at the default's (and its smallest)."""
    out = []
    for k in space.knobs:
        for values in ([k.values[::-1], k.values] if smallest else [k.values[::-1]]):
            for v in values:
                cfg = space.from_values(dict(default.values, **{k.name: v}))
                if v != default.values[k.name] and space.is_valid(cfg):
                    out.append(cfg)
                    break
    return out


def _form(name):
    if name == "vnni" and not HOST.int8_dot_lanes or not HOST.int16_dot_lanes:
        pytest.skip(f"this CPU has no {name} dot product")
    return HOST if name == "vnni" else INT16


@pytest.mark.parametrize("case, x_min, form", [(c, x, "vnni") for c, x in CASES] +
                         [(c, x, "int16") for c, x in CASES[1::2]],
                         ids=lambda c: f"c{c['C']}k{c['K']}h{c['H']}k{c['k']}s{c['s']}"
                         if isinstance(c, dict) else str(c))
def test_knobs_sum_exactly(case, x_min, form):
    """The default and each knob's largest valid value (the others at the default's; the smallest
    too on one case), on inputs that span the whole byte range (x_min and x_min + 255 included: the zero
    halo is -x_min)."""
    with target.use(_form(form)):
        wl = quantized_wl(x_min, **case)
        assert INT8.matches(wl) and select(wl).name == "conv2d" and untuned(wl, select(wl)) is INT8
        space = INT8.space(wl)
        default = INT8.default_config(wl, space)
        assert space.is_valid(default)
        # (the first case, whose default tile is the largest and slowest to compile, alone)
        cfgs = [default] + ([] if case is CASES[0][0] else
                            _knob_extremes(space, default, smallest=case is CASES[2][0] and form == "vnni"))
        kernels = [(cfg, INT8.build(wl, cfg)) for cfg in cfgs]
    ins = integer_inputs(wl, x_min)
    ins[0].flat[:2] = [x_min, x_min + 255]
    seen = set()
    for cfg, kernel in kernels:
        if str(cfg.values) in seen:
            continue
        seen.add(str(cfg.values))
        got, want = _run(wl, kernel, ins, owners=len(seen) == 1)
        if case.get("residual"):     # integer sums, then a float32 add (one rounding, as the reference's)
            np.testing.assert_allclose(got[0], want[0], rtol=1e-6, atol=1e-6 * np.abs(want[0]).max())
        else:
            np.testing.assert_array_equal(got[0], want[0], err_msg=str(cfg.values))
    assert len(seen) >= (1 if case is CASES[0][0] else 2)


@needs_dot
def test_256_bit_vectors_sum_exactly():
    """Where kernels use 256-bit vectors (AVX2's int16 pairs; AVX-VNNI, or AVX-512 preferring 256
    bits) the dot products are 8 lanes wide; the forms the host has run."""
    wl = quantized_wl(-128, **CASES[3][0])
    forms = [replace(INT16, vector_bits=256)]
    if HOST.int8_dot_lanes and "avx512vl" in HOST.isa:
        forms.append(replace(HOST, vector_bits=256))
    for tg in forms:
        with target.use(tg):
            assert 8 in (tg.int8_dot_lanes, tg.int16_dot_lanes) and INT8.matches(wl)
            kernel = INT8.build(wl, INT8.default_config(wl, INT8.space(wl)))
        got, want = _run(wl, kernel, integer_inputs(wl, -128))
        np.testing.assert_array_equal(got[0], want[0])


def test_what_it_takes():
    case = CASES[3][0]
    for tg in (ZEN4, ZEN3, SKX):
        with target.use(tg):
            assert INT8.matches(quantized_wl(-128, **case))
    with target.use(ZEN4):
        # no note from the importer, a note out of range or not an integer (a crafted record or
        # module: the value reaches generated source), or a float conv
        plain = conv2d_wl(**case).json
        assert not INT8.matches(Workload(plain))
        for bad in (1, -256, 0.5, True, "-128"):
            assert not INT8.matches(quantized_wl(bad, **case)), bad
        j = quantized_wl(-128, **case).json
        j["ops"][0]["attrs"]["exact"] = 0
        assert not INT8.matches(Workload(j))
    with target.use(SSE):                   # no integer dot product: float32 FMAs
        assert not INT8.matches(quantized_wl(-128, **case))


def _qconv_model(x_dtype, w_dtype, w_zp, w_range, seed=0):
    """QLinearConv 16 -> 32, 3x3 on 12x12, per-channel weight scales, then a ReLU-free requantize."""
    rng = np.random.default_rng(seed)
    xt = {np.uint8: TensorProto.UINT8, np.int8: TensorProto.INT8}
    w = rng.integers(*w_range, (32, 16, 3, 3)).astype(w_dtype)
    inits = [numpy_helper.from_array(np.array(0.02, np.float32), "xs"),
             numpy_helper.from_array(np.array(7 if x_dtype == np.uint8 else -3, x_dtype), "xz"),
             numpy_helper.from_array(w, "w"),
             numpy_helper.from_array(rng.uniform(0.001, 0.01, 32).astype(np.float32), "ws"),
             numpy_helper.from_array(np.full(32, w_zp, w_dtype), "wz"),
             numpy_helper.from_array(np.array(0.05, np.float32), "ys"),
             numpy_helper.from_array(np.array(128 if x_dtype == np.uint8 else 5, x_dtype), "yz"),
             numpy_helper.from_array(rng.integers(-2000, 2000, 32).astype(np.int32), "b")]
    node = helper.make_node("QLinearConv", ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz", "b"], ["y"],
                            pads=[1, 1, 1, 1])
    g = helper.make_graph([node], "qconv", [helper.make_tensor_value_info("x", xt[x_dtype], [1, 16, 12, 12])],
                          [helper.make_tensor_value_info("y", xt[x_dtype], [1, 32, 12, 12])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])


@pytest.mark.parametrize("x_dtype, w_dtype, w_zp, w_range, int8", [
    (np.uint8, np.int8, 0, (-128, 128), True),
    (np.int8, np.int8, 0, (-128, 128), True),
    (np.uint8, np.uint8, 128, (0, 256), True),        # centered: -128 .. 127
    (np.uint8, np.uint8, 0, (0, 256), False),         # centered up to 255: not int8
])
def test_quantized_conv_runs_on_the_dot_product_where_its_weights_fit(x_dtype, w_dtype, w_zp, w_range, int8):
    model = _qconv_model(x_dtype, w_dtype, w_zp, w_range)
    mod = modelc.compile(model)
    templates = {s["template"] for s in mod.program["steps"]}
    assert ("conv2d_int8" in templates) == (int8 and dot_form(HOST) is not None), templates
    rng = np.random.default_rng(1)
    x = rng.integers(np.iinfo(x_dtype).min, np.iinfo(x_dtype).max + 1, (1, 16, 12, 12)).astype(x_dtype)
    # uint8 x int8 are the products onnxruntime may saturate (integer_reference.py); the others it sums exactly
    outputs = integer_outputs if (x_dtype, w_dtype) == (np.uint8, np.int8) else onnxruntime_outputs
    want = outputs(model, {"x": x})[0]
    np.testing.assert_array_equal(mod.run({"x": x})["y"], want)


@needs_dot
def test_tuning_measures_the_dot_product_alone(tmp_path):
    """On a CPU with an integer dot product a quantized conv is one task of conv2d_int8 (no float32
    algorithm to try), its measurements run on the integers the kernel takes, and the tuned module
    stays exact."""
    model = _qconv_model(np.uint8, np.int8, 0, (-128, 128))
    path, log = str(tmp_path / "q.onnx"), str(tmp_path / "q.jsonl")
    onnx.save(model, path)
    tasks = [t for t in modelc.extract_tasks(path) if t.template.startswith("conv2d")]
    assert [(t.template, t.alternatives) for t in tasks] == [("conv2d_int8", [])]
    modelc.tune(path, n_trials=4, log=log, trials_per_round=2, verbose=0, module_check=0)
    recs = R.load_records(log, warn=False)
    assert recs and all(r.template == "conv2d_int8" and not r.error for r in recs if r.key == tasks[0].key)
    x = np.random.default_rng(2).integers(0, 256, (1, 16, 12, 12)).astype(np.uint8)
    want = integer_outputs(model, {"x": x})[0]
    with modelc.ApplyHistoryBest(log):
        np.testing.assert_array_equal(modelc.compile(path).run({"x": x})["y"], want)


@pytest.mark.parametrize("form", ["vnni", "int16"])
@pytest.mark.parametrize("x_shape, n, epi, x_min", [
    ((1, 7, 40), 52, ("Relu",), -9),       # K past a multiple of 4, N past a vector, rows shifted
    ((3, 130), 16, ("res",), -128),
    ((13, 64), 100, ("Mul", "Sigmoid"), -255),
])
def test_dense_knobs_sum_exactly(x_shape, n, epi, x_min, form):
    j = dense_wl(x_shape, n, bias=True, epi=epi)
    j["ops"][0]["attrs"].update(exact=1, x_min=x_min)
    wl = Workload(j)
    with target.use(_form(form)):
        assert DENSE8.matches(wl) and untuned(wl, select(wl)) is DENSE8
        space = DENSE8.space(wl)
        default = DENSE8.default_config(wl, space)
        cfgs = [default] + _knob_extremes(space, default, smallest=True)
        kernels = {str(c.values): DENSE8.build(wl, c) for c in cfgs}
    ins = wl.random_inputs(3)
    assert ins[0].min() >= x_min and ins[0].max() <= x_min + 255 and np.all(ins[1] == np.round(ins[1]))
    for k, (name, kernel) in enumerate(kernels.items()):
        got, want = _run(wl, kernel, ins, owners=k == 0)
        np.testing.assert_allclose(got[0], want[0], rtol=1e-6, atol=1e-6 * np.abs(want[0]).max(), err_msg=name)
    assert len(kernels) >= 2


def _qproduct(op, a_shape, k, n, trans_b=0, seed=0):
    """QLinearMatMul or onnxruntime's QGemm (with an int32 bias) of uint8 rows and int8 weights."""
    rng = np.random.default_rng(seed)
    b = rng.integers(-128, 128, (n, k) if trans_b else (k, n)).astype(np.int8)
    inits = [numpy_helper.from_array(np.array(0.02, np.float32), "as"),
             numpy_helper.from_array(np.array(9, np.uint8), "az"), numpy_helper.from_array(b, "b"),
             numpy_helper.from_array(rng.uniform(0.001, 0.01, n).astype(np.float32), "bs"),
             numpy_helper.from_array(np.zeros(n, np.int8), "bz"),
             numpy_helper.from_array(np.array(0.07, np.float32), "ys"),
             numpy_helper.from_array(np.array(100, np.uint8), "yz")]
    if op == "QGemm":
        inits.append(numpy_helper.from_array(rng.integers(-3000, 3000, n).astype(np.int32), "c"))
        node = helper.make_node("QGemm", ["a", "as", "az", "b", "bs", "bz", "c", "ys", "yz"], ["y"],
                                domain="com.microsoft", transB=trans_b)
    else:
        node = helper.make_node(op, ["a", "as", "az", "b", "bs", "bz", "ys", "yz"], ["y"])
    g = helper.make_graph([node], "q", [helper.make_tensor_value_info("a", TensorProto.UINT8, list(a_shape))],
                          [helper.make_tensor_value_info("y", TensorProto.UINT8, list(a_shape[:-1]) + [n])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13), helper.make_opsetid("com.microsoft", 1)])


@pytest.mark.parametrize("op, a_shape, k, n, trans_b", [
    ("QLinearMatMul", (1, 7, 40), 40, 52, 0), ("QGemm", (5, 64), 64, 48, 1), ("QGemm", (5, 64), 64, 48, 0)])
def test_quantized_products_run_on_the_dot_product(op, a_shape, k, n, trans_b):
    model = _qproduct(op, a_shape, k, n, trans_b)
    mod = modelc.compile(model)
    assert ("dense_int8" in {s["template"] for s in mod.program["steps"]}) == (dot_form(HOST) is not None)
    a = np.random.default_rng(1).integers(0, 256, a_shape).astype(np.uint8)
    want = integer_outputs(model, {"a": a})[0]
    np.testing.assert_array_equal(mod.run({"a": a})["y"], want)


@needs_dot
def test_a_saved_module_loads_with_the_loading_cpus_form(tmp_path):
    """A module saved where the conv ran on one dot product builds the loading CPU's (the same
    results), and is refused, naming the step, where that CPU has none: its kernel would abort."""
    model = _qconv_model(np.uint8, np.int8, 0, (-128, 128))
    mod = modelc.compile(model)
    path = str(tmp_path / "q.modelc")
    mod.save(path)
    x = np.random.default_rng(1).integers(0, 256, (1, 16, 12, 12)).astype(np.uint8)
    want = mod.run({"x": x})["y"]
    with target.use(INT16):
        np.testing.assert_array_equal(modelc.load(path).run({"x": x})["y"], want)
    no_dot = replace(HOST, isa=tuple(f for f in HOST.isa if "vnni" not in f and f not in ("avx2", "avx512bw")))
    if dot_form(HOST) is not None and "conv2d_int8" in {s["template"] for s in mod.program["steps"]}:
        with target.use(no_dot), pytest.raises(modelc.ModelcError, match=r"steps\[\d+\]\.template.*conv2d_int8"):
            modelc.load(path)
