import pytest


def pytest_addoption(parser):
    parser.addoption("--runslow", action="store_true", default=False, help="run tests marked slow")


def pytest_collection_modifyitems(config, items):
    if config.getoption("--runslow"):
        return
    skip = pytest.mark.skip(reason="slow: run with --runslow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


def pytest_configure(config):
    """Tests never write to the user's cache: built models and kernels go to one temp folder, made by
    the first process (pytest-xdist's controller, before its workers start, so that they share it:
    a kernel one worker compiled is loaded, not compiled again, by the other)."""
    import os
    import tempfile
    if "MODELC_CACHE_DIR" not in os.environ:
        os.environ["MODELC_CACHE_DIR"] = config._modelc_cache = tempfile.mkdtemp(prefix="modelc_cache_")


def pytest_unconfigure(config):
    import shutil
    if getattr(config, "_modelc_cache", None):
        shutil.rmtree(config._modelc_cache, ignore_errors=True)
