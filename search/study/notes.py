"""What a person reads first about a trial in optuna-dashboard: a Markdown note per measured trial.

The plan as stage ranges of module names, predicted vs measured figure (speedup or throughput), the spread
of its repeats, peak memory per rank against the budget (measured and predicted) and its timeline (the
uploaded artifact, shown inline). Saved with
``optuna_dashboard.save_note``; the study gets one too (what was searched, how to read the trials).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import optuna

from pipeline.core.ceiling import above_ceiling
from search.trials.report import stage_ranges

__all__ = ["save_study_note", "save_trial_note", "study_note", "trial_note"]


def _x(v: Any, metric: str = "speedup") -> str:
    if not isinstance(v, (int, float)) or v != v:
        return "-"
    return f"{float(v):.2f}x" if metric == "speedup" else f"{float(v):.3g} samples/s"


def _schedule(attrs: Mapping[str, Any]) -> str:
    """The plan's schedule (and V, and training) where it is not the default forward-only GPipe."""
    v = int(attrs.get("stages_per_rank") or 1)
    sched = str(attrs.get("schedule") or "GPipe")
    plan = attrs.get("plan") or {}
    train = plan.get("mode") == "train"
    if sched == "GPipe" and v == 1 and not train:
        return ""
    rc = plan.get("recompute", "none")
    counts = "" if rc in (None, "none") else \
        f" recomputing {'every block' if rc == 'full' else ','.join(map(str, rc)) + ' blocks per stage'}"
    return (f", schedule {sched}" + (f" with {v} stages per rank" if v > 1 else "")
            + (f", training steps{counts}" if train else ""))


def trial_note(attrs: Mapping[str, Any], names: Sequence[str], *, number: int, state: str,
               timeline_url: str | None = None, metric: str = "speedup", budget: int | None = None) -> str:
    """The note of one measured trial from its user attributes, its figure in ``metric``, its memory against
    ``budget`` (``--device-memory``)."""
    starts = [str(s) for s in attrs.get("split_points", [])]
    lines = [f"## Trial {number}: {state} ({attrs.get('source', '?')})", "",
             f"**Plan**: {attrs.get('chunks', '?')} chunks, cuts at {', '.join(starts) or '-'}"
             + _schedule(attrs), ""]
    lines += [f"- stage {k}: {r}" for k, r in enumerate(stage_ranges(starts, list(names)), 1)]
    spread = attrs.get(f"{metric}_spread") or []
    measured = attrs.get("value", attrs.get(metric))
    ceiling = attrs.get("predicted_ceiling") if metric == "speedup" else None
    flag = f" ({f})" if (f := above_ceiling(measured, ceiling)) else ""
    lines += ["", f"| | {metric} |", "|---|---|",
              f"| measured (median of {attrs.get('repeats', '?')} repeats) | {_x(measured, metric)}{flag} |",
              f"| spread of repeats | {_x(spread[0], metric) if spread else '-'} .. "
              f"{_x(spread[-1], metric) if spread else '-'} |",
              f"| predicted by the cost model | {_x(attrs.get('predicted_value', attrs.get('predicted_speedup')), metric)} |",
              f"| predicted, calibrated to the measured trials | "
              f"{_x(attrs.get('calibrated_value', attrs.get('calibrated_speedup')), metric)} |"]
    peaks = attrs.get("peak_mem_bytes") or []
    predicted = attrs.get("predicted_rank_bytes") or []
    if peaks or predicted:
        of = f" (of {budget / 2**30:.2f} GiB each)" if budget else ""
        lines += ["", f"**Memory per rank**{of}: "
                  + ", ".join(f"rank {r}: " + (f"peak {peaks[r] / 2**20:.0f} MiB" if r < len(peaks) else "not run")
                              + (f", predicted {predicted[r] / 2**20:.0f} MiB" if r < len(predicted) else "")
                              for r in range(max(len(peaks), len(predicted))))]
    if attrs.get("raced_out"):
        lines += ["", f"**Raced out**: {attrs['raced_out']}"]
    if attrs.get("over_memory"):
        lines += ["", f"**Infeasible**: {attrs['over_memory']}"]
    if attrs.get("prediction"):
        lines += ["", f"**Prediction**: {attrs['prediction']}"]
    if attrs.get("fail_reason"):
        lines += ["", f"**Failed**: {attrs['fail_reason']}"]
    if timeline_url:
        lines += ["", f"![measured timeline]({timeline_url})", "", f"[timeline PNG]({timeline_url})"]
    return "\n".join(lines) + "\n"


def save_trial_note(trial: optuna.Trial, names: Sequence[str], state: str, artifact_id: str | None,
                    metric: str = "speedup", budget: int | None = None) -> None:
    """Save ``trial_note`` for a live trial (its timeline link is the dashboard's artifact route)."""
    from optuna_dashboard import save_note

    url = None
    if artifact_id:
        url = f"/artifacts/{trial.study._study_id}/{trial._trial_id}/{artifact_id}"
    save_note(trial, trial_note(trial.user_attrs, names, number=trial.number, state=state, timeline_url=url,
                                metric=metric, budget=budget))


def study_note(config: Mapping[str, Any], space_size: int, ceiling: float | None, decided: str = "") -> str:
    """The study's note on the dashboard: how to read its trials, and (``decided``) what the confirmation round
    decided: the best, or the plans tied with it and how the tie was broken."""
    return "\n".join([
        f"## pipesplit search: {config.get('model')} on {config.get('stages')} ranks (--stages {config.get('stages')})",
        "",
        f"Every trial is a real {config.get('device')} pipeline run ({config.get('backend')} backend, "
        f"{config.get('schedule')}, {config.get('threads_per_stage')} thread(s) per stage"
        + (f", training steps with {config.get('optimizer')}" if config.get("mode") == "train" else "")
        + "); the space holds "
        f"{space_size} plans ({config.get('granularity')} cuts x chunk counts).",
        "",
        ("- **value** is the measured speedup (serial model on one stage's threads / pipeline, median of repeats);"
         if config.get("objective", "speedup") == "speedup" else
         "- **value** is the measured throughput (samples/s for the whole batch, median of repeats; no serial model);"),
        "  intermediate values are that median after each repeat (racing: a plan clearly behind stops early).",
        "- **params** name the module each later stage starts at (`cut_1` starts stage 2) and the chunk count.",
        "- Predictions are user attributes only (`predicted_value`, `calibrated_value`), never values.",
        *([f"- Memory: each rank may hold {config['device_memory'] / 2**30:.2f} GiB (--device-memory); a plan "
           "predicted over it never ran (`over_memory`), `predicted_rank_bytes` beside `peak_mem_bytes`."]
          if config.get("device_memory") else []),
        "- Pruned trials without intermediate values were pruned by the cost model and never ran.",
        *([f"- Ceiling: {ceiling:.2f}x is the most this machine can give this many stages."]
          if ceiling and config.get("objective", "speedup") == "speedup" else []),
        *([f"- **Confirmation round**: {decided}"] if decided else []),
    ]) + "\n"


def save_study_note(study: optuna.Study, body: str) -> None:
    from optuna_dashboard import save_note

    save_note(study, body)
