"""Tuning on a Ray cluster: a real two-node cluster on 127.0.0.1 (two raylets, one CPU each), a tiny
model, a handful of trials; node selection and the driver's checks on their own."""
import os
import socket
import threading
import time

# Ray turns 127.0.0.1 into the machine's outward address unless told this is a one-machine cluster;
# read when ray is imported, so it comes first. Tests never use any address but 127.0.0.1.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import pytest  # noqa: E402

import modelc  # noqa: E402
from modelc.errors import ModelcError  # noqa: E402
from modelc.tune import cluster_nodes as CN  # noqa: E402
from modelc.tune import records as R  # noqa: E402
from modelc.tune import tuning  # noqa: E402
from modelc.tune.cluster import ClusterMeasurer  # noqa: E402
from modelc.tune.cluster_node import PROTOCOL, numba_version  # noqa: E402
from modelc.tune.measure import MeasureOptions  # noqa: E402
from modelc.version import VERSION  # noqa: E402
from test_tuning import _tiny  # noqa: E402

OPTS = MeasureOptions(number=2, repeat=2, min_repeat_ms=1, n_parallel=1)


# ---- selection and checks, without Ray --------------------------------------------------------------

def _info(**target):
    t = dict(R.current_target(), **target)
    return {"protocol": PROTOCOL, "modelc": VERSION, "numba": numba_version(), "target": t}


def test_a_node_is_left_out_with_the_reason():
    own = R.current_target()
    assert CN.exclusion(_info(), own) == ""
    assert "another CPU model: 'Intel(R) Xeon(R) Platinum 8480+'" in CN.exclusion(
        _info(cpu="Intel(R) Xeon(R) Platinum 8480+"), own)
    assert "another ISA" in CN.exclusion(_info(isa=own["isa"][:-1]), own)
    assert "measures with 64 threads" in CN.exclusion(_info(threads=64), own)
    assert "modelc '0.0.9', the driver's is" in CN.exclusion(dict(_info(), modelc="0.0.9"), own)
    assert "numba '0.1'" in CN.exclusion(dict(_info(), numba="0.1"), own)
    node = CN.Node("ab" * 28, "127.0.0.1", 1, {CN.LABEL: "intel-xeon"})
    assert "labelled modelc-cpu=intel-xeon" in CN.pre_exclusion(node, own["cpu"])
    node.labels = {CN.LABEL: CN.cpu_label(own["cpu"])}
    assert CN.pre_exclusion(node, own["cpu"]) == ""
    assert "no CPU" in CN.pre_exclusion(CN.Node("cd" * 28, "127.0.0.1", 0), own["cpu"])


def test_another_target_takes_the_isa_and_threads_most_of_its_nodes_have():
    own = R.current_target()
    xeon = [_info(cpu="Xeon", isa=["avx2"], threads=t)["target"] for t in (8, 4, 8)]
    infos = [{"target": t} for t in xeon] + [{"target": own}]
    assert CN.choose_target(infos, own, None) == own
    assert CN.choose_target(infos, own, "Xeon")["threads"] == 8


def test_cpu_label_is_a_ray_label_value():
    assert CN.cpu_label("AMD EPYC 9R14 96-Core Processor") == "amd-epyc-9r14-96-core-processor"
    assert CN.cpu_label("Intel(R) Xeon(R) Platinum 8480+") == "intel-r-xeon-r-platinum-8480"
    assert len(CN.cpu_label("x" * 200)) == 63


def test_an_unreachable_address_is_a_clear_error_at_once():
    pytest.importorskip("ray")
    with socket.socket() as s:             # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t0 = time.time()
    with pytest.raises(ModelcError, match=f"cannot reach the Ray cluster at 127.0.0.1:{port}"):
        modelc.tune("unused.onnx", n_trials=1, log="unused.jsonl", cluster=f"127.0.0.1:{port}", tasks=[], verbose=0)
    assert time.time() - t0 < 15
    with pytest.raises(ModelcError, match="not HOST:PORT"):
        modelc.tune("unused.onnx", n_trials=1, log="unused.jsonl", cluster="127.0.0.1", tasks=[], verbose=0)


# ---- a real cluster ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def cluster():
    pytest.importorskip("ray")
    import pathlib
    import shutil
    import tempfile

    from ray.cluster_utils import Cluster
    # a short path: Ray's sockets live under it and a socket's path may not pass 107 bytes
    # (pytest-xdist's tmp_path adds a worker's folder, and the test failed on that)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="ray"))
    (tmp / "ray").mkdir()
    old = os.environ.get("RAY_TMPDIR")
    os.environ["RAY_TMPDIR"] = str(tmp)    # the cluster's files, and the address "auto" finds, stay here
    c = Cluster(initialize_head=True, head_node_args=dict(node_ip_address="127.0.0.1", num_cpus=1,
                                                          include_dashboard=False))
    c.add_node(node_ip_address="127.0.0.1", num_cpus=1)
    try:
        yield c
    finally:
        c.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)
        if old is None:
            os.environ.pop("RAY_TMPDIR", None)
        else:
            os.environ["RAY_TMPDIR"] = old


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("model") / "tiny.onnx")
    _tiny(path)
    return path


def _measurers(monkeypatch):
    """The ClusterMeasurer each tune() makes, to look at its nodes."""
    made = []
    real = tuning.cluster_measurer

    def spy(*a, **k):
        made.append(real(*a, **k))
        return made[-1]
    monkeypatch.setattr(tuning, "cluster_measurer", spy)
    return made


def test_a_tune_over_two_nodes_writes_the_records_of_a_local_tune_and_resumes(cluster, model, tmp_path,
                                                                              monkeypatch, caplog):
    caplog.set_level("INFO", logger="modelc")
    made = _measurers(monkeypatch)
    log = str(tmp_path / "tiny.jsonl")
    # 5 tasks (two convs: direct, te, and Winograd for the stride-1 one): a warm-up trial each, then
    # rounds of 2 (a round is at most budget / tasks) that the two nodes share
    modelc.tune(model, n_trials=10, log=log, trials_per_round=3, measure_options=OPTS, verbose=0,
                cluster=cluster.address)
    recs = R.load_records(log, warn=False)
    assert len(recs) == 10
    assert all(r.error == R.NO_ERROR for r in recs), [r.error_msg for r in recs if r.error]
    assert all(r.target == R.current_target() and r.version == VERSION and r.workload for r in recs)
    stats = made[0].stats()
    used = [n for n in stats["nodes"].values() if n["trials"]]
    assert len(used) == 2 and sum(n["trials"] for n in used) == 10, stats
    assert "using     127.0.0.1" in caplog.text and "measuring for " + R.current_target()["cpu"] in caplog.text
    # resumed ("auto" finds the cluster as `ray start` left it): the budget counts the first run's trials
    modelc.tune(model, n_trials=13, log=log, trials_per_round=3, measure_options=OPTS, verbose=0, cluster="auto")
    after = R.load_records(log, warn=False)
    assert after[:10] == recs and len(after) == 13
    pairs = [(r.key, r.template, repr(sorted(r.config.items()))) for r in after]
    assert max(pairs.count(p) for p in pairs) <= 2          # nothing measured again but rechecks


def test_a_killed_actor_loses_no_record_and_the_other_node_completes_the_budget(cluster, model, tmp_path,
                                                                                monkeypatch, caplog):
    import ray
    made = _measurers(monkeypatch)
    log = str(tmp_path / "killed.jsonl")
    killed = []

    def kill_one_mid_round():
        deadline = time.time() + 300
        while time.time() < deadline:
            if made and os.path.exists(log) and sum(1 for _ in open(log)) >= 2:
                victim = made[0].active[-1]
                killed.append(victim.id)
                ray.kill(victim.actor)
                return
            time.sleep(0.05)
    th = threading.Thread(target=kill_one_mid_round, daemon=True)
    th.start()
    modelc.tune(model, n_trials=10, log=log, trials_per_round=4, measure_options=OPTS, verbose=0,
                cluster=cluster.address)
    th.join(5)
    recs = R.load_records(log, warn=False)
    # the budget counts the killed node's candidates in flight (at most a round) as spent
    assert killed and 10 - 4 <= len(recs) <= 10
    assert all(r.error == R.NO_ERROR for r in recs), [r.error_msg for r in recs if r.error]
    nodes = made[0].stats()["nodes"]
    assert not nodes[killed[0]]["active"] and "candidate(s) in flight go to the others" in nodes[killed[0]]["why_not"]
    assert sum(n["trials"] for n in nodes.values()) == len(recs)


def test_a_node_of_another_cpu_label_or_version_is_left_out(cluster, monkeypatch, caplog):
    caplog.set_level("INFO", logger="modelc")
    node = cluster.add_node(node_ip_address="127.0.0.1", num_cpus=1, labels={CN.LABEL: "intel-r-xeon-r-platinum"})
    try:
        m = ClusterMeasurer(cluster.address, OPTS)
        try:
            assert len(m.active) == 2
            assert "labelled modelc-cpu=intel-r-xeon-r-platinum: another CPU than the target" in caplog.text
        finally:
            m.close()
        monkeypatch.setattr(CN, "VERSION", "0.0.9")            # the driver's modelc is another now
        with pytest.raises(ModelcError, match=r"no node .* can measure .*modelc '0\.1\.0', the driver's is '0\.0\.9'"):
            ClusterMeasurer(cluster.address, OPTS)
        monkeypatch.undo()
        with pytest.raises(ModelcError, match=r"no node .* can measure for Intel.*another CPU"):
            ClusterMeasurer(cluster.address, OPTS, target_cpu="Intel(R) Xeon(R) Platinum 8480+")
    finally:
        cluster.remove_node(node)


def test_a_node_that_compiles_for_another_isa_is_left_out(cluster, monkeypatch, caplog):
    if "avx512f" not in R.current_target()["isa"]:
        pytest.skip("the node's Haswell ISA differs from this machine's only where it has AVX-512")
    caplog.set_level("INFO", logger="modelc")
    # the node's workers inherit its environment: numba compiles for a Haswell there (AVX2, no AVX-512)
    monkeypatch.setenv("NUMBA_CPU_NAME", "haswell")
    monkeypatch.setenv("NUMBA_CPU_FEATURES", "+avx,+avx2,+fma,+sse4.1,+sse4.2,-avx512f")
    node = cluster.add_node(node_ip_address="127.0.0.1", num_cpus=1)
    monkeypatch.undo()
    try:
        m = ClusterMeasurer(cluster.address, OPTS)
        try:
            assert len(m.active) == 2
            # (the features it lacks, sorted: an AMX host's list starts with -amx-bf16)
            left_out = caplog.text.split("another ISA than the target's (", 1)[-1]
            assert "another ISA" in caplog.text and " -avx512f " in f" {left_out.split(')')[0]} ", caplog.text
        finally:
            m.close()
    finally:
        cluster.remove_node(node)


def test_a_node_that_joins_later_is_picked_up_between_rounds(cluster, model):
    task = tuning.tuning_tasks(model)[0]
    cfg = task.tpl.default_config(task.wl, task.space)
    m = ClusterMeasurer(cluster.address, OPTS, rescan_s=0)
    node = None
    try:
        assert len(m.active) == 2
        node = cluster.add_node(node_ip_address="127.0.0.1", num_cpus=1)
        deadline = time.time() + 120
        while len(m.active) < 3 and time.time() < deadline:
            recs = m.measure(task, [cfg, cfg])
            assert [r.error for r in recs] == [R.NO_ERROR] * 2, [r.error_msg for r in recs]
        assert len(m.active) == 3
        assert len(m.measure(task, [cfg] * 3)) == 3
    finally:
        m.close()
        if node is not None:
            cluster.remove_node(node)


def test_the_command_line_prints_the_nodes_it_uses(cluster, model, tmp_path, capsys):
    from modelc import cli
    log = str(tmp_path / "cli.jsonl")
    assert cli.main(["tune", model, "--trials", "2", "--trials-per-round", "2", "--log", log, "--number", "2",
                     "--repeat", "2", "--min-repeat-ms", "1", "--cluster", cluster.address]) == 0
    err = capsys.readouterr().err
    assert err.count("  using     127.0.0.1 (node ") == 2, err
    assert "threads per measurement" in err and len(R.load_records(log, warn=False)) == 2
    assert cli.main(["tune", model, "--trials", "2", "--log", log, "--target", "Some CPU"]) == 2
    assert "needs a cluster" in capsys.readouterr().err


def test_disagreeing_timings_are_reported(caplog):
    m = object.__new__(ClusterMeasurer)
    a, b = CN.Node("a" * 56, "127.0.0.1", 1), CN.Node("b" * 56, "127.0.0.1", 1)
    m.nodes, m.seen, m.disagreements, m.noise = {a.id: a, b.id: b}, {}, [], 1.5

    class T:
        key, template, desc = "k", "conv2d", "conv2d 1x16x28x28"
    rec = R.Record("k", "", "conv2d", {"tile": 4}, [1e-3])
    m._compare(T, rec, a)
    m._compare(T, R.Record("k", "", "conv2d", {"tile": 4}, [1.2e-3]), b)      # within noise
    assert not m.disagreements
    m._compare(T, R.Record("k", "", "conv2d", {"tile": 4}, [3e-3]), a)
    assert len(m.disagreements) == 1 and "timings disagree" in caplog.text and "2.50x" in caplog.text


def test_a_cross_check_then_with_no_node_left_runner_errors_then_an_error(cluster, model):
    import ray
    task = tuning.tuning_tasks(model)[0]
    cfg = task.tpl.default_config(task.wl, task.space)
    m = ClusterMeasurer(cluster.address, OPTS, crosscheck_every=1, noise=1e9, wait_for_nodes_s=1)
    try:
        recs = m.measure(task, [cfg])           # a cross-check times it again on the other node
        assert len(recs) == 1 and recs[0].error == R.NO_ERROR, recs[0].error_msg
        nodes = m.stats()["nodes"].values()
        assert sorted(n["calls"] for n in nodes) == [1, 1] and sum(n["trials"] for n in nodes) == 1
        for node in m.active:
            ray.kill(node.actor)
        recs = m.measure(task, [cfg, cfg, cfg])
        assert [r.error for r in recs] == [R.RUNTIME_ERROR] * 3
        assert all("no node of the cluster was left" in r.error_msg and r.target == m.target for r in recs)
        with pytest.raises(ModelcError, match="is left to measure for .*waited 1 s for one to join"):
            m.measure(task, [cfg])
    finally:
        m.close()

