"""Worker processes import the modelc their parent runs, and one that cannot start says why."""
import os
import subprocess
import sys

import pytest

import modelc
from modelc.errors import ModelcError
from modelc.kernels import cache

PACKAGE = os.path.dirname(os.path.abspath(modelc.__file__))


def test_a_worker_imports_the_modelc_its_parent_imported(tmp_path):
    """A parent that took modelc from a folder of its own (a source tree on sys.path, ahead of an
    installed copy) starts workers that import that same modelc, not another one on their path."""
    src = tmp_path / "src"
    src.mkdir()
    os.symlink(PACKAGE, src / "modelc")
    parent = (f"import sys; sys.path.insert(0, {str(src)!r}); import modelc, subprocess\n"
              "from modelc.kernels import cache\n"
              "print(modelc.__file__)\n"
              "print(subprocess.check_output([sys.executable, '-c', 'import modelc; print(modelc.__file__)'],"
              " env=cache.worker_env(), text=True).strip())\n")
    out = subprocess.run([sys.executable, "-c", parent], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    mine, workers = out.stdout.split()
    assert mine.startswith(str(src)) and workers == mine


def test_the_path_keeps_the_users_entries_after_modelcs(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(["/some/where", "/else"]))
    monkeypatch.setattr(cache, "import_root", lambda: "/the/root")
    assert cache.worker_env()["PYTHONPATH"].split(os.pathsep) == ["/the/root", "/some/where", "/else"]
    monkeypatch.setattr(cache, "import_root", lambda: None)       # an installed modelc: the path as it was
    assert cache.worker_env()["PYTHONPATH"] == os.pathsep.join(["/some/where", "/else"])


def test_a_compile_worker_that_cannot_start_names_why(tmp_path, monkeypatch):
    monkeypatch.setenv("MODELC_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(cache, "_WORKER", "import no_such_module_for_modelc_workers\n")
    monkeypatch.setattr(cache, "_workers", [])
    with pytest.raises(ModelcError, match=r"compile worker .* exited before compiling kernel k_\w+\.py \(op Fake\): "
                                          r"ModuleNotFoundError: No module named 'no_such_module_for_modelc_workers'$"):
        cache.compile_all(["X = 1\n", "Y = 2\n"], names=["op Fake", "op Fake"], jobs=1)
