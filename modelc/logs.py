"""The library reports through the "modelc" logger (each module logs under it, by `__name__`);
the command line shows those messages as plain lines on stderr, as its own output."""
from __future__ import annotations

import contextlib
import logging
import sys


@contextlib.contextmanager
def to_stderr(level: int = logging.INFO):
    """While a command runs, the library's messages go to stderr as plain lines. The handler is
    removed afterwards, so a program that calls `cli.main` keeps its own logging as it was."""
    log = logging.getLogger("modelc")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    old_level = log.level
    log.addHandler(handler)
    log.setLevel(level)
    try:
        yield log
    finally:
        log.removeHandler(handler)
        log.setLevel(old_level)


def shown(verbose: int):
    """`to_stderr` while a call that was asked to report (`verbose`) runs in a program that has
    set up no logging of its own (else its own handlers decide)."""
    if verbose and not logging.getLogger("modelc").hasHandlers():
        return to_stderr()
    return contextlib.nullcontext()
