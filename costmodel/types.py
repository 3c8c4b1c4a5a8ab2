"""Profile and Prediction: the numbers the cost model works on; plain data, no torch."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

PROFILE_VERSION = 2
"""2: small microbatch sizes timed over a whole batch of samples (older profiles are measured again)."""


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

    def latency(self, m: int) -> float:
        """Seconds at microbatch size ``m``; between measured sizes, per-sample time is interpolated."""
        if m in self.latency_s:
            return self.latency_s[m]
        sizes = sorted(self.latency_s)
        lo = max((s for s in sizes if s < m), default=sizes[0])
        hi = min((s for s in sizes if s > m), default=sizes[-1])
        if lo == hi:
            return self.latency_s[lo] * m / lo
        per_lo, per_hi = self.latency_s[lo] / lo, self.latency_s[hi] / hi
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
        d["link"]["samples"] = [list(x) for x in self.link.samples]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Profile:
        if d.get("version") != PROFILE_VERSION:
            raise ValueError(f"profile version {d.get('version')} is not {PROFILE_VERSION}: profile again")
        segs = tuple(
            Segment(fqn=s["fqn"], flops=int(s["flops"]), param_bytes=int(s["param_bytes"]),
                    out_bytes=int(s["out_bytes"]),
                    latency_s={int(k): float(v) for k, v in s["latency_s"].items()},
                    latency_spread={int(k): (float(v[0]), float(v[1])) for k, v in s.get("latency_spread", {}).items()})
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

    @property
    def speedup(self) -> float:
        return self.serial_s / self.makespan_s if self.makespan_s > 0 else float("nan")

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["speedup"] = self.speedup
        return d
