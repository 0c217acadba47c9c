"""The executable Module: planned buffers, kernels in order, run, benchmark, save and load."""
from .module import Module, load

__all__ = ["Module", "load"]
