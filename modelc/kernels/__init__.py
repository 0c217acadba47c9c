"""Kernel templates, their config spaces, code generation and the on-disk kernel cache.

Importing this package before numba lets modelc start numba with 512-bit vectors preferred on
AVX-512 machines (LLVM otherwise prefers 256-bit vectors there; see shared/PERFORMANCE.md: the
same convolution went from 114 to 157-197 GFLOP/s). A user's own NUMBA_CPU_FEATURES is respected.
"""
import os
import sys


def _prefer_wide_vectors():
    if "NUMBA_CPU_FEATURES" in os.environ or "numba" in sys.modules:
        return
    try:
        import llvmlite.binding as llvm
        features = llvm.get_host_cpu_features().flatten()
    except Exception:
        return
    if "+avx512f" in features.split(","):
        os.environ["NUMBA_CPU_FEATURES"] = features + ",-prefer-256-bit"


_prefer_wide_vectors()
