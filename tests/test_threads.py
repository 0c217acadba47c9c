"""A compiled module is used as onnxruntime's session is: from many threads at once."""
import threading

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import modelc


def _model():
    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array(rng.standard_normal((16, 8, 3, 3)).astype(np.float32) * 0.2, "w1")
    w2 = numpy_helper.from_array(rng.standard_normal((16, 16, 1, 1)).astype(np.float32) * 0.2, "w2")
    wd = numpy_helper.from_array(rng.standard_normal((16 * 4 * 4, 10)).astype(np.float32) * 0.1, "wd")
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2"], ["c2"]),
             helper.make_node("Add", ["c2", "r1"], ["s"]),
             helper.make_node("MaxPool", ["s"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Flatten", ["p"], ["f"]),
             helper.make_node("MatMul", ["f", "wd"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 8, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10]),
                           helper.make_tensor_value_info("p", TensorProto.FLOAT, [1, 16, 4, 4])], [w1, w2, wd])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


@pytest.fixture(scope="module")
def module():
    return modelc.compile(_model())


@pytest.mark.parametrize("threads", [4, 8])
def test_concurrent_runs_each_get_their_own_result(module, threads):
    rng = np.random.default_rng(1)
    xs = [rng.standard_normal((1, 8, 8, 8)).astype(np.float32) for _ in range(threads)]
    want = [module.run({"x": x}) for x in xs]
    wrong, errors, runs = [0], [], 60
    start = threading.Barrier(threads)

    def work(k):
        try:
            start.wait()
            for _ in range(runs):
                got = module.run({"x": xs[k]})
                if any(not np.array_equal(got[n], want[k][n]) for n in want[k]):
                    wrong[0] += 1
        except Exception as e:          # pragma: no cover - reported below
            errors.append(e)

    ts = [threading.Thread(target=work, args=(k,)) for k in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors
    print(f"{threads} threads x {runs} runs: {wrong[0]} wrong results, "
          f"{module.memory_report()['contexts']} buffer sets")
    assert wrong[0] == 0
    assert module.memory_report()["contexts"] <= threads + 1


def _rss_kib() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def test_ten_thousand_runs_do_not_grow_memory(module):
    x = np.random.default_rng(2).standard_normal((1, 8, 8, 8)).astype(np.float32)
    for _ in range(200):                    # warm: allocator pools and caches settle
        module.run({"x": x})
    before = _rss_kib()
    for _ in range(10_000):
        module.run({"x": x})
    after = _rss_kib()
    print(f"RSS before {before} KiB, after 10,000 runs {after} KiB ({after - before:+d} KiB)")
    assert after - before < 4096


def test_tuning_context_is_per_thread():
    """`with ApplyHistoryBest(...)` in one thread does not reach a compile in another."""
    from modelc.tune import dispatch
    from modelc.tune.records import ApplyHistoryBest
    seen = {}
    inside, done = threading.Event(), threading.Event()

    def tuned():
        with ApplyHistoryBest([]) as ctx:
            seen["tuned"] = dispatch.current() is ctx
            inside.set()
            done.wait(10)

    t = threading.Thread(target=tuned)
    t.start()
    inside.wait(10)
    seen["other"] = dispatch.current()
    done.set()
    t.join()
    assert seen == {"tuned": True, "other": None}


def test_without_memory_for_more_buffers_callers_wait_their_turn(monkeypatch):
    from modelc import memory
    mod = modelc.compile(_model())
    monkeypatch.setattr(memory, "available_bytes", lambda: 0)
    rng = np.random.default_rng(3)
    xs = [rng.standard_normal((1, 8, 8, 8)).astype(np.float32) for _ in range(4)]
    want = [mod.run({"x": x})["y"] for x in xs]
    wrong = []

    def work(k):
        for _ in range(20):
            wrong.append(not np.array_equal(mod.run({"x": xs[k]})["y"], want[k]))

    ts = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert len(wrong) == 80 and not any(wrong)
    assert mod.memory_report()["contexts"] == 1


def test_memory_check_respects_the_address_space_limit():
    """Under `ulimit -v` the check counts what the limit leaves, not the machine's free memory."""
    import subprocess
    import sys
    code = ("import resource; resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))\n"
            "from modelc import memory\n"
            "try:\n    memory.check({'x': 4 << 30}, 'a test')\nexcept memory.OutOfMemoryError as e:\n"
            "    print('refused:', e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120).stdout
    assert out.startswith("refused:") and "'x'" in out, out
