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
