"""Example models with seeded weights, built with onnx.helper (no torch, no downloads).

`build(name, seed=0)` returns an `onnx.ModelProto`; `cached_path(name)` builds it once into
`$MODELC_CACHE_DIR/models/` (default `~/.cache/modelc/models/`) and returns the file path.
"""
from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

import onnx

from ._stats import count_macs, count_params
from .efficientnet import efficientnet_b0
from .mobilenet import mobilenet_v2
from .resnet import resnet18, resnet34, resnet50
from .squeezenet import squeezenet1_1
from .transformer import transformer

MODELS = {
    "resnet18": resnet18,
    "resnet34": resnet34,
    "resnet50": resnet50,
    "mobilenet_v2": mobilenet_v2,
    "squeezenet1_1": squeezenet1_1,
    "efficientnet_b0": efficientnet_b0,
    "transformer": transformer,
}

__all__ = ["MODELS", "build", "save", "cached_path", "cache_dir", "builder_version",
           "count_params", "count_macs", *MODELS]


def build(name: str, seed: int = 0) -> onnx.ModelProto:
    """The model `name` with weights drawn from `seed` (same seed, same bytes)."""
    try:
        builder = MODELS[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; available models: {', '.join(MODELS)}") from None
    return builder(seed=seed)


def save(name: str, path, seed: int = 0) -> str:
    """Build `name` and write it to `path` atomically; returns the path."""
    path = os.fspath(path)
    _atomic_write(build(name, seed).SerializeToString(), path)
    return path


def builder_version() -> str:
    """A hash of the builders' source: any change to them gives new cache file names."""
    h = hashlib.sha256()
    for src in sorted(Path(__file__).parent.glob("*.py")):
        h.update(src.name.encode() + b"\0" + src.read_bytes())
    return h.hexdigest()[:12]


def cache_dir() -> Path:
    root = os.environ.get("MODELC_CACHE_DIR") or os.path.join("~", ".cache", "modelc")
    return Path(root).expanduser() / "models"


def cached_path(name: str, seed: int = 0) -> str:
    """Path of the built model `name`, building it on first use."""
    if name not in MODELS:
        build(name)  # raises the ValueError listing the names
    path = cache_dir() / f"{name}-seed{seed}-{builder_version()}.onnx"
    if not path.exists():
        save(name, path, seed)
    return str(path)


def _atomic_write(data: bytes, path: str) -> None:
    """Write to a temporary file in the same folder, then rename: readers never see half a file."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-", suffix=".onnx")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
