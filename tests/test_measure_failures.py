"""Measurement failure paths and a log shared by concurrent writers.

The real measurer (worker processes, timeouts, restarts) is driven through a compile error, a wrong
result, a build timeout, a run timeout and crashing workers by a test-only template whose one knob
picks the fault; every failure becomes a record with its own error code that nothing applies.
Two processes appending to one log at once lose and break nothing.
"""
import json
import os
import subprocess
import sys
import time

import pytest

from modelc.tune import records as R
from modelc.tune.records import Record, RecordWriter, load_records

# ---- a log shared by concurrent writers ------------------------------------------------------

_WRITER = r"""
import sys, time
from modelc.tune.records import Record, RecordWriter
log, who, n, start = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
while time.time() < start:
    time.sleep(0.001)
with RecordWriter(log) as w:
    for i in range(n):
        pad = f"{who}{i}." * (2000 + 97 * (i % 40))        # 10-60 KB lines, longer than any pipe buffer
        w.write(Record("k", "d", "t", {"who": who, "i": i, "pad": pad}, [1e-3], 0, "", {}, None, 1.0))
"""


def test_two_processes_appending_to_one_log_lose_and_break_nothing(tmp_path):
    log = tmp_path / "shared.jsonl"
    log.write_text(_rec_line("before"))
    n, start = 500, time.time() + 2.0              # both start writing at the same moment
    procs = [subprocess.Popen([sys.executable, "-c", _WRITER, str(log), who, str(n), str(start)])
             for who in "ab"]
    assert [p.wait(120) for p in procs] == [0, 0]
    raw = log.read_bytes()
    assert raw.endswith(b"\n")
    lines = raw.decode().split("\n")[:-1]
    assert len(lines) == 1 + 2 * n                   # no line lost, none split in two
    recs = [Record.from_json(ln) for ln in lines]     # every line parses (raises otherwise)
    seen = {"a": [], "b": []}
    for r in recs[1:]:
        who, i = r.config["who"], r.config["i"]
        assert r.config["pad"] == f"{who}{i}." * (2000 + 97 * (i % 40))    # nothing interleaved
        seen[who].append(i)
    assert seen == {"a": list(range(n)), "b": list(range(n))}             # each writer's order kept
    a_pos = [k for k, r in enumerate(recs) if r.config.get("who") == "a"]
    assert a_pos[-1] - a_pos[0] > n                  # the writers really did overlap


def _rec_line(key):
    return Record(key, "d", "t", {"x": 1}, [1e-3], 0, "", {}, None, 1.0).to_json() + "\n"


def test_a_line_torn_while_a_writer_is_open_is_ended_before_its_next_record(tmp_path):
    log = tmp_path / "log.jsonl"
    with RecordWriter(str(log)) as w:
        w.write(Record("a", "d", "t", {}, [1e-3], 0, "", {}, None, 1.0))
        with open(log, "a") as other:                # another writer killed mid-line
            other.write(_rec_line("b")[:25])
        w.write(Record("c", "d", "t", {}, [1e-3], 0, "", {}, None, 1.0))
    with pytest.warns(UserWarning, match="skipped 1 corrupt"):
        assert [r.key for r in load_records(str(log))] == ["a", "c"]


def test_a_corrupt_line_in_the_middle_is_skipped_with_a_counted_warning(tmp_path):
    log = tmp_path / "log.jsonl"
    log.write_text(_rec_line("a") + '{"v": 1, "key": "trunc' + "\n" + _rec_line("b") + "\x00\x01garbage\n"
                   + _rec_line("c"))
    with pytest.warns(UserWarning, match=r"skipped 2 corrupt or foreign line\(s\) in .*log.jsonl"):
        assert [r.key for r in load_records(str(log))] == ["a", "b", "c"]
