"""Where the time goes: each fused group's kernel time in the module beside the onnxruntime nodes
it replaces, timed by onnxruntime's own profiler (and, `against` OpenVINO, beside OpenVINO's nodes,
timed by its own performance counters).

A fused group keeps the names of the ONNX nodes and tensors it was made from; onnxruntime's
optimised graph names its nodes after an original node or output tensor (a Conv fused with its
BatchNorm and Clip is `<Clip's output>_nchwc` on x86). So a node of onnxruntime's is matched to the
group that made the tensor it writes or that carries its name; the nodes onnxruntime adds of its
own (layout reorders) go to the group that reads what they write, else to the one that wrote what
they read. OpenVINO lists, for each node it ran, the original ONNX nodes it covers
(`originalLayersNames`); its reorders cover none and go by the same rule. What is left is listed as
unmatched, never dropped: every column adds up to its runtime's whole kernel time.
"""
from __future__ import annotations

import bisect
import json
import os
import statistics
import tempfile

NCHWC = "_nchwc"        # onnxruntime's x86 name for a node it moved to the blocked layout
ROUNDS = 5              # alternating rounds of modelc's and the peers' profiled runs
WARM = 2                # untimed runs that open each runtime's turn (another runtime's threads ran last)


def group_names(graph, fused) -> list[set]:
    """For each fused group in run order, the original node and tensor names it covers."""
    known = set(graph.tensors) | {n.name for n in graph.topo()}
    out = []
    for node in fused.topo():
        names = {node.name, *node.outputs}
        if node.subgraph is not None:
            for n in node.subgraph.topo():
                names.add(n.name)
                names.update(n.outputs)
        out.append({x for x in names if x and x in known})
    # a node the passes merged into another op (a gate's Mul into a ScaledConv) belongs to the
    # group that reads what it wrote; consumers first, so a chain of such nodes follows
    owner = {x: i for i, names in enumerate(out) for x in names}
    for n in reversed(graph.topo()):
        if n.name in owner:
            continue
        readers = {owner.get(c.name) for o in n.outputs if o for c in graph.consumers(o)}
        if len(readers) == 1 and None not in readers:
            i = readers.pop()
            for x in [n.name, *(o for o in n.outputs if o)]:
                out[i].add(x)
                owner[x] = i
    return out


def _strip(name: str) -> str:
    return name[: -len(NCHWC)] if name.endswith(NCHWC) else name


class OnnxruntimeNodes:
    """onnxruntime's session with its profiler on: `run` adds runs (between modelc's, so both are timed
    at the same moments of a shared machine), `nodes` reads them: the nodes of its optimised graph
    with their median kernel time (ms)."""

    def __init__(self, path: str, feeds: dict, threads: int):
        import onnxruntime as ort

        from .peers import onnxruntime_options
        self._tmp = tempfile.TemporaryDirectory()
        so = onnxruntime_options(threads)
        so.optimized_model_filepath = os.path.join(self._tmp.name, "optimized.onnx")
        so.enable_profiling = True
        so.profile_file_prefix = os.path.join(self._tmp.name, "profile")
        so.log_severity_level = 3          # the NCHWc "hardware specific" warning is expected here
        self._optimized, self._path, self.feeds = so.optimized_model_filepath, path, feeds
        self.sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        self.sess.run(None, feeds)         # warms up; left out of the times below
        self.done, self.timed = 1, set()   # runs so far; the indices of those timed

    def run(self, runs: int, warm: int = 0):
        for k in range(warm + runs):
            self.sess.run(None, self.feeds)
            if k >= warm:
                self.timed.add(self.done)
            self.done += 1

    def nodes(self) -> list[dict]:
        import onnx
        try:
            with open(self.sess.end_profiling()) as f:
                events = json.load(f)
            graph = onnx.load(self._optimized, load_external_data=False).graph
        finally:
            self._tmp.cleanup()
        # each node's times in the timed runs: a node's event falls within the run (`model_run`) it was part of
        starts = sorted(e["ts"] for e in events if e.get("cat") == "Session" and e.get("name") == "model_run")
        timed = self.timed if len(starts) == self.done else set(range(1, len(starts)))
        times: dict = {}
        for e in events:
            if e.get("cat") == "Node" and e.get("name", "").endswith("_kernel_time") and \
                    bisect.bisect_right(starts, e["ts"]) - 1 in timed:
                times.setdefault(e["name"][: -len("_kernel_time")], []).append(e["dur"] / 1e3)
        # onnxruntime times an unnamed node as `<op>_<its index in the model>`; the optimised graph
        # keeps it unnamed, with the outputs it had
        unnamed = {tuple(n.output): f"{n.op_type}_{i}" for i, n in
                   enumerate(onnx.load(self._path, load_external_data=False).graph.node) if not n.name}
        nodes = []
        for n in graph.node:
            name = n.name or unnamed.get(tuple(n.output), "")
            ts = times.get(name, [])
            nodes.append({"name": name, "op": n.op_type, "inputs": [i for i in n.input if i],
                          "outputs": [o for o in n.output if o], "ms": statistics.median(ts) if ts else 0.0,
                          "runs": len(ts)})
        return nodes


class OpenvinoNodes:
    """OpenVINO's compiled model with its performance counters on, run as `OnnxruntimeNodes` is: the nodes
    it ran with their median time (ms), the original ONNX nodes each covers, and the nodes it reads
    (by name, as `match` links them)."""

    def __init__(self, path: str, feeds: dict, threads: int, shapes: dict):
        from .peers import openvino_compiled
        compiled = openvino_compiled(path, threads, shapes, perf_count=True)
        self.graph = {}
        for op in compiled.get_runtime_model().get_ordered_ops():
            info = op.get_rt_info()
            names = info["originalLayersNames"].astype(str) if "originalLayersNames" in info else ""
            kind = info["layerType"].astype(str) if "layerType" in info else op.get_type_name()
            self.graph[op.get_friendly_name()] = {
                "op": kind, "originals": [x for x in names.split(",") if x],
                "inputs": [v.get_node().get_friendly_name() for v in op.input_values()]}
        self.request, self.feeds, self.times = compiled.create_infer_request(), feeds, {}
        self.request.infer(feeds)          # warms up; left out of the times

    def run(self, runs: int, warm: int = 0):
        for _ in range(warm):
            self.request.infer(self.feeds)
        for _ in range(runs):
            self.request.infer(self.feeds)
            for p in self.request.get_profiling_info():
                if p.status == p.Status.EXECUTED:
                    self.times.setdefault(p.node_name, []).append(p.real_time.total_seconds() * 1e3)

    def nodes(self) -> list[dict]:
        out = []
        for name, ts in self.times.items():
            node = self.graph.get(name, {"op": "?", "originals": [], "inputs": []})
            out.append({"name": name, **node, "outputs": [name], "ms": statistics.median(ts)})
        return out


def match(nodes: list[dict], groups: list[set]) -> list:
    """The group index of each peer node (None where nothing ties it to one): by the tensor it
    writes, its name, or the original nodes it covers (OpenVINO's)."""
    owner = {}
    for g, names in enumerate(groups):
        for x in names:
            owner.setdefault(x, g)
    where = []
    for n in nodes:
        g = next((owner[o] for o in n["outputs"] if o in owner), None)
        if g is None:
            g = owner.get(n["name"], owner.get(_strip(n["name"])))
        if g is None:
            g = next((owner[o] for o in n.get("originals", ()) if o in owner), None)
        where.append(g)
    # onnxruntime's own nodes (reorders, ...): to the group that reads their output, else the writer of their input
    for _ in range(len(nodes)):
        made, read = {}, {}
        for n, g in zip(nodes, where):
            if g is not None:
                made.update({o: g for o in n["outputs"]})
                for i in n["inputs"]:
                    read.setdefault(i, g)
        changed = False
        for k, n in enumerate(nodes):
            if where[k] is None:
                g = next((read[o] for o in n["outputs"] if o in read), None)
                if g is None:
                    g = next((made[i] for i in n["inputs"] if i in made), None)
                if g is not None:
                    where[k], changed = g, True
        if not changed:
            break
    return where


def report(module, graph, fused, path: str, feeds: dict, threads: int, repeat: int = 20, against: tuple = ()) -> dict:
    """Per fused group: modelc's kernel ms and the onnxruntime nodes (and their ms) it replaces, and
    OpenVINO's where `against` names it."""
    groups = group_names(graph, fused)
    steps = module.program["steps"]
    fused_nodes = list(fused.topo())
    if [list(n.outputs) for n in fused_nodes] != [s["outputs"] for s in steps]:
        raise ValueError("the module was not compiled from this fused graph")
    peers = {"onnxruntime": OnnxruntimeNodes(path, feeds, threads)}
    if "openvino" in against:
        shapes = {i["name"]: i["shape"] for i in module.input_specs}
        peers["openvino"] = OpenvinoNodes(path, feeds, threads, shapes)
    # in alternating rounds: profiled one after the other, on a shared host the runtimes' sums drifted
    # apart by 18% (the machine's speed moved between them), and every ratio with them
    rounds = max(1, min(ROUNDS, repeat))
    samples: dict = {}                 # each kernel's median of each round
    for k in range(rounds):
        runs = repeat // rounds + (k < repeat % rounds)
        for _ in range(WARM):
            module.run(feeds)
        for p in module.profile(repeat=runs, feeds=feeds):
            samples.setdefault(p["step"], []).append(p["ms"])
        for peer in peers.values():
            peer.run(runs, warm=WARM)
    prof = {i: statistics.median(ts) for i, ts in samples.items()}
    rows = [{"step": i, "desc": s["desc"], "template": s["template"] if i in prof else "(view)",
             "modelc_ms": prof.get(i, 0.0)} for i, s in enumerate(steps)]
    res = {"rows": rows, "modelc_kernels_ms": sum(r["modelc_ms"] for r in rows)}
    for peer, prof_nodes in peers.items():
        nodes = prof_nodes.nodes()
        for r in rows:
            r[peer], r[f"{peer}_ms"] = [], 0.0
        unmatched = []
        for n, g in zip(nodes, match(nodes, groups)):
            if g is None:
                unmatched.append(n)
            else:
                rows[g][peer].append(n["op"])
                rows[g][f"{peer}_ms"] += n["ms"]
        res[f"{peer}_nodes_ms"] = sum(n["ms"] for n in nodes)
        res["unmatched" if peer == "onnxruntime" else f"unmatched_{peer}"] = [
            {"name": n["name"], "op": n["op"], "ms": n["ms"]} for n in unmatched]
    return res


def _ops(ops: list) -> str:
    counts: dict = {}
    for o in ops:
        counts[o] = counts.get(o, 0) + 1
    return " ".join(o if c == 1 else f"{o}x{c}" for o, c in counts.items()) or "-"


def format_report(rep: dict, title: str, top: int | None = None) -> str:
    """The table, in run order (or the `top` groups that lose most time against onnxruntime)."""
    rows = rep["rows"]
    ov = "openvino_nodes_ms" in rep
    if top:
        rows = sorted(rows, key=lambda r: r["onnxruntime_ms"] - r["modelc_ms"])[:top]

    def ratio(mine, theirs):
        return f"{mine / theirs:.2f}" if theirs > 0 and mine else "-"
    head = (f"{'#':>4}  {'fused group (modelc)':<52}{'template':<18}{'modelc ms':>10}  "
            f"{'onnxruntime nodes':<26}{'ort ms':>8}{'ratio':>7}")
    out = [title, head + (f"  {'openvino nodes':<22}{'ov ms':>8}{'ratio':>7}" if ov else "")]
    for r in rows:
        line = (f"{r['step']:>4}  {r['desc'][:51]:<52}{r['template'][:17]:<18}{r['modelc_ms']:>10.3f}  "
                f"{_ops(r['onnxruntime'])[:25]:<26}{r['onnxruntime_ms']:>8.3f}"
                f"{ratio(r['modelc_ms'], r['onnxruntime_ms']):>7}")
        if ov:
            line += (f"  {_ops(r['openvino'])[:21]:<22}{r['openvino_ms']:>8.3f}"
                     f"{ratio(r['modelc_ms'], r['openvino_ms']):>7}")
        out.append(line)
    for peer, key in (("onnxruntime", "unmatched"), ("openvino", "unmatched_openvino")):
        for n in rep.get(key, []):
            out.append(f"{'':>4}  {f'({peer} only) ' + n['name']:<52.51}{'':<18}{'':>10}  "
                       f"{n['op'][:25]:<26}{n['ms']:>8.3f}{'':>7}")
    total = rep["modelc_kernels_ms"] / rep["onnxruntime_nodes_ms"] if rep["onnxruntime_nodes_ms"] else float("nan")
    out.append(f"      kernels: modelc {rep['modelc_kernels_ms']:.3f} ms, "
               f"onnxruntime {rep['onnxruntime_nodes_ms']:.3f} ms (ratio {total:.2f}; "
               "modelc: each kernel timed in the running module; medians)")
    if ov:
        out.append(f"      OpenVINO's nodes (its performance counters): {rep['openvino_nodes_ms']:.3f} ms "
                   f"(modelc's kernels {rep['modelc_kernels_ms'] / rep['openvino_nodes_ms']:.2f} of them)")
    lat = rep.get("latency_ms", {})
    if "onnxruntime" in lat and len(lat) == 2:
        mine = next(v for k, v in lat.items() if k != "onnxruntime")
        # onnxruntime's profiler times each node with its own overhead: on a network of many small
        # nodes its nodes summed to 12.0 ms where a run took 8.7 (ShuffleNetV2 x2.0, AMD EPYC Zen 4)
        out.append(f"      whole runs: modelc {mine:.3f} ms, onnxruntime {lat['onnxruntime']:.3f} ms; onnxruntime's "
                   f"profiled nodes sum to {rep['onnxruntime_nodes_ms'] / lat['onnxruntime']:.2f}x its run, "
                   f"modelc's kernels to {rep['modelc_kernels_ms'] / mine:.2f}x its run")
    return "\n".join(out) + "\n"
