"""Where the stage workers run: cores, GPUs and the CUDA fallback."""

import pytest

from pipeline.core.errors import PipesplitError


def test_cuda_with_fewer_gpus_than_stages_falls_back_to_cpu_in_one_line(capsys):
    import torch

    from pipeline.ranks.hosts import resolve_device
    from pipeline.ranks.pool import StagePool

    if torch.cuda.is_available() and torch.cuda.device_count() >= 2:
        pytest.skip("this machine has a GPU per stage")
    assert resolve_device("cuda", 2) == "cpu"
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--device cuda needs one GPU per stage" in err and "falling back" in err
    assert resolve_device("cpu", 2) == "cpu"
    with pytest.raises(PipesplitError, match="one GPU per stage"):  # the pool itself never guesses
        StagePool(2, device="cuda")


def test_the_cpu_ceiling_is_the_cores_a_pipeline_can_use_over_one_stages_threads(monkeypatch):
    from pipeline.ranks import hosts

    monkeypatch.setattr(hosts, "available_cores", lambda: 2)
    for key in ("TORCHELASTIC_RUN_ID", "RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(key, raising=False)
    assert hosts.cpu_ceiling(4, 1) == 2.0 and hosts.cpu_ceiling(2, 2) == 1.0 and hosts.cpu_ceiling(1, 1) == 1.0
    monkeypatch.setattr(hosts, "available_cores", lambda: 16)
    assert hosts.cpu_ceiling(4, 2) == 4.0
    # torchrun ranks over two hosts: this host's cores say nothing of the others'
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "x")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert hosts.cpu_ceiling(4, 1) is None
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert hosts.cpu_ceiling(4, 1) == 4.0
