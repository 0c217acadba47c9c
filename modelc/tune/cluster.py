"""Measuring on a Ray cluster: `ClusterMeasurer` has `Measurer`'s `measure`/`close`, and spreads each
round's candidates over one actor per node of the target CPU (cluster_node.py), so trials per minute
grow with the nodes while the driver keeps the search and stays the log's only writer.

Candidates go out as data (task JSON, knob values) and come back as record lines that are checked
here like any log line, and against what was asked, before they reach the log. A node that dies, hangs
past its deadline or answers nonsense is dropped and the candidates it held are measured on the
others; nodes that join later are picked up between rounds; a node whose timing of a config disagrees
with another node's beyond `noise` is reported.
"""
from __future__ import annotations

import collections
import json
import logging
import math
import threading
import time

from ..errors import ModelcError
from ..validate import check_config
from . import records as R
from .cluster_node import NodeMeasurer
from .cluster_nodes import alive_nodes, choose_target, exclusion, host_target, pre_exclusion, probe, resolve
from .measure import MeasureOptions

logger = logging.getLogger(__name__)


def import_ray():
    try:
        import ray
    except ImportError:
        raise ModelcError("tuning on a cluster needs Ray: pip install -e \".[ray]\" (or pip install 'ray>=2.9')") \
            from None
    return ray


def connect(address: str, timeout: float = 30.0) -> bool:
    """Join the cluster as a driver; True if this call did (and `close` should leave it)."""
    ray = import_ray()
    if ray.is_initialized():
        return False
    addr = resolve(address)
    probe(addr, min(timeout, 10.0))
    done: list = []

    def init():
        try:
            ray.init(address=addr, logging_level="ERROR", log_to_driver=False, configure_logging=False)
            done.append(None)
        except Exception as e:
            done.append(e)
    # in a thread, so that a GCS that accepts connections but never answers costs `timeout`, not a
    # hang; Ray warns that a thread cannot set its SIGTERM handler, which says nothing to our user
    quiet = _Without("SIGTERM handler is not set")
    logging.getLogger("ray._private.worker").addFilter(quiet)
    th = threading.Thread(target=init, daemon=True)
    th.start()
    th.join(timeout)
    logging.getLogger("ray._private.worker").removeFilter(quiet)
    if not done:
        raise ModelcError(f"could not join the Ray cluster at {addr}: its GCS accepted a connection but "
                          f"ray.init did not finish within {timeout:g} s")
    if done[0] is not None:
        raise ModelcError(f"could not join the Ray cluster at {addr}: {done[0]}") from None
    return True


class ClusterMeasurer:
    def __init__(self, address: str = "auto", options: MeasureOptions | None = None, target_cpu: str | None = None,
                 start_timeout: float = 120.0, connect_timeout: float = 30.0, rescan_s: float = 10.0,
                 crosscheck_every: int = 8, noise: float = 1.5, wait_for_nodes_s: float = 60.0):
        self.ray = import_ray()
        self.opt = options or MeasureOptions()
        self.owns_connection = connect(address, connect_timeout)
        self.address = self.ray.get_runtime_context().gcs_address
        self.target_cpu, self.start_timeout, self.rescan_s = target_cpu, start_timeout, rescan_s
        self.crosscheck_every, self.noise, self.wait_for_nodes_s = crosscheck_every, noise, wait_for_nodes_s
        self.nodes: dict = {}             # id -> Node, every node ever seen
        self.active: list = []            # nodes measuring now
        self.joining: dict = {}           # describe() ref -> (Node, since), actors starting on new nodes
        self.rounds = 0
        self.seen: dict = {}              # (key, template, config) -> (node id, cost)
        self.disagreements: list = []
        self.round_s = self.node_s = 0.0  # wall time of measure() calls, and the nodes' own time in them
        self.trials = 0
        self._actor_cls = None
        self.last_scan = time.time()
        try:
            self._start_all()
        except BaseException:
            self.close()
            raise

    # ---- nodes ----------------------------------------------------------------------------------
    def _spawn(self, node):
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
        if self._actor_cls is None:
            self._actor_cls = self.ray.remote(NodeMeasurer)
        node.actor = self._actor_cls.options(
            num_cpus=node.cpus, max_restarts=0, max_concurrency=1,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node.id, soft=False)).remote(vars(self.opt))
        return node.actor.describe.remote()

    def _scan(self, target_cpu: str, quiet: bool = False) -> dict:
        """Start an actor on each node not seen before; {describe ref: node}."""
        refs = {}
        for node in alive_nodes(self.ray):
            if node.id in self.nodes:
                continue
            self.nodes[node.id] = node
            why = pre_exclusion(node, target_cpu)
            if why:
                node.lost = why
                if not quiet:
                    logger.info("  left out  %s: %s", node.name, why)
                continue
            refs[self._spawn(node)] = node
        return refs

    def _start_all(self):
        own = R.current_target()
        refs = self._scan(self.target_cpu or own["cpu"], quiet=True)
        ready, late = self.ray.wait(list(refs), num_returns=len(refs), timeout=self.start_timeout) if refs \
            else ([], [])
        infos = {}
        for ref in ready:
            infos[ref] = self._describe(refs[ref], ref)
        self.target = choose_target([i for i in infos.values() if i], own, self.target_cpu)
        t = self.target
        logger.info("cluster %s: measuring for %s (%s), %s threads per measurement", self.address, t["cpu"],
                    t.get("llvm_cpu") or "?", t.get("threads") or "?")
        for ref, info in infos.items():
            self._admit(refs[ref], info)
        for node in self.nodes.values():
            if node.lost and node.info is None and node not in refs.values():
                logger.info("  left out  %s: %s", node.name, node.lost)
        for ref in late:
            self._drop(refs[ref], self._late(refs[ref]))
        self.host = None                  # the Target that tasks and candidates follow, if not the driver's
        if self.target_cpu is not None and self.active:
            self.host = host_target(self.active[0].info.get("host"), self.target)
        if not self.active:
            left = "; ".join(f"{n.name}: {n.lost}" for n in self.nodes.values()) or "the cluster has no alive node"
            raise ModelcError(f"no node of the Ray cluster at {self.address} can measure for {t['cpu']} "
                              f"(ISA {' '.join(t.get('isa', [])) or '?'}, {t.get('threads')} threads): {left}")

    def _late(self, node) -> str:
        return (f"its actor did not answer within {self.start_timeout:g} s (waited for {node.cpus} CPUs of the "
                "node to be free, the actor's start and modelc's imports in it)")

    def _describe(self, node, ref) -> dict | None:
        try:
            info = self.ray.get(ref)
            if not isinstance(info, dict) or not isinstance(info.get("target"), dict):
                raise ValueError(f"described itself as {str(info)[:200]!r}")
            node.info = info
            return info
        except Exception as e:
            self._drop(node, f"its actor failed to start: {_first_line(e)}")
            return None

    def _admit(self, node, info):
        if info is None:
            return
        why = exclusion(info, self.target)
        if why:
            self._drop(node, why)
            return
        self.active.append(node)
        logger.info("  using     %s: %s, %s cores, %s threads per measurement, %s builders", node.name,
                    info["target"].get("cpu"), info.get("cores"), info["target"].get("threads"), node.builders)
        if isinstance(info.get("nice"), int) and info["nice"] > 0:
            logger.warning("  %s measures at nice %d (Ray's worker niceness): with other work on the machine its "
                           "compiles and timings lose the CPU; start the node with RAY_worker_niceness=0",
                           node.name, info["nice"])

    def _drop(self, node, why: str):
        node.lost = why
        if node in self.active:
            self.active.remove(node)
            logger.warning("  lost      %s: %s", node.name, why)
        else:
            logger.info("  left out  %s: %s", node.name, why)
        if node.actor is not None:
            try:
                self.ray.kill(node.actor)
            except Exception:
                pass
            node.actor = None

    def _rescan(self, block: bool = False):
        """Pick up nodes that joined. Their actors start in the background, so a round never waits
        on them - unless no node is left: then wait up to `wait_for_nodes_s` for one to join."""
        deadline = time.time() + (self.wait_for_nodes_s if block else 0.0)
        while True:
            now = time.time()
            if block or now - self.last_scan >= self.rescan_s:
                self.joining.update({ref: (node, now) for ref, node in self._scan(self.target["cpu"]).items()})
                self.last_scan = now
            if self.joining:
                ready, _ = self.ray.wait(list(self.joining), num_returns=len(self.joining),
                                         timeout=min(1.0, max(0.0, deadline - now)))
                for ref in ready:
                    node, _ = self.joining.pop(ref)
                    self._admit(node, self._describe(node, ref))
                    if node in self.active:
                        logger.info("  joined    %s", node.name)
                for ref, (node, since) in list(self.joining.items()):
                    if time.time() - since > self.start_timeout:
                        del self.joining[ref]
                        self._drop(node, self._late(node))
            if not block or self.active or time.time() >= deadline:
                return
            if not self.joining:
                time.sleep(min(1.0, max(0.0, deadline - time.time())))

    # ---- measuring ------------------------------------------------------------------------------
    streams = True                        # measure() hands each record to `on_record` as it arrives

    def measure(self, task, configs: list, target: dict | None = None, on_record=None) -> list:
        """Records (one per config) for candidates of a Task, measured on the cluster's nodes; each
        is passed to `on_record` as it arrives (the driver logs it then, not at the round's end)."""
        t0 = time.time()
        self.rounds += 1
        self._rescan(block=not self.active)
        if not self.active:
            raise ModelcError(f"no node of the Ray cluster at {self.address} is left to measure for "
                              f"{self.target['cpu']}; waited {self.wait_for_nodes_s:g} s for one to join")
        task_json = json.dumps({"key": task.key, "desc": task.desc, "template": task.template,
                                "workload": task.workload, "weight": task.weight})
        values = [c.values for c in configs]
        out: list = [None] * len(configs)
        pending = collections.deque((i, None) for i in range(len(configs)))   # (index, node it must avoid)
        crosscheck = self.crosscheck_every > 0 and self.rounds % self.crosscheck_every == 0
        inflight: dict = {}               # ref -> (node, items, deadline)
        per = self.opt.build_timeout + self.opt.run_timeout
        while pending or inflight:
            for node in list(self.active):
                if pending and not any(v[0] is node for v in inflight.values()):
                    items = _take(pending, node.id, node.builders)
                    if items:
                        ref = node.actor.measure.remote(task_json, json.dumps([values[i] for i, _ in items]))
                        limit = per * len(items) + 60.0
                        inflight[ref] = (node, items, time.time() + limit, limit)
            if not inflight:
                if pending and all(avoid is not None for _, avoid in pending):
                    break                 # only cross-checks for the one node left: not needed
                self._rescan(block=True)
                if not self.active:       # nothing left to measure on: the candidates get a runner error
                    for i, avoid in pending:
                        if avoid is None:
                            out[i] = self._lost(task, values[i])
                            if on_record is not None:
                                on_record(out[i])
                    break
                continue
            ready, _ = self.ray.wait(list(inflight), num_returns=1, timeout=1.0)
            for ref in ready:
                node, items = inflight.pop(ref)[:2]
                try:
                    answer = self.ray.get(ref)
                    recs = self._accept(answer, task, [values[i] for i, _ in items])
                except Exception as e:
                    self._drop(node, f"{_first_line(e)}; its {len(items)} candidate(s) in flight go to the others")
                    pending.extendleft(reversed(items))
                    continue
                node.calls += 1
                node.busy_s += float(answer["seconds"])
                self.node_s += float(answer["seconds"])
                for (i, avoid), rec in zip(items, recs):
                    self._compare(task, rec, node)
                    if avoid is None:
                        out[i] = rec
                        node.trials += 1
                        if on_record is not None:
                            on_record(rec)
                        if crosscheck and i == 0 and rec.error == R.NO_ERROR and len(self.active) > 1:
                            pending.append((i, node.id))     # the same config on another node
            now = time.time()
            for ref, (node, items, deadline, limit) in list(inflight.items()):
                if now > deadline:
                    del inflight[ref]
                    self._drop(node, f"no answer within {limit:.0f} s for {len(items)} candidate(s) (its build "
                                     f"and run timeouts, plus a minute); they go to the others")
                    pending.extendleft(reversed(items))
        self.trials += len(out)
        self.round_s += time.time() - t0
        return out

    def _accept(self, answer, task, sent: list) -> list:
        """The records a node answered, if they are records of what it was asked, for the target."""
        if not isinstance(answer, dict) or not isinstance(answer.get("records"), list) \
                or not isinstance(answer.get("seconds"), (int, float)) or len(answer["records"]) != len(sent):
            raise ValueError(f"answered {str(answer)[:200]!r} instead of {len(sent)} record(s)")
        recs = []
        for line, values in zip(answer["records"], sent):
            if not isinstance(line, str):
                raise ValueError("answered a record that is not a JSON line")
            rec = R.Record.from_json(line)           # the schema, as for every log line
            if (rec.key, rec.template, rec.config, rec.workload) != (task.key, task.template, values, task.workload):
                raise ValueError(f"answered a record of another candidate ({rec.key[:12]} {rec.template})")
            if not R.same_target(rec.target, self.target):
                raise ValueError(f"measured for another target ({rec.target.get('cpu')}, "
                                 f"{rec.target.get('threads')} threads)")
            if rec.version != R.VERSION:
                raise ValueError(f"wrote a record of modelc {rec.version!r}")
            check_config(rec.template, rec.workload, rec.config, "record", key=rec.key)
            rec.desc, rec.weight, rec.target = task.desc, task.weight, dict(self.target)
            recs.append(rec)
        return recs

    def _lost(self, task, values: dict):
        return R.Record(task.key, task.desc, task.template, values, [], R.RUNTIME_ERROR,
                        "not measured: no node of the cluster was left to measure it", dict(self.target),
                        task.workload, time.time())

    def _compare(self, task, rec, node):
        """Report a node whose timing of a config another node measured too disagrees beyond noise."""
        if rec.error != R.NO_ERROR:
            return
        k = (task.key, task.template, json.dumps(rec.config, sort_keys=True))
        prev = self.seen.get(k)
        self.seen[k] = (node.id, rec.cost)
        if prev is None or prev[0] == node.id:
            return
        other = self.nodes[prev[0]]
        ratio = rec.cost / prev[1] if prev[1] > 0 else math.inf
        if max(ratio, 1 / ratio if ratio else math.inf) > self.noise:
            self.disagreements.append((node.id, other.id, ratio))
            logger.warning("timings disagree: %s measured %.4f ms and %s %.4f ms for one config of %s (%.2fx; "
                           "noise is taken as %.2fx): is one of them loaded or throttled?", node.name,
                           rec.cost * 1e3, other.name, prev[1] * 1e3, task.desc, max(ratio, 1 / ratio), self.noise)

    def stats(self) -> dict:
        return {"address": self.address, "target": self.target, "trials": self.trials, "round_s": self.round_s,
                "node_s": self.node_s, "disagreements": len(self.disagreements),
                "nodes": {n.id: {"address": n.address, "trials": n.trials, "busy_s": n.busy_s, "calls": n.calls,
                                 "active": n in self.active, "why_not": n.lost} for n in self.nodes.values()}}

    def close(self):
        if getattr(self, "closed", False):
            return
        self.closed = True
        for node in self.nodes.values():
            if node.trials:
                logger.info("  %s measured %d trial(s) in %.0f s", node.name, node.trials, node.busy_s)
        for node in list(self.nodes.values()):
            if node.actor is not None:
                try:
                    self.ray.get(node.actor.close.remote(), timeout=10)
                except Exception:
                    pass
                try:
                    self.ray.kill(node.actor)
                except Exception:
                    pass
                node.actor = None
        self.active = []
        if self.owns_connection and self.ray.is_initialized():
            self.ray.shutdown()
            self.owns_connection = False


class _Without(logging.Filter):
    def __init__(self, text: str):
        super().__init__()
        self.text = text

    def filter(self, record) -> bool:
        return self.text not in record.getMessage()


def _take(pending, node_id: str, n: int) -> list:
    """Up to `n` items a node may take (a cross-check avoids the node that measured it first)."""
    items, keep = [], []
    while pending and len(items) < n:
        item = pending.popleft()
        (keep if item[1] == node_id else items).append(item)
    pending.extendleft(reversed(keep))
    return items


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[-1] if text else ''}"[:300]
