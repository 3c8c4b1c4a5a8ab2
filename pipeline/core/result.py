"""TrialResult: what one real pipeline run measured (or why it failed); JSON in, JSON out.

``to_dict`` is the one JSON shape of a result: ``pipeline.run --out``, ``best_split.json``'s
``measured`` section and the search's trial attributes all take their keys from it.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from pipeline.core.plan import SplitPlan

RESULT_VERSION = 1


def median(xs: list[float] | tuple[float, ...]) -> float:
    return float(statistics.median(xs)) if xs else float("nan")


@dataclass(frozen=True, kw_only=True)
class OutputCheck:
    """What a trial's check compared with the unsplit model, so that a result says what it covered."""

    compared: str = "output"
    """``output`` (inference: the pipeline's output tensor) or ``loss and gradients`` (a training step)."""
    gradients: int = 0
    """Gradient tensors compared, over every rank's stage (training)."""
    worst: str = "output"
    """The tensor furthest from the unsplit model's, relative to its tolerance: ``output``, ``loss`` or a
    parameter's name (whose gradient it is)."""
    diff: float = float("nan")
    """That tensor's max |pipeline - unsplit|."""
    tolerance: float = float("nan")
    """What the check allowed it."""
    loss_diff: float | None = None
    """|pipeline loss - unsplit loss| (training)."""
    loss_tolerance: float | None = None
    streamed_diff: float | None = None
    """Output: max |pipeline - the streamed reference| (the model's finest split, run one block at a time on
    one rank or relayed by the ranks: ``made_by``); None where the whole model's own output was compared
    instead (``whole_diff``)."""
    whole_diff: float | None = None
    """Output: max |pipeline - the whole model's own output|, where rank 0 held the whole model (it timed the
    serial model); None where no rank did (a model bigger than the budget)."""
    reference_made: bool | None = None
    """Whether this trial made the reference it compared with: the serial step's loss and gradients, or the
    streamed output (False: an earlier trial's, kept by the ranks or read from the study's reference folder;
    neither depends on the split); None where the whole model's own output was compared."""
    made_by: str | None = None
    """Output, where this trial made the reference: ``relayed`` (the ranks ran the model's finest split together,
    each its own stage's blocks with the tensors it had just made, ``pipeline.stage.relay``) or ``streamed`` (the
    last rank made every block of the model, one at a time); None otherwise."""
    precision: str | None = None
    """Training in mixed precision: how both sides computed (``bf16 autocast``, ``bf16 FSDP2 policy``), and so
    why the tolerance is bfloat16's; None in the model's own dtype."""

    def describe(self) -> str:
        """One line: what was compared, and the worst of it against its tolerance."""
        if self.compared == "output":
            against = (" (whole model)" if self.whole_diff is not None else
                       " (streamed reference)" if self.streamed_diff is not None else "")
            return f"output check: max |diff| {self.diff:.2e} <= {self.tolerance:.1e}{against}"
        loss = (f"loss |diff| {self.loss_diff:.2e} <= {self.loss_tolerance:.1e}, "
                if self.loss_diff is not None and self.loss_tolerance is not None else "")
        how = f" in {self.precision} (bfloat16's tolerance)" if self.precision else ""
        return (f"training step check vs the serial step{how}: {loss}{self.gradients} gradients; the worst "
                f"(relative to its scale) {self.worst}: max |diff| {self.diff:.2e} <= {self.tolerance:.1e}")

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> OutputCheck:
        names = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in d.items() if k in names})


@dataclass(frozen=True, kw_only=True)
class Breakdown:
    """Where a trial's wall time went, in seconds: the slowest rank's phases, then the driver's own time.

    The parts add up to the trial's wall time; everything but ``timed_s`` is the trial's fixed cost.
    """

    build_s: float = 0.0
    """Trace the model and build the stage, until every rank has built (0 when a race step resumes)."""
    check_s: float = 0.0
    """The output check: the batch through the pipeline once, compared with the unsplit model."""
    warmup_s: float = 0.0
    """Untimed runs: the pipeline's warm-up, and the serial model's once per worker and thread count."""
    timed_s: float = 0.0
    """The timed repeats: serial, pipeline and serial on all threads, back to back."""
    other_s: float = 0.0
    """The rest of the rank's time: agreeing with the other ranks, a profiler trace, keeping the stage."""
    driver_s: float = 0.0
    """The driver's time outside the slowest rank: dispatch, pickling, collecting replies."""

    @property
    def total_s(self) -> float:
        return self.build_s + self.check_s + self.warmup_s + self.timed_s + self.other_s + self.driver_s

    @property
    def fixed_s(self) -> float:
        """Everything but the timed repeats."""
        return self.total_s - self.timed_s

    @property
    def timed_share(self) -> float:
        return self.timed_s / self.total_s if self.total_s > 0 else float("nan")

    def plus(self, other: Breakdown) -> Breakdown:
        """Both trials' time, part by part (a race's steps on one kept stage)."""
        return Breakdown(**{k: getattr(self, k) + getattr(other, k) for k in self.__dataclass_fields__})

    @classmethod
    def summed(cls, parts: list[Breakdown]) -> Breakdown:
        """The parts' times added up, part by part (nothing: all zero)."""
        out = cls()
        for b in parts:
            out = out.plus(b)
        return out

    def describe(self) -> str:
        return (f"build {self.build_s:.2f}s, check {self.check_s:.2f}s, warm-up {self.warmup_s:.2f}s, "
                f"timed {self.timed_s:.2f}s ({self.timed_share:.0%}), other {self.other_s:.2f}s, "
                f"driver {self.driver_s:.2f}s")


@dataclass(frozen=True, kw_only=True)
class TrialResult:
    """Per-repeat timings and per-stage breakdown of one plan, measured in one trial."""

    plan: SplitPlan
    """The plan that ran."""
    ok: bool
    reason: str = ""
    """Why the trial failed (empty when ``ok``)."""
    serial_s: tuple[float, ...] = ()
    """Whole model, whole batch, on one stage's resources (rank 0, its threads / its GPU), per repeat."""
    serial_all_s: tuple[float, ...] = ()
    """Whole model on all the pipeline's CPU threads, per repeat (empty on CUDA)."""
    pipeline_s: tuple[float, ...] = ()
    """Whole batch through the pipeline, first stage start to last stage end, per repeat."""
    stage_compute_s: tuple[float, ...] = ()
    """Per rank, median over repeats of the time spent inside its stage module."""
    stage_comm_s: tuple[float, ...] = ()
    """Per rank, median of the rest of the pipeline time: send, receive and waiting for a neighbour."""
    boundary_bytes: tuple[int, ...] = ()
    """Bytes of activations crossing each cut for one whole batch."""
    peak_mem_bytes: tuple[int, ...] = ()
    """Per rank peak resident memory (CPU) or peak allocated GPU memory (CUDA) during the timed pipeline runs
    (not the build, nor the serial model that rank 0 also times)."""
    work_events: tuple[tuple[tuple[str, float, float], ...], ...] = ()
    """Per rank, the schedule's forwards and backwards in the last run: (``1B0``-style name, start, end) on the
    events' clock (torch backend); the timeline draws the backward (``B``, ``I``) and weight-grad (``W``) ones."""
    base_mem_bytes: tuple[int, ...] = ()
    """Per rank memory held as a timed run starts (the least over runs): parameters, gradients, optimizer
    state, the runtime; the peak less this is what a step adds, activations above all."""
    stage_bytes: tuple[int, ...] = ()
    """Per rank, bytes of the parameters and buffers it made real for its own stages (nothing else of the
    model: the rest stays on meta); the base less this is the rank's runtime and training state."""
    reused_bytes: tuple[int, ...] = ()
    """Per rank, of ``stage_bytes``, those it took as they were from the tensors an earlier trial's stage left
    it (weights are the same by name in any split); the rest it made for this trial."""
    max_abs_diff: float = float("nan")
    """Largest |pipeline output - unsplit model output|."""
    tolerance: float = float("nan")
    """The difference the output check allowed."""
    check: OutputCheck | None = None
    """What the check compared (output, or loss and every gradient) and its worst tensor."""
    build_s: float = float("nan")
    """Slowest rank's time to trace the model and build its stage."""
    wall_s: float = float("nan")
    """Driver's wall time for the trial: dispatch, build, check, warm-up, timed work, results."""
    busy_s: float = float("nan")
    """Slowest rank's time from receiving the plan to answering: the trial's own work."""
    events: tuple[tuple[tuple[int, float, float], ...], ...] = ()
    """Per rank, (microbatch, start, end) of each compute span in the last timed repeat, seconds from its start."""
    comm_events: tuple[tuple[tuple[str, float, float], ...], ...] = ()
    """Per rank, (kind, start, end) of each send ('send' post, 'send_wait') and receive ('recv', post to
    end of wait, so it includes waiting for the previous stage) in the same repeat, on the same clock."""
    traces: tuple[str, ...] = ()
    """Per rank, the torch.profiler chrome trace of one extra run (when asked for)."""
    breakdown: Breakdown | None = None
    """Where the trial's wall time went (None for a failed trial)."""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def speedups(self) -> list[float]:
        return [s / p for s, p in zip(self.serial_s, self.pipeline_s) if p > 0]

    @property
    def speedup(self) -> float:
        """Median over repeats of serial / pipeline time, each pair measured back to back."""
        return median(self.speedups)

    @property
    def throughput(self) -> float:
        """Samples per second through the pipeline: the batch over the median pipeline time (NaN before a run)."""
        p = median(self.pipeline_s)
        return self.plan.model.batch_size / p if p > 0 else float("nan")

    @property
    def throughputs(self) -> list[float]:
        """Samples per second of each timed repeat."""
        return [self.plan.model.batch_size / p for p in self.pipeline_s if p > 0]

    @property
    def throughput_spread(self) -> tuple[float, float]:
        s = self.throughputs
        return (min(s), max(s)) if s else (float("nan"), float("nan"))

    @property
    def tokens_per_s(self) -> float | None:
        """Tokens per second for a language model (token ids in), None for any other."""
        if self.plan.model.input_dtype != "int64" or len(self.plan.model.input_shape) != 1:
            return None
        return self.throughput * self.plan.model.input_shape[0]

    @property
    def runtime_bytes(self) -> tuple[int, ...]:
        """Per rank, what it held besides its stage's weights as a timed run started: the process (torch, the
        tracing stack), and in training the gradients and optimizer state."""
        if not self.stage_bytes or not self.base_mem_bytes:
            return ()
        return tuple(max(0, b - s) for b, s in zip(self.base_mem_bytes, self.stage_bytes))

    @property
    def speedup_spread(self) -> tuple[float, float]:
        s = self.speedups
        return (min(s), max(s)) if s else (float("nan"), float("nan"))

    @property
    def speedup_all(self) -> float:
        """Median speedup over the serial model given all the pipeline's threads."""
        return median([s / p for s, p in zip(self.serial_all_s, self.pipeline_s) if p > 0])

    @property
    def overhead_s(self) -> float:
        """Driver wall time not spent in the trial's own work (dispatch, pickling, process start-up)."""
        return self.wall_s - self.busy_s

    def measured(self) -> dict[str, Any]:
        """Everything measured, without the plan: ``best_split.json``'s ``measured`` section.

        ``speedup_all_threads`` and ``serial_all_threads_s`` repeat ``speedup_all`` and ``serial_all_s``
        under the names that plan files have carried since version 1.
        """
        d = {k: v for k, v in asdict(self).items() if k != "plan"}
        for k in ("events", "comm_events", "work_events"):
            d[k] = [[list(e) for e in rank] for rank in d[k]]
        for k, v in d.items():
            if isinstance(v, tuple):
                d[k] = list(v)
        d.update(throughput=self.throughput, throughput_spread=list(self.throughput_spread),
                 tokens_per_s=self.tokens_per_s, runtime_bytes=list(self.runtime_bytes))
        d.update(speedup=self.speedup, speedup_spread=list(self.speedup_spread), speedup_all=self.speedup_all,
                 speedup_all_threads=self.speedup_all, serial_all_threads_s=list(self.serial_all_s))
        return d

    def to_dict(self) -> dict[str, Any]:
        return {"version": RESULT_VERSION, "plan": self.plan.to_dict(), **self.measured()}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrialResult:
        names = {f for f in cls.__dataclass_fields__}
        args = {k: v for k, v in d.items() if k in names}
        args["plan"] = SplitPlan.from_dict(d["plan"])
        for k in ("serial_s", "serial_all_s", "pipeline_s", "stage_compute_s", "stage_comm_s"):
            args[k] = tuple(float(x) for x in args.get(k, ()))
        for k in ("boundary_bytes", "peak_mem_bytes", "base_mem_bytes", "stage_bytes", "reused_bytes"):
            args[k] = tuple(int(x) for x in args.get(k, ()))
        args["events"] = tuple(tuple(tuple(e) for e in rank) for rank in args.get("events", ()))
        args["comm_events"] = tuple(tuple(tuple(e) for e in rank) for rank in args.get("comm_events", ()))
        args["work_events"] = tuple(tuple((str(n), float(x), float(y)) for n, x, y in rank)
                                    for rank in args.get("work_events", ()))
        args["traces"] = tuple(args.get("traces", ()))
        if isinstance(args.get("breakdown"), dict):
            args["breakdown"] = Breakdown(**args["breakdown"])
        if isinstance(args.get("check"), dict):
            args["check"] = OutputCheck.from_dict(args["check"])
        return cls(**args)

    @classmethod
    def failed(cls, plan: SplitPlan, reason: str, **kw: Any) -> TrialResult:
        return cls(plan=plan, ok=False, reason=reason, **kw)


def merged(parts: list[TrialResult]) -> TrialResult:
    """One result from a trial and the resumed trials that added repeats to the same built stage (the
    search's races): per-repeat timings joined, times summed, the per-rank medians weighted by repeats,
    the build and output check from the first part, the timeline from the last."""
    if not parts:
        raise ValueError("nothing to merge")
    bad = next((p for p in parts if not p.ok), None)
    if bad is not None or len(parts) == 1:
        return bad or parts[0]
    first, last = parts[0], parts[-1]

    def joined(name: str) -> tuple[float, ...]:
        return tuple(x for p in parts for x in getattr(p, name))

    def weighted(name: str) -> tuple[float, ...]:
        ranks = len(getattr(first, name))
        return tuple(median([getattr(p, name)[r] for p in parts for _ in p.pipeline_s]) for r in range(ranks))

    kept = [p.breakdown for p in parts if p.breakdown is not None]
    breakdown = Breakdown.summed(kept) if len(kept) == len(parts) else None
    peaks = tuple(max(p.peak_mem_bytes[r] for p in parts) for r in range(len(first.peak_mem_bytes)))
    bases = tuple(min(p.base_mem_bytes[r] for p in parts) for r in range(len(first.base_mem_bytes)))
    # a resumed part reuses the kept stage: the bytes made real are the first part's
    return replace(last, serial_s=joined("serial_s"), serial_all_s=joined("serial_all_s"),
                   pipeline_s=joined("pipeline_s"), stage_compute_s=weighted("stage_compute_s"),
                   stage_comm_s=weighted("stage_comm_s"), peak_mem_bytes=peaks, base_mem_bytes=bases,
                   max_abs_diff=first.max_abs_diff, check=first.check,
                   tolerance=first.tolerance, build_s=first.build_s, wall_s=sum(p.wall_s for p in parts),
                   busy_s=sum(p.busy_s for p in parts), boundary_bytes=first.boundary_bytes, breakdown=breakdown,
                   stage_bytes=first.stage_bytes, reused_bytes=first.reused_bytes)
