"""Dense and batch_matmul templates against the reference executor.

Hand-made workloads (the JSON `extract.workload_of` writes) cover ragged M and N tiles, no bias,
residual and scalar epilogues, 1-d operands, broadcast batch dims, a constant right operand and a
blocked input of 1x1 planes; the transformer's real tasks run too. Each case runs its default
config and, for most, a seeded random valid config; kernels compile in parallel up front.
"""
import random

import numpy as np
import pytest

from modelc import target
from modelc.kernels import cache, template, templates, testing  # noqa: F401  (registers the templates)
from modelc.kernels.testing import bind, reference_outputs
from modelc.kernels.workload import Workload
from workloads import dense_wl, matmul_wl, with_epilogue

TOL = 1e-5

HAND = {
    "dense_ragged_res_relu": (dense_wl((2, 5, 37), 23, bias=False, epi=("res", "Relu")), 1),
    "dense_1d_scalars": (dense_wl((7,), 40, epi=("Mul", "Add")), 0),
    "dense_blocked_1x1": (dense_wl((1, 16, 1, 1), 24, epi=("Gelu",), x_layout=[16, 0]), 0),
    "dense_classifier": (dense_wl((1, 512), 1000), 0),
    "matmul_broadcast_res": (matmul_wl((3, 1, 9, 20), (2, 20, 35), epi=("res",)), 1),
    "matmul_attention_div": (matmul_wl((1, 2, 24, 16), (1, 2, 16, 32), epi=("Div",)), 1),
    "matmul_1d_left": (matmul_wl((20,), (3, 20, 7)), 0),
    "matmul_1d_right": (matmul_wl((2, 11, 20), (20,)), 0),
    "matmul_const_b": (matmul_wl((13, 20), (20, 50), epi=("Relu",), b_const=True), 0),
    "matmul_scores_ragged_n": (matmul_wl((1, 8, 128, 16), (1, 8, 16, 37)), 1),
}


def _random_configs(sp, n, seed):
    rng = random.Random(seed)
    out = []
    for _ in range(2000):
        if len(out) == n:
            break
        c = sp.get(rng.randrange(len(sp)))
        if sp.is_valid(c) and c.values not in [o.values for o in out]:
            out.append(c)
    return out


def _cases(wl_json, n_random, seed):
    wl = Workload(wl_json)
    t = template.select(wl)
    sp = t.space(wl)
    return [(wl, t, c) for c in [t.default_config(wl, sp)] + _random_configs(sp, n_random, seed)]


@pytest.fixture(scope="module")
def transformer_tasks():
    import models
    from modelc.extract import extract_tasks
    return [t for t in extract_tasks(models.cached_path("transformer"))
            if t.template in ("dense", "batch_matmul")]


@pytest.fixture(scope="module")
def compiled(transformer_tasks):
    """Every (workload, template, config) the tests run, compiled in parallel once."""
    runs = {}
    for name, (wl, n_random) in HAND.items():
        runs[name] = _cases(wl, n_random, seed=len(name))
    for k, task in enumerate(transformer_tasks):
        runs[task.desc] = _cases(task.workload, 1 if k == 0 else 0, seed=k)
    cache.compile_all([t.build(wl, c).source for cs in runs.values() for wl, t, c in cs])
    return runs


@pytest.mark.parametrize("name", list(HAND))
def test_hand_made_workloads(compiled, name):
    for wl, t, cfg in compiled[name]:
        assert t.name == ("dense" if wl.anchor.op == "Dense" else "batch_matmul")
        assert t.space(wl).is_valid(cfg)
        got, want, _, _ = testing.run(wl, t, cfg, seed=3)
        assert got[0].shape == want[0].shape
        assert testing.max_rel_error(got, want) <= TOL, (name, str(cfg))


def test_a_packed_panel_of_b_is_shared_by_row_tiles(compiled):
    """Attention scores over a sequence that is no multiple of a vector (ViT's 197) pack their
    columns of B per work item; the default shares each panel among several row tiles."""
    wl, t, cfg = compiled["matmul_scores_ragged_n"][0]
    assert cfg["pack_b"] and cfg["m_group"] > 1, str(cfg)


@pytest.mark.parametrize("wl_json, values", [
    # 13 row tiles of 10 in groups of 4 (the last of one), each sharing its packed panel of 37 columns
    (matmul_wl((1, 2, 128, 16), (1, 2, 16, 37)), {"tile_m": 10, "m_group": 4, "pack_b": True}),
    # 9 row tiles of 6 in groups of 8 and 1, their sums kept across two k blocks of 128; 12 of 4 in 8 and 4
    (dense_wl((50, 256), 40, epi=("res",)), {"tile_m": 6, "m_group": 8, "k_block": 128}),
    (dense_wl((48, 256), 40), {"tile_m": 4, "m_group": 8, "k_block": 256, "order": ["m", "n"]}),
])
def test_a_short_last_group_of_row_tiles(wl_json, values):
    """m_group need not divide the row tiles (ViT's 197 rows make 20 tiles of 10, 33 of 6): the last
    group is short, and every element is stored once, by one item."""
    wl = Workload(wl_json)
    t = template.select(wl)
    sp = t.space(wl)
    cfg = sp.from_values(dict(t.default_config(wl, sp).values, **values))
    assert sp.is_valid(cfg), str(cfg)
    got, want, fn, args = testing.run(wl, t, cfg, seed=2)
    assert testing.max_rel_error(got, want) <= TOL, str(cfg)
    assert (testing.stores_per_output(fn, args) == 1).all()


def test_transformer_tasks(compiled, transformer_tasks):
    assert {t.template for t in transformer_tasks} == {"dense", "batch_matmul"}
    for task in transformer_tasks:
        for wl, t, cfg in compiled[task.desc]:
            assert t.name == task.template
            got, want, _, _ = testing.run(wl, t, cfg)
            assert testing.max_rel_error(got, want) <= TOL, (task.desc, str(cfg))


def test_stores_stay_inside_the_output(compiled):
    """Ragged N (padded weights) and a shifted last M tile write exactly the output's elements."""
    for name in ("dense_ragged_res_relu", "matmul_broadcast_res"):
        for wl, t, cfg in compiled[name]:
            k = t.build(wl, cfg)
            inputs = wl.random_inputs(1)
            args, outs = bind(wl, k, inputs)
            size = outs[0].size
            big = np.full(size + 64, 7.0, np.float32)
            args[k.args.index("out0")] = big[:size]
            cache.load(k.source)(*args)
            assert np.all(big[size:] == 7.0)
            want = reference_outputs(wl, inputs)[0]
            assert testing.max_rel_error([big[:size].reshape(want.shape)], [want]) <= TOL


def test_spaces_defaults_and_sources(transformer_tasks):
    """Defaults are valid and pick register tiles of at least half the registers in accumulators
    (16 vectors on AVX-512, 8 on AVX2); random configs generate."""
    tg = target.current()
    for task in transformer_tasks:
        wl = Workload(task.workload)
        t = template.select(wl)
        sp = t.space(wl)
        d = t.default_config(wl, sp)
        assert sp.is_valid(d)
        lanes = tg.lanes(4)
        assert d["tile_m"] * (d["tile_n"] // lanes) >= tg.vector_registers // 2 and d["tile_n"] % lanes == 0
        for c in _random_configs(sp, 20, seed=7):
            src = t.build(wl, c).source
            compile(src, "kernel", "exec")
            assert c.describe()
    wl = Workload(dense_wl((1, 512), 1000))
    t = template.select(wl)
    d = t.default_config(wl, t.space(wl))
    assert d["tile_m"] == 1 and d["tile_n"] >= 3 * tg.lanes(4)      # memory-bound: wide, few tiles


@pytest.mark.parametrize("wl_json", [
    dense_wl((1, 16, 4, 4), 8, x_layout=[16, 0]),                        # blocked, planes not 1x1
    dense_wl((1, 16, 1, 1), 8, x_layout=[16, 1]),                        # blocked with a halo
    dict(dense_wl((4, 8), 8), inputs=[{"shape": [4, 8], "dtype": "float32", "const": False},
                                      {"shape": [8, 8], "dtype": "float32", "const": False},
                                      {"shape": [8], "dtype": "float32", "const": True}]),
    with_epilogue([{"op": "Dense", "attrs": {}, "args": ["i0", "i1"]}],
                  [{"shape": [4, 8], "dtype": "float32", "const": False},
                   {"shape": [8, 6], "dtype": "float32", "const": True}], {}, (4, 6), ("Softmax",)),
    with_epilogue([{"op": "MatMul", "attrs": {}, "args": ["i0", "i1"]}],
                  [{"shape": [4, 8], "dtype": "float32", "const": False},
                   {"shape": [8, 6], "dtype": "float32", "const": False},
                   {"shape": [3, 4, 6], "dtype": "float32", "const": False}], {}, (4, 6), ())
    | {"ops": [{"op": "MatMul", "attrs": {}, "args": ["i0", "i1"]},
               {"op": "Add", "attrs": {}, "args": ["v0", "i2"]}],
       "outputs": [{"shape": [3, 4, 6], "dtype": "float32", "value": "v1"}]},   # output grows
    matmul_wl((4, 8), (8, 6)) | {"inputs": [{"shape": [4, 8], "dtype": "int64", "const": False},
                                            {"shape": [8, 6], "dtype": "int64", "const": False}],
                                 "outputs": [{"shape": [4, 6], "dtype": "int64", "value": "v0"}]},
])
def test_rejects(wl_json):
    from modelc.kernels import dense, matmul
    wl = Workload(wl_json)
    assert not dense.Dense().matches(wl) and not matmul.BatchMatMul().matches(wl)


@pytest.mark.skipif(__import__("platform").machine().lower() not in ("x86_64", "amd64"),
                    reason="reads x86 assembly")
def test_gelu_epilogue_is_vectorised():
    """The exact GELU's erf is a rational polynomial that numba inlines: left to LLVM's inliner it
    stayed one float at a time (vdivss, vmulss) and the transformer's GELU dense ran 0.33 -> 0.49 ms."""
    import uuid
    wl = Workload(dense_wl((64, 128), 256, epi=("Gelu",)))
    tpl = template.select(wl)
    cfg = tpl.default_config(wl, tpl.space(wl))
    asm = cache.load(tpl.build(wl, cfg).source + f"# {uuid.uuid4().hex}\n").cfunc._library.get_asm_str()
    assert "vdivps" in asm and "vdivss" not in asm
    got, want, _, _ = testing.run(wl, tpl, cfg)
    assert testing.max_rel_error(got, want) <= 1e-5


@pytest.mark.parametrize("name", ["dense_ragged_res_relu", "matmul_broadcast_res", "matmul_const_b",
                                  "matmul_scores_ragged_n"])
def test_broadcasts_loaded_row_by_row_give_the_same_sums(name, monkeypatch):
    """Tiles loading each row's broadcast of A by its FMAs (where hoisting them all would spill) sum
    in the usual order: under the default and sampled configs (k unrolled, flat indexing, packed
    panels, shifted rows, ragged columns) outputs bit for bit those of the usual source."""
    from modelc.target import Target
    wl_json, _ = HAND[name]
    cases = _cases(wl_json, 3, seed=11)
    wl, t, cfg = cases[0]
    split = t.space(wl).from_values(dict(cfg.values, k_unroll=2, k_split=2, m_group=1))   # two sets of sums
    for wl, t, cfg in cases + [(wl, t, split)] * t.space(wl).is_valid(split):
        monkeypatch.setattr(Target, "broadcasts_by_pixel", lambda *a: False)
        usual, src = testing.run(wl, t, cfg, seed=3)[0], t.build(wl, cfg).source
        monkeypatch.setattr(Target, "broadcasts_by_pixel", lambda *a: True)
        by_row = t.build(wl, cfg).source
        assert " x0 = " in src and " x0 = " not in by_row and "xv = " in by_row, str(cfg)
        got, want, _, _ = testing.run(wl, t, cfg, seed=3)
        assert testing.max_rel_error(got, want) <= TOL, (name, str(cfg))
        assert np.array_equal(got[0], usual[0]), (name, str(cfg))
