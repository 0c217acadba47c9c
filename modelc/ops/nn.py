"""Former home of the neural-network ops, now split by concept (window, conv, pool, norm, softmax).
Only the old private names the kernel templates import remain, until they import the public ones
from `ops.window`; then this module goes.
"""
from .window import conv_transpose_geometry, window_geometry

_geometry = window_geometry                   # alias until kernels switch
_convt_geometry = conv_transpose_geometry     # alias until kernels switch
