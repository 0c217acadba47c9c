"""Issue 15, the search: derived schedule spaces, sampled schedules against numpy, kernels as
documents (round trip and refusals), and tuning a te workload through the records."""
import json
import math
import random

import numpy as np
import pytest
import te_workloads as W

import modelc
from modelc import target
from modelc.errors import ModelcError
from modelc.target import Target
from modelc.te.codegen import kernel_source
from modelc.te.document import from_document, to_document
from modelc.te.sketch import default_values, rules, space
from modelc.te.task import BuiltFunction, build_many
from modelc.tune import records as R
from modelc.tune.measure import MeasureOptions
from modelc.validate import DocumentError, check_workload

AVX512 = Target.from_features("znver4", "+avx,+avx2,+fma,+avx512f,+avx512dq,+avx512bw,+avx512vl", threads=2)
AVX2 = Target.from_features("znver3", "+avx,+avx2,+fma,+sse4.1,+sse4.2,-avx512f", threads=2)

CASES = {
    "matmul_add": (W.matmul_add, (13, 40, 70, "float32")),
    "conv2d": (W.conv2d, (1, 3, 9, 10, 5, 3, 1, 1, 1)),
    "softmax": (W.softmax, (5, 37)),
    "l2_normalize": (W.l2_normalize, (7, 33)),
    "bmm_gelu": (W.bmm_gelu, (2, 9, 20, 12)),
    "conv1d": (W.conv1d, (2, 4, 30, 5, 3, 2)),
    "elementwise": (W.elementwise, (6, 19)),
}


def task_of(name):
    func, args = CASES[name]
    return modelc.SearchTask(func=func, args=args)


def inputs(dag, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(t.shape).astype(t.dtype) for t in dag.inputs]


def close(got, want, rel=1e-5):
    got, want = (got if isinstance(got, tuple) else (got,)), (want if isinstance(want, tuple) else (want,))
    for g, w in zip(got, want):
        scale = float(np.abs(w).max())
        assert float(np.abs(g - w).max()) <= rel * scale


def test_rules_follow_the_loop_structure():
    kinds = {name: [rules(p) for p in task_of(name).plans] for name in ("matmul_add", "softmax", "elementwise")}
    assert "multi-level-tiling" in kinds["matmul_add"][0]
    assert all("reduce-per-lane" in r for r in kinds["softmax"][:2]) and "row-tiles" in kinds["softmax"][2]
    assert "row-tiles" in kinds["elementwise"][0] and "multi-level-tiling" not in kinds["elementwise"][0]


def test_index_arithmetic_is_folded_and_one_trip_loops_dropped():
    """What numba would type and LLVM fold anyway: a 1x1 conv's `(oh * 1 + kh * 1) - 0` and its
    loops over one filter row and column; a 0 only where numba reads it as the same int64."""
    from modelc.te.codegen import _fold
    assert _fold("*", "np.int64(1)", "m0", "int64") == "m0" and _fold("*", "q3", "1", "int64") == "q3"
    assert _fold("+", "0", "r3", "int64") == "r3" and _fold("-", "(m0 + 1)", "np.int64(0)", "int64") == "(m0 + 1)"
    assert _fold("*", "np.int64(0)", "r3", "int64") == "0" and _fold("*", "np.uint64(0)", "r3", "uint64") is None
    assert _fold("-", "0", "r3", "int64") is None and _fold("+", "np.int64(10)", "r3", "int64") is None
    (plan,) = modelc.SearchTask(func=W.conv2d, args=(1, 8, 6, 6, 16, 1, 1, 0, 1)).plans
    src, _ = kernel_source(plan)
    assert "range(0, 1)" not in src and "* np.int64(1)" not in src and "- np.int64(0)" not in src


def test_constant_sums_in_indices_are_folded_to_the_same_values():
    """A padded conv reads row `(oh * 2 + kh) - 3` of a buffer whose halo adds the 3 back: the
    kernel computes `oh * 2 + kh`; constants combine wherever they meet, and the values agree with
    the expression as written (integers wrap, so reassociating sums keeps them)."""
    from modelc.te.codegen import _Emitter, _reassociate
    from modelc.te.expr import Binary, Const, Var
    oh, kh = Var("oh", 0, 9, "spatial"), Var("kh", 0, 3, "reduce")
    c = lambda v: Const(v, "int64")                              # noqa: E731
    row = Binary("+", Binary("-", Binary("+", Binary("*", oh, c(2), "int64"), kh, "int64"), c(3), "int64"),
                 c(3), "int64")
    env = {id(oh): "oh", id(kh): "kh"}
    text = _Emitter({}, set())(row, env)
    assert "3" not in text and "oh" in text and "kh" in text
    rng = np.random.default_rng(0)
    for _ in range(20):
        a, b, k = (int(x) for x in rng.integers(-50, 50, 3))
        e = Binary("-", Binary("+", Binary("*", c(a), c(b), "int64"), oh, "int64"), c(k), "int64")
        e = Binary("+", e, c(7), "int64")
        for v in (0, 4, 8):
            want = a * b + v - k + 7
            assert eval(_Emitter({}, set())(e, {id(oh): "oh"}), {"np": np, "oh": v}) == want
    x = lambda v: Const(v, "float32")                            # noqa: E731
    f = Binary("+", Binary("-", x(2.5), x(1.0), "float32"), x(1.0), "float32")    # floats: as written
    assert _reassociate(f) is f


def test_an_offset_the_rows_of_a_tile_share_is_computed_once_per_lane():
    """The rows of a register tile read the same weight offset (and a depthwise window's taps
    overlapping inputs): each lane loop names such an offset once, before its updates, and the
    kernel still matches the reference (test_te.py checks every plan's values)."""
    import re
    from modelc.te.codegen import _offsets
    (conv,) = modelc.SearchTask(func=W.conv2d, args=(1, 8, 10, 10, 16, 3, 1, 1, 1)).plans
    sp = space(conv)
    v = next(sp.get(i).values for i in range(len(sp)) if sp.is_valid(sp.get(i)) and sp.get(i).values["tile_m"] >= 2)
    src, _ = kernel_source(conv, v)
    loops = re.findall(r"for jj in range\(\d+\):\n((?:\s+(?:acc|o__)\S*.*\n)+)", src)
    assert loops and "o__0 = np.uintp(" in src
    for body in loops:
        offs = [o for ln in body.splitlines() if ln.strip().startswith("acc[") for o in _offsets(ln)]
        shared = [o for o in set(offs) if offs.count(o) > 1 and not re.fullmatch(r"np\.uintp\(\w+\)", o)]
        assert not shared, shared


def test_unroll_writes_out_small_reductions_and_row_tiles_are_written_out():
    """After Ansor's auto_unroll_max_step: a depthwise 3x3's nine taps are written out inside one
    lane loop by default (no loop over the window: the accumulators stay in registers); a conv's
    reduction is too large to write out and gets no such knob; grouped row tiles are written out
    one after another, not a loop (a variable offset into the accumulators put every update on
    the stack)."""
    import re
    (dw,) = modelc.SearchTask(func=W.depthwise, args=(1, 32, 12, 12, 3, 1, 1)).plans
    with target.use(AVX512):
        sp = space(dw)
        assert next(k.values for k in sp.knobs if k.name == "unroll") == [0, 16]
        v = default_values(dw, sp)
        assert v["unroll"] == 16 and sp.is_valid(sp.from_values(v))
        src, _ = kernel_source(dw, v)
        body = src.split("def kernel", 1)[1]
        assert not re.search(r"for r\d in range", body) and body.count("acc[") >= 2 * 9
        assert not sp.is_valid(sp.from_values({**v, "k_unroll": 2}))       # moot once written out
        grouped = next(sp.get(i).values for i in range(len(sp)) if sp.is_valid(sp.get(i))
                       and sp.get(i).values["m_group"] == 2 and sp.get(i).values["unroll"] == 16)
        body = kernel_source(dw, grouped)[0].split("def kernel", 1)[1]
        assert "for g in" not in body and "mt = mg * 2 + 1" in body
        (conv,) = modelc.SearchTask(func=W.conv2d, args=(1, 8, 10, 10, 16, 3, 1, 1, 1)).plans
        assert "unroll" not in [k.name for k in space(conv).knobs]


def test_space_is_derived_from_the_target():
    """Column tiles are whole vectors of the CPU (16 float32 lanes with AVX-512, 8 with AVX2); a
    register tile never exceeds its vector registers; grouped row tiles divide the row tiles."""
    p = task_of("matmul_add").plans[0]
    for tg, lanes in ((AVX512, 16), (AVX2, 8)):
        with target.use(tg):
            sp = space(p)
            tiles = next(k.values for k in sp.knobs if k.name == "tile_n")
            assert all(t % lanes == 0 for t in tiles) and lanes in tiles
            for i in range(0, len(sp), max(1, len(sp) // 400)):
                cfg = sp.get(i)
                if sp.is_valid(cfg):
                    v = cfg.values
                    assert v["tile_m"] * -(-v["tile_n"] // lanes) <= tg.max_tile_vectors
                    assert -(-13 // v["tile_m"]) % v["m_group"] == 0
            assert sp.is_valid(sp.from_values(default_values(p, sp)))


def test_every_valid_annotation_is_a_different_kernel():
    """Two valid annotations of a kernel never generate the same source, up to the order of its
    lines (an item order over a single column tile or a single group of row tiles only moves a
    `nt = 0` line: the rows-first kernel): the tuner would measure one kernel twice under two names."""
    for name in CASES:
        for p in task_of(name).plans:
            sp = space(p)
            step = max(1, len(sp) // 300)
            sources = {}
            for i in range(0, len(sp), step):
                cfg = sp.get(i)
                if sp.is_valid(cfg):
                    src = "\n".join(sorted(kernel_source(p, cfg.values)[0].splitlines()))
                    assert src not in sources, (name, cfg.values, sources.get(src))
                    sources[src] = cfg.values


def test_a_config_from_before_a_knob_existed_still_loads():
    """Logs outlive the version that wrote them: a te config written before `unroll` existed means
    a reduction not written out; a config lacking any other knob is refused by name."""
    plans = [p for name in CASES for p in task_of(name).plans if "unroll" in {k.name for k in space(p).knobs}]
    assert plans
    sp = space(plans[0])
    old = {k: v for k, v in default_values(plans[0], sp).items() if k != "unroll"}
    assert sp.from_values(old)["unroll"] == 0
    del old["tile_n"]
    with pytest.raises(ModelcError, match="lacks knob 'tile_n'"):
        sp.from_values(old)


def sampled(name, n, seed):
    """`n` random valid annotations of each of the task's kernels."""
    rnd = random.Random(seed)
    out = []
    task = task_of(name)
    for _ in range(n):
        values = []
        for p in task.plans:
            sp = space(p)
            valid = [i for i in range(len(sp)) if sp.is_valid(sp.get(i))]
            values.append(sp.get(rnd.choice(valid)).values)
        out.append(values)
    return task, out


def test_sampled_schedules_match_numpy():
    """Every kernel of random points of each derived space (tails, groups, k blocks, unrolling,
    both orders) against numpy's evaluation of the declaration; all compiled in one parallel batch."""
    fns = []
    for k, name in enumerate(CASES):
        task, samples = sampled(name, 3, seed=k)
        fns += [(task, BuiltFunction(task.compute_dag, compile=False, values=v, plans=task.plans)) for v in samples]
    build_many([f for _, f in fns])
    for task, f in fns:
        xs = inputs(task.compute_dag, seed=1)
        close(f(*xs), task.compute_dag.evaluate(*xs))


def test_tail_tiles_store_each_output_once():
    """A last row or column tile is shifted back to end at the axis' end and stores only what the
    tile before did not: one item per output (two would race on it from two threads). Kernels for
    AVX-512 and AVX2 (column tiles of one and two vectors of 16 or 8 lanes), on every host: te's
    kernels are plain float loops, which numba compiles for the host."""
    from modelc.kernels import cache
    from modelc.kernels.testing import stores_per_output
    made, configs = [], []
    for tg in (AVX512, AVX2):
        lanes = tg.lanes(4)
        with target.use(tg):
            for name, want in (("matmul_add", {"tile_m": 4, "tile_n": lanes, "m_group": 1}),  # 13 rows, 70 columns
                               ("matmul_add", {"tile_m": 6, "tile_n": 2 * lanes, "m_group": 1, "vectorize": "spatial"}),
                               ("conv2d", {"row_axis": 2, "tile_m": 4, "row_axis2": -1}),    # 9 rows of 10
                               ("conv2d", {"row_axis": 1, "tile_m": 2, "row_axis2": 2, "tile_m2": 4}),  # 5 ch x 9 rows
                               ("softmax", {"vectorize": "reduce"})):
                p = task_of(name).plans[0]
                sp = space(p)
                v = next(sp.get(i).values for i in range(len(sp)) if sp.is_valid(sp.get(i))
                         and all(sp.get(i).values.get(k) == w for k, w in want.items()))
                configs.append((tg.llvm_cpu, name, v))
                made.append(kernel_source(p, v))
    fns = cache.compile_all([src for src, _ in made])
    for (src, tensors), fn, v in zip(made, fns, configs):
        args = [np.zeros(math.prod(t.shape), np.float32) for t in tensors]
        assert (stores_per_output(fn, args) == 1).all(), v


def test_document_round_trip_and_key():
    for name in ("matmul_add", "conv2d", "bmm_gelu", "softmax"):
        for p in task_of(name).plans:
            doc = json.loads(json.dumps(to_document(p)))
            _, q = from_document(doc)
            assert kernel_source(q)[0] == kernel_source(p)[0]
    t1 = task_of("matmul_add").tuning_tasks()[0]
    assert t1.flops == 13 * 70 * (2 * 40 + 1)          # multiply-adds and the + C; no index arithmetic
    conv = task_of("conv2d").tuning_tasks()[0]          # the padding's conditions are no FLOPs either
    assert conv.flops == 2 * 5 * 9 * 10 * 3 * 3 * 3

    @modelc.register_workload
    def renamed_matmul_add(N, L, M, dtype):       # the same kernel under other names shares its key
        return W.matmul_add(N, L, M, dtype)
    t2 = modelc.SearchTask(func=renamed_matmul_add, args=(13, 40, 70, "float32")).tuning_tasks()[0]
    assert t1.key == t2.key and t1.desc != t2.desc


def _doc():
    return to_document(task_of("matmul_add").plans[0])


def _edit(path, value):
    def f(d):
        node = d
        for k in path[:-1]:
            node = node[k]
        node[path[-1]] = value
        return d
    return f


BAD_DOCS = [
    (_edit(["te"], 2), r"workload\.te: document version 2"),
    (_edit(["inputs", 0, "dtype"], "float32; import os"), r"inputs\[0\]\.dtype"),
    (_edit(["inputs", 0, "shape"], [13, -1]), r"inputs\[0\]\.shape"),
    (_edit(["stages", 0, "reduce", "op"], "prod"), r"reduce\.op: 'prod'"),
    (_edit(["stages", 0, "reduce", "source"], ["call", "system", ["const", 1.0, "float32"]]),
     r"reduce\.source: unknown expression"),
    (_edit(["stages", 0, "reduce", "source"], ["input", 7, [["axis", 0], ["raxis", 0]]]), r"input 7 out of range"),
    (_edit(["stages", 0, "reduce", "source", 3, 2], [["axis", 1], ["axis", 1]]),
     r"stages\[0\].*index 0 of .* ranges over \[0, 69\], outside \[0, 39\]"),
    (_edit(["stages", 0, "reduce", "source"], ["binary", "**", ["const", 1.0, "float32"], ["const", 1.0, "float32"]]),
     r"unknown expression"),
    (_edit(["stages", 1, "value"], ["stage", 0, [["axis", 0]]]), r"stages\[1\].*indexed with 1"),
    (_edit(["stages", 0, "shape"], [1 << 39, 1 << 39]), r"needs .* of memory"),
    (_edit(["stages", 0, "reduce", "axes"], [[0, 1 << 39]]), r"index 1 of .* outside"),
    (lambda d: _edit(["stages", 0, "reduce", "source"], ["const", 1.0, "float32"])(
        _edit(["stages", 0, "reduce", "axes"], [[0, 1 << 39]])(d)), r"loop steps, more than"),
    (_edit(["stages", 1, "value"], ["binary", "+", ["stage", 0, [["axis", 0], ["axis", 1]]],
                                    ["cast", "float32", ["const", 1 << 40, "int32"]]]), r"is not a int32 constant"),
]


@pytest.mark.parametrize("edit,message", BAD_DOCS)
def test_bad_documents_are_refused_naming_the_field(edit, message):
    doc = edit(json.loads(json.dumps(_doc())))
    with pytest.raises(DocumentError, match=message):
        check_workload(doc)


def test_deep_documents_are_refused():
    e = ["const", 1.0, "float32"]
    for _ in range(300):
        e = ["binary", "+", e, ["const", 1.0, "float32"]]
    doc = _doc()
    doc["stages"][1]["value"] = e
    with pytest.raises(DocumentError, match="deeper than|nested too deeply|larger than"):
        check_workload(json.loads(json.dumps(doc)))


FAST = MeasureOptions(number=2, repeat=2, min_repeat_ms=0.0)


def test_tune_resume_build_and_print_best(tmp_path):
    """Two kernels tuned through the records; a second call resumes to the larger budget; build(log)
    applies each kernel's best record; print_best shows the schedule; a tampered record is skipped."""
    task = modelc.SearchTask(func=W.matmul_rownorm, args=(8, 10, 17))
    log = str(tmp_path / "te.jsonl")
    task.tune(n_trials=4, log=log, trials_per_round=2, measure_options=FAST, verbose=0)
    assert len(R.load_records(log)) == 4
    task.tune(n_trials=8, log=log, trials_per_round=2, measure_options=FAST, verbose=0)
    recs = R.load_records(log)
    assert len(recs) == 8 and {r.template for r in recs} == {"te"}
    assert {r.key for r in recs} == {t.key for t in task.tuning_tasks()}
    best = R.best_by_key(recs)
    f = task.build(log=log)
    for t, p, src in zip(task.tuning_tasks(), task.plans, f.sources):
        r = best.get((t.key, "te"))
        assert src == kernel_source(p, r.config if r else None)[0]
    xs = inputs(task.compute_dag)
    close(f(*xs), W.np_matmul_rownorm(*[x.astype(np.float64) for x in xs]))
    text = task.print_best(log)
    assert "GFLOP/s" in text and "loop nest:" in text and "multi-level-tiling" in text
    # a record whose document was edited no longer hashes to its key: skipped, with a warning
    line = json.loads(open(log).readline())
    line["workload"]["stages"][0]["shape"] = [9, 10]
    with open(log, "a") as fh:
        fh.write(json.dumps(line) + "\n")
    with pytest.warns(UserWarning, match="skipped 1 corrupt"):
        assert len(R.load_records(log)) == 8


def test_a_missing_log_is_an_error():
    with pytest.raises(ModelcError, match="no tuning log"):
        task_of("softmax").build(log="/nonexistent/te.jsonl")


def test_cost_model_features_come_from_the_loop_nest():
    """The te template tells the cost model what the loop nest does: one row of a matmul tile
    loads a vector of B per multiply-add, eight rows share it; conv's padding is a guard. With
    AVX-512's vectors of 16 lanes and AVX2's of 8 (a tile of one vector of columns on each)."""
    from modelc.te.sketch import loop_features
    from modelc.tune.features import N_FEATURES, config_features
    for tg in (AVX512, AVX2):
        with target.use(tg):
            task = task_of("matmul_add").tuning_tasks()[0]
            sp, p = task.space, task.wl.plan
            lanes = tg.lanes(4)
            one = next(sp.get(i) for i in range(len(sp)) if sp.is_valid(sp.get(i)) and sp.get(i)["tile_m"] == 1
                       and sp.get(i)["tile_n"] == lanes and sp.get(i).values.get("vectorize") == "spatial")
            eight = sp.from_values(dict(one.values, tile_m=8))
            assert sp.is_valid(eight)
            assert loop_features(p, one.values)["loads_per_fma"] == 2.0        # A broadcast + B vector per FMA
            assert loop_features(p, eight.values)["loads_per_fma"] == 9 / 8
            a, b = (config_features(task.tpl, task.wl, c, task.flops) for c in (one, eight))
            assert a.shape == (N_FEATURES,) and not np.array_equal(a, b)
            conv = task_of("conv2d").plans[0]
            assert loop_features(conv, default_values(conv))["guards"] == 1
