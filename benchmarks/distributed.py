"""What a Ray cluster adds to tuning: trials per minute and the driver's overhead per trial, measured
locally (worker processes), on a one-node and on a two-node Ray cluster started here on 127.0.0.1.

    python benchmarks/distributed.py [--model tiny|resnet18|PATH] [--trials 24] [--builders 1]

Each configuration tunes the same tasks with the same seed into a log of its own, from an empty kernel
cache of its own (a warm cache would make the later runs' compiles free). Columns, per trial:
- `start s`: making the measurer, once (on a cluster: joining it, starting an actor per node);
- `wall`: the tune's wall time; `search`: the driver's own work (cost model, scheduler, log writes),
  the wall time outside `measure` and the start; `measure`: inside `measure` (a round's wall time);
- `node`: the nodes' own time measuring (their clocks; local: the same as `measure`);
- `dispatch`: `measure` - `node` / nodes: what Ray, the record checks and idle nodes at the end of a
  round add to a trial.
The nodes of one machine share its cores: with `--builders 1` (one compile at a time per node, and
locally) two nodes have two builders to the local run's one, which is what a second machine brings.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")     # 127.0.0.1 stays 127.0.0.1
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import numpy as np  # noqa: E402
import onnx  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from modelc.resolve import resolve_model  # noqa: E402
from modelc.tune import records as R  # noqa: E402
from modelc.tune.cluster import ClusterMeasurer  # noqa: E402
from modelc.tune.measure import MeasureOptions, Measurer  # noqa: E402
from modelc.tune.tuning import tune, tuning_tasks  # noqa: E402


def tiny(path: str):
    """Two 3x3 convolutions on 28x28 (three tasks with Winograd): compiles of a second or two."""
    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array((rng.standard_normal((32, 16, 3, 3)) * 0.1).astype(np.float32), "w1")
    w2 = numpy_helper.from_array((rng.standard_normal((32, 32, 3, 3)) * 0.1).astype(np.float32), "w2")
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2"], ["y"], pads=[1, 1, 1, 1], strides=[2, 2])]
    g = helper.make_graph(nodes, "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 28, 28])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 32, 14, 14])], [w1, w2])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    onnx.save(m, path)


class Timed:
    """Wall time to make a measurer (connect, start actors), and inside its `measure`."""

    def __init__(self, make):
        t0 = time.time()
        measurer = make()
        self.start = time.time() - t0
        self.m, self.seconds = measurer, 0.0
        self.target = getattr(measurer, "target", None)
        self.host = getattr(measurer, "host", None)

    @property
    def streams(self):
        return getattr(self.m, "streams", False)

    def measure(self, task, configs, target=None, **kw):
        t0 = time.time()
        try:
            return self.m.measure(task, configs, target, **kw)
        finally:
            self.seconds += time.time() - t0

    def close(self):
        self.m.close()


def run(name, tasks, args, tmp, nodes: int):
    os.environ["MODELC_CACHE_DIR"] = os.path.join(tmp, f"cache-{name}")   # cold, for workers started from now
    opts = MeasureOptions(number=2, repeat=2, min_repeat_ms=5, n_parallel=args.builders)
    log = os.path.join(tmp, f"{name}.jsonl")
    cluster, timed = None, []
    if nodes:
        from ray.cluster_utils import Cluster
        cluster = Cluster(initialize_head=True, head_node_args=dict(node_ip_address="127.0.0.1", num_cpus=1,
                                                                    include_dashboard=False))
        for _ in range(nodes - 1):
            cluster.add_node(node_ip_address="127.0.0.1", num_cpus=1)
    from modelc.tune import tuning as T
    real_local, real_cluster = T.Measurer, T.cluster_measurer
    T.Measurer = lambda o: timed.append(Timed(lambda: Measurer(o))) or timed[-1]
    T.cluster_measurer = lambda a, o, c: timed.append(Timed(lambda: ClusterMeasurer(a, o, target_cpu=c))) or timed[-1]
    try:
        t0 = time.time()
        tune(None, n_trials=args.trials, log=log, tasks=tasks, trials_per_round=args.trials_per_round,
             measure_options=opts, verbose=args.verbose, cluster=cluster.address if cluster else None)
        wall = time.time() - t0
    finally:
        T.Measurer, T.cluster_measurer = real_local, real_cluster
        if cluster is not None:
            cluster.shutdown()
    recs = R.load_records(log, warn=False)
    n = len(recs)
    measured, start = timed[0].seconds, timed[0].start
    node = timed[0].m.stats()["node_s"] if nodes else measured
    return {"name": name, "trials": n, "errors": sum(r.error != R.NO_ERROR for r in recs), "wall": wall,
            "start": start, "per_min": 60 * n / wall, "search": (wall - start - measured) / n, "measure": measured / n,
            "node": node / n, "dispatch": (measured - node / max(nodes, 1)) / n if nodes else 0.0}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="tiny", help="tiny (two convolutions), a built-in model or an .onnx path")
    ap.add_argument("--trials", type=int, default=24)
    ap.add_argument("--trials-per-round", type=int, default=8)
    ap.add_argument("--builders", type=int, default=1, help="parallel compiles per node, and locally")
    ap.add_argument("--verbose", type=int, default=0)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="modelc-distributed-") as tmp:
        os.makedirs(os.path.join(tmp, "ray"))
        os.environ["RAY_TMPDIR"] = tmp
        path = os.path.join(tmp, "tiny.onnx")
        if args.model == "tiny":
            tiny(path)
        else:
            path = resolve_model(args.model)
        tasks = tuning_tasks(path)
        print(f"{args.model}: {len(tasks)} tasks, {args.trials} trials, {args.trials_per_round} per round, "
              f"{args.builders} builder(s) per node; {R.current_target()['cpu']}, {os.cpu_count()} cores",
              flush=True)
        rows = [run("local", tasks, args, tmp, 0), run("ray-1-node", tasks, args, tmp, 1),
                run("ray-2-nodes", tasks, args, tmp, 2)]
    print(f"{'measurer':<12} {'trials':>6} {'errors':>6} {'wall s':>7} {'start s':>7} {'trials/min':>10}   "
          f"per trial (s): {'wall':>6} {'search':>6} {'measure':>7} {'node':>6} {'dispatch':>8}")
    for r in rows:
        print(f"{r['name']:<12} {r['trials']:>6} {r['errors']:>6} {r['wall']:>7.1f} {r['start']:>7.1f} "
              f"{r['per_min']:>10.1f}   {'':>15}{r['wall'] / r['trials']:>6.3f} {r['search']:>6.3f} "
              f"{r['measure']:>7.3f} {r['node']:>6.3f} {r['dispatch']:>8.3f}")
    local, one, two = rows
    print(f"the driver adds {one['wall'] / one['trials'] - local['wall'] / local['trials']:+.3f} s per trial on one "
          f"node against the local measurer ({one['dispatch']:.3f} s of it between the driver and the node); "
          f"two nodes: {two['per_min'] / one['per_min']:.2f}x the trials per minute of one")
    return 0


if __name__ == "__main__":
    sys.exit(main())
