"""Search tuners and the XGBoost cost model on synthetic tasks: real ConfigSpaces, a made-up cost
function of the knobs with one clear optimum plus noise, fixed seeds, no kernel compiles."""
import math
from types import SimpleNamespace

import numpy as np
import pytest

from modelc.errors import ModelcError
from modelc.extract import Task
from modelc.kernels import template as registry
from modelc.kernels import templates  # noqa: F401  (registers the templates)
from modelc.kernels.space import ConfigSpace
from modelc.kernels.workload import Workload
from modelc.tune.cost_model import XGBCostModel
from modelc.tune.features import KNOB_WIDTH, MAX_KNOBS, N_FEATURES, WL_LEN, config_features
from modelc.tune.index_based_tuner import GridSearchTuner, RandomTuner
from modelc.tune.tuning import TUNERS
from modelc.tune.xgb_tuner import XGBTuner
from workloads import conv2d_wl

SEEDS = (0, 1, 2)


# ---- a synthetic task -------------------------------------------------------------------------

def conv_workload(c=64, k=64, hw=56, stride=1):
    """A 3x3 conv2d + bias + relu workload in the blocked layout, as layout planning leaves it."""
    return conv2d_wl(C=c, H=hw, W=hw, K=k, k=3, s=stride, p=1, hin=1, hout=1).json


def synthetic_space(large=True):
    sp = ConfigSpace()
    sp.define_knob("tile_x", [1, 2, 3, 4, 6, 8, 12, 16, 24, 32])
    sp.define_knob("tile_y", [1, 2, 4, 8, 16, 32])
    if large:                                  # 60480 configs: searched by sampling, not enumerated
        sp.define_split("sp", 64, 3)
        sp.define_reorder("order", ["a", "b", "c"])
        sp.define_knob("vec", ["a", "b", "c"])
    sp.define_annotate("unroll", [False, True])
    sp.constraint = lambda cfg: cfg["tile_x"] * cfg["tile_y"] <= 64
    return sp


def synthetic_task(key="A", large=True, c=64):
    task = Task(key, "synthetic", "synthetic", conv_workload(c, c), flops=2e8 * c / 64)
    task.tpl, task.space = SimpleNamespace(name="synthetic"), synthetic_space(large)   # not registered
    return task


def latency(values, rng, shift=0.0):
    """1 ms at the optimum (tile 8x4, split [.,4,4], order b>a>c, vec b, unrolled), 3% noise."""
    x = 0.3 * (math.log2(values["tile_x"]) - 3 - shift) ** 2 + 0.3 * (math.log2(values["tile_y"]) - 2) ** 2
    x += 0.4 * (not values["unroll"])
    if "sp" in values:
        s = values["sp"]
        x += 0.2 * (math.log2(s[2]) - 2) ** 2 + 0.1 * (math.log2(s[1]) - 2) ** 2
        x += 0.3 * (values["order"] != ["b", "a", "c"]) + 0.2 * (values["vec"] != "b")
    return 1e-3 * (1 + x) * math.exp(0.03 * rng.standard_normal())


def tune(tuner, trials, batch=8, cost=latency, seed=0):
    """Run the measure loop; returns the latencies in measurement order."""
    rng = np.random.default_rng(1000 + seed)
    costs, seen = [], set()
    while len(costs) < trials and tuner.has_next():
        cfgs = tuner.next_batch(min(batch, trials - len(costs)))
        assert cfgs, "has_next() promised a config"
        for c in cfgs:
            assert c.index not in seen, "a config was proposed twice"
            assert tuner.space.is_valid(c), "an invalid config was proposed"
            seen.add(c.index)
        cs = [cost(c.values, rng) for c in cfgs]
        tuner.update(cfgs, cs)
        costs += cs
    return costs


def history(n=200, seed=99, shift=0.3):
    """Random measurements of a similar task (other shape, slightly moved optimum)."""
    other = synthetic_task("B", c=128)
    rng = np.random.default_rng(seed)
    out = []
    for i in rng.choice(len(other.space), n, replace=False):
        cfg = other.space.get(int(i))
        if other.space.is_valid(cfg):
            out.append((other, cfg.values, latency(cfg.values, rng, shift)))
    return out


# ---- features -----------------------------------------------------------------------------------

def test_features_of_a_real_conv2d_space():
    wl = Workload(conv_workload())
    tpl = registry.select(wl)
    assert tpl.name == "conv2d"
    space = tpl.space(wl)
    rows = [config_features(tpl, wl, space.get(i), flops=2.3e8) for i in range(0, len(space), 7)]
    X = np.stack(rows)
    assert X.shape[1] == N_FEATURES and np.isfinite(X).all()
    assert len({r.tobytes() for r in rows}) == len(rows)        # every config looks different
    # the same knob value means the same number in another workload whose candidates differ
    wl7 = Workload(conv_workload(512, 512, 7))
    sp7 = tpl.space(wl7)
    vals = {"tile_ow": 7, "tile_oc_blocks": 2, "tile_oh": 1, "reduction_order": ["c", "kh", "kw"], "unroll_kw": True}
    a = config_features(tpl, wl, space.from_values(vals))
    b = config_features(tpl, wl7, sp7.from_values(vals))
    assert len(space.knobs[0].values) != len(sp7.knobs[0].values)
    knobs = N_FEATURES - MAX_KNOBS * KNOB_WIDTH
    np.testing.assert_array_equal(a[knobs:], b[knobs:])
    assert a[knobs + 1] == math.log2(8)                            # tile_ow 7 -> log2(7 + 1)
    assert not np.array_equal(a[:WL_LEN], b[:WL_LEN])


def test_template_feature_hook():
    task = synthetic_task(large=False)
    hooked = SimpleNamespace(name="synthetic", features=lambda wl, cfg: {"zz": 5.0, "aa": cfg["tile_x"]})
    cfg = task.space.from_values({"tile_x": 3, "tile_y": 2, "unroll": True})
    plain, hook = config_features(task.template, task.wl, cfg), config_features(hooked, task.wl, cfg)
    assert set(hook[~np.isclose(plain, hook)]) >= {3.0, 5.0}


# ---- cost model -----------------------------------------------------------------------------------

@pytest.mark.parametrize("loss", ["rank", "reg"])
def test_cost_model_orders_configs(loss):
    task = synthetic_task()
    rng = np.random.default_rng(0)
    idx = [int(i) for i in rng.choice(len(task.space), 600, replace=False)]
    X = np.stack([config_features(task.template, task.wl, task.space.get(i)) for i in idx])
    y = np.array([1.0 / latency(task.space.get(i).values, rng) for i in idx])
    y[:20] = 0.0                                                    # failed measurements
    model = XGBCostModel(loss=loss, seed=0)
    model.fit(X[:400], y[:400], groups=np.arange(400) % 2)
    p = model.predict(X[400:])
    rank = lambda v: np.argsort(np.argsort(v))                    # noqa: E731
    assert np.corrcoef(rank(p), rank(y[400:]))[0, 1] > 0.7
    with pytest.raises(ModelcError):
        XGBCostModel(loss="nope")


# ---- tuner bookkeeping ------------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(TUNERS))
def test_exhausts_a_small_space_without_repeats(name):
    task = synthetic_task(large=False)
    valid = {i for i in range(len(task.space)) if task.space.is_valid(task.space.get(i))}
    assert len(valid) < len(task.space)                            # the constraint bites
    tuner = TUNERS[name](task, seed=0)
    costs = tune(tuner, 10 ** 6, batch=7)
    assert len(costs) == len(valid)
    assert set(tuner.measured) == valid
    assert not tuner.has_next() and tuner.next_batch(4) == []


def test_grid_covers_the_space_in_order():
    task = synthetic_task(large=False)
    tuner = GridSearchTuner(task)
    order = []
    while tuner.has_next():
        cfgs = tuner.next_batch(5)
        order += [c.index for c in cfgs]
        tuner.update(cfgs, [1.0] * len(cfgs))
    assert order == [i for i in range(len(task.space)) if task.space.is_valid(task.space.get(i))]


@pytest.mark.parametrize("name", sorted(TUNERS))
def test_large_space_is_sampled_and_pending_configs_are_not_reproposed(name):
    task = synthetic_task()
    tuner = TUNERS[name](task, seed=1)
    a, b = tuner.next_batch(16), tuner.next_batch(16)
    assert len(a) == len(b) == 16
    assert not {c.index for c in a} & {c.index for c in b}
    assert all(task.space.is_valid(c) for c in a + b)
    assert tuner._valid is None                                    # 60480 configs: never enumerated
    tuner.update(a + b, [1e-3] * 16 + [math.inf] * 16)             # errors are costs of inf
    assert tuner.best_cost == 1e-3 and len(tuner.measured) == 32 and not tuner.pending


def test_own_history_counts_as_measured():
    task = synthetic_task(large=False)
    cfgs = [task.space.get(i) for i in range(len(task.space)) if task.space.is_valid(task.space.get(i))]
    records = [(task, c.values, 1e-3 * (1 + k)) for k, c in enumerate(cfgs[:-3])]
    records.append((task, {"tile_x": 5, "tile_y": 1, "unroll": True}, 1e-4))   # not a candidate: skipped
    tuner = RandomTuner(task)
    assert tuner.load_history(records) == len(cfgs) - 3
    assert tuner.best_cost == 1e-3 and tuner.best_config.index == cfgs[0].index
    rest = tuner.next_batch(10)
    assert sorted(c.index for c in rest) == sorted(c.index for c in cfgs[-3:])
    assert not tuner.has_next()


# ---- search quality ---------------------------------------------------------------------------------

def test_ga_and_xgb_beat_random():
    ga, rand = [], []
    for seed in SEEDS:
        rnd = tune(RandomTuner(synthetic_task(), seed=seed), 200, seed=seed)
        rand.append(min(rnd))
        ga.append(min(tune(TUNERS["ga"](synthetic_task(), seed=seed), 200, seed=seed)))
        # xgb matches random's best of 200 within 100 trials
        xgb = tune(XGBTuner(synthetic_task(), seed=seed), 100, seed=seed)
        assert min(xgb) <= min(rnd), f"seed {seed}: xgb {min(xgb):.3g} vs random@200 {min(rnd):.3g}"
    assert np.mean(ga) < 0.9 * np.mean(rand)


def test_warm_start_from_a_similar_task_speeds_xgb_up():
    hist = history()
    cold, warm = [], []
    for seed in SEEDS:
        cold.append(min(tune(XGBTuner(synthetic_task(), seed=seed), 16, seed=seed)))
        tuner = XGBTuner(synthetic_task(), seed=seed)
        assert tuner.load_history(hist) == len(hist)
        warm.append(min(tune(tuner, 16, seed=seed)))
    assert np.mean(warm) < 0.8 * np.mean(cold)


def test_xgb_on_a_real_conv2d_space_warm_started_from_log_like_records():
    """Records as the log gives them: task descriptions with a template name and workload JSON."""
    def task_of(c, hw, stride=1):
        wl = conv_workload(c, c, hw, stride)
        w = Workload(wl)
        tpl = registry.select(w)
        return Task(f"conv{c}x{hw}", "", tpl.name, wl, flops=2 * 9 * c * c * hw * hw / stride ** 2)

    def cost(values, rng):          # the best tiles use ~16 accumulators
        vecs = values["tile_ow"] * values["tile_oc_blocks"] * values["tile_oh"]
        return 1e-3 * (1 + abs(math.log2(vecs / 16)) + 0.2 * values["unroll_kw"]) * \
            math.exp(0.02 * rng.standard_normal())

    other, task = task_of(64, 56), task_of(128, 28)
    rng = np.random.default_rng(5)
    records = [(Task(other.key, "", "conv2d", other.workload, flops=other.flops),
                other.space.get(i).values, cost(other.space.get(i).values, rng))
               for i in range(0, len(other.space), 3) if other.space.is_valid(other.space.get(i))]
    records.append((Task("x", "", "dense", {}), {}, 1.0))   # other template
    tuner = XGBTuner(task, seed=0)
    assert tuner.load_history(records) == len(records) - 1
    costs = tune(tuner, 8, cost=cost)
    best = min(cost(task.space.get(i).values, np.random.default_rng(0))
               for i in tuner.valid_indices().tolist())
    assert min(costs) < 1.1 * best


def test_preferred_configs_come_first_and_only_once():
    task = synthetic_task()
    tuner = RandomTuner(task, seed=3)
    default = task.space.get(task.space.valid_indices()[7])
    tuner.prefer([default])
    first = tuner.next_batch(4)
    assert first[0].index == default.index
    tuner.update(first, [1e-3] * len(first))
    later = [c.index for _ in range(5) for c in tuner.next_batch(4)]
    assert default.index not in later


# ---- Ansor's evolutionary search ------------------------------------------------------------------

def evolutionary_task(key="A"):
    task = synthetic_task(key)
    task.tpl = SimpleNamespace(name="synthetic", search="evolutionary")
    return task


def test_mutation_rules_group_the_knobs_and_change_one_knob():
    tuner = XGBTuner(evolutionary_task(), seed=0)
    kinds = tuner.mutation_kinds
    names = {k: [tuner.space.knobs[j].name for j in js] for k, js in kinds.items()}
    assert names == {"tile_size": ["tile_x", "tile_y"], "parallel": ["order"], "unroll": ["unroll"],
                     "compute_location": ["sp", "vec"]}
    pop = np.array([tuner.digits(i) for i in tuner._random_unvisited(200)])
    kids = tuner.mutate(pop)
    changed = (kids != pop).sum(axis=1)
    assert changed.max() == 1 and changed.mean() > 0.6            # one knob each (a +-1 step may clip)
    assert all(0 <= kids[:, j].min() and kids[:, j].max() < r for j, r in enumerate(tuner.radix))
    for kind, js in kinds.items():                                 # every rule is applied
        assert (kids[:, js] != pop[:, js]).any(), kind


def test_crossover_takes_each_rule_s_knobs_from_one_parent():
    tuner = XGBTuner(evolutionary_task(), seed=0)
    a = np.array([tuner.digits(i) for i in tuner._random_unvisited(100)])
    b = np.array([tuner.digits(i) for i in tuner._random_unvisited(100)])
    kids = tuner.crossover(a, b)
    for js in tuner.mutation_kinds.values():
        from_a = (kids[:, js] == a[:, js]).all(axis=1)
        from_b = (kids[:, js] == b[:, js]).all(axis=1)
        assert (from_a | from_b).all()
    assert (kids != a).any() and (kids != b).any()


def test_evolutionary_search_plans_valid_unvisited_configs_and_beats_random():
    for seed in SEEDS:
        tuner = XGBTuner(evolutionary_task(), seed=seed)
        evo = tune(tuner, 100, seed=seed)
        assert tuner.n_train > 0
        rnd = tune(RandomTuner(synthetic_task(), seed=seed), 200, seed=seed)
        assert min(evo) <= min(rnd), f"seed {seed}: evolutionary {min(evo):.3g} vs random@200 {min(rnd):.3g}"
        plan = tuner._plan_evolutionary()
        assert plan and len(set(plan)) == len(plan)
        assert all(tuner.is_valid(i) and not tuner.visited(i) for i in plan)


def test_te_spaces_are_searched_by_evolution():
    from modelc.kernels.template import get
    assert get("te").search == "evolutionary" and get("te_conv2d").search == "evolutionary"
    assert getattr(get("conv2d"), "search", "sa") == "sa"
