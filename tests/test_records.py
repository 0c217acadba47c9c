"""Tuning records: round trip, corrupt lines, distill, ApplyHistoryBest."""
import json

import pytest

from modelc.tune import records as R
from modelc.tune.records import ApplyHistoryBest, Record, RecordWriter, load_records

T1 = {"cpu": "cpu A", "isa": ["avx2"], "threads": 2}
T2 = {"cpu": "cpu B", "isa": ["avx2"], "threads": 2}


def _rec(key, cost, cfg=0, error=0, target=T1, template="conv2d"):
    return Record(key, f"desc {key}", template, {"tile": cfg}, [cost] * 3 if not error else [], error,
                  "boom" if error else "", target, None, 1.0)


def test_round_trip_and_flush(tmp_path):
    log = tmp_path / "log.jsonl"
    with RecordWriter(str(log)) as w:
        w.write(_rec("a", 1e-3))
        assert len(load_records(str(log))) == 1          # on disk before the next write
        w.write(_rec("a", 5e-4, cfg=1))
    recs = load_records(str(log))
    assert [r.cost for r in recs] == [1e-3, 5e-4] and recs[1].config == {"tile": 1}


def test_corrupt_and_foreign_lines_are_skipped_with_one_warning(tmp_path):
    log = tmp_path / "log.jsonl"
    good = _rec("a", 1e-3).to_json()
    log.write_text(good + "\n{not json\n" + json.dumps({"v": 99, "key": "x"}) + "\n" + good[:40] + "\n" + good + "\n")
    with pytest.warns(UserWarning, match="skipped 3 corrupt"):
        recs = load_records(str(log))
    assert len(recs) == 2


def test_writer_after_a_torn_line_starts_a_new_line(tmp_path):
    log = tmp_path / "log.jsonl"
    log.write_text(_rec("a", 1e-3).to_json() + "\n" + _rec("b", 1e-3).to_json()[:30])
    with RecordWriter(str(log)) as w:
        w.write(_rec("c", 2e-3))
    with pytest.warns(UserWarning, match="skipped 1"):
        assert [r.key for r in load_records(str(log))] == ["a", "c"]


def test_distill_keeps_best_per_workload_and_target(tmp_path):
    src, dst = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    with RecordWriter(str(src)) as w:
        for r in [_rec("a", 3e-3), _rec("a", 1e-3, 1), _rec("a", 1e-4, 2, error=R.WRONG_RESULT),
                  _rec("b", 2e-3), _rec("a", 9e-3, target=T2)]:
            w.write(r)
    assert R.distill(str(src), str(dst)) == 3
    recs = load_records(str(dst))
    assert sorted((r.key, r.target["cpu"], r.cost) for r in recs) == [
        ("a", "cpu A", 1e-3), ("a", "cpu B", 9e-3), ("b", "cpu A", 2e-3)]


def test_apply_history_best_picks_best_valid_for_the_target():
    recs = [_rec("a", 3e-3, 0), _rec("a", 1e-3, 1), _rec("a", 1e-5, 2, error=R.RUN_TIMEOUT),
            _rec("b", 1e-3, 5, target=T2)]
    ctx = ApplyHistoryBest(recs, target=T1)
    assert ctx.query("a", "conv2d") == {"tile": 1}
    assert ctx.query("b", "conv2d") is None              # another machine's record
    assert ApplyHistoryBest(recs, target=T1, any_target=True).query("b", "conv2d") == {"tile": 5}
    ctx.report([{"key": "a", "template": "conv2d", "desc": "conv a"},
                {"key": "b", "template": "conv2d", "desc": "conv b"}])
    assert "1 of 2" in ctx.summary and "conv b" in ctx.summary


def test_apply_history_best_missing_log(tmp_path):
    from modelc.errors import ModelcError
    with pytest.raises(ModelcError, match="does not exist"):
        ApplyHistoryBest(str(tmp_path / "nope.jsonl"))


def test_plot_counts_each_workloads_fastest_algorithm(tmp_path):
    from modelc.plot import series
    recs = [_rec("a", 3e-3, template="conv2d"), _rec("a", 1e-3, template="conv2d_winograd"),
            _rec("b", 5e-4, template="dense"), _rec("a", 2e-3, template="conv2d")]
    order, _, curves, (tx, ty), (_, alloc) = series(recs)
    assert order == [("a", "conv2d"), ("a", "conv2d_winograd"), ("b", "dense")]
    assert curves[("a", "conv2d")][1] == [3.0, 2.0] and alloc == [0, 1, 2, 0]
    # over the workloads seen so far, each at its fastest algorithm: 3; 1 (not 3 + 1); 1 + 0.5; ...
    assert tx == [1, 2, 3, 4] and ty == pytest.approx([3.0, 1.0, 1.5, 1.5])
    pytest.importorskip("matplotlib")
    from modelc.plot import plot_log
    log = tmp_path / "log.jsonl"
    with RecordWriter(str(log)) as w:
        for r in recs:
            w.write(r)
    out = tmp_path / "tuning.png"
    plot_log(str(log), str(out))
    assert out.stat().st_size > 10_000
