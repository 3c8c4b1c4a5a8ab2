"""Stage workers from torchrun: every rank runs the same command; rank 0 drives, the others follow.

``torchrun --nnodes N --nproc-per-node K --rdzv-backend c10d --rdzv-endpoint HOST:PORT -m search.optimize
--stages N*K`` starts N*K copies of the program. Each joins the pipeline's process group from torchrun's
environment (``env://``); rank 0 also runs the search (or ``pipeline.run``) and sends commands to the
others over a gloo control group (``broadcast_object_list``), gathering their replies
(``gather_object``). A trial is the same ``RunTrial`` command as in the local ``StagePool``, so a plan
measures the same way on one host or many. Unlike the local pool, a rank cannot be restarted from
inside: a rank that fails mid-trial ends the run with its reason, and torchrun's own restart policy
(``--max-restarts``) and the resumable study take it from there.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager
from datetime import timedelta
from typing import Any

from pipeline.core.errors import PipesplitError
from pipeline.core.plan import SplitPlan
from pipeline.core.result import TrialResult
from pipeline.core.spec import ModelSpec
from pipeline.ranks.hosts import TorchrunEnv, check_device, default_threads, torchrun_env
from pipeline.ranks.pool import StagePool
from pipeline.ranks.pooling import Pool, RunsTrials, link_samples, result_from_replies
from pipeline.ranks.protocol import Command, Configure, MeasureLink, ProfileSegments, RunTrial, Stop, handle
from pipeline.stage.messages import ErrorReply, Reply, SegmentReply, TrialOptions
from pipeline.stage.rank import RankState, WorkerConfig, join_group

__all__ = ["RankPool", "follow", "follower_exit", "lend_pool", "open_pool", "release_followers", "torchrun_env"]


def _config(env: TorchrunEnv, device: str, threads: int, timeout_s: float) -> WorkerConfig:
    return WorkerConfig(world_size=env.world_size, device=device, init_method="env://", timeout_s=timeout_s,
                        threads=threads, local_rank=env.local_rank)


def _control_group() -> Any:
    import torch.distributed as dist

    return dist.new_group(backend="gloo", timeout=timedelta(days=1))  # followers wait between trials


_JOINED = False  # whether this process has joined the torchrun group (a RankPool started)


class RankPool(RunsTrials):
    """Rank 0's view of a torchrun job: the ``Pool`` interface over ranks that already exist."""

    def __init__(self, stages: int, *, device: str = "cpu", threads_per_stage: int | None = None,
                 group_timeout_s: float = 600.0, quiet: bool = False) -> None:
        env = torchrun_env()
        if env is None:
            raise PipesplitError("RankPool runs under torchrun only")
        if env.world_size != stages:
            raise PipesplitError(f"torchrun started {env.world_size} processes but --stages is {stages}: "
                                 f"pass --stages {env.world_size} (nnodes x nproc-per-node)")
        check_device(device, stages)
        self.env = env
        self.stages = stages
        self.device = device
        self.threads_per_stage = threads_per_stage or default_threads(env.local_world_size)
        self.group_timeout_s = group_timeout_s
        self.quiet = quiet
        self.restarts = 0
        self.start_s = float("nan")
        self._state: RankState | None = None
        self._ctrl: Any = None

    @property
    def pids(self) -> list[int]:
        return [os.getpid()]

    def __enter__(self) -> RankPool:
        self.start()
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        # the followers leave with rank 0's fate: if only rank 0 failed, the other torchrun agents would wait
        # for it in their exit barrier until the rendezvous store, hosted by a failed agent, times out
        self.close(0 if exc_type is None else 1)

    def start(self) -> None:
        if self._state is not None:
            return
        global _JOINED
        t = time.perf_counter()
        self._state = join_group(0, _config(self.env, self.device, self.threads_per_stage, self.group_timeout_s))
        _JOINED = True
        self._ctrl = _control_group()
        self._send(Configure(threads=self.threads_per_stage))
        self.start_s = time.perf_counter() - t

    def _send(self, cmd: Command) -> None:
        import torch.distributed as dist

        dist.broadcast_object_list([cmd], src=0, group=self._ctrl)

    def _round(self, cmd: RunTrial | ProfileSegments | MeasureLink) -> list[Reply]:
        """Every rank (this one too) answers ``cmd``."""
        import torch.distributed as dist

        self.start()
        assert self._state is not None
        self._send(cmd)
        mine = handle(self._state, cmd)
        replies: list[Any] = [None] * self.stages
        dist.gather_object(mine, replies, dst=0, group=self._ctrl)
        return replies

    def _run_trial(self, plan: SplitPlan, opts: TrialOptions, timeout_s: float) -> TrialResult:
        """One real trial on the torchrun ranks (``timeout_s`` is the process group's own timeout here)."""
        t = time.perf_counter()
        replies = self._round(RunTrial(plan=plan, options=opts))
        result, broken = result_from_replies(plan, replies, time.perf_counter() - t)
        if broken:
            raise PipesplitError(f"a torchrun rank failed mid-trial and cannot be restarted from inside the job: "
                                 f"{result.reason}; finished trials are kept, run the command again to resume")
        return result

    def _command(self, cmd: ProfileSegments | MeasureLink, what: str) -> list[Reply]:
        replies = self._round(cmd)
        bad = [r for r in replies if isinstance(r, ErrorReply)]
        if bad:
            raise PipesplitError(f"could not {what}: {bad[0].error}")
        return replies

    def measure_link(self, sizes: list[int], repeats: int = 5, timeout_s: float = 300.0) -> list[tuple[int, float]]:
        return link_samples(self._command(MeasureLink(sizes=tuple(sizes), repeats=repeats), "measure the link"))

    def profile(self, spec: ModelSpec, granularity: str, micro: list[int], repeats: int, warmup: int,
                timeout_s: float = 3600.0, streamed: bool = False) -> list[SegmentReply]:
        cmd = ProfileSegments(spec=spec, granularity=granularity, micro=tuple(micro), repeats=repeats, warmup=warmup,
                              streamed=streamed)
        return [r for r in self._command(cmd, "profile in the stage workers") if isinstance(r, SegmentReply)]

    def restart(self) -> None:
        raise PipesplitError("torchrun ranks cannot be restarted from inside the job: run the command again")

    def close(self, code: int = 0) -> None:
        """Tell the followers to leave with exit code ``code``, then leave the group."""
        if self._state is None:
            return
        import torch.distributed as dist

        try:
            self._send(Stop(code=code))
            dist.destroy_process_group()
        except Exception:  # noqa: BLE001 - a broken group is being left anyway
            pass
        self._state = None


def follow(device: str, threads: int | None, group_timeout_s: float = 600.0) -> int:
    """Ranks 1..N-1 under torchrun: join the group, then answer rank 0's commands until it stops."""
    import torch
    import torch.distributed as dist

    env = torchrun_env()
    assert env is not None
    check_device(device, env.world_size)
    threads = threads or default_threads(env.local_world_size)
    state = join_group(env.rank, _config(env, device, threads, group_timeout_s))
    ctrl = _control_group()
    code = 0
    while True:
        box: list[Any] = [None]
        dist.broadcast_object_list(box, src=0, group=ctrl)
        cmd = box[0]
        if isinstance(cmd, Stop):
            code = cmd.code
            break
        if isinstance(cmd, Configure):  # the driver's resolved settings, so that every rank runs alike
            if device == "cpu":
                torch.set_num_threads(cmd.threads)
            continue
        dist.gather_object(handle(state, cmd), None, dst=0, group=ctrl)
    try:
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001
        pass
    return code


_LENT: list[Pool] = []
"""Started pools lent to every ``open_pool`` of this process that asks for their shape (``lend_pool``)."""


@contextlib.contextmanager
def lend_pool(pool: Pool) -> Iterator[Pool]:
    """Lend a started pool to the commands this process runs (a program that drives several searches, or
    a test session): an ``open_pool`` of its stages, device and threads uses it, and leaves it open."""
    _LENT.append(pool)
    try:
        yield pool
    finally:
        _LENT.remove(pool)


def open_pool(stages: int, *, device: str = "cpu", threads_per_stage: int | None = None,
              quiet: bool = False) -> AbstractContextManager[Pool]:
    """The stage pool for this process, to use in a ``with``: a pool lent to it (``lend_pool``) of this
    shape, else the torchrun ranks when launched by torchrun, else new local workers."""
    threads = threads_per_stage or default_threads(stages)
    for lent in _LENT:
        if (lent.stages, lent.device, lent.threads_per_stage) == (stages, device, threads):
            return contextlib.nullcontext(lent)  # borrowed: the lender closes it
    if torchrun_env() is not None:
        return RankPool(stages, device=device, threads_per_stage=threads_per_stage, quiet=quiet)
    return StagePool(stages, device=device, threads_per_stage=threads_per_stage, quiet=quiet)


def follower_exit(device: str | None = None, threads_per_stage: int | None = None) -> int | None:
    """Under torchrun, ranks other than 0 follow rank 0 and return their exit code; rank 0 (or no torchrun)
    gets None and runs the command. Followers print nothing: rank 0 speaks for the job."""
    env = torchrun_env()
    if env is None or env.rank == 0:
        return None
    try:
        return follow(device or "cpu", threads_per_stage)
    except PipesplitError as e:
        print(f"error: rank {env.rank}: {e}", file=sys.stderr)
        return 2


def release_followers(device: str | None = None, threads_per_stage: int | None = None, code: int = 2) -> None:
    """Rank 0 is stopping before it started a pool (bad input, say): let the followers, which wait to join
    the group, join and leave at once with the same exit code, instead of waiting for the group timeout."""
    env = torchrun_env()
    if env is None or env.rank != 0 or _JOINED:
        return
    try:
        pool = RankPool(env.world_size, device=device or "cpu", threads_per_stage=threads_per_stage, quiet=True)
        pool.start()
        pool.close(code)
    except Exception:  # noqa: BLE001 - best effort: the followers time out otherwise
        pass
