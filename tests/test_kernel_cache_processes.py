"""Processes sharing a kernel cache compile each kernel once: the others wait and load it."""
import json
import subprocess
import sys
import time

from modelc.kernels import cache

CHILD = """
import json, os, sys, time
from modelc.kernels import cache
path, start = sys.argv[1], float(sys.argv[2])
time.sleep(max(0.0, start - time.time()))      # both at once
t0 = time.time()
mod = cache.import_file(path)
st = mod.drive.stats
print(json.dumps({"compiled": sum(st.cache_misses.values()), "loaded": sum(st.cache_hits.values()),
                  "began": t0, "ended": time.time()}))
"""


def test_two_processes_compile_a_kernel_once(tmp_path, monkeypatch):
    monkeypatch.setenv("MODELC_CACHE_DIR", str(tmp_path / "c"))
    source = cache.launch.driver_source(6)        # a parallel njit: about a second's compile
    path = cache.source_path(source)
    cache.write_source(path, source)
    start = time.time() + 8.0                       # after both have imported modelc
    procs = [subprocess.Popen([sys.executable, "-c", CHILD, path, str(start)],
                              stdout=subprocess.PIPE, text=True) for _ in range(2)]
    got = [json.loads(p.communicate(timeout=300)[0].strip().splitlines()[-1]) for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert all(g["began"] < start + 1.0 for g in got), got      # they did start together
    assert sorted((g["compiled"], g["loaded"]) for g in got) == [(0, 1), (1, 0)], got
