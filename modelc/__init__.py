"""modelc: an ONNX model compiler for CPUs that tunes its own kernels."""
__version__ = "0.1.0"

from .errors import ModelcError  # noqa: E402
from .frontend import from_onnx  # noqa: E402
from .tune.task import extract_tasks  # noqa: E402
from . import reference  # noqa: E402

__all__ = ["ModelcError", "extract_tasks", "from_onnx", "reference", "__version__"]
