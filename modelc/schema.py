"""The generic checks of a JSON document's fields, shared by every reader of outside documents
(validate.py for modules, records and workloads; te/document.py for te kernels): each refusal is a
`DocumentError` that names the field."""
from __future__ import annotations

import re

from .errors import ModelcError

MAX_RANK = 16
MAX_DIM = 1 << 40


class DocumentError(ModelcError):
    """A saved module, tuning record or workload that modelc refuses to use; names the field."""


def fail(path: str, msg: str):
    raise DocumentError(f"{path}: {msg}")


def show(v) -> str:
    s = repr(v)
    return s if len(s) <= 60 else s[:57] + "..."


def is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def check_int(v, path: str, lo: int | None = None, hi: int | None = None) -> int:
    if not is_int(v) or (lo is not None and v < lo) or (hi is not None and v > hi):
        rng = f" in [{lo}, {hi}]" if hi is not None else (f" >= {lo}" if lo is not None else "")
        fail(path, f"expected an integer{rng}, got {show(v)}")
    return v


def check_str(v, path: str, pattern: re.Pattern | None = None, choices=None) -> str:
    if not isinstance(v, str):
        fail(path, f"expected a string, got {show(v)}")
    if choices is not None and v not in choices:
        fail(path, f"{show(v)} is not one of modelc's names ({', '.join(sorted(choices)[:12])} ...)")
    if pattern is not None and not pattern.fullmatch(v):
        fail(path, f"{show(v)} is not a name modelc makes")
    return v


def check_keys(d, path: str, required: set, optional: set = frozenset()) -> dict:
    if not isinstance(d, dict):
        fail(path, f"expected an object, got {type(d).__name__}")
    missing = required - set(d)
    if missing:
        fail(path, f"missing field(s) {sorted(missing)}")
    extra = set(d) - required - set(optional)
    if extra:
        fail(path, f"unknown field(s) {sorted(map(str, extra))[:5]}")
    return d


def check_list(v, path: str, max_len: int | None = None) -> list:
    if not isinstance(v, list):
        fail(path, f"expected a list, got {type(v).__name__}")
    if max_len is not None and len(v) > max_len:
        fail(path, f"has {len(v)} entries, at most {max_len} allowed")
    return v


def check_shape(v, path: str) -> tuple:
    check_list(v, path, MAX_RANK)
    return tuple(check_int(d, f"{path}[{k}]", 0, MAX_DIM) for k, d in enumerate(v))
