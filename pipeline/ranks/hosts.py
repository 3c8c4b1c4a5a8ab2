"""Where the stage workers run: this host's cores and GPUs, and torchrun's placement of this process.

Every command asks the same questions (how many threads per stage, is there a GPU per stage, was I
started by torchrun); this module answers them once, for the local pool and the torchrun pool alike.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

from pipeline.core.errors import PipesplitError

__all__ = ["TorchrunEnv", "available_cores", "check_device", "default_threads", "gpu_count", "resolve_device",
           "torchrun_env"]


@dataclass(frozen=True, kw_only=True)
class TorchrunEnv:
    """What torchrun (torch.distributed.elastic) tells each process about its place."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int


def torchrun_env() -> TorchrunEnv | None:
    """This process's torchrun placement, or None when it was not started by torchrun."""
    env = os.environ
    if "TORCHELASTIC_RUN_ID" not in env or "RANK" not in env or "WORLD_SIZE" not in env:
        return None
    return TorchrunEnv(rank=int(env["RANK"]), world_size=int(env["WORLD_SIZE"]),
                       local_rank=int(env.get("LOCAL_RANK", "0")),
                       local_world_size=int(env.get("LOCAL_WORLD_SIZE", "1")))


def check_torchrun_world(processes: int, layout: str) -> None:
    """Under torchrun, one line where the job's processes are not the ``processes`` that ``layout`` (what the
    user asked for, in their flags) runs on; nothing otherwise."""
    env = torchrun_env()
    if env is not None and env.world_size != processes:
        raise PipesplitError(f"torchrun started {env.world_size} processes but {layout} runs on {processes}: start "
                             f"{processes} (nnodes x nproc-per-node), or give --stages x --dp-shard = {env.world_size}")


def available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def default_threads(stages: int) -> int:
    """Threads per stage that fill the machine's cores without oversubscribing them (at least one); under
    torchrun only this host's ranks share its cores."""
    env = torchrun_env()
    local = env.local_world_size if env is not None else stages
    return max(1, available_cores() // local)


def cpu_ceiling(ranks: int, threads: int) -> float | None:
    """The most speedup over the serial model on one stage's threads that ``ranks`` CPU stages can give when
    they share this host's cores (None under a torchrun spread over several hosts, whose cores are not known
    here): a measured speedup above it is noise."""
    env = torchrun_env()
    if env is not None and env.local_world_size != env.world_size:
        return None
    return min(float(ranks), available_cores() / max(1, threads))


def gpu_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def check_device(device: str, stages: int) -> None:
    """Fail clearly when CUDA is asked for but this host has fewer GPUs than the stages it runs."""
    if device != "cuda":
        return
    env = torchrun_env()
    n = gpu_count()
    if env is not None:
        if n < env.local_world_size:
            raise PipesplitError(f"--device cuda needs one GPU per stage: this host has {n} GPU(s) for "
                                 f"{env.local_world_size} local ranks; lower --nproc-per-node or use --device cpu")
        return
    if n < stages:
        raise PipesplitError(f"--device cuda needs one GPU per stage: found {n} GPU(s) for {stages} stages; "
                             "use --device cpu or fewer --stages")


def resolve_device(device: str, stages: int) -> str:
    """The device a command will use: ``cuda`` with fewer GPUs than stages falls back to ``cpu``, saying so
    in one line (results, study names and plans then say cpu, so nothing is mislabelled). Under torchrun
    there is no fallback: every rank must agree, so each host checks its own GPUs when its ranks start."""
    if torchrun_env() is not None:
        return device
    try:
        check_device(device, stages)
    except PipesplitError as e:
        print(f"warning: {e}; falling back to --device cpu (gloo)", file=sys.stderr)
        return "cpu"
    return device
