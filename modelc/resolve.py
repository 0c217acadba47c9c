"""What a model argument names: a file as given, or a built-in example model by name.

Every command that takes a model (the CLI's subcommands, `compare`) resolves it here, below them all.
"""
from __future__ import annotations

import os

from .errors import ModelcError


def resolve_model(model: str) -> str:
    """A path as given, or the cached file of a built-in example model (built on first use)."""
    if os.path.exists(model) or os.sep in model or model.endswith(".onnx"):
        return model
    try:
        import models
    except ImportError:
        raise ModelcError(f"{model!r} is not a file, and the built-in example models are not installed")
    if model not in models.MODELS:
        raise ModelcError(f"{model!r} is neither a file nor a built-in model "
                          f"(built-in: {', '.join(sorted(models.MODELS))})")
    return models.cached_path(model)
