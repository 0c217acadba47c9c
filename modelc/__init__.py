"""modelc: an ONNX model compiler for CPUs that tunes its own kernels."""
__version__ = "0.1.0"

from .errors import ModelcError  # noqa: E402
from .frontend import from_onnx  # noqa: E402
from . import reference  # noqa: E402

__all__ = ["ModelcError", "from_onnx", "reference", "__version__"]
