"""Compile never kills the process: Pow's integer exponents, aborting kernel compiles, dtypes."""
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import modelc
from modelc.errors import ModelcError
from modelc.kernels import cache
from workloads import onnx_model


def _vi(name, et, shape):
    return helper.make_tensor_value_info(name, et, shape)


@pytest.mark.parametrize("base, expo", [(np.float32, np.int32), (np.float32, np.int64), (np.float32, np.int16),
                                        (np.float32, np.uint8), (np.float64, np.int32), (np.int32, np.int32),
                                        (np.int64, np.int64), (np.int64, np.float32), (np.int32, np.float32),
                                        (np.float32, np.float32)])
def test_pow_with_any_exponent_type_compiles_and_is_right(base, expo):
    tb, te = (helper.np_dtype_to_tensor_dtype(np.dtype(t)) for t in (base, expo))
    m = onnx_model([helper.make_node("Pow", ["x", "y"], ["z"]), helper.make_node("Pow", ["x", "c"], ["w"])],
                    [_vi("x", tb, [3, 5]), _vi("y", te, [3, 5])], [_vi("z", tb, [3, 5]), _vi("w", tb, [3, 5])],
                    [onnx.numpy_helper.from_array(np.array([3, 0, 1, 2, 5], expo), "c")])
    mod = modelc.compile(m)
    rng = np.random.default_rng(0)
    x = (rng.integers(1, 4, (3, 5)) * (1.0 if base in (np.float32, np.float64) else 1)).astype(base)
    if base in (np.float32, np.float64):
        x = x * np.asarray(0.75, base)
    y = rng.integers(0, 5, (3, 5)).astype(expo)
    got = mod.run({"x": x, "y": y})
    np.testing.assert_allclose(got["z"], np.power(x.astype(np.float64), y.astype(np.float64)).astype(base),
                               rtol=1e-5)
    c = np.array([3, 0, 1, 2, 5], expo)
    np.testing.assert_allclose(got["w"], np.power(x.astype(np.float64), c.astype(np.float64)).astype(base),
                               rtol=1e-5)
    assert got["z"].dtype == base and not mod.fallbacks


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MODELC_CACHE_DIR", str(tmp_path))
    return tmp_path


ABORT = "\nimport os\nos.abort()\n"


def test_kernel_whose_compile_aborts_is_a_modelc_error(fresh_cache):
    src = "X = 1\n" + ABORT
    with pytest.raises(ModelcError, match=r"(?s)k_\w+\.py \(op Fake of node 'n1'\).*SIGABRT"):
        cache.compile_all([src], names=["op Fake of node 'n1'"])
    # this process is alive; the worker that died is replaced for the next compile
    with pytest.raises(ModelcError, match="failed to compile: NameError"):
        cache.compile_all(["undefined_name + 1\n"])


def test_a_real_llvm_fatal_error_is_a_modelc_error(fresh_cache):
    # Pow as it was generated before: numba lowers float32 ** int32 to LLVM's powi, whose
    # compiler-rt helper numba does not link; LLVM aborts the process that links it
    from modelc.kernels.template import source
    src = source(["out0", "in0", "in1"], [np.float32, np.float32, np.int32],
                 ["for i in prange(64):", "    out0[i] = in0[i] ** in1[i]"])
    with pytest.raises(ModelcError, match=r"killed its worker process \(killed by signal SIGABRT.*__powi"):
        cache.compile_all([src])


def test_compile_of_a_model_whose_kernel_aborts_names_the_op(fresh_cache, monkeypatch):
    real = cache.compile_all
    monkeypatch.setattr(cache, "compile_all", lambda sources, **kw: real([s + ABORT for s in sources], **kw))
    m = onnx_model([helper.make_node("Relu", ["x"], ["y"])], [_vi("x", TensorProto.FLOAT, [2, 3])],
                    [_vi("y", TensorProto.FLOAT, [2, 3])])
    with pytest.raises(ModelcError, match=r"(?si)op Relu.*'y'.*killed its worker process.*SIGABRT"):
        modelc.compile(m)


def test_float16_model_runs_generated_kernels_or_the_fallback_where_the_cpu_cannot_convert():
    m = onnx_model([helper.make_node("Relu", ["x"], ["r"]),
                    helper.make_node("Cast", ["r"], ["y"], to=TensorProto.FLOAT)],
                   [_vi("x", TensorProto.FLOAT16, [4, 5])], [_vi("y", TensorProto.FLOAT, [4, 5])])
    x = np.random.default_rng(0).standard_normal((4, 5)).astype(np.float16)
    mod = modelc.compile(m)
    assert not mod.fallbacks                  # a te kernel: float16 bits in, float32 out
    np.testing.assert_array_equal(mod.run({"x": x})["y"], np.maximum(x, 0).astype(np.float32))
    from modelc import target
    with target.use(target.Target.from_features("x86-64", "+sse4.2")):    # no F16C
        old = modelc.compile(m)
    assert old.fallbacks
    np.testing.assert_array_equal(old.run({"x": x})["y"], np.maximum(x, 0).astype(np.float32))


@pytest.mark.parametrize("et", [TensorProto.BFLOAT16, TensorProto.FLOAT8E4M3FN, TensorProto.FLOAT8E5M2,
                                TensorProto.INT4, TensorProto.UINT4, TensorProto.FLOAT4E2M1, TensorProto.INT2])
def test_unsupported_dtype_is_a_modelc_error_naming_tensor_and_dtype(et):
    name = np.dtype(helper.tensor_dtype_to_np_dtype(et)).name
    m = onnx_model([helper.make_node("Neg", ["x"], ["y"], name="negate")], [_vi("x", et, [4])], [_vi("y", et, [4])])
    with pytest.raises(ModelcError) as e:
        modelc.compile(m)                   # refused at import, or by compile
    msg = str(e.value).lower().replace("_", "")
    assert "'x'" in msg and (name.replace("_", "") in msg or TensorProto.DataType.Name(et).lower() in msg)
    # past the importer (a Graph built by hand): compile names the tensor, its node and dtype
    g = modelc.from_onnx(onnx_model([helper.make_node("Neg", ["x"], ["h"], name="negate"),
                                      helper.make_node("Neg", ["h"], ["y"], name="again")],
                                     [_vi("x", TensorProto.FLOAT, [4])], [_vi("y", TensorProto.FLOAT, [4])]))
    g.tensors["h"].dtype = np.dtype(helper.tensor_dtype_to_np_dtype(et))
    with pytest.raises(ModelcError, match=rf"tensor 'h' of node 'negate' \(Neg\) has dtype {name}"):
        modelc.compile(g)


@pytest.mark.slow
def test_every_elementwise_expression_links_for_every_dtype(fresh_cache):
    """No op of the fused epilogues needs a runtime symbol numba does not link (compiler-rt's
    __powidf2 was one): each op, for each dtype it can see, compiles and loads in a worker."""
    from modelc.kernels.expr import SUPPORTED, emit
    from modelc.kernels.template import source
    logic, cmp = {"Not", "And", "Or", "Xor"}, {"Equal", "Greater", "Less", "GreaterOrEqual", "LessOrEqual"}
    ints_only = {"BitShift", "BitwiseAnd", "BitwiseOr", "BitwiseXor", "BitwiseNot"}
    arity = {"Clip": 3, "Where": 3, "Sum": 3, "Mean": 2, "Max": 2, "Min": 2, "PRelu": 2, "Pow": 2,
             "Sub": 2, "Mul": 2, "Div": 2, "Add": 2, "And": 2, "Or": 2, "Xor": 2, "Mod": 2, "BitShift": 2,
             "BitwiseAnd": 2, "BitwiseOr": 2, "BitwiseXor": 2, "CastLike": 2, **{c: 2 for c in cmp}}
    variants = {"Mod": [{"fmod": 0}, {"fmod": 1}], "BitShift": [{"direction": "LEFT"}, {"direction": "RIGHT"}],
                "IsInf": [{}, {"detect_negative": 0}]}
    sources, names = [], []
    for op in sorted(SUPPORTED):
        for dt in ["float32", "float64", "int32", "int64", "int8", "uint8", "uint64", "bool"]:
            if (op in logic) != (dt == "bool") and not (dt == "bool" and op in cmp | {"Cast", "Identity", "Where"}):
                continue
            if op in ints_only and np.dtype(dt).kind not in "iu":
                continue
            ins = [np.dtype(dt)] * arity.get(op, 1)
            if op == "Where":
                ins[0] = np.dtype(bool)
            out = np.dtype(bool) if op in cmp | {"IsNaN", "IsInf"} else \
                np.dtype("int64" if op in ("Cast", "CastLike") else dt)
            for attrs in variants.get(op, [{}]):
                expr = emit(op, [f"in{k}[i]" for k in range(len(ins))], attrs, out, {}, ins)
                sources.append(source(["out0"] + [f"in{k}" for k in range(len(ins))], [out] + ins,
                                      ["for i in prange(8):", f"    out0[i] = {expr}"]))
                names.append(f"{op} {attrs} on {dt}")
    assert len(sources) > 250
    cache.compile_all(sources, names=names)


def test_kernel_compile_that_hangs_is_stopped_by_the_timeout(fresh_cache):
    with pytest.raises(ModelcError, match=r"k_\w+\.py \(op Slow\) killed its worker process "
                                          r"\(killed after the timeout of 3 s\)"):
        cache.compile_all(["import time\ntime.sleep(60)\n"], names=["op Slow"], timeout=3)
