"""modelc: an ONNX model compiler for CPUs that tunes its own kernels."""
__version__ = "0.1.0"

from . import kernels as _kernels  # noqa: E402,F401  (starts numba with this CPU's vector width)
from .errors import ModelcError  # noqa: E402
from .frontend import from_onnx  # noqa: E402
from .tune.task import extract_tasks  # noqa: E402
from . import reference  # noqa: E402
from .compiler import compile  # noqa: E402
from .runtime import Module, load  # noqa: E402
from .tune.records import ApplyHistoryBest  # noqa: E402
from .tune.tuning import tune  # noqa: E402

__all__ = ["ApplyHistoryBest", "ModelcError", "Module", "compile", "tune", "extract_tasks", "from_onnx", "load", "reference",
           "__version__"]
