"""modelc: an ONNX model compiler for CPUs that tunes its own kernels."""
from .version import VERSION as __version__

from . import kernels as _kernels  # noqa: F401  (starts numba with this CPU's vector width)
from .errors import ModelcError
from .frontend import from_onnx
from .extract import extract_tasks
from . import reference
from .compiler import compile
from .runtime import Module, load
from .tune.records import ApplyHistoryBest
from .tune.tuning import tune
from .te.task import SearchTask, register_workload
from .kernels.launch import set_flush_denormal

__all__ = ["ApplyHistoryBest", "ModelcError", "Module", "compile", "tune", "extract_tasks", "from_onnx", "load",
           "reference", "SearchTask", "register_workload", "set_flush_denormal", "__version__"]
