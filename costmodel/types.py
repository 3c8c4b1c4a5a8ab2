"""Profile and Prediction: the numbers the cost model works on; plain data, no torch."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

PROFILE_VERSION = 4
"""4: training profiles time I and W as torch's zero-bubble stages run them and split the saved bytes into
a segment's input and output (3: segments timed alone plus a machine model; 2: small microbatch sizes
timed over a whole batch of samples); older profiles are measured again."""

PROFILE_DIR_ENV = "PIPESPLIT_PROFILE_DIR"
"""Environment variable naming a profile cache that every command and results directory shares."""


@dataclass(frozen=True, kw_only=True)
class Segment:
    """The code between two consecutive candidate cuts, as the pipeline runs it."""

    fqn: str
    """The candidate module the segment starts at."""
    flops: int
    """Multiply-accumulates for one sample (fvcore's convention: one MAC counts as one flop)."""
    param_bytes: int
    out_bytes: int
    """Bytes per sample of every tensor crossing a cut right after this segment (0 for the last)."""
    latency_s: dict[int, float]
    """Median forward seconds of this segment at each microbatch size."""
    latency_spread: dict[int, tuple[float, float]] = field(default_factory=dict)
    """(min, max) of the repeats behind each median."""
    backward_s: dict[int, float] = field(default_factory=dict)
    """Training profiles: median seconds of the segment's whole backward (inputs' and weights' gradients)."""
    input_grad_s: dict[int, float] = field(default_factory=dict)
    """Training profiles: the inputs' gradient alone (a zero-bubble schedule's ``I``)."""
    weight_grad_s: dict[int, float] = field(default_factory=dict)
    """Training profiles: the weights' gradient after it (``W``)."""
    optimizer_s: float | None = None
    """Training profiles: one optimizer step over the segment's parameters (AdamW; independent of microbatch)."""

    saved_bytes: int = 0
    """Training profiles: bytes per sample its forward keeps for the backward (autograd's saved tensors)."""
    saved_input_bytes: int = 0
    """Training profiles: of ``saved_bytes``, those of the segment's own input (held once with the previous
    segment's saved output when both are on one stage)."""
    saved_output_bytes: int = 0
    """Training profiles: of ``saved_bytes``, those of the segment's own output."""
    largest_param_bytes: int = 0
    """Its largest parameter: a backward's new gradient of it lives beside the accumulated one for a moment,
    and so does an optimizer's update of it on CPU (torch steps one parameter at a time there)."""

    def latency(self, m: int) -> float:
        """Seconds at microbatch size ``m``; between measured sizes, per-sample time is interpolated."""
        return interpolate(self.latency_s, m)


def interpolate(values: Mapping[int, float], m: int) -> float:
    """A per-microbatch-size time at size ``m``: measured, or per-sample time interpolated between the
    nearest sizes (scaled from the nearest one outside them); 0 where nothing was measured."""
    if not values:
        return 0.0
    if m in values:
        return values[m]
    sizes = sorted(values)
    lo = max((s for s in sizes if s < m), default=sizes[0])
    hi = min((s for s in sizes if s > m), default=sizes[-1])
    if lo == hi:
        return values[lo] * m / lo
    per_lo, per_hi = values[lo] / lo, values[hi] / hi
    w = (m - lo) / (hi - lo)
    return m * (per_lo + w * (per_hi - per_lo))


@dataclass(frozen=True, kw_only=True)
class Link:
    """Point-to-point transfer time = latency + bytes / bandwidth, fitted to measured send/recv."""

    latency_s: float
    bandwidth_Bps: float
    backend: str = "gloo"
    samples: tuple[tuple[int, float], ...] = ()
    """(bytes, median one-way seconds) behind the fit."""

    def time(self, nbytes: float) -> float:
        return 0.0 if nbytes <= 0 else self.latency_s + nbytes / self.bandwidth_Bps


@dataclass(frozen=True, kw_only=True)
class Machine:
    """Which devices the stages run on and how a device shares itself between busy stages.

    On CPU every stage runs ``threads`` threads on the ``cores`` that all stages share: with ``k`` stages
    busy each progresses at ``min(1, cores / (k * threads))`` of its alone speed, divided by the measured
    ``contention`` at ``k`` (memory bandwidth and caches are shared too; 1.0 = none). On CUDA each stage
    has its own GPU, so a stage runs at its alone speed whatever the others do.
    """

    device: str = "cpu"
    cores: int = 1
    """CPU cores the stages share (on CUDA: the GPUs, one per stage)."""
    threads: int = 1
    """Intra-op threads of each stage (and of the serial baseline)."""
    contention: dict[int, float] = field(default_factory=dict)
    """Busy stages -> slowdown beyond the share of cores, measured by the profile (1.0 when absent)."""

    @property
    def shared(self) -> bool:
        return self.device != "cuda"

    def contention_at(self, busy: int) -> float:
        """The measured contention at ``busy`` stages, interpolated between measured counts (1.0 alone)."""
        known = {1: 1.0, **{int(k): float(v) for k, v in self.contention.items()}}
        if busy in known:
            return known[busy]
        lo = max((k for k in known if k < busy), default=1)
        hi = min((k for k in known if k > busy), default=None)
        if hi is None:
            return known[lo]
        return known[lo] + (known[hi] - known[lo]) * (busy - lo) / (hi - lo)

    def rate(self, busy: int) -> float:
        """The speed of each busy stage, as a share of its speed alone, with ``busy`` stages computing."""
        if busy <= 0:
            return 1.0
        if not self.shared:
            return 1.0
        return min(1.0, self.cores / (busy * self.threads)) / self.contention_at(busy)

    def ceiling(self, stages: int) -> float:
        """The most speedup over the serial model on one stage's resources that ``stages`` can give here."""
        return float(stages) if not self.shared else min(float(stages), self.cores / self.threads)

    def to_dict(self) -> dict[str, Any]:
        return {"device": self.device, "cores": self.cores, "threads": self.threads,
                "contention": {str(k): v for k, v in self.contention.items()}}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Machine:
        return cls(device=str(d.get("device", "cpu")), cores=int(d.get("cores", 1)), threads=int(d.get("threads", 1)),
                   contention={int(k): float(v) for k, v in (d.get("contention") or {}).items()})


@dataclass(frozen=True, kw_only=True)
class Profile:
    """Everything the simulator needs about one model on one device and thread count."""

    model: dict[str, Any]
    device: str
    threads: int
    granularity: str
    batch_size: int
    segments: tuple[Segment, ...]
    link: Link
    concurrency: int = 1
    """How many stage workers timed the segments at once (a pipeline's stages share the machine)."""
    machine: Machine | None = None
    """The machine model; with one, ``latency_s`` is each segment alone and the simulator shares the
    device between busy stages. Without one (older callers), latencies are used as measured."""
    step_overhead_s: float = 0.0
    """Fixed cost per microbatch per stage (schedule bookkeeping, send/recv calls). Not measured by the
    profile (timelines put it at ~1 % of a DeiT-S step here): 0 unless a caller sets it."""
    versions: dict[str, Any] = field(default_factory=dict)
    key: str = ""

    @property
    def total_flops(self) -> int:
        return sum(s.flops for s in self.segments)

    @property
    def fqns(self) -> tuple[str, ...]:
        return tuple(s.fqn for s in self.segments)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["version"] = PROFILE_VERSION
        d["total_flops"] = self.total_flops
        for s in d["segments"]:
            s["latency_s"] = {str(k): v for k, v in s["latency_s"].items()}
            s["latency_spread"] = {str(k): list(v) for k, v in s["latency_spread"].items()}
            for k in ("backward_s", "input_grad_s", "weight_grad_s"):
                s[k] = {str(m): v for m, v in s[k].items()}
        d["link"]["samples"] = [list(x) for x in self.link.samples]
        d["machine"] = self.machine.to_dict() if self.machine is not None else None
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Profile:
        if d.get("version") != PROFILE_VERSION:
            raise ValueError(f"profile version {d.get('version')} is not {PROFILE_VERSION}: profile again")
        segs = tuple(
            Segment(fqn=s["fqn"], flops=int(s["flops"]), param_bytes=int(s["param_bytes"]),
                    out_bytes=int(s["out_bytes"]),
                    latency_s={int(k): float(v) for k, v in s["latency_s"].items()},
                    latency_spread={int(k): (float(v[0]), float(v[1])) for k, v in s.get("latency_spread", {}).items()},
                    backward_s={int(k): float(v) for k, v in (s.get("backward_s") or {}).items()},
                    input_grad_s={int(k): float(v) for k, v in (s.get("input_grad_s") or {}).items()},
                    weight_grad_s={int(k): float(v) for k, v in (s.get("weight_grad_s") or {}).items()},
                    optimizer_s=None if s.get("optimizer_s") is None else float(s["optimizer_s"]),
                    saved_bytes=int(s.get("saved_bytes", 0)), saved_input_bytes=int(s.get("saved_input_bytes", 0)),
                    saved_output_bytes=int(s.get("saved_output_bytes", 0)),
                    largest_param_bytes=int(s.get("largest_param_bytes", 0)))
            for s in d["segments"]
        )
        link = d["link"]
        return cls(
            model=d["model"], device=d["device"], threads=int(d["threads"]), granularity=d["granularity"],
            batch_size=int(d["batch_size"]), segments=segs,
            link=Link(latency_s=float(link["latency_s"]), bandwidth_Bps=float(link["bandwidth_Bps"]),
                      backend=link.get("backend", "gloo"),
                      samples=tuple((int(b), float(t)) for b, t in link.get("samples", ()))),
            concurrency=int(d.get("concurrency", 1)), step_overhead_s=float(d.get("step_overhead_s", 0.0)),
            machine=Machine.from_dict(d["machine"]) if d.get("machine") else None,
            versions=d.get("versions", {}), key=d.get("key", ""),
        )


@dataclass(frozen=True, kw_only=True)
class Prediction:
    """What the simulator expects of a plan."""

    cuts: tuple[int, ...]
    chunks: int
    stage_s: tuple[float, ...]
    """Per stage, seconds per microbatch."""
    transfer_s: tuple[float, ...]
    """Per cut, seconds per microbatch."""
    makespan_s: float
    serial_s: float
    bubble_fraction: float
    ceiling: float | None = None
    """The most speedup this machine can give this many stages (cores / threads per stage on CPU)."""

    @property
    def speedup(self) -> float:
        return self.serial_s / self.makespan_s if self.makespan_s > 0 else float("nan")

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["speedup"] = self.speedup
        return d
