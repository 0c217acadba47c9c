"""Kernels as serial chunks launched by a parallel driver: every item computed once, whatever the
split; bodies with several parallel loops or none; arguments checked before any pointer is used."""
import numpy as np
import pytest

from modelc.kernels import cache
from modelc.kernels.template import parallel_loop, source

TWO_LOOPS = [parallel_loop("i", 7),
             "    out0[i] = in0[i] * np.float32(2.0)",
             parallel_loop("j", 3),
             "    out1[j] = out1[j] + in0[j] + np.float32(1.0)"]   # += shows an item run twice


@pytest.mark.parametrize("nchunks", [1, 2, 3, 10, 64])
def test_every_item_of_every_loop_runs_once(nchunks):
    fn = cache.load(source(["out0", "out1", "in0"], [np.float32] * 3, TWO_LOOPS))
    assert fn.n_items == 10 and fn.outputs == (0, 1)
    x = np.arange(7, dtype=np.float32)
    out0, out1 = np.zeros(7, np.float32), np.zeros(3, np.float32)
    call = fn.bind([out0, out1, x], nchunks=nchunks)
    assert call.nchunks == min(nchunks, 10)
    call()
    np.testing.assert_array_equal(out0, 2 * x)
    np.testing.assert_array_equal(out1, x[:3] + 1)


def test_default_split_is_one_chunk_per_thread_when_bound():
    import numba
    fn = cache.load(source(["out0", "out1", "in0"], [np.float32] * 3, TWO_LOOPS))
    args = [np.zeros(7, np.float32), np.zeros(3, np.float32), np.zeros(7, np.float32)]
    old = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        assert fn.bind(args).nchunks == 1
        numba.set_num_threads(numba.config.NUMBA_NUM_THREADS)
        assert fn.bind(args).nchunks == min(numba.config.NUMBA_NUM_THREADS, 10)
    finally:
        numba.set_num_threads(old)


def test_body_without_parallel_loop_is_one_item():
    fn = cache.load(source(["out0", "in0"], [np.int64] * 2, ["out0[0] = out0[0] + in0[0] + 1"]))
    out, x = np.zeros(1, np.int64), np.array([41], np.int64)
    fn.bind([out, x], nchunks=4)()
    assert fn.n_items == 1 and out[0] == 42


def test_views_read_the_argument_memory_as_nd_arrays():
    body = [parallel_loop("i", 2), "    for j in range(3):", "        out0[i * 3 + j] = X[i, j] + X[1 - i, j]"]
    fn = cache.load(source(["out0", "in0"], [np.float32] * 2, body, views={"X": ("in0", (2, 3))}))
    x = np.arange(6, dtype=np.float32)
    out = np.zeros(6, np.float32)
    fn(out, x)
    np.testing.assert_array_equal(out, (x.reshape(2, 3) + x.reshape(2, 3)[::-1]).reshape(-1))


def test_arguments_are_checked_before_the_kernel_sees_a_pointer():
    fn = cache.load(source(["out0", "out1", "in0"], [np.float32] * 3, TWO_LOOPS))
    x = np.zeros(7, np.float32)
    with pytest.raises(TypeError, match="float32"):
        fn(np.zeros(7, np.float64), np.zeros(3, np.float32), x)
    with pytest.raises(TypeError, match="takes 3"):
        fn(np.zeros(7, np.float32), x)
    with pytest.raises(ValueError, match="overlaps"):
        fn(x, np.zeros(3, np.float32), x)                 # output 0 is also the input
    with pytest.raises(TypeError, match="C-contiguous"):
        fn(np.zeros(14, np.float32)[::2], np.zeros(3, np.float32), x)


def test_compiled_kernels_are_cached_on_disk():
    src = source(["out0", "in0"], [np.float32] * 2, [parallel_loop("i", 4), "    out0[i] = in0[i] + np.float32(3.0)"])
    cache.load(src)
    assert cache.is_compiled(cache.source_path(src))


def test_compiled_kernels_are_found_under_the_users_numba_cache_dir(tmp_path, monkeypatch):
    """With NUMBA_CACHE_DIR set, numba keeps its index there, not beside the kernel's file."""
    from numba.core import config
    monkeypatch.setattr(config, "CACHE_DIR", str(tmp_path))
    src = source(["out0", "in0"], [np.float32] * 2,
                 [parallel_loop("i", 4), f"    out0[i] = in0[i] + np.float32({tmp_path.stat().st_ino % 997})"])
    assert not cache.is_compiled(cache.source_path(src))
    cache.load(src)
    assert cache.is_compiled(cache.source_path(src)) and any(tmp_path.rglob("*.nbi"))


def test_profiled_sequence_stamps_each_kernel_where_it_runs():
    """The stamped sequence computes what the plain one does and charges each kernel its own
    time: a kernel doing ~500x the work of another takes many times its ticks."""
    from modelc.kernels import launch
    heavy = cache.load(source(["out0", "in0"], [np.float32] * 2, [
        parallel_loop("i", 64),
        "    s = np.float32(0.0)",
        "    for r in range(20000):",
        "        s = s * np.float32(0.5) + in0[(i + r) % 64]",
        "    out0[i] = s"]))
    light = cache.load(source(["out0", "in0"], [np.float32] * 2, [
        parallel_loop("i", 64), "    out0[i] = in0[i] + np.float32(1.0)"]))
    x = np.arange(64, dtype=np.float32)
    a, b = np.zeros(64, np.float32), np.zeros(64, np.float32)
    seq = launch.Sequence([light.bind([a, x]), heavy.bind([b, x])], cache.sequence_runner())
    run, counter = cache.profiled_sequence_runner()
    ticks = [seq.stamped(run) for _ in range(7)]
    np.testing.assert_array_equal(a, x + 1)
    assert b.min() > 0
    if counter() == 0:
        pytest.skip("no cycle counter on this CPU")
    # the run the machine disturbed least: with other work on both cores (a model compiled and timed
    # beside the test suite) the median of 5 runs read light 16.8M ticks and heavy 198, stamps of a
    # descheduled thread 0; so a kernel now ends when its last chunk does, on any thread, and the first
    # starts with the team's first thread (beside another pytest worker this read light 13.4M, heavy 171
    # in each of 7 runs; since then it passed beside one and two busy loops)
    light_t, heavy_t = min(ticks, key=sum)
    assert light_t > 0 and heavy_t > 20 * light_t


def _chain(n_kernels, n, nchunks):
    """Kernels each adding one to the previous one's output: any chunk run out of order, twice or
    not at all shows in the last buffer."""
    fn = cache.load(source(["out0", "in0"], [np.float32] * 2, [
        parallel_loop("i", n), "    out0[i] = in0[i] + np.float32(1.0)"]))
    bufs = [np.zeros(n, np.float32) for _ in range(n_kernels + 1)]
    return [fn.bind([bufs[k + 1], bufs[k]], nchunks=nchunks) for k in range(n_kernels)], bufs


@pytest.mark.parametrize("nchunks,threads", [(2, None), (7, None), (3, 1), (1, None)])
def test_a_sequence_runs_its_kernels_in_order_whatever_the_team(nchunks, threads):
    """One parallel region for the whole sequence: a kernel starts only when every chunk of the one
    before is done, also when the team has fewer threads than chunks (a thread then runs the
    chunks no one else claimed) or one thread only."""
    import numba
    from modelc.kernels import launch
    before = numba.get_num_threads()
    try:
        if threads:
            numba.set_num_threads(threads)
        calls, bufs = _chain(40, 1000, nchunks)
        seq = launch.Sequence(calls, cache.sequence_runner())
        # a parallel kernel's items in SEQUENCE_SPLIT chunks a thread, so that the others share a slow one's
        assert set(seq.chunks) == {nchunks * launch.SEQUENCE_SPLIT if nchunks > 1 else 1} and seq.nthreads == nchunks
        for rep in range(1, 4):
            seq()
            np.testing.assert_array_equal(bufs[-1], np.full(1000, 40, np.float32))
    finally:
        numba.set_num_threads(before)


def test_sequences_run_from_several_threads_at_once():
    import threading
    from modelc.kernels import launch
    runs = [_chain(30, 5000, 2) for _ in range(3)]
    seqs = [launch.Sequence(calls, cache.sequence_runner()) for calls, _ in runs]
    errors = []

    def work(seq, bufs):
        for _ in range(50):
            bufs[-1][:] = 0
            seq()
            if not (bufs[-1] == 30).all():
                errors.append(bufs[-1].copy())

    threads = [threading.Thread(target=work, args=(s, b)) for s, (_, b) in zip(seqs, runs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


_X86 = __import__("platform").machine().lower() in ("x86_64", "amd64")


@pytest.mark.skipif(not _X86, reason="MXCSR is x86's")
@pytest.mark.parametrize("how", ["bound", "sequence", "sequence_one_thread"])
def test_kernels_flush_denormals_and_their_threads_keep_their_own_mode(how):
    """Every kernel runs with flush-to-zero and denormals-are-zero set (a denormal operand costs x86
    a microcode assist: Swin's masked attention products ran 24x slower); each thread's own mode
    comes back after the run: numpy on the caller's thread and numba's team still make denormals."""
    import numba
    from modelc.kernels import launch
    fn = cache.load(source(["out0", "in0", "in1"], [np.float32] * 3, [
        parallel_loop("i", 64), "    out0[i] = in0[i] * in1[i] + in1[i] * np.float32(0.0)"]))
    tiny = np.full(64, 1e-30, np.float32)
    small = np.full(64, 1e-10, np.float32)
    denormal = np.full(64, 1e-40, np.float32)           # read as 0: 0 * 1 + 1 * 0
    out = np.full(64, np.nan, np.float32)
    before = numba.get_num_threads()
    try:
        numba.set_num_threads(1 if how == "sequence_one_thread" else before)
        first = fn.bind([out, tiny, small], nchunks=1 if how == "sequence_one_thread" else 2)
        second = fn.bind([np.zeros(64, np.float32), denormal, np.ones(64, np.float32)], nchunks=first.nchunks)
        if how == "bound":
            first()
            second()
        else:
            launch.Sequence([first, second], cache.sequence_runner())()
    finally:
        numba.set_num_threads(before)
    assert (out == 0).all()                             # 1e-40 would be a denormal: flushed
    assert (second.arrays[0] == 0).all()
    assert np.float32(1e-30) * np.float32(1e-10) > 0    # the caller's thread: denormals as before

    @numba.njit(parallel=True)
    def team_modes(n):
        modes = np.zeros(n, np.int32)
        for t in numba.prange(n):
            old = launch.flush_denormals(np.int32(0))
            launch.restore_csr(old)
            modes[t] = old & launch.FLUSH_DENORMALS
        return modes
    assert (team_modes(64) == 0).all()                  # nor left set in numba's threads


@pytest.mark.skipif(not _X86, reason="MXCSR is x86's")
def test_denormals_are_kept_on_request_from_the_next_run_on():
    import modelc
    from onnx import TensorProto, helper
    from workloads import onnx_model
    m = onnx_model([helper.make_node("Mul", ["x", "y"], ["z"])],
                   [helper.make_tensor_value_info(n, TensorProto.FLOAT, [64]) for n in "xy"],
                   [helper.make_tensor_value_info("z", TensorProto.FLOAT, [64])])
    mod = modelc.compile(m)
    x, y = np.full(64, 1e-30, np.float32), np.full(64, 1e-10, np.float32)
    assert (mod(x, y) == 0).all()
    try:
        modelc.set_flush_denormal(False)
        np.testing.assert_array_equal(mod(x, y), x * y)     # 1e-40, as numpy computes it
    finally:
        modelc.set_flush_denormal(True)
    assert (mod(x, y) == 0).all()
