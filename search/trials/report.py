"""The sweep's report: per stage count, every policy's cut, chunks, predicted and measured speedup, and a
generated reading of where each one loses. Pure: rows in, Markdown out."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from pipeline.core.ceiling import above_ceiling
from pipeline.peers.registry import PIPPY, POLICIES

POLICY_ORDER = (*POLICIES, "costmodel-optimum", "costmodel-next")
"""Report order: the reference policies as the registry lists them (PiPPy's first), then the cost model's."""


@dataclass(frozen=True)
class PolicyRow:
    """One plan measured in a stage count's confirmation round (the optimizer's best or a reference)."""

    stages: int
    source: str
    trial: int
    best: bool
    split_points: tuple[str, ...]
    stage_ranges: tuple[str, ...]
    chunks: int
    predicted: float | None
    measured: float
    spread: tuple[float, float]
    compute_s: tuple[float, ...] = ()
    """Per stage, measured time inside the stage module for the whole batch."""
    send_s: tuple[float, ...] = ()
    """Per stage, measured time posting sends (waiting for a busy next stage to take them is not counted)."""
    serial_s: float = math.nan
    """The serial model on one stage's threads, same run."""
    failed: str = ""
    """Why the plan has no measurement (its trial failed), else empty."""
    peak_mib: tuple[int, ...] = ()
    """Per stage, peak memory of its trial's timed runs (MiB)."""
    schedule: str = "GPipe"
    """The plan's schedule, ``/V<v>`` where it holds several stages per rank."""
    predicted_mib: tuple[int, ...] = ()
    """Per stage, the predicted peak (MiB): parameters, optimizer state and the step's walk (training) or
    parameters (forward), plus the least the study's measured trials held beyond their prediction."""
    predicted_s: float | None = None
    """The cost model's pipeline step seconds (None where it cannot price the plan)."""
    measured_s: float | None = None
    """The trial's measured pipeline step seconds (median of its repeats)."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PolicyRow:
        d = dict(d)
        for k in ("split_points", "stage_ranges", "compute_s", "send_s", "spread", "peak_mib", "predicted_mib"):
            d[k] = tuple(d.get(k) or ())
        return cls(**d)

    @property
    def policies(self) -> list[str]:
        """The policy names this row stands for (merged seeds carry several, joined by '+')."""
        return [p for p in self.source.split("+") if p]


def stage_ranges(split_points: list[str], segments: list[str]) -> list[str]:
    """Each stage as 'first..last' over the candidate segments; a cut inside a block reads 'before X'."""
    if not segments:
        return []
    out = []
    starts = [segments[0], *split_points]
    for i, start in enumerate(starts):
        nxt = split_points[i] if i < len(split_points) else None
        if nxt is None:
            end = segments[-1]
        elif nxt in segments and segments.index(nxt) > 0:
            end = segments[segments.index(nxt) - 1]
        else:
            end = f"(before {nxt})"
        out.append(start if start == end else f"{start}..{end}")
    return out


def losses(row: PolicyRow) -> dict[str, float]:
    """Multiplicative factors by which the row falls short of the ideal S-fold speedup.

    imbalance: slowest stage's compute / mean stage compute. compute: all stages' compute / the serial
    model's time (smaller microbatches run less efficiently; stages share cores). bubbles: 1 / (1 - (S-1)/(M+S-1)),
    GPipe's fill and drain with M microbatches. communication: 1 / (1 - share of the pipeline time the busiest
    rank spends posting sends; waiting for a busy neighbour is imbalance, not communication, and is left
    out). Their product approximates S / (S-fold speedup); what is left is overhead and waiting.
    """
    s, m = row.stages, row.chunks
    out: dict[str, float] = {}
    if row.compute_s and max(row.compute_s) > 0:
        out["imbalance"] = max(row.compute_s) / (sum(row.compute_s) / len(row.compute_s))
        if row.serial_s == row.serial_s and row.serial_s > 0:
            out["compute"] = sum(row.compute_s) / row.serial_s
    out["bubbles"] = 1 / (1 - (s - 1) / (m + s - 1))
    if row.send_s and row.measured > 0 and row.serial_s == row.serial_s:
        pipe_s = row.serial_s / row.measured
        share = min(0.95, max(row.send_s) / pipe_s) if pipe_s > 0 else 0.0
        out["communication"] = 1 / (1 - share)
    return out


WHY = {"imbalance": "the slowest stage does {x:.2f}x the mean stage's compute",
       "compute": "the stages together compute {x:.2f}x the serial model's time (smaller microbatches, shared cores)",
       "bubbles": "fill and drain with {m} microbatches over {s} stages idle {b:.0%} of each stage",
       "communication": "posting sends takes {c:.0%} of the pipeline time on the busiest rank"}


def reading(row: PolicyRow) -> str:
    """One sentence per policy: its speedup against the ideal and its biggest losses, largest first."""
    if row.failed:
        return f"{row.source}: failed ({row.failed})."
    if not row.measured == row.measured:
        return f"{row.source}: failed in the confirmation round."
    f = losses(row)
    if not f:
        return f"{row.source}: {row.measured:.2f}x of an ideal {row.stages}x."
    ordered = sorted(f.items(), key=lambda kv: -kv[1])
    parts = []
    for name, x in ordered:
        if x < 1.02:
            continue
        parts.append(WHY[name].format(x=x, m=row.chunks, s=row.stages, b=1 - 1 / x, c=1 - 1 / x))
    if not parts:
        return f"{row.source}: {row.measured:.2f}x of an ideal {row.stages}x, no single loss above 2 %."
    return (f"{row.source}: {row.measured:.2f}x of an ideal {row.stages}x; loses most to {ordered[0][0]}: "
            + "; ".join(parts) + ".")


def _fmt(x: float | None) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.2f}"


def _sort_key(row: PolicyRow) -> tuple[bool, int, int]:
    first = row.policies[0] if row.policies else row.source
    return (not row.best, POLICY_ORDER.index(first) if first in POLICY_ORDER else len(POLICY_ORDER), row.trial)


def _pair(predicted: str, measured: str) -> str:
    return f"{predicted} / {measured}" if predicted != "-" or measured != "-" else "-"


def table(rows: list[PolicyRow], ceiling: float | None = None) -> str:
    out = ["| policy | stages (block ranges) | chunks | schedule | predicted | measured | spread "
           "| step s predicted / measured | peak MiB per stage predicted / measured |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in sorted(rows, key=_sort_key):
        name = f"**best** ({r.source})" if r.best else r.source
        ranges = " \\| ".join(f"`{x}`" for x in r.stage_ranges)
        measured = f"failed: {r.failed[:80]}" if r.failed else _fmt(r.measured)
        if not r.failed and (flag := above_ceiling(r.measured, ceiling)):
            measured += f" ({flag})"
        step = _pair(_fmt(r.predicted_s), _fmt(r.measured_s))
        mem = _pair(", ".join(map(str, r.predicted_mib)) or "-", ", ".join(map(str, r.peak_mib)) or "-")
        out.append(f"| {name} | {ranges} | {r.chunks} | {r.schedule} | {_fmt(r.predicted)} | {measured} "
                   f"| {_fmt(r.spread[0])}-{_fmt(r.spread[1])} | {step} | {mem} |")
    return "\n".join(out)


def markdown(title: str, rows: list[PolicyRow], *, plots: dict[str, str], meta: dict[str, Any]) -> str:
    """The whole report: how it was measured, one section per stage count, then the plots."""
    counts = sorted({r.stages for r in rows})
    lines = [f"# {title}", ""]
    lines.append(f"Model {meta.get('model')}, batch {meta.get('batch_size')}, {meta.get('device')}, "
                 f"{meta.get('threads')}; measured {meta.get('date', '')}.")
    speedup = meta.get("objective", "speedup") == "speedup"

    def fig(v: float) -> str:
        return f"{v:.2f}x" if speedup else f"{v:.3g} samples/s"

    if not speedup:
        lines.append("Figures are throughput (samples/s for the whole batch, median of the confirmation round): the "
                     "whole model does not fit --device-memory, so no serial model was timed and there is no speedup "
                     "or S-fold ideal; the 'measured' and 'predicted' columns are samples/s.")
    lines.append(("Speedup" if speedup else "Were the figure a speedup, it would be the") +
                 " = serial model on one stage's threads / pipeline, median of the confirmation round "
                 "(every plan of a stage count re-measured in the same interleaved rounds); spread = min-max; "
                 "predicted = cost model (`-` for PiPPy's mid-block cut, which the block profile cannot price); "
                 "step s = one pipeline step (the trial's median), predicted beside measured; predicted peak memory "
                 "= what the cost model expects a stage to hold (parameters, and in training gradients, optimizer "
                 "state, activations in flight and temporaries) + the least the study's measured trials held "
                 "beyond their prediction (the runtime's own). The ideal is S-fold.")
    lines.append("")
    for s in counts:
        rs = [r for r in rows if r.stages == s]
        best = next((r for r in rs if r.best), None)
        pippy = next((r for r in rs if PIPPY in r.policies), None)
        ceiling = (meta.get("ceilings") or {}).get(str(s)) if speedup else None
        lines.append(f"## {s} stages" + (f" (ideal {s}x)" if speedup else ""))
        lines.append("")
        if ceiling and ceiling < s:
            lines.append(f"This machine's ceiling is {ceiling:.2f}x for {s} stages (its cores / threads per stage): a "
                         "measured speedup above it is noise, flagged where it is shown.")
            lines.append("")
        if best and pippy and best is pippy:
            lines.append(f"The best plan is PiPPy's equal-size split: {fig(best.measured)}"
                         + (f", {best.measured / s:.0%} of the ideal." if speedup else "."))
            lines.append("")
        elif best and pippy and pippy.measured > 0:
            overlap = best.spread[0] <= pippy.spread[1]
            lines.append(f"Best {fig(best.measured)} vs PiPPy's equal-size {fig(pippy.measured)}: "
                         f"{best.measured / pippy.measured:.2f}x better"
                         + (f"; {best.measured / s:.0%} of the ideal." if speedup else ".")
                         + (" Their spreads overlap: the difference is within this machine's run-to-run noise."
                            if overlap else ""))
            lines.append("")
        lines.append(table(rs, ceiling))
        lines.append("")
        if speedup:  # the losses are read against the S-fold ideal, which a throughput has not
            lines.append("Where each loses:")
            lines.append("")
            for r in sorted(rs, key=_sort_key):
                lines.append(f"- {reading(r)}")
            lines.append("")
        for key in (f"timeline_best_s{s}", f"timeline_pippy_s{s}"):
            if key in plots:
                lines.append(f"![{key}]({plots[key]})")
        lines.append("")
    lines.append("## Plots")
    lines.append("")
    for key in ("speedup_vs_stages", "predicted_vs_measured", "compute_comm"):
        if key in plots:
            lines.append(f"![{key}]({plots[key]})")
            lines.append("")
    return "\n".join(lines).rstrip() + "\n"
