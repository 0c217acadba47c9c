"""Pool and reduction-family kernel templates against the reference executor (max rel error 1e-5).

Hand-made workloads cover blocked and plain pools (ceil mode, asymmetric pads, dilations,
count_include_pad, global pools, fused epilogues), softmax on last and non-last axes, layer norm
with and without bias, and reductions with keepdims 0/1; real workloads come from the example
models. Each template is also run with a few random configs of its space.
"""
import numpy as np
import pytest

from modelc.kernels import template, templates, testing  # noqa: F401  (registers templates)
from modelc.kernels.workload import Workload
from workloads import pool_wl, red_wl

TOL = 1e-5


def check(wl, name, cfg=None, seed=0):
    t = template.select(wl)
    assert t.name == name
    sp = t.space(wl)
    cfg = cfg if cfg is not None else t.default_config(wl, sp)
    assert sp.is_valid(cfg)
    got, want, _, _ = testing.run(wl, t, cfg, seed=seed)
    err = testing.max_rel_error(got, want)
    assert err <= TOL, f"{name} {cfg}: error {err:.2e}"
    return t, sp


POOLS = {
    "max_blocked": pool_wl("MaxPool", 1, 32, 15, 16, lin=(16, 0), lout=(16, 1)),
    "max_plain_ceil_asym": pool_wl("MaxPool", 2, 3, 13, 11, k=(3, 2), s=(2, 1), pads=(0, 1, 2, 0), ceil=1,
                                   epi=("relu",)),
    "max_halo_in_nan": pool_wl("MaxPool", 1, 16, 9, 9, k=(2, 2), s=(2, 2), pads=(1, 1, 1, 1), lin=(16, 2)),
    "avg_cip_ceil_asym": pool_wl("AveragePool", 2, 32, 9, 10, pads=(1, 0, 1, 2), ceil=1, cip=1, lin=(16, 1),
                                 epi=("add_channel",)),
    "avg_dilated_reblock": pool_wl("AveragePool", 1, 16, 9, 10, s=(1, 2), d=(2, 1), lin=(8, 2), lout=(16, 0)),
    "avg_plain_excl_pad": pool_wl("AveragePool", 1, 5, 8, 7, k=(3, 3), s=(1, 1), pads=(2, 1, 0, 1)),
    "gap_blocked": pool_wl("GlobalAveragePool", 1, 64, 7, 7, lin=(16, 1), lout=(16, 0), epi=("relu",)),
    "gmp_plain": pool_wl("GlobalMaxPool", 2, 24, 7, 5, epi=("half",)),
}


@pytest.mark.parametrize("case", sorted(POOLS))
def test_pool(case):
    wl = POOLS[case]
    if case == "max_halo_in_nan":
        # the input halo holds garbage: the kernel must bound its reads, not rely on zero pads
        t = template.select(wl)
        k = t.build(wl, t.default_config(wl, t.space(wl)))
        x = wl.random_inputs(0)
        args, outs = testing.bind(wl, k, x)
        from modelc.kernels import cache
        from modelc.kernels.layout import from_physical, to_physical
        phys = to_physical(x[0], wl.inputs[0].layout)
        phys[to_physical(np.ones_like(x[0]), wl.inputs[0].layout) == 0] = 1e30
        args[k.args.index("in0")][:] = phys
        cache.load(k.source)(*args)
        got = from_physical(outs[0], wl.outputs[0].shape, wl.outputs[0].layout)
        want = testing.reference_outputs(wl, x)
        assert testing.max_rel_error([got], want) <= TOL
        return
    check(wl, "pool")


def test_pool_random_configs():
    wl = POOLS["avg_cip_ceil_asym"]
    t = template.select(wl)
    sp = t.space(wl)
    rng = np.random.default_rng(1)
    picked = [i for i in rng.permutation(len(sp)) if sp.is_valid(sp.get(int(i)))][:2]
    for i in picked:
        check(wl, "pool", sp.get(int(i)))
    wl = POOLS["max_plain_ceil_asym"]
    sp = t.space(wl)
    check(wl, "pool", sp.get(int(rng.integers(len(sp)))))


def test_pool_does_not_match():
    assert not template.get("pool").matches(pool_wl("MaxPool", 1, 16, 8, 8, indices=True))


def test_real_pools():
    import modelc
    import models
    from modelc.passes import optimize
    from modelc.passes.layout import plan_layouts
    from modelc.extract import tasks_from_graph
    g = plan_layouts(optimize(modelc.from_onnx(models.cached_path("resnet18"), default_batch=1)))
    seen = set()
    for task in tasks_from_graph(g):
        wl = Workload(task.workload)
        if wl.anchor.op in ("MaxPool", "GlobalAveragePool"):
            check(wl, "pool")
            seen.add(wl.anchor.op)
    assert seen == {"MaxPool", "GlobalAveragePool"}


REDUCE = {
    "softmax_odd_row": (red_wl("LogSoftmax", (2, 5, 37)), "softmax"),
    "softmax_axis1_tail": (red_wl("Softmax", (2, 24, 5, 7), {"axis": 1}, epi=("relu",)), "softmax"),
    "logsoftmax_axis1": (red_wl("LogSoftmax", (3, 40, 6), {"axis": 1}), "softmax"),
    "softmax_epilogue_input": (red_wl("Softmax", (2, 3, 20), epi=(("add", (3, 1)),)), "softmax"),
    "layernorm_no_bias": (red_wl("LayerNormalization", (2, 6, 5, 7), {"axis": -2, "epsilon": 1e-3},
                                 scale=(5, 7), epi=(("add", (5, 7)),)), "layernorm"),
    "layernorm_bias_bcast": (red_wl("LayerNormalization", (3, 50), scale=(50,), bias=(1,)), "layernorm"),
    "mean_hw_keep": (red_wl("ReduceMean", (2, 24, 7, 7), axes=(2, 3)), "reduce"),
    "sum_axis1_drop": (red_wl("ReduceSum", (2, 24, 7, 9), {"keepdims": 0}, axes=(1,)), "reduce"),
    "max_split_axes": (red_wl("ReduceMax", (3, 4, 5, 6), axes=(0, 2)), "reduce"),
    "min_split_drop": (red_wl("ReduceMin", (3, 4, 5, 6), {"keepdims": 0}, axes=(1, -1), epi=("half",)),
                       "reduce"),
    "sumsquare_all": (red_wl("ReduceSumSquare", (3, 40, 50), {"keepdims": 0}), "reduce"),
    "l2_last": (red_wl("ReduceL2", (3, 40, 50), axes=(-1,), epi=(("add", (40, 1)),)), "reduce"),
    "sum_noop": (red_wl("ReduceSum", (3, 4, 5), {"noop_with_empty_axes": 1}), "reduce"),
    "l1_cols": (red_wl("ReduceL1", (3, 40, 70), axes=(1,)), "reduce"),
    "prod_last": (red_wl("ReduceProd", (3, 4, 6), {"keepdims": 0}, axes=(-1,)), "reduce"),
    "mean_big_f64_acc": (red_wl("ReduceMean", (2, 3000), axes=(1,)), "reduce"),
}


@pytest.mark.parametrize("case", sorted(REDUCE))
def test_reduce_family(case):
    wl, name = REDUCE[case]
    check(wl, name)


def test_real_transformer_and_random_configs():
    import models
    from modelc.extract import extract_tasks
    seen = set()
    rng = np.random.default_rng(2)
    for task in extract_tasks(models.cached_path("transformer")):
        wl = Workload(task.workload)
        if wl.anchor.op in ("Softmax", "LayerNormalization"):
            t, sp = check(wl, "softmax" if wl.anchor.op == "Softmax" else "layernorm")
            check(wl, t.name, sp.get(int(rng.integers(len(sp)))))
            seen.add(wl.anchor.op)
    assert seen == {"Softmax", "LayerNormalization"}
    wl, name = REDUCE["sum_axis1_drop"]
    sp = template.get(name).space(wl)
    check(wl, name, sp.get(int(rng.integers(len(sp)))))


def test_reduce_does_not_match():
    wl, _ = REDUCE["mean_hw_keep"]
    js = dict(wl.json)
    js["inputs"] = js["inputs"] + [{"shape": [2], "dtype": "int64", "const": False}]
    js["ops"] = [dict(js["ops"][0], args=["i0", "i1"])]
    assert not template.get("reduce").matches(Workload(js))      # axes not inlined
    x = red_wl("Softmax", (1, 32, 4, 4), {"axis": 1}).json
    x["inputs"][0]["layout"] = [16, 0]
    assert not template.get("softmax").matches(Workload(x))      # blocked input
