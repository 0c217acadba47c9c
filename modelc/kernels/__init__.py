"""Kernel templates, their config spaces, code generation and the on-disk kernel cache.

Importing this package before numba lets modelc start numba with 512-bit vectors preferred on
AVX-512 machines (`modelc.target.prefer_wide_vectors` says why).
"""
from ..target import prefer_wide_vectors

prefer_wide_vectors()

