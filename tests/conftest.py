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


@pytest.fixture(autouse=True, scope="session")
def _isolated_cache(tmp_path_factory):
    """Tests never write to the user's cache: built models and kernels go to a temp folder."""
    import os
    if "MODELC_CACHE_DIR" not in os.environ:
        os.environ["MODELC_CACHE_DIR"] = str(tmp_path_factory.mktemp("modelc_cache"))
    yield
