"""A rank's lasting state without a process group: one model cached at a time, one-line exceptions."""

from pipeline.stage.rank import RankState, WorkerConfig, one_line


def test_the_model_is_built_once_per_spec(tiny_spec):
    state = RankState(0, WorkerConfig(world_size=2, device="cpu", init_method="tcp://127.0.0.1:1", timeout_s=1))
    a = state.model(tiny_spec)
    assert state.model(tiny_spec) is a and list(state.models) == [tiny_spec.key]


def test_the_batch_is_drawn_once_per_model_and_each_trial_gets_its_own_copy(tiny_spec, monkeypatch):
    import torch

    from pipeline.models.batch import example_input
    from pipeline.stage import rank

    draws = []
    monkeypatch.setattr(rank, "example_input", lambda spec, device: draws.append(spec.key) or example_input(spec, device))
    state = RankState(0, WorkerConfig(world_size=2, device="cpu", init_method="tcp://127.0.0.1:1", timeout_s=1))
    first = state.batch(tiny_spec)
    assert all(torch.equal(a, b) for a, b in zip(first, example_input(tiny_spec)))
    first[0].zero_()  # a model that writes into its input
    again = state.batch(tiny_spec)
    assert all(torch.equal(a, b) for a, b in zip(again, example_input(tiny_spec))) and draws == [tiny_spec.key]


def test_one_line_keeps_the_type_and_first_line():
    assert one_line(ValueError("bad\nsecond line")) == "ValueError: bad"


def test_a_rank_draws_tqdm_bars_under_a_thread_lock_so_a_killed_rank_leaks_no_semaphore(monkeypatch):
    import multiprocessing.context as mpc
    from multiprocessing import resource_tracker

    import tqdm
    import tqdm.std

    from pipeline.stage.rank import _thread_lock_for_tqdm

    def bar_registers() -> list[tuple[str, str]]:
        """Whether tqdm's first bar, in a process whose start method is not fork (a rank's), names a semaphore."""
        registered: list[tuple[str, str]] = []
        monkeypatch.setattr(resource_tracker, "register", lambda name, rtype: registered.append((name, rtype)))
        monkeypatch.setattr(mpc._default_context, "_actual_context", mpc._concrete_contexts["spawn"])
        monkeypatch.delattr(tqdm.std.TqdmDefaultWriteLock, "mp_lock", raising=False)
        with tqdm.tqdm(total=1, disable=True):  # what torch.fx's interpreter opens on every run
            pass
        return registered

    monkeypatch.delattr(tqdm.tqdm, "_lock", raising=False)
    assert bar_registers() != []  # tqdm's own lock: a named semaphore that a killed rank never unlinks
    monkeypatch.delattr(tqdm.tqdm, "_lock", raising=False)
    _thread_lock_for_tqdm()
    assert bar_registers() == []
