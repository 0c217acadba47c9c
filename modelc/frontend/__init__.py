"""ONNX frontend: `from_onnx(model, shape=None) -> Graph`."""
from .onnx_import import from_onnx, load_model

__all__ = ["from_onnx", "load_model"]
