"""The library logs under "modelc"; a call asked to report shows it when the program set up no logging."""
import subprocess
import sys

CODE = """
import logging
from modelc import logs
with logs.shown({verbose}):
    logging.getLogger("modelc.tune.tuning").info("tuning finished")
logging.getLogger("modelc.tune.records").warning("untuned: conv 3x3")
"""


def _stderr(verbose: int) -> str:
    out = subprocess.run([sys.executable, "-c", CODE.format(verbose=verbose)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return out.stderr


def test_verbose_call_shows_its_messages_without_logging_set_up():
    err = _stderr(1)
    assert "tuning finished" in err
    assert "untuned: conv 3x3" in err          # warnings reach stderr in any case


def test_quiet_call_shows_only_warnings():
    err = _stderr(0)
    assert "tuning finished" not in err and "untuned: conv 3x3" in err


def test_a_program_with_its_own_logging_keeps_it(caplog):
    import logging
    from modelc import logs
    before = list(logging.getLogger("modelc").handlers)
    with caplog.at_level(logging.INFO, logger="modelc"), logs.shown(1):
        logging.getLogger("modelc.x").info("hello")
        assert logging.getLogger("modelc").handlers == before     # no handler of ours added
    assert "hello" in caplog.text
