"""The kernel cache's bound: least recently used kernels go first; recent and locked ones stay."""
import json
import os
import subprocess
import sys
import time

import pytest

from modelc import cli
from modelc.errors import ModelcError
from modelc.kernels import cache, cache_files


def source(k: int) -> str:
    return f"import numba\n\n@numba.njit('f8(f8)', cache=True)\ndef f(x):\n    return x + {k}\n"


@pytest.fixture
def fresh(tmp_path, monkeypatch):
    monkeypatch.setenv("MODELC_CACHE_DIR", str(tmp_path / "c"))
    monkeypatch.setattr(cache, "_loaded", {})
    return tmp_path


def compiled(k: int, used_ago_s: float) -> str:
    """A compiled kernel file, last used `used_ago_s` seconds ago."""
    path = cache.source_path(source(k))
    cache.write_source(path, source(k))
    assert cache.import_file(path).f(1.0) == 1.0 + k
    assert cache.is_compiled(path)
    st = os.stat(path)
    os.utime(path, ns=(time.time_ns() - int(used_ago_s * 1e9), st.st_mtime_ns))
    return path


def files_of(path: str) -> list:
    stem = os.path.basename(path)[:-3]
    d = cache.numba_dir(path)
    return [path] + [os.path.join(d, f) for f in os.listdir(d) if f.startswith(stem + ".")]


def test_prune_removes_the_least_recently_used_first(fresh):
    paths = [compiled(k, ago) for k, ago in ((1, 9000), (2, 3 * 3600), (3, 7200))]
    sizes = [sum(os.path.getsize(f) for f in files_of(p)) for p in paths]
    assert all(len(files_of(p)) == 3 for p in paths)            # source, numba's index and code
    assert [e.stem for e in cache_files.entries()] == [os.path.basename(paths[i])[:-3] for i in (1, 0, 2)]
    removed, freed, left, size = cache_files.prune(sum(sizes) - 1)
    assert (removed, freed, left, size) == (1, sizes[1], 2, sizes[0] + sizes[2])
    assert not any(os.path.exists(f) for f in files_of(paths[1])) and not os.path.exists(paths[1])
    assert all(os.path.exists(p) and cache.is_compiled(p) for p in (paths[0], paths[2]))


def test_recently_used_and_locked_kernels_stay(fresh):
    recent, held, old = compiled(1, 60), compiled(2, 7200), compiled(3, 7200)
    holder = subprocess.Popen([sys.executable, "-c", "import fcntl, os, sys, time\n"
                               "fd = os.open(sys.argv[1], os.O_RDONLY); fcntl.flock(fd, fcntl.LOCK_EX)\n"
                               "print('held', flush=True); time.sleep(60)", held],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        removed, _, left, _ = cache_files.prune(0)
    finally:
        holder.kill()
        holder.wait()
    assert (removed, left) == (1, 2)
    assert os.path.exists(recent) and os.path.exists(held) and not os.path.exists(old)
    assert cache_files.prune(0, keep_recent_s=0.0)[::2] == (2, 0)     # unlocked, cleared: both


def test_loading_marks_a_kernel_used_and_numba_still_loads_it(fresh):
    # (modelc marks it; where the file system keeps access times (relatime) the read does too)
    path = compiled(1, 7200)
    mtime = os.stat(path).st_mtime_ns
    child = ("import json, sys\nfrom modelc.kernels import cache\nm = cache.import_file(sys.argv[1])\n"
             "print(json.dumps(sum(m.f.stats.cache_hits.values())))")
    out = subprocess.run([sys.executable, "-c", child, path], capture_output=True, text=True, check=True).stdout
    assert json.loads(out) == 1                                  # numba's cache stayed valid
    st = os.stat(path)
    assert st.st_mtime_ns == mtime and time.time() - st.st_atime < 600


def test_a_cache_past_its_bound_is_cut_to_most_of_it(fresh, monkeypatch):
    paths = [compiled(k, 7300 - 10 * k) for k in range(4)]       # oldest first
    total = sum(e.size for e in cache_files.entries())
    monkeypatch.setenv("MODELC_CACHE_MAX_SIZE", str(total - 1))
    cache_files.auto()
    left = cache_files.entries()
    assert sum(e.size for e in left) <= 0.8 * (total - 1) and len(left) < 4
    assert [os.path.exists(p) for p in paths][-len(left):] == [True] * len(left)    # the newest stay
    monkeypatch.setenv("MODELC_CACHE_MAX_SIZE", "0")             # no bound
    cache_files.auto()
    assert len(cache_files.entries()) == len(left)


def test_sizes_and_their_errors():
    assert [cache_files.parse_size(s) for s in ("900", "500M", "2G", "1.5GB", "64kib")] == \
        [900, 500 << 20, 2 << 30, 3 << 29, 64 << 10]
    with pytest.raises(ModelcError, match="MODELC_CACHE_MAX_SIZE='lots' is not a size"):
        cache_files.parse_size("lots")


def test_the_cache_command(fresh, capsys):
    for k in range(3):
        compiled(k, 7200)
    assert cli.main(["cache"]) == 0
    assert "3 kernels" in capsys.readouterr().out
    assert cli.main(["cache", "prune", "--max-size", "0"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("removed 3 least recently used kernels") and "0 kernels" in out
    assert cli.main(["cache", "prune", "--max-size", "much"]) == 2


def test_a_kernel_pruned_while_a_process_waited_for_it_is_written_again(fresh):
    path = compiled(5, 7200)
    assert cache_files.prune(0)[0] == 1 and not os.path.exists(path)
    cache._loaded.clear()
    mod = cache.import_file(path, source(5))      # (a loader that had read the text before the prune)
    assert mod.f(1.0) == 6.0 and os.path.exists(path) and cache.is_compiled(path)


def test_writes_that_never_finished_are_cleaned_up_after_an_hour(fresh):
    path = compiled(6, 60)
    d, nd = os.path.dirname(path), cache.numba_dir(path)
    stale = [os.path.join(d, "tmpab_12cd.tmp"),                                  # write_source's, numba's
             os.path.join(nd, os.path.basename(path)[:-3] + ".f-4.py311.1.nbc.tmp.0a1b")]
    fresh_tmp = os.path.join(d, "tmpzz_99.tmp")
    for f in stale + [fresh_tmp]:
        with open(f, "w") as fh:
            fh.write("x" * 100)
    for f in stale:
        os.utime(f, (time.time() - 7200, time.time() - 7200))
    assert cache_files.prune(1 << 40) == (0, 200, 1, sum(e.size for e in cache_files.entries()))
    assert not any(os.path.exists(f) for f in stale) and os.path.exists(fresh_tmp) and os.path.exists(path)
