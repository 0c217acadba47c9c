"""`modelc.compile`: the pipeline from an ONNX model to an executable Module, top to bottom."""
from __future__ import annotations

from .canonical import workload_key, workload_of
from .extract import describe
from .frontend import from_onnx
from .ir import Graph
from .kernels import templates as _templates  # noqa: F401  (registers the templates)
from .kernels.template import alternatives, select, untuned
from .kernels.template import get as get_template
from .kernels.workload import Workload
from .passes.lower import lower
from .runtime.module import FORMAT_VERSION, Module
from .tune import dispatch
from .version import VERSION


def build_program(fused: Graph) -> tuple[dict, dict]:
    """The module's program (plain data) and constants, choosing a config per kernel."""
    ctx = dispatch.current()
    steps, used = [], set()
    for node in fused.topo():
        wl = workload_of(fused, node)
        key = workload_key(wl)
        view = Workload(wl)
        tpl = select(view)
        name, config = untuned(view, tpl).name, None
        if ctx is not None and tpl.tunable:
            # the fastest record among the algorithms that can run it (direct or Winograd ...)
            algos = [tpl.name] + [t.name for t in alternatives(view, tpl)]
            name, config = ctx.choose(key, algos, untuned=name) or (name, None)
        steps.append({"key": key, "pattern": node.attrs.get("pattern", node.op_type),
                      "desc": describe(fused, node), "template": name, "config": config,
                      "workload": wl, "inputs": list(node.inputs), "outputs": list(node.outputs)})
        used.update(node.inputs)
        used.update(o for o in node.outputs if o)
    used.update(fused.outputs)
    tensors = {}
    for name in sorted(used | set(fused.inputs)):
        t = fused.tensors[name]
        tensors[name] = {"shape": list(t.shape), "dtype": t.dtype.name,
                         "layout": list(t.layout) if t.layout else None, "const": t.is_const}
    program = {"format": FORMAT_VERSION, "modelc": VERSION, "name": fused.name,
               "inputs": [{"name": n, "shape": list(fused.tensors[n].shape),
                           "dtype": fused.tensors[n].dtype.name} for n in fused.inputs],
               "outputs": [{"name": n, "shape": list(fused.tensors[n].shape),
                            "dtype": fused.tensors[n].dtype.name} for n in fused.outputs],
               "tensors": tensors, "steps": steps}
    consts = {n: fused.tensors[n].value for n, t in tensors.items() if t["const"]}
    if ctx is not None:
        ctx.report([s for s in steps if get_tunable(s)])
    return program, consts


def get_tunable(step: dict) -> bool:
    return get_template(step["template"]).tunable


def compile(model, shape: dict | None = None, jobs: int | None = None, progress: bool = False) -> Module:
    """Compile an ONNX model (path, bytes, ModelProto or imported Graph) into a Module.

    Kernels use the best records of an active `ApplyHistoryBest` context and default configs
    otherwise; kernels already in the cache are not compiled again.
    """
    graph = model if isinstance(model, Graph) else from_onnx(model, shape=shape)
    program, consts = build_program(lower(graph))
    if graph.tail is not None:
        program["tail"] = {**graph.tail.interface(), "model_outputs": list(graph.model_outputs)}
    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=len(program["steps"]), desc="compiling kernels", unit="kernel")
    try:
        return Module(program, consts, jobs=jobs, progress=(bar.update if bar else None), tail=graph.tail)
    finally:
        if bar:
            bar.close()
