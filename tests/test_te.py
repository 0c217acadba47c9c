"""modelc.te: declarations, their numpy reference, and the kernels of the default schedule.

Every workload is compiled once for the module (all cold kernels in one parallel compile), and each
test checks kernel == reference (to float32 precision, relative to the output's scale) and
reference == a hand-written numpy formula.
"""
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import modelc
import te_workloads as W
from modelc import te
from modelc.errors import InputError, ModelcError
from modelc.te.task import build_many

CASES = {
    "matmul_add": ((W.matmul_add, (37, 29, 45, "float32")), lambda a, b, c: W.np_matmul_add(a, b, c)),
    "matmul_add_rows": ((W.matmul_add, (16, 24, 40, "float32")), lambda a, b, c: W.np_matmul_add(a, b, c)),
    "conv2d": ((W.conv2d, (2, 5, 11, 9, 6, 3, 2, 1, 2)), lambda x, w: W.np_conv2d(x, w, 2, 1, 2)),
    "depthwise": ((W.depthwise, (1, 7, 10, 12, 3, 1, 1)), lambda x, w: W.np_conv2d(x, w, 1, 1, 1, True)),
    "maxpool": ((W.maxpool, (1, 3, 9, 8)), W.np_maxpool),
    "softmax": ((W.softmax, (5, 37)), W.np_softmax),
    "layer_norm": ((W.layer_norm, (6, 40, 1e-5)), lambda x, g, b: W.np_layer_norm(x, g, b, 1e-5)),
    "conv1d": ((W.conv1d, (2, 4, 30, 5, 3, 2)), lambda x, w: W.np_conv1d(x, w, 2)),
    "l2_normalize": ((W.l2_normalize, (7, 33)), W.np_l2_normalize),
    "bmm_gelu": ((W.bmm_gelu, (2, 8, 20, 12)), W.np_bmm_gelu),
    "elementwise": ((W.elementwise, (6, 19)), W.np_elementwise),
    "matmul_rownorm": ((W.matmul_rownorm, (8, 10, 17)), W.np_matmul_rownorm),
}


def inputs(dag, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(t.shape).astype(t.dtype) for t in dag.inputs]


@pytest.fixture(scope="module")
def built():
    tasks = {name: modelc.SearchTask(func=f, args=args) for name, ((f, args), _) in CASES.items()}
    fns = build_many([t.build(compile=False) for t in tasks.values()])
    return {name: (tasks[name], f) for name, f in zip(tasks, fns)}


def close(got, want, rel=1e-5):
    scale = max(1.0, float(np.abs(want).max()))
    err = float(np.abs(np.asarray(got, np.float64) - want).max())
    assert err <= rel * scale, f"max error {err} against scale {scale}"


@pytest.mark.parametrize("name", list(CASES))
def test_kernel_matches_reference_and_formula(built, name):
    task, f = built[name]
    xs = inputs(task.compute_dag)
    ref = task.compute_dag.evaluate(*xs)
    close(ref, CASES[name][1](*[x.astype(np.float64) for x in xs]), rel=1e-4)
    close(f(*xs), ref)
    out = np.full_like(ref, np.nan)
    assert f(*xs, out) is out
    close(out, ref)


def test_dag_prints_like_tvm(built):
    assert str(built["matmul_add"][0].compute_dag) == (
        "A = PLACEHOLDER [37, 29]\nB = PLACEHOLDER [29, 45]\nmatmul(i, j) += (A[i, k]*B[k, j])\n"
        "C = PLACEHOLDER [37, 45]\nout(i, j) = (matmul[i, j] + C[i, j])\n")
    assert "maxelem(i) max= X[i, k1]" in str(built["softmax"][0].compute_dag)


def test_default_schedule(built):
    """matmul + C is one kernel (the add fused after the reduction), with a register tile chosen by the
    GEMM's model of the target (AVX-512: 4 rows x all 40 columns; AVX2: 8 rows x one vector of 8 -
    from the target, never a constant); softmax is three (max, sum of exp, divide: exp inlined into
    both readers)."""
    from modelc import target
    from modelc.target import Target
    f = built["matmul_add_rows"][1]
    assert len(f.sources) == 1
    task = built["matmul_add_rows"][0]
    avx512 = Target.from_features("znver4", "+avx,+avx2,+fma,+avx512f,+avx512dq,+avx512bw,+avx512vl", threads=2)
    avx2 = Target.from_features("znver3", "+avx,+avx2,+fma,+sse4.1,+sse4.2,-avx512f", threads=2)
    for tg, tile in ((avx512, 4 * 40), (avx2, 8 * 8)):
        with target.use(tg):
            src = task.build(compile=False).sources[0]
        assert f"stack_empty({tile}, np.float32)" in src, (tg.llvm_cpu, tile)
    assert [p.name for p in built["softmax"][1].plans] == ["maxelem", "expsum", "softmax"]
    assert [p.name for p in built["bmm_gelu"][1].plans] == ["bmm + gelu"]
    assert [p.name for p in built["matmul_rownorm"][1].plans] == ["s", "mm + out"]


def test_workload_key_and_argument_checks(built):
    task, f = built["matmul_add"]
    assert task.workload_key == '["matmul_add", 37, 29, 45, "float32"]'
    assert modelc.SearchTask(workload_key=task.workload_key).workload_key == task.workload_key
    a, b, c = inputs(task.compute_dag)
    with pytest.raises(InputError, match="input 'B' must be float32 of shape \\(29, 45\\)"):
        f(a, b.T.copy(), c)
    with pytest.raises(InputError, match="input 'C'"):
        f(a, b, c.astype(np.float64))
    with pytest.raises(InputError, match="expected 3 input"):
        f(a, b)
    with pytest.raises(InputError, match="output 'out'"):
        f(a, b, c, np.empty((37, 45), np.float64))
    with pytest.raises(ModelcError, match="not a registered workload"):
        modelc.SearchTask(func=lambda: None, args=())
    with pytest.raises(ModelcError, match="no tuning log at 'x.jsonl'"):
        task.build(log="x.jsonl")


@settings(max_examples=4, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.integers(1, 20), st.integers(1, 24), st.integers(1, 40))
def test_matmul_shapes(n, red, m):
    task = modelc.SearchTask(func=W.matmul_add, args=(n, red, m, "float32"))
    xs = inputs(task.compute_dag, seed=n)
    ref = task.compute_dag.evaluate(*xs)
    close(ref, W.np_matmul_add(*[x.astype(np.float64) for x in xs]), rel=1e-4)
    close(task.build()(*xs), ref)


@settings(max_examples=3, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.integers(1, 4), st.integers(3, 9), st.integers(1, 3), st.sampled_from([1, 3]),
       st.integers(1, 2), st.integers(0, 1), st.integers(1, 2))
def test_conv2d_shapes(c, h, k, r, stride, pad, dil):
    if W.out_size(h, r, stride, pad, dil) < 1:
        return
    task = modelc.SearchTask(func=W.conv2d, args=(1, c, h, h + 1, k, r, stride, pad, dil))
    xs = inputs(task.compute_dag, seed=h)
    ref = task.compute_dag.evaluate(*xs)
    close(ref, W.np_conv2d(*[x.astype(np.float64) for x in xs], stride, pad, dil), rel=1e-4)
    close(task.build()(*xs), ref)


# ---- declarations that must be refused, naming the stage ------------------------------------------

A = te.placeholder((8, 8), name="A")
X64 = te.placeholder((8,), name="X64", dtype="float64")
IX = te.placeholder((8,), name="I", dtype="int64")
K = te.reduce_axis((0, 8), name="k")
BAD = [
    (lambda: te.compute((8,), lambda i: A[i], name="s1"), "stage 's1'.*'A' has 2 dimension.*indexed with 1"),
    (lambda: te.compute((8,), lambda i: A[i, K], name="s2"), "stage 's2'.*reduce axis 'k' is used outside"),
    (lambda: te.compute((8,), lambda i: te.call("foo", A[i, 0]), name="s3"), "stage 's3'.*unknown function 'foo'"),
    (lambda: te.compute((8,), lambda i: A[i, 0] + X64[i], name="s4"), "stage 's4'.*cannot combine float32 and float64"),
    (lambda: te.compute((8,), lambda i: IX[i] + 0.5, name="s5"), "stage 's5'.*float constant 0.5 meets a int64"),
    (lambda: te.compute((8, 8), lambda i, j: A[i + 1, j], name="s6"),
     r"stage 's6'.*index 0 of A\[\(i \+ 1\), j\] ranges over \[1, 8\], outside \[0, 7\]"),
    (lambda: te.compute((8,), lambda i: A[i, A[i, 0]], name="s7"),
     "stage 's7'.*index 1 of 'A' is float32, not an integer"),
    (lambda: te.compute((8,), lambda i: te.sum(A[i, K], axis=K) + 1.0, name="s8"), "stage 's8'.*whole body"),
    (lambda: te.compute((8, 8), lambda i: A[i, 0], name="s9"), "stage 's9'.*1 index argument.*2 dimension"),
    (lambda: te.compute((8,), lambda i: A[i, i] if A[i, 0] > 0 else 0.0, name="s10"), "stage 's10'.*no truth value"),
    (lambda: te.compute((8,), lambda i: A[i // 2 + 5, 0], name="s11"), "stage 's11'.*ranges over \\[5, 8\\]"),
    (lambda: te.compute((8,), lambda i: A[(i + 3) % 9, 0], name="s12"), "stage 's12'.*ranges over \\[0, 8\\]"),
    (lambda: te.compute((8,), lambda i: A[i, 0] / 2 + IX[i] / 2, name="s13"), "stage 's13'"),
    (lambda: te.compute((8,), lambda i: te.exp(IX[i]), name="s14"), "stage 's14'.*exp of a int64"),
    (lambda: te.placeholder((8, 0), name="p"), "positive integers"),
    (lambda: te.compute((8,), lambda i: te.max(A[i, 0]), name="s15"), "stage 's15'.*axis= .a reduction"),
]


@pytest.mark.parametrize("k", range(len(BAD)))
def test_bad_declarations(k):
    make, message = BAD[k]
    with pytest.raises(te.DeclarationError, match=message):
        make()


def test_guarded_reads_and_missing_placeholder():
    pad = te.compute((10,), lambda i: te.if_then_else(te.all(i >= 1, i < 9), A[i - 1, 0], 0.0), name="ok")
    assert pad.shape == (10,)
    out = te.compute((8,), lambda i: A[i, 0] * 2.0, name="twice")
    with pytest.raises(ModelcError, match="placeholder 'A' is read but is not among"):
        te.ComputeDAG([out])


def test_hostile_names_never_reach_the_source():
    bad = "x; import os"

    @modelc.register_workload(name="hostile")
    def hostile(n):
        X = te.placeholder((n, n), name=bad)
        k = te.reduce_axis((0, n), name=bad + "k")
        s = te.compute((n,), lambda i: te.sum(X[i, k], axis=k), name=bad + " sum")
        return [X, te.compute((n, n), lambda i, j: X[i, j] - s[i], name=bad + "'\"\n")]
    task = modelc.SearchTask(func="hostile", args=(5,))
    assert bad in str(task.compute_dag)
    f = task.build(compile=False)
    for src in f.sources:
        assert "import os" not in src and "x;" not in src
    x = np.arange(25, dtype=np.float32).reshape(5, 5)
    close(task.compute_dag.evaluate(x), x - x.sum(axis=1, keepdims=True))


def test_reference_of_reductions_and_guards():
    """The numpy reference alone, on integers: floor division and modulo of negatives, min."""
    N = 7
    X = te.placeholder((N,), name="X", dtype="int64")
    k = te.reduce_axis((0, N), "k")
    out = te.compute((N,), lambda i: te.min(X[(i - 3) % N] * ((k - 3) // 2), axis=k), name="m")
    x = np.arange(N, dtype=np.int64) - 2
    want = [min(x[(i - 3) % N] * ((kk - 3) // 2) for kk in range(N)) for i in range(N)]
    assert te.ComputeDAG([X, out]).evaluate(x).tolist() == want
    assert math.isfinite(te.ComputeDAG([X, out]).flop_count())


def test_several_outputs_of_other_dtypes_and_a_guarded_gather():
    """Outputs that are read by other stages, bool and int64 outputs, an index read from a tensor
    (clamped in the kernel: only the guard bounds it)."""
    n = 21
    X = te.placeholder((n, 3), name="X")
    ix = te.placeholder((n,), name="I", dtype="int32")
    k = te.reduce_axis((0, 3), "k")
    mx = te.compute((n,), lambda i: te.max(X[i, k], axis=k), name="mx")
    pos = te.compute((n, 3), lambda i, j: X[i, j] > mx[i] * 0.5, name="pos")
    cnt = te.compute((n,), lambda i: te.sum(te.cast("int64", ix[i]) * 2 + k, axis=k), name="cnt")
    g = te.compute((n,), lambda i: te.if_then_else(
        ix[i] >= 0, X[te.min(te.cast("int64", ix[i]), n + 5), 0], 0.0), name="gather")
    dag = te.ComputeDAG([X, ix, mx, pos, cnt, g])
    x, i = np.random.default_rng(1).random((n, 3)).astype(np.float32), np.arange(n, dtype=np.int32) - 3
    from modelc.te.task import BuiltFunction
    outs, refs = BuiltFunction(dag)(x, i), dag.evaluate(x, i)
    assert [o.dtype for o in outs] == [np.float32, np.bool_, np.int64, np.float32]
    for o, r in zip(outs, refs):
        assert np.array_equal(o, r)
    assert np.array_equal(refs[3], np.where(i >= 0, x[np.minimum(np.maximum(i, 0), n - 1), 0], 0))
