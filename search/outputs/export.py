"""What a search leaves behind: best_split.json, trials.csv, summary.md (and the printed summary)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import optuna

from pipeline.core.atomic import write_json, write_text, write_with
from pipeline.core.plan import SplitPlan
from pipeline.export import provenance
from search.judging.confirm import Confirmation
from search.outputs.summary import budget_line, frameworks_summary, memory_errors, pareto_table, summary_rows, summary_table
from search.plans.memory import OVER_MEMORY, format_size
from search.study.context import SearchContext
from search.trials.coordination import failed_trials, timed_share, trial_counts, value_of


def export(study: optuna.Study, ctx: SearchContext, outdir: Path, *, confirmation: Confirmation | None,
           out: str | None, storage_url: str, asked: int | None = None) -> list[Path]:
    """best_split.json (the confirmed best, or the best measured), trials.csv and summary.md."""
    paths = []
    metric = ctx.metric.name
    best_no = confirmation.best_trial if confirmation else None
    if best_no is None:
        fallback = ctx.best_measured()
        best_no = fallback.number if fallback else None
    if best_no is not None:
        t = study.trials[best_no]
        plan = SplitPlan.from_dict(t.user_attrs["plan"])
        result = confirmation.best_result if confirmation and confirmation.best_trial == best_no else None
        result = result or ctx.results.get(best_no)
        meas = result.measured() if result is not None else {
            "ok": True, metric: value_of(t), **{k: t.user_attrs.get(k) for k in (
                "speedup_spread", "serial_s", "pipeline_s", "stage_compute_s", "stage_comm_s", "boundary_bytes",
                "peak_mem_bytes", "base_mem_bytes", "max_abs_diff", "check")}}
        row = confirmation.row(best_no) if confirmation else None
        if row and row.values:
            meas[metric] = row.median
            meas[f"{metric}_spread"] = list(row.spread)
            meas[f"confirmation_{metric}s"] = list(row.values)
        meas["objective"] = metric
        meas[f"search_{metric}"] = value_of(t)
        meas["confirmed"] = bool(row and row.values)
        meas["frameworks"] = frameworks_summary(confirmation, metric)[1]
        if confirmation is not None and confirmation.best_trial == best_no and confirmation.declared is not None:
            meas["pipeline_s"] = row.pipeline_s if row else meas.get("pipeline_s")
            tie = {"tied_with": [{"trial": r.trial, "split_points": list(r.split_points), "chunks": r.chunks,
                                  "pipeline_s": r.pipeline_s, metric: r.median, f"{metric}_spread": list(r.spread),
                                  "largest_peak_bytes": r.peak_bytes, "source": r.source,
                                  "comparison": confirmation.comparisons.get(r.trial)} for r in confirmation.tied],
                   "tie_reason": confirmation.tie_reason}
        else:
            tie = {}
        predicted = {k: t.user_attrs.get(a) for k, a in
                     (("speedup", "predicted_speedup"), ("makespan_s", "predicted_s"),
                      ("bubble_fraction", "predicted_bubble"), ("calibrated", "calibrated_value"),
                      ("ceiling", "predicted_ceiling"), ("rank_bytes", "predicted_rank_bytes"))}
        if metric != "speedup":
            predicted[metric] = t.user_attrs.get("predicted_value")
        doc = {**plan.to_dict(), **tie, "measured": meas, "predicted": predicted,
               "provenance": provenance(study=study.study_name, trial=best_no, storage=storage_url,
                                        source=t.user_attrs.get("source"), command="search.optimize")}
        best_path = Path(out) if out else outdir / "best_split.json"
        write_json(best_path, doc)
        paths.append(best_path)
    df = study.trials_dataframe(attrs=("number", "value", "state", "params", "user_attrs", "datetime_start",
                                       "duration"))
    paths.append(write_with(outdir / "trials.csv", lambda tmp: df.to_csv(tmp, index=False)))
    rows = summary_rows(study, confirmation)
    ceiling = study.user_attrs.get("ceiling")
    table = summary_table(rows, metric, ceiling)
    budget = budget_line(trial_counts(study) | {"unrun_over_memory": int(study.user_attrs.get("unrun_over_memory", 0))},
                         asked, ctx.budget_repeats, failures=failed_trials(study))
    share = timed_share(study)
    if share is not None:
        budget += (f" The measured trials spent {share:.0%} of their wall time in timed repeats (the rest: building "
                   "stages, output checks, warm-up, the driver).")
    if ceiling and metric == "speedup":
        stages = (study.user_attrs.get("config") or {}).get("stages", "?")
        budget += (f" Ceiling: {ceiling:.2f}x is the most speedup this machine can give {stages} stages (cores / "
                   "threads per stage on CPU); no prediction exceeds it.")
    if (study.user_attrs.get("config") or {}).get("mode") == "train":
        budget += (" Training steps (forward, loss, backward, optimizer): 'predicted' replays each schedule's own "
                   "action order (torch's) over the profile's forward, backward and optimizer-step times.")
    limit = (study.user_attrs.get("config") or {}).get("device_memory")
    if limit:
        budget += (f" Device memory: {format_size(limit)} per rank (--device-memory); a plan with a rank predicted "
                   "over it (from the model on meta, plus the runtime memory measured trials held) was not run, a "
                   "measured plan that peaked over it is infeasible.")
        budget += memory_errors(study)
        over = [t for t in study.get_trials(deepcopy=False) if t.user_attrs.get(OVER_MEMORY)]
        if best_no is None and over:
            peaks = [max(t.user_attrs["peak_mem_bytes"]) for t in over if t.user_attrs.get("peak_mem_bytes")]
            unrun = sum(1 for t in over if not t.user_attrs.get("peak_mem_bytes"))
            budget += (" No measured plan fits it"
                       + (f" (the smallest largest-stage peak was {format_size(min(peaks))})" if peaks else "")
                       + (f"; {unrun} plan{'s' if unrun != 1 else ''} predicted over it did not run" if unrun else "")
                       + ", so no best split was written: raise the limit, or add stages or stages per rank.")
    decided = confirmation.verdict() if confirmation else ""
    if decided:
        budget += " " + decided
    peers = frameworks_summary(confirmation, metric, study.user_attrs.get("frameworks_unseeded"))[0]
    if peers:
        budget += " " + peers
    front = pareto_table(study, metric)
    if front:
        table += "\n\n" + front
    text = (f"# {study.study_name}\n\n{budget}\n\n"
            f"Plans are ranked by {ctx.metric.words}; the confirmation round compares them by their own pipeline "
            "seconds, paired within each interleaved round ('confirmed': the round's median, a speedup over the "
            "pooled serial seconds of its round; min-max in brackets).\n\n" + table + "\n")
    paths.append(write_text(outdir / "summary.md", text))
    print(table)
    print(budget)
    return paths


def figure_label(detail: dict[str, Any]) -> str:
    """A confirmed run's figure as its title shows it (a round kept before the metric was named: speedup)."""
    return str(detail.get("label") or f"{detail['speedup']:.2f}x")


def timeline_runs(confirmation: Confirmation | None, frameworks: bool = False) -> list[tuple[str, int, Any, Any]]:
    """(role, trial, Timeline, Confirmed) of the confirmed best plan and PiPPy's equal-size plan (with
    ``frameworks``, each framework default rule's plan too, once per trial), from the confirmation round as
    kept in the study (``search.sweep`` reads the same)."""
    if confirmation is None:
        return []
    rows = [("best", confirmation.row(confirmation.best_trial)), ("pippy", confirmation.pippy)]
    if frameworks:
        rows += list(confirmation.frameworks.items())
    out, seen = [], set()
    for role, row in rows:
        tl = row.timeline if row is not None else None
        if row is not None and tl is not None and (role in ("best", "pippy") or row.trial not in seen):
            out.append((role, row.trial, tl, row))
            seen.add(row.trial)
    return out


def export_timelines(study: optuna.Study, outdir: Path, confirmation: Confirmation | None,
                     artifacts: Any = None) -> list[Path]:
    """Measured Gantt charts of the confirmed best plan, PiPPy's equal-size plan and each framework default
    rule's plan (PNG + spans JSON),
    uploaded to the study as artifacts when a store is given."""
    from pipeline.stage.timeline import render

    paths: list[Path] = []
    spans: dict[str, Any] = {}
    for role, number, tl, row in timeline_runs(confirmation, frameworks=True):
        label = {"best": "best plan", "pippy": "PiPPy equal-size"}.get(role, f"{row.source}'s default rule")
        path = render(tl, outdir / f"timeline_{role}.png",
                      title=f"{label} (trial {number}): {row.plan.describe()} - {figure_label(row.detail)}")
        spans[role] = {"trial": number, **tl.to_dict()}
        paths.append(path)
        if artifacts is not None:
            from optuna.artifacts import upload_artifact

            upload_artifact(artifact_store=artifacts, file_path=str(path), study_or_trial=study, mimetype="image/png")
    if spans:
        write_json(outdir / "timelines.json", spans)
        paths.append(outdir / "timelines.json")
    return paths


def check_formats(formats: tuple[str, ...], blocks: tuple[str, ...], label: str) -> None:
    """Before anything is measured: one line where ``--export-to`` asks for a format this model cannot be
    written in (no single stack of layers)."""
    from pipeline.core.errors import PipesplitError
    from pipeline.core.stack import NoStack, find_stack

    if not formats:
        return
    try:
        find_stack(blocks)
    except NoStack as e:
        raise PipesplitError(f"--export-to {','.join(formats)}: {label} cannot be written in a framework's format: "
                             f"{e}; leave --export-to out") from None


def export_formats(best_path: Path, formats: tuple[str, ...]) -> list[Path]:
    """The best split in each framework's format, beside it (``best_split.<format>.txt``), as
    ``python -m pipeline.export --split best_split.json --to <format>`` prints it."""
    from pipeline.core.errors import PipesplitError
    from pipeline.export import export_text, figure_of, study_lookup

    doc = SplitPlan.read(best_path)
    plan = SplitPlan.from_dict(doc)
    out = []
    for fmt in formats:
        try:
            text = export_text(plan, fmt, measured=study_lookup(doc), figure=figure_of(doc))
        except PipesplitError as e:
            print(f"warning: the best split was not written for {fmt}: {e}", file=sys.stderr)
            continue
        out.append(write_text(best_path.with_name(f"{best_path.stem}.{fmt}.txt"), text))
    return out
