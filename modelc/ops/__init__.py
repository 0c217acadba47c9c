"""The operator registry; importing this package registers every supported op."""
from . import elementwise, internal, linalg, nn, reduce, tensor  # noqa: F401  (registration)
from .registry import REGISTRY, Kind, OpDef, evaluate, get, infer, register, supported_ops

__all__ = ["REGISTRY", "Kind", "OpDef", "evaluate", "get", "infer", "register", "supported_ops"]
