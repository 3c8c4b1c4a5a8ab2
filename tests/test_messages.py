"""The rank protocol's data survives pickling, as it crosses pipes and the gloo control group."""

import pickle

from pipeline.stage.messages import ErrorReply, Lost, SegmentReply, TrialOptions


def test_messages_pickle_and_compare_by_value(tmp_path):
    for msg in (TrialOptions(repeats=2, trace_dir="t"),
                ErrorReply(rank=1, error="x", fatal=True, max_abs_diff=0.0, tolerance=1.0),
                SegmentReply(rank=0, blocks=("a", "b"), latency_s={1: (0.1, 0.2)}, spread={1: ((0.1, 0.1), (0.2, 0.3))}),
                Lost(rank=0, why="died", dead=True)):
        assert pickle.loads(pickle.dumps(msg)) == msg


def test_a_trace_dir_is_made_absolute_once(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert TrialOptions(trace_dir="traces").trace_dir == str(tmp_path / "traces")
    assert TrialOptions().trace_dir is None
