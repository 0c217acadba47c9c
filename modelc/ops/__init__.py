"""The operator registry; importing this package registers every supported op."""
from . import (  # noqa: F401  (registration)
    cast, conv, elementwise, gather, generate, internal, linalg, norm, pad, pool, recurrent, reduce, resize, sample,
    shape, softmax,
)
from .registry import REGISTRY, Kind, OpDef, evaluate, get, infer, register, supported_ops

__all__ = ["REGISTRY", "Kind", "OpDef", "evaluate", "get", "infer", "register", "supported_ops"]
