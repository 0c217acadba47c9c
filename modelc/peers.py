"""The runtimes modelc is measured against, each as `run(feeds) -> [outputs]` on a thread count.

onnxruntime is a dependency (it checks every compiled model); OpenVINO is an optional extra
(`pip install -e ".[openvino]"`), configured as docs/performance.md describes for a like-for-like
comparison: the CPU plugin, float32 inference precision, the latency hint and the same threads.
"""
from __future__ import annotations

from .errors import ModelcError

PEERS = ("onnxruntime", "openvino")


def onnxruntime_options(threads: int):
    """onnxruntime as modelc is compared with it: every graph optimisation, `threads` intra-op threads."""
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return so


def onnxruntime_runner(path: str, threads: int, shapes: dict | None = None):
    import onnxruntime as ort
    sess = ort.InferenceSession(path, onnxruntime_options(threads), providers=["CPUExecutionProvider"])
    return lambda feeds: sess.run(None, feeds)


def openvino_compiled(path: str, threads: int, shapes: dict | None = None, perf_count: bool = False):
    """OpenVINO's compiled model as modelc is compared with it (`perf_count`: with its per-node timers,
    for the per-layer report)."""
    try:
        import openvino as ov
    except ImportError:
        raise ModelcError("comparing against OpenVINO needs the openvino extra: "
                          "pip install -e \".[openvino]\"") from None
    core = ov.Core()
    model = core.read_model(path)
    if shapes:                       # static shapes, as modelc compiles them (a dynamic batch is slower)
        model.reshape({name: ov.PartialShape(list(s)) for name, s in shapes.items()})
    return core.compile_model(model, "CPU", {"INFERENCE_NUM_THREADS": int(threads),
                                             "PERFORMANCE_HINT": "LATENCY",
                                             "INFERENCE_PRECISION_HINT": "f32",
                                             "PERF_COUNT": bool(perf_count)})


def openvino_runner(path: str, threads: int, shapes: dict | None = None):
    compiled = openvino_compiled(path, threads, shapes)
    request = compiled.create_infer_request()
    n_out = len(compiled.outputs)

    def run(feeds):
        request.infer(feeds)
        return [request.get_output_tensor(i).data.copy() for i in range(n_out)]
    return run


def runner(name: str, path: str, threads: int, shapes: dict | None = None):
    """A peer runtime's `run(feeds) -> [outputs]` for the model at `path`."""
    if name not in PEERS:
        raise ModelcError(f"unknown runtime {name!r} to compare against (known: {', '.join(PEERS)})")
    return {"onnxruntime": onnxruntime_runner, "openvino": openvino_runner}[name](path, threads, shapes)
