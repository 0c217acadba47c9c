"""The kernel cache's files are untrusted: a kernel file is executed only if its name is the hash
of its text, never from a planted .pyc, and a cache folder other users can write to is refused."""
import glob
import os

import pytest

from modelc.errors import ModelcError
from modelc.kernels import cache

SOURCE = cache.launch.driver_source(4)


@pytest.fixture
def fresh(tmp_path, monkeypatch):
    monkeypatch.setenv("MODELC_CACHE_DIR", str(tmp_path / "c"))
    monkeypatch.setattr(cache, "_loaded", {})
    return tmp_path


def test_a_modified_kernel_file_is_refused_and_rewritten(fresh):
    path = cache.source_path(SOURCE)
    cache.write_source(path, SOURCE)
    with open(path, "a") as f:
        f.write("\nimport os; os.system('touch /tmp/modelc_pwned_cache')\n")
    with pytest.raises(ModelcError, match="hash"):
        cache.import_file(path)
    cache.write_source(path, SOURCE)                     # the next compile puts the true text back
    assert open(path).read() == SOURCE
    cache.import_file(path)
    assert not os.path.exists("/tmp/modelc_pwned_cache")


def test_no_bytecode_is_written_or_read(fresh):
    path = cache.source_path(SOURCE)
    cache.write_source(path, SOURCE)
    cache.import_file(path)
    assert not glob.glob(os.path.join(os.path.dirname(path), "__pycache__", "*.pyc"))


def test_a_cache_others_can_write_is_refused(fresh):
    d = cache.kernel_dir()
    os.chmod(d, 0o777)
    try:
        with pytest.raises(ModelcError, match="writable by other users"):
            cache.kernel_dir()
    finally:
        os.chmod(d, 0o700)
    assert cache.kernel_dir() == d
