"""A rank's lasting state without a process group: one model cached at a time, one-line exceptions."""

from pipeline.stage.rank import RankState, WorkerConfig, one_line


def test_the_model_is_built_once_per_spec(tiny_spec):
    state = RankState(0, WorkerConfig(world_size=2, device="cpu", init_method="tcp://127.0.0.1:1", timeout_s=1))
    a = state.model(tiny_spec)
    assert state.model(tiny_spec) is a and list(state.models) == [tiny_spec.key]


def test_one_line_keeps_the_type_and_first_line():
    assert one_line(ValueError("bad\nsecond line")) == "ValueError: bad"
