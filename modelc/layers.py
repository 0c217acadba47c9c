"""Where the time goes: each fused group's kernel time in the module beside the onnxruntime nodes
it replaces, timed by onnxruntime's own profiler.

A fused group keeps the names of the ONNX nodes and tensors it was made from; onnxruntime's
optimised graph names its nodes after an original node or output tensor (a Conv fused with its
BatchNorm and Clip is `<Clip's output>_nchwc` on x86). So a node of onnxruntime's is matched to the
group that made the tensor it writes or that carries its name; the nodes onnxruntime adds of its
own (layout reorders) go to the group that reads what they write, else to the one that wrote what
they read. What is left is listed as unmatched, never dropped: both columns add up to each
runtime's whole kernel time.
"""
from __future__ import annotations

import json
import os
import statistics
import tempfile

NCHWC = "_nchwc"        # onnxruntime's x86 name for a node it moved to the blocked layout


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


def onnxruntime_nodes(path: str, feeds: dict, threads: int, runs: int = 20) -> list[dict]:
    """The nodes of onnxruntime's optimised graph with their median kernel time (ms) over `runs`."""
    import onnx
    import onnxruntime as ort

    from .peers import onnxruntime_options
    with tempfile.TemporaryDirectory() as tmp:
        so = onnxruntime_options(threads)
        so.optimized_model_filepath = os.path.join(tmp, "optimized.onnx")
        so.enable_profiling = True
        so.profile_file_prefix = os.path.join(tmp, "profile")
        so.log_severity_level = 3          # the NCHWc "hardware specific" warning is expected here
        sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        for _ in range(runs + 1):
            sess.run(None, feeds)
        with open(sess.end_profiling()) as f:
            events = json.load(f)
        graph = onnx.load(so.optimized_model_filepath, load_external_data=False).graph
    times: dict = {}
    for e in events:
        if e.get("cat") == "Node" and e.get("name", "").endswith("_kernel_time"):
            times.setdefault(e["name"][: -len("_kernel_time")], []).append(e["dur"] / 1e3)
    nodes = []
    for n in graph.node:
        ts = times.get(n.name, [])[1:] or times.get(n.name, [])       # the first run warms up
        nodes.append({"name": n.name, "op": n.op_type, "inputs": [i for i in n.input if i],
                      "outputs": [o for o in n.output if o], "ms": statistics.median(ts) if ts else 0.0})
    return nodes


def match(nodes: list[dict], groups: list[set]) -> list:
    """The group index of each onnxruntime node (None where nothing ties it to one)."""
    owner = {}
    for g, names in enumerate(groups):
        for x in names:
            owner.setdefault(x, g)
    where = []
    for n in nodes:
        g = next((owner[o] for o in n["outputs"] if o in owner), None)
        if g is None:
            g = owner.get(n["name"], owner.get(_strip(n["name"])))
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


def report(module, graph, fused, path: str, feeds: dict, threads: int, repeat: int = 20) -> dict:
    """Per fused group: modelc's kernel ms and the onnxruntime nodes (and their ms) it replaces."""
    groups = group_names(graph, fused)
    steps = module.program["steps"]
    fused_nodes = list(fused.topo())
    if [list(n.outputs) for n in fused_nodes] != [s["outputs"] for s in steps]:
        raise ValueError("the module was not compiled from this fused graph")
    prof = {p["step"]: p["ms"] for p in module.profile(repeat=repeat, feeds=feeds)}
    nodes = onnxruntime_nodes(path, feeds, threads, repeat)
    where = match(nodes, groups)
    rows = [{"step": i, "desc": s["desc"], "template": s["template"] if i in prof else "(view)",
             "modelc_ms": prof.get(i, 0.0),
             "onnxruntime": [], "onnxruntime_ms": 0.0} for i, s in enumerate(steps)]
    unmatched = []
    for n, g in zip(nodes, where):
        if g is None:
            unmatched.append(n)
        else:
            rows[g]["onnxruntime"].append(n["op"])
            rows[g]["onnxruntime_ms"] += n["ms"]
    return {"rows": rows, "unmatched": [{"name": n["name"], "op": n["op"], "ms": n["ms"]} for n in unmatched],
            "modelc_kernels_ms": sum(r["modelc_ms"] for r in rows),
            "onnxruntime_nodes_ms": sum(n["ms"] for n in nodes)}


def _ops(ops: list) -> str:
    counts: dict = {}
    for o in ops:
        counts[o] = counts.get(o, 0) + 1
    return " ".join(o if c == 1 else f"{o}x{c}" for o, c in counts.items()) or "-"


def format_report(rep: dict, title: str, top: int | None = None) -> str:
    """The table, in run order (or the `top` groups that lose most time against onnxruntime)."""
    rows = rep["rows"]
    if top:
        rows = sorted(rows, key=lambda r: r["onnxruntime_ms"] - r["modelc_ms"])[:top]
    out = [title, f"{'#':>4}  {'fused group (modelc)':<52}{'template':<18}{'modelc ms':>10}  "
                  f"{'onnxruntime nodes':<26}{'ort ms':>8}{'ratio':>7}"]
    for r in rows:
        ratio = f"{r['modelc_ms'] / r['onnxruntime_ms']:.2f}" if r["onnxruntime_ms"] > 0 and r["modelc_ms"] else "-"
        out.append(f"{r['step']:>4}  {r['desc'][:51]:<52}{r['template'][:17]:<18}{r['modelc_ms']:>10.3f}  "
                   f"{_ops(r['onnxruntime'])[:25]:<26}{r['onnxruntime_ms']:>8.3f}{ratio:>7}")
    for n in rep["unmatched"]:
        out.append(f"{'':>4}  {'(onnxruntime only) ' + n['name']:<52.51}{'':<18}{'':>10}  "
                   f"{n['op'][:25]:<26}{n['ms']:>8.3f}{'':>7}")
    total = rep["modelc_kernels_ms"] / rep["onnxruntime_nodes_ms"] if rep["onnxruntime_nodes_ms"] else float("nan")
    out.append(f"      kernels: modelc {rep['modelc_kernels_ms']:.3f} ms, "
               f"onnxruntime {rep['onnxruntime_nodes_ms']:.3f} ms (ratio {total:.2f}; "
               "modelc: each kernel timed in the running module; medians)")
    lat = rep.get("latency_ms", {})
    if "onnxruntime" in lat and len(lat) == 2:
        mine = next(v for k, v in lat.items() if k != "onnxruntime")
        # onnxruntime's profiler times each node with its own overhead: on a network of many small
        # nodes its nodes summed to 12.0 ms where a run took 8.7 (ShuffleNetV2 x2.0, AMD EPYC Zen 4)
        out.append(f"      whole runs: modelc {mine:.3f} ms, onnxruntime {lat['onnxruntime']:.3f} ms; onnxruntime's "
                   f"profiled nodes sum to {rep['onnxruntime_nodes_ms'] / lat['onnxruntime']:.2f}x its run, "
                   f"modelc's kernels to {rep['modelc_kernels_ms'] / mine:.2f}x its run")
    return "\n".join(out) + "\n"
