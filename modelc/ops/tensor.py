"""Former home of the data-movement ops, now split by concept (shape, generate, cast, gather, pad,
resize). Only the old private names the kernel templates import remain, until they import the
public ones from `ops.resize`; then this module goes.
"""
from .resize import interpolation_taps, resize_plan, source_coords

_resize_plan = resize_plan            # alias until kernels switch
_source_coords = source_coords        # alias until kernels switch
_taps = interpolation_taps            # alias until kernels switch
