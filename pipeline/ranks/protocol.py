"""The rank protocol: each command a frozen dataclass that carries the code it runs on a rank.

The driver (the local pool's parent, or rank 0 under torchrun) sends one command to every rank; each
rank calls ``handle`` and sends back one reply of ``pipeline.stage.messages``. A command that raises becomes
a fatal ``ErrorReply`` with its reason: the process group may be broken, so the pool restarts.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass

import torch
import torch.distributed as dist

from pipeline.core.plan import SplitPlan
from pipeline.core.spec import ModelSpec
from pipeline.stage.messages import ErrorReply, LinkReply, Reply, SegmentReply, TrialOptions, TrialReply
from pipeline.stage.probes import ping_pong, time_segments
from pipeline.stage.rank import RankState, one_line
from pipeline.stage.trial import run_trial

__all__ = ["Command", "Configure", "MeasureLink", "ProfileSegments", "RunTrial", "Stop", "handle"]


@dataclass(frozen=True, kw_only=True)
class RunTrial:
    """Build, check and time ``plan`` on every rank."""

    plan: SplitPlan
    options: TrialOptions
    what = "failed mid-trial"

    def run(self, state: RankState) -> TrialReply | ErrorReply:
        return run_trial(state, self.plan, self.options)


@dataclass(frozen=True, kw_only=True)
class ProfileSegments:
    """Time every candidate segment on every rank at once, as the stages of a pipeline share the machine."""

    spec: ModelSpec
    granularity: str
    micro: tuple[int, ...]
    repeats: int
    warmup: int
    streamed: bool = False
    """One segment made real at a time (a model bigger than the device): ``pipeline.stage.segments``."""
    what = "could not profile"

    def run(self, state: RankState) -> SegmentReply:
        if state.device.type == "cpu":
            torch.set_num_threads(state.cfg.threads)
        out = time_segments(self.spec, granularity=self.granularity, micro=self.micro, repeats=self.repeats,
                            warmup=self.warmup, device=state.device, rank=state.rank, count=state.rank == 0,
                            together=dist.barrier, streamed=self.streamed)
        dist.barrier()
        return out


@dataclass(frozen=True, kw_only=True)
class MeasureLink:
    """Ping-pong between ranks 0 and 1 of the real backend, one median per message size."""

    sizes: tuple[int, ...]
    repeats: int
    what = "could not measure the link"

    def run(self, state: RankState) -> LinkReply:
        return ping_pong(state.rank, state.device, self.sizes, self.repeats, state.sync)


@dataclass(frozen=True, kw_only=True)
class Configure:
    """The driver's resolved settings, so that every torchrun rank runs alike (no reply)."""

    threads: int


@dataclass(frozen=True, kw_only=True)
class Stop:
    """Leave the group and exit with ``code``."""

    code: int = 0


Command = RunTrial | ProfileSegments | MeasureLink | Configure | Stop


def handle(state: RankState, cmd: RunTrial | ProfileSegments | MeasureLink) -> Reply:
    """Answer one driver command on this rank; an exception becomes a fatal reply with its reason."""
    try:
        return cmd.run(state)
    except Exception as e:  # noqa: BLE001 - the process group may be broken: the driver restarts the pool
        return ErrorReply(rank=state.rank, error=f"rank {state.rank} {cmd.what}: {one_line(e)}", fatal=True,
                          trace=traceback.format_exc()[-2000:])
