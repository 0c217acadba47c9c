"""Defaults that follow the target: channel blocks, column blocks, task counts and the serial
threshold are derived from `target.current()`, so that an AVX2 target (8 float32 lanes) does not
get AVX-512's (16) and the values on an AVX-512 machine stay those the kernels were tuned with.
Also the code generation options that replaced text patching of generated kernels."""
import dataclasses


from modelc import target
from modelc.kernels import rows, template, templates  # noqa: F401  (registers the templates)
from modelc.kernels.expr import emit
from modelc.kernels.layout import choose_block
from modelc.kernels.workload import Workload

AVX512 = target.Target.from_features("znver4", "+avx,+avx2,+fma,+avx512f,+avx512bw,+avx512vl", threads=2)
AVX2 = target.Target.from_features("znver3", "+avx,+avx2,+fma,+sse4.1,+sse4.2", threads=2)


def reduce_wl(shape, axes):
    out = [1 if k in axes else d for k, d in enumerate(shape)]
    return Workload({"version": 1, "inputs": [{"shape": list(shape), "dtype": "float32", "const": False}],
                     "ops": [{"op": "ReduceSum", "attrs": {}, "args": ["i0", "p0"]}],
                     "params": {"p0": {"dtype": "int64", "shape": [len(axes)], "value": list(axes)}},
                     "outputs": [{"shape": out, "dtype": "float32", "value": "v0"}]})


def test_channel_block_is_one_vector_of_the_target():
    with target.use(AVX512):
        assert [choose_block(c) for c in (64, 24, 12, 3)] == [16, 8, 12, 3]
    with target.use(AVX2):
        assert [choose_block(c) for c in (64, 24, 12, 3)] == [8, 8, 4, 3]


def test_column_blocks_start_at_one_vector():
    with target.use(AVX512):
        assert rows.col_widths(1000) == [16, 32, 64, 128]
        assert rows.col_widths(40) == [16, 32]
    with target.use(AVX2):
        assert rows.col_widths(1000) == [8, 16, 32, 64, 128]
        assert rows.col_widths(12) == [8]


def test_serial_threshold_follows_vector_width_and_threads():
    assert target.Target.from_features("x", "+avx512f").lanes(4) == 16
    with target.use(AVX512):
        assert rows.parallel_min() == 131072
        assert rows.default_rows(64, 10 ** 6, rows.RPT_CANDIDATES) == {"rows_per_task": 4, "parallel": True}
        assert rows.default_rows(64, 100000, rows.RPT_CANDIDATES)["parallel"] is False
    with target.use(AVX2):
        assert rows.parallel_min() == 65536
        assert rows.default_rows(64, 100000, rows.RPT_CANDIDATES)["parallel"] is True
    with target.use(dataclasses.replace(AVX512, threads=8)):       # more threads: more, smaller tasks
        assert rows.default_rows(64, 10 ** 6, rows.RPT_CANDIDATES)["rows_per_task"] == 1
    with target.use(dataclasses.replace(AVX512, threads=1)):       # one thread: never the thread pool
        assert rows.default_rows(64, 10 ** 9, rows.RPT_CANDIDATES)["parallel"] is False


def test_column_reduction_space_follows_the_target():
    wl = reduce_wl((4, 256, 40), (1,))          # kept axis of 40 innermost: column blocks
    t = template.select(wl)
    assert t.name == "reduce"
    with target.use(AVX512):
        sp = t.space(wl)
        assert rows.knob_values(sp, "vector_width") == [16, 32]
        assert t.default_config(wl, sp)["vector_width"] == 32
    with target.use(AVX2):
        sp = t.space(wl)
        assert rows.knob_values(sp, "vector_width") == [8, 16, 32]
        t.build(wl, t.default_config(wl, sp))


# ---- options of the code generator ------------------------------------------------------------

def test_parallel_loops_are_declared_not_parsed():
    body = [template.parallel_loop("it", 6), "    out0[it] = 1.0",
            template.parallel_loop("j", 4), "    out0[j] = 2.0"]
    src = template.source(["out0"], ["float32"], body)
    assert "N_ITEMS = 10" in src and "prange" not in src.split("def kernel")[1]
    assert "for j in range(max(lo, 6) - 6, min(hi, 10) - 6):" in src
    # a copy indented into another loop is a plain line: not parallel
    src = template.source(["out0"], ["float32"], ["for i in range(2):", "    " + template.parallel_loop("j", 4)])
    assert "N_ITEMS = 1" in src
    # and a loop written as text is not one either: only declared loops are
    src = template.source(["out0"], ["float32"], ["for j in prange(3):", "    out0[j] = 1.0"])
    assert "N_ITEMS = 1" in src


def test_fast_erf_is_an_option_of_the_emitter():
    assert emit("Erf", ["x"], {}, "float32") == "fast_erf(x)"          # float32: the polynomial
    assert emit("Erf", ["x"], {}, "float32", fast_erf=False) == "math.erf(x)"
    assert emit("Erf", ["x"], {}, "float64") == "math.erf(x)"          # (float32's precision only)
    assert "fast_erf(" in emit("Gelu", ["x"], {}, "float32", fast_erf=True)
    src = template.source(["out0"], ["float32"], ["out0[0] = fast_erf(out0[0])"])
    assert src.count("def fast_erf(") == 1


def test_unsigned_epilogue_reads():
    wl = Workload({"version": 1, "inputs": [{"shape": [2, 8], "dtype": "float32", "const": False},
                                            {"shape": [8], "dtype": "float32", "const": False}],
                   "ops": [{"op": "Relu", "attrs": {}, "args": ["i0"]},
                           {"op": "Add", "attrs": {}, "args": ["v0", "i1"]}],
                   "params": {}, "outputs": [{"shape": [2, 8], "dtype": "float32", "value": "v1"}]})
    lines, _ = template.epilogue(wl, wl.ops[1:], "a", ["n", "j"], (2, 8), "float32", "v0")
    assert lines == ["e0 = (a + in1[j])"]
    lines, _ = template.epilogue(wl, wl.ops[1:], "a", ["n", "j"], (2, 8), "float32", "v0", unsigned=True)
    assert lines == ["e0 = (a + in1[np.uintp(j)])"]
