"""Cache flushing before timed runs: data is untouched, and flushed timings are per call."""
import numpy as np
import pytest

from modelc.kernels import cache
from modelc.kernels.template import source
from modelc.tune import cache_flush, timing

pytestmark = pytest.mark.skipif(not cache_flush.supported(), reason="clflush is x86 only")


def test_flush_keeps_every_value():
    for a in (np.arange(100_000, dtype=np.float32), np.arange(3, dtype=np.int64), np.zeros(0, np.float32)):
        before = a.copy()
        cache_flush.flush(a)
        np.testing.assert_array_equal(a, before)


def test_time_kernel_with_flush_times_each_call_after_evicting_the_weights():
    fn = cache.load(source(["out0", "in0", "w"], [np.float32] * 3,
                           ["for i in prange(4096):", "    out0[i] = in0[i] * w[i]"]))
    out, x, w = np.zeros(4096, np.float32), np.ones(4096, np.float32), np.full(4096, 2, np.float32)
    costs = timing.time_kernel(fn, [out, x, w], number=3, repeat=4, flush=[w])
    assert len(costs) == 4 and all(c > 0 for c in costs)
    np.testing.assert_array_equal(out, 2 * x)


def test_a_module_finds_all_but_the_anchors_first_input_cold():
    """What the runner evicts before each timed call: weights, bias, the output buffer and the
    residual; the input the previous kernel has just written stays warm."""
    from modelc.tune.worker import cold_arrays
    from workloads import conv2d_wl
    wl = conv2d_wl(C=16, H=8, W=8, K=16, k=3, s=1, p=1, hin=1, hout=0, residual=True)
    names = ["out0", "in0", "w", "bias", "in3"]
    arrays = [np.zeros(1) + k for k in range(len(names))]
    cold = cold_arrays(wl, names, arrays)
    assert [next(k for k, x in enumerate(arrays) if np.shares_memory(x, a)) for a in cold] == [0, 2, 3, 4]
    # as bytes, so that arrays of any dtype (float16: no numba type) can be evicted
    from modelc.tune.cache_flush import flush
    half = np.arange(100, dtype=np.float16)
    for a in cold_arrays(wl, names, [half] * len(names)):
        assert a.dtype == np.uint8 and a.size == half.nbytes
        flush(a)
    np.testing.assert_array_equal(half, np.arange(100, dtype=np.float16))
