"""What every stage pool shares: the ``Pool`` protocol, the trial checks, and the replies-to-result step.

``StagePool`` (local worker processes) and ``RankPool`` (torchrun's ranks) both implement ``Pool``; the
search, the cost model and the CLIs see only this protocol.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any, Protocol

from pipeline.core.errors import PipesplitError
from pipeline.core.plan import SplitPlan
from pipeline.core.result import Breakdown, TrialResult, median
from pipeline.core.spec import ModelSpec
from pipeline.stage.messages import ErrorReply, LinkReply, Lost, Reply, SegmentReply, TrialOptions, TrialReply

__all__ = ["Pool", "RunsTrials", "check_trial_args", "link_samples", "references_in", "result_from_replies"]


class Pool(Protocol):
    """S stage workers that run plan after plan; a pool owns its processes (or ranks) and their group."""

    stages: int
    device: str
    threads_per_stage: int
    restarts: int
    reference_dir: str | None

    def __enter__(self) -> Pool: ...

    def __exit__(self, exc_type: object, *exc: object) -> None: ...

    def start(self) -> None: ...

    def run(self, plan: SplitPlan, *, repeats: int = 3, warmup: int = 1, timeout_s: float = 900.0,
            serial_all: bool = True, serial: bool = True, trace_dir: str | None = None, keep: bool = False,
            resume: bool = False, check_first_repeat: bool = False, cached_trace: bool = True) -> TrialResult: ...

    def measure_link(self, sizes: list[int], repeats: int = 5, timeout_s: float = 300.0) -> list[tuple[int, float]]:
        ...

    def profile(self, spec: ModelSpec, granularity: str, micro: list[int], repeats: int, warmup: int,
                timeout_s: float = 3600.0, streamed: bool = False) -> list[SegmentReply]: ...

    def restart(self) -> None: ...


class RunsTrials:
    """The ``run`` both pools share: a trial's options built and checked once, then sent the pool's own way."""

    stages: int
    device: str
    reference_dir: str | None = None
    """Where the ranks keep the study's references (``references_in``); None: in their memory only."""

    def run(self, plan: SplitPlan, *, repeats: int = 3, warmup: int = 1, timeout_s: float = 900.0,
            serial_all: bool = True, serial: bool = True, trace_dir: str | None = None, keep: bool = False,
            resume: bool = False, check_first_repeat: bool = False, cached_trace: bool = True) -> TrialResult:
        """Run one real trial of ``plan``; a failure (bad build, wrong output, dead or hung rank) is a failed result."""
        opts = TrialOptions(repeats=repeats, warmup=warmup, serial_all=serial_all, serial=serial, trace_dir=trace_dir,
                            keep=keep, resume=resume, check_first_repeat=check_first_repeat,
                            cached_trace=cached_trace, reference_dir=self.reference_dir)
        check_trial_args(plan, self.stages, self.device, opts)
        return self._run_trial(plan, opts, timeout_s)

    def _run_trial(self, plan: SplitPlan, opts: TrialOptions, timeout_s: float) -> TrialResult:
        raise NotImplementedError


@contextlib.contextmanager
def references_in(pool: Pool, folder: str | None) -> Iterator[Pool]:
    """The pool's trials keep the study's references in ``folder`` for as long as the ``with`` lasts (a lent
    pool goes back to its lender as it came)."""
    before = pool.reference_dir
    pool.reference_dir = folder
    try:
        yield pool
    finally:
        pool.reference_dir = before


def check_trial_args(plan: SplitPlan, stages: int, device: str, opts: TrialOptions) -> None:
    """Refuse a plan this pool cannot run, or options it cannot use, in one line."""
    if plan.world != stages:
        per = f" ({plan.stages_per_rank} per rank)" if plan.stages_per_rank > 1 else ""
        per += f" x dp_shard {plan.dp_shard}" if plan.dp_shard > 1 else ""
        raise PipesplitError(f"plan runs on {plan.world} ranks{per} but the pool has {stages}: start a pool per rank count")
    if plan.device != device:
        raise PipesplitError(f"plan is for {plan.device} but the pool runs on {device}")
    if opts.repeats < 1 or opts.warmup < 0:
        raise PipesplitError(f"repeats must be >= 1 and warmup >= 0 (got {opts.repeats}, {opts.warmup})")


def _aligned(ranks: Sequence[TrialReply], events: str) -> list[list[tuple[Any, float, float]]]:
    """Each rank's events shifted onto one clock: ranks on one host share its monotonic clock, so the
    offset between their starts is known exactly; across hosts each rank keeps its own (barrier-aligned) start."""
    hosts = {d.host for d in ranks}
    t0s = [d.t0 for d in ranks]
    base = min(t0s) if len(hosts) == 1 and all(t == t for t in t0s) else None
    out = []
    for d, t0 in zip(ranks, t0s):
        shift = t0 - base if base is not None else 0.0
        out.append([(e[0], e[1] + shift, e[2] + shift) for e in getattr(d, events)])
    return out


def result_from_replies(plan: SplitPlan, replies: Sequence[Reply], wall: float) -> tuple[TrialResult, bool]:
    """One TrialResult from every rank's reply, and whether the process group may be broken (a rank died,
    hung or failed mid-trial)."""
    lost = [r for r in replies if isinstance(r, Lost)]
    errors = [r for r in replies if isinstance(r, ErrorReply)]
    dead = [f.why for f in lost if f.dead]
    if dead:  # a dead rank is the reason: its peers' errors (a reset connection) only follow from it
        others = len(replies) - len(dead)
        reason = "; ".join(dead) + (f" (the other {others} rank(s) failed with it)" if others else "")
        return TrialResult.failed(plan, reason, wall_s=wall), True
    if lost:
        # a rank that failed explains the ranks left waiting on it
        reason = "; ".join([*[e.error for e in errors], *[f.why for f in lost]][:2])
        return TrialResult.failed(plan, reason, wall_s=wall), True
    last = replies[-1]
    if errors:
        return TrialResult.failed(plan, errors[0].error, wall_s=wall,
                                  max_abs_diff=getattr(last, "max_abs_diff", float("nan")),
                                  tolerance=getattr(last, "tolerance", float("nan"))), any(e.fatal for e in errors)
    ranks = [r for r in replies if isinstance(r, TrialReply)]
    if len(ranks) != len(replies):
        raise PipesplitError(f"a rank answered a trial with {type(replies[0]).__name__}: the pool is out of step")
    slowest = max(ranks, key=lambda d: d.busy_s)
    build, check, warm, timed = slowest.phases
    breakdown = Breakdown(build_s=build, check_s=check, warmup_s=warm, timed_s=timed,
                          other_s=max(0.0, slowest.busy_s - build - check - warm - timed),
                          driver_s=max(0.0, wall - slowest.busy_s))
    return TrialResult(
        plan=plan,
        ok=True,
        breakdown=breakdown,
        serial_s=ranks[0].serial_s,
        serial_all_s=ranks[0].serial_all_s,
        pipeline_s=ranks[0].pipeline_s,
        stage_compute_s=tuple(median(d.compute_s) for d in ranks),
        stage_comm_s=tuple(median(d.comm_s) for d in ranks),
        boundary_bytes=tuple(d.out_bytes for d in ranks[:-1]),
        peak_mem_bytes=tuple(d.peak_mem_bytes for d in ranks),
        base_mem_bytes=tuple(d.base_mem_bytes for d in ranks),
        stage_bytes=tuple(d.stage_bytes for d in ranks), reused_bytes=tuple(d.reused_bytes for d in ranks),
        work_events=tuple(tuple((str(n), a, b) for n, a, b in ev) for ev in _aligned(ranks, "work_events")),
        max_abs_diff=ranks[-1].max_abs_diff,
        tolerance=ranks[-1].tolerance,
        check=ranks[-1].check,
        build_s=max(d.build_s for d in ranks),
        wall_s=wall,
        busy_s=max(d.busy_s for d in ranks),
        events=tuple(tuple(ev) for ev in _aligned(ranks, "events")),
        comm_events=tuple(tuple(ev) for ev in _aligned(ranks, "comm_events")),
        traces=tuple(d.trace for d in ranks if d.trace),
        extra={"actions": [list(d.actions) for d in ranks]} if any(d.actions for d in ranks) else {},
    ), False


def link_samples(replies: Sequence[Reply]) -> list[tuple[int, float]]:
    """Rank 0's ping-pong figures."""
    first = replies[0]
    if not isinstance(first, LinkReply):
        raise PipesplitError(f"rank 0 answered the link probe with {type(first).__name__}")
    return [(int(b), float(t)) for b, t in first.samples]
