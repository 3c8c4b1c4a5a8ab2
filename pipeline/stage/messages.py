"""The rank protocol's data: trial options and every reply a rank sends back, as frozen dataclasses.

Plain data (no torch), pickled over the local pool's pipes or gathered over torchrun's gloo control
group; the commands that produce them are in ``pipeline.ranks.protocol``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from pipeline.core.result import OutputCheck

__all__ = ["ErrorReply", "LinkReply", "Lost", "Ready", "Reply", "SegmentReply", "TrialOptions", "TrialReply"]


@dataclass(frozen=True, kw_only=True)
class TrialOptions:
    """How one trial measures a plan on every rank."""

    repeats: int = 3
    """Timed repeats: serial (rank 0) | pipeline (all ranks) | serial on all threads, interleaved."""
    warmup: int = 1
    """Untimed pipeline runs after the output check."""
    serial: bool = True
    """Time the serial model on one stage's threads beside each repeat."""
    serial_all: bool = True
    """Time the serial model on all the pipeline's threads too (CPU only)."""
    trace_dir: str | None = None
    """Run once more under torch.profiler and write a chrome trace per rank here."""
    check_first_repeat: bool = False
    """Check the output of the first timed repeat instead of running the batch once more for the check
    (a fresh stage's first run is no slower than its next ones once a run takes seconds; the search does
    this for such models: ``search.study.runner.check_on_first_repeat``)."""
    cached_trace: bool = True
    """Build torch-backend stages from the worker's cached export of the model (``pipeline.models.traces``);
    False traces the model afresh for this plan."""
    keep: bool = False
    """Keep the built stage on every rank afterwards, so that a ``resume`` trial of the same plan can add repeats."""
    resume: bool = False
    """Add repeats to the stage the previous trial kept for this same plan: no build and no output check (it
    passed in that trial); a rank that kept none builds and checks as usual."""
    reference_dir: str | None = None
    """The study's reference folder (``pipeline.stage.refstore``): what the check compares with, made once and
    read by later pools and processes; None keeps it in the ranks' memory only."""

    def __post_init__(self) -> None:
        for name in ("trace_dir", "reference_dir"):
            if getattr(self, name):
                object.__setattr__(self, name, os.path.abspath(getattr(self, name)))


@dataclass(frozen=True, kw_only=True)
class Ready:
    """A worker joined the process group."""

    rank: int


@dataclass(frozen=True, kw_only=True)
class ErrorReply:
    """A command failed on this rank; ``fatal`` when the process group may be broken (restart the pool)."""

    rank: int
    error: str
    fatal: bool = False
    trace: str = ""
    max_abs_diff: float = float("nan")
    tolerance: float = float("nan")


@dataclass(frozen=True, kw_only=True)
class TrialReply:
    """What one rank measured in a trial."""

    rank: int
    build_s: float
    out_bytes: int
    """Bytes this rank's stage sent on for one whole batch (0 on the last rank)."""
    max_abs_diff: float
    tolerance: float
    serial_s: tuple[float, ...]
    serial_all_s: tuple[float, ...]
    pipeline_s: tuple[float, ...]
    compute_s: tuple[float, ...]
    """Per repeat, this rank's time inside its stage module."""
    comm_s: tuple[float, ...]
    """Per repeat, this rank's busy time outside its stage module: send, receive, waiting."""
    events: tuple[tuple[int, float, float], ...]
    comm_events: tuple[tuple[str, float, float], ...]
    t0: float
    """The last repeat's start on this host's monotonic clock (ranks on one host share it)."""
    host: str
    peak_mem_bytes: int
    """The highest over this rank's timed pipeline runs (``Peak``, reset before each)."""
    busy_s: float
    """From receiving the plan to answering: the trial's own work on this rank."""
    trace: str | None = None
    base_mem_bytes: int = 0
    """Memory held as a timed run started (the least over runs)."""
    stage_bytes: int = 0
    """Bytes of the parameters and buffers this rank made real for its stages."""
    reused_bytes: int = 0
    """Of those, the bytes taken as they were from the tensors an earlier trial left this rank."""
    phases: tuple[float, float, float, float] = (0.0, 0.0, 0.0, 0.0)
    """Seconds this rank spent to build (until every rank had built), check, warm up and time."""
    check: OutputCheck | None = None
    """What the check compared and its worst tensor (the same on every rank)."""
    work_events: tuple[tuple[str, float, float], ...] = ()
    """The schedule's actions in the last run as (``0F1``-style name, start, end), on the compute spans' base."""
    actions: tuple[str, ...] = ()
    """This rank's forwards and backwards in the order the last run ran them (``0F1``: stage 0's forward of
    microbatch 1; ``1B0``: stage 1's backward of microbatch 0); torch backend only."""


@dataclass(frozen=True, kw_only=True)
class SegmentReply:
    """Every candidate segment timed on this rank at every microbatch size (``ProfileSegments``)."""

    rank: int
    blocks: tuple[str, ...]
    latency_s: dict[int, tuple[float, ...]]
    """Microbatch size -> median seconds of each segment."""
    spread: dict[int, tuple[tuple[float, float], ...]]
    """Microbatch size -> (min, max) of each segment's repeats."""
    cross_bytes: tuple[int, ...] = ()
    """Bytes per sample crossing the cut after each segment but the last (counted on one rank)."""
    param_bytes: tuple[int, ...] = ()
    """Parameter and buffer bytes of each segment (counted on one rank)."""
    backward_s: dict[int, tuple[tuple[float, float, float], ...]] = field(default_factory=dict)
    """Training profiles: microbatch size -> each segment's median (whole backward, input grad, weight grad) s."""
    optimizer_s: tuple[float, ...] = ()
    """Training profiles: each segment's optimizer step (AdamW over its parameters), median seconds."""
    saved_bytes: tuple[int, ...] = ()
    """Training profiles: bytes per sample each segment's forward keeps for its backward."""
    saved_input_bytes: tuple[int, ...] = ()
    """Training profiles: of those, the bytes per sample that are the segment's own input."""
    saved_output_bytes: tuple[int, ...] = ()
    """Training profiles: of those, the bytes per sample that are the segment's own output."""
    peak_mem_bytes: int = 0
    """Streamed profiles: this rank's peak memory while it timed every segment (0 where not measured)."""
    base_mem_bytes: int = 0
    """Streamed profiles: what it held as it started (the peak less this is what the segments made real)."""
    largest_param_bytes: tuple[int, ...] = ()
    """Each segment's largest parameter (the gradient a backward adds to before freeing its own)."""


@dataclass(frozen=True, kw_only=True)
class LinkReply:
    """Ping-pong between ranks 0 and 1: (bytes, median one-way seconds) per message size."""

    rank: int
    samples: tuple[tuple[int, float], ...] = field(default_factory=tuple)


@dataclass(frozen=True, kw_only=True)
class Lost:
    """No reply from a rank: its process died, or it did not answer in time (the pool's own note)."""

    rank: int
    why: str
    dead: bool


Reply = Ready | ErrorReply | TrialReply | SegmentReply | LinkReply | Lost
