"""Importing this module registers every kernel template, most specific first."""
from . import conv2d, winograd, conv2d_int8  # noqa: F401
from . import dense, matmul, dense_int8  # noqa: F401
from . import depthwise, expand_depthwise, expand_depthwise_int8  # noqa: F401
from . import conv_generic  # noqa: F401  (after conv2d and depthwise)
from . import pool, pool_nd  # noqa: F401
from . import softmax, layernorm, reduce, arg_reduce, scan, select, logsumexp  # noqa: F401
from . import lrn, recurrent  # noqa: F401
from . import scatter  # noqa: F401
from . import injective  # noqa: F401,E402  (after the specialised templates)
from . import fallback  # noqa: F401,E402  (matches everything: keep it last)
from ..te import template as _te  # noqa: F401,E402  (te kernels: never an ONNX workload)
