"""What a search leaves behind: best_split.json, trials.csv, summary.md (and the printed summary)."""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import optuna

from pipeline.core.atomic import write_json, write_text, write_with
from pipeline.core.ceiling import above_ceiling
from pipeline.core.plan import SplitPlan
from pipeline.export import provenance
from search.judging.confirm import Confirmation
from search.plans.memory import OVER_MEMORY, format_size
from search.plans.seeds import frameworks_line
from search.study.context import SearchContext
from search.trials.coordination import MEASURED, SAMPLER, failed_trials, is_seed, timed_share, trial_counts, value_of


def _fmt(x: Any, spec: str = ".2f") -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def summary_rows(study: optuna.Study, confirmation: Confirmation | None) -> list[dict[str, Any]]:
    """One row per reference source and for the declared best: where it cut, predicted and measured."""
    confirmed = {r.trial: r for r in (confirmation.plans if confirmation else ())}
    rows: list[dict[str, Any]] = []
    best_no = confirmation.best_trial if confirmation else None
    tied = set(confirmation.tied_with) if confirmation else set()
    for t in study.get_trials(deepcopy=False):
        if not t.user_attrs.get(MEASURED):
            continue
        if not is_seed(t) and t.number != best_no and t.number not in tied:
            continue
        c = confirmed.get(t.number)
        repeats = [float(v) for v in t.user_attrs.get("repeat_values") or []]
        rows.append({
            "role": "BEST" if t.number == best_no else "TIED" if t.number in tied else "reference",
            "source": str(t.user_attrs.get("source", SAMPLER)), "trial": t.number,
            "split_points": t.user_attrs.get("split_points"),
            "chunks": t.user_attrs.get("chunks"),
            "predicted": t.user_attrs.get("predicted_value", t.user_attrs.get("predicted_speedup")),
            "measured": value_of(t) if t.state == optuna.trial.TrialState.COMPLETE else None,
            "confirmed": c.median if c else None,
            "confirmed_spread": list(c.spread) if c and c.values else None,
            "measured_spread": [min(repeats), max(repeats)] if repeats else None,
            "failed": t.user_attrs.get("fail_reason"),
            "schedule": layout_label(t.user_attrs.get("plan") or {}),
            "peak_mib": [round(b / 2**20) for b in t.user_attrs.get("peak_mem_bytes") or []],
            "predicted_mib": [round(b / 2**20) for b in t.user_attrs.get("predicted_rank_bytes") or []],
        })
    rows.sort(key=lambda r: (r["role"] != "BEST", r["role"] != "TIED", -float(r["confirmed"] or r["measured"] or 0)))
    return rows


def frameworks_summary(confirmation: Confirmation | None, metric: str,
                       unseeded: dict[str, str] | None = None) -> tuple[str, dict[str, Any]]:
    """The best against each framework's default rule, as measured in the same confirmation rounds: a line
    for the summary and the figures for ``best_split.json`` (``measured.frameworks``)."""
    best = confirmation.best if confirmation else None
    peers = confirmation.frameworks if confirmation else {}
    fmt = ".2f" if metric == "speedup" else ".3g"
    data: dict[str, Any] = {}
    grouped: dict[int, list[str]] = {}
    for rule, row in peers.items():
        ratio = best.median / row.median if best and row.median > 0 else math.nan
        data[rule] = {"trial": row.trial, "split_points": list(row.split_points), "chunks": row.chunks,
                      metric: row.median, f"{metric}_spread": list(row.spread), "best_over_it": ratio}
        grouped.setdefault(row.trial, []).append(rule)
    parts = []
    for trial, rules in grouped.items():
        d = data[rules[0]]
        lo, hi = d[f"{metric}_spread"]
        if best is not None and trial == best.trial:
            parts.append(f"the default plan of {', '.join(rules)} itself")
            continue
        parts.append(f"{d['best_over_it']:.2f}x the plan of {', '.join(rules)} ({d[metric]:{fmt}}, spread {lo:{fmt}}-{hi:{fmt}})")
    text = ""
    if best and parts:
        text = (f"Against the frameworks' default rules, in the same interleaved rounds: the best ({best.median:{fmt}}) "
                "is " + ", ".join(parts) + ".")
    if unseeded:
        text += (" " if text else "") + "Frameworks' rules " + frameworks_line(unseeded) + "."
    return text, data


def layout_label(plan: dict[str, Any]) -> str:
    """A plan's schedule, with its stages per rank where more than one: ``Interleaved1F1B/V2``."""
    v = int(plan.get("stages_per_rank", 1))
    name = str(plan.get("schedule", "GPipe"))
    return name if v == 1 else f"{name}/V{v}"


def _with_spread(value: Any, spread: Any, fmt: str, ceiling: float | None) -> str:
    """A figure with its min-max, flagged where a speedup passes the machine's ceiling (noise, not speed)."""
    text = _fmt(value, fmt)
    if spread and text != "-":
        text += f" ({_fmt(spread[0], fmt)}-{_fmt(spread[1], fmt)})"
    if flag := above_ceiling(value, ceiling):
        text += f" {flag}"
    return text


def summary_table(rows: list[dict[str, Any]], metric: str = "speedup", ceiling: float | None = None) -> str:
    """The summary's table: the best (and the plans tied with it) and each reference, their schedule, figures
    (speedup or throughput in samples/s, as ``metric``, each with its min-max, a speedup over ``ceiling``
    flagged) and peak memory per stage (measured, and predicted where a budget was given)."""
    fmt = ".2f" if metric == "speedup" else ".3g"
    ceiling = ceiling if metric == "speedup" else None
    predicted = any(r.get("predicted_mib") for r in rows)
    head = "speedup" if metric == "speedup" else "samples/s"
    out = [f"| role | source | trial | split points | chunks | schedule | predicted {head} | measured {head} "
           f"| confirmed {head} | peak MiB per stage |" + (" predicted MiB per stage |" if predicted else ""),
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |" + (" --- |" if predicted else "")]
    for r in rows:
        pts = ", ".join(r["split_points"] or [])
        measured = _with_spread(r["measured"], r.get("measured_spread"), fmt, ceiling) if not r["failed"] \
            else f"failed: {r['failed'][:60]}"
        peaks = ", ".join(map(str, r.get("peak_mib") or [])) or "-"
        pred = (" " + (", ".join(map(str, r.get("predicted_mib") or [])) or "-") + " |") if predicted else ""
        confirmed = _with_spread(r["confirmed"], r.get("confirmed_spread"), fmt, ceiling)
        out.append(f"| {r['role']} | {r['source']} | {r['trial']} | {pts} | {r['chunks']} | {r.get('schedule', 'GPipe')} "
                   f"| {_fmt(r['predicted'], fmt)} | {measured} | {confirmed} | {peaks} |{pred}")
    return "\n".join(out)


def pareto_table(study: optuna.Study, metric: str = "speedup") -> str:
    """A two-objective study's Pareto front (the figure up, largest stage's peak memory down), fastest first;
    empty for a one-objective study."""
    if len(study.directions) < 2:
        return ""
    out = [f"Pareto front ({metric} up, the largest stage's peak memory down):", "",
           f"| trial | split points | chunks | schedule | {metric} | largest stage's peak MiB |",
           "| --- | --- | --- | --- | --- | --- |"]
    for t in sorted(study.best_trials, key=lambda t: -t.values[0]):
        pts = ", ".join(t.user_attrs.get("split_points") or [])
        out.append(f"| {t.number} | {pts} | {t.user_attrs.get('chunks')} | {layout_label(t.user_attrs.get('plan') or {})} "
                   f"| {t.values[0]:.2f} | {t.values[1]:.0f} |")
    return "\n".join(out)


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


def memory_errors(study: optuna.Study) -> str:
    """Predicted vs measured peak per rank over the measured plans, in a sentence (empty before any)."""
    pairs = [(p, q) for t in study.get_trials(deepcopy=False)
             for p, q in zip(t.user_attrs.get("peak_mem_bytes") or [], t.user_attrs.get("predicted_rank_bytes") or [])]
    if not pairs:
        return ""
    errs = sorted(q / p - 1 for p, q in pairs if p > 0)
    return (f" Predicted / measured peak per rank over {len(pairs)} measured ranks: median {errs[len(errs) // 2]:+.0%}, "
            f"from {errs[0]:+.0%} to {errs[-1]:+.0%} (the table shows both per stage).")


def budget_line(c: dict[str, int], asked: int | None, budget_repeats: int | None = None,
                memory_flag: str = "--device-memory", failures: Sequence[tuple[int, str]] = ()) -> str:
    """The search's budget in words: what was asked, what was measured, what failed and why the rest was not."""
    own = c["measured"] - c["seeds"]
    raced = f", {c['raced_out']} of them raced out early" if c.get("raced_out") else ""
    if c.get("over_memory"):
        raced += f", {c['over_memory']} over {memory_flag} (infeasible)"
    failed = c.get("failed", 0)
    named = "; ".join(f"trial {n}: {why[:160]}" for n, why in failures[:3]) + ("; ..." if len(failures) > 3 else "")
    text = (f"{c['measured']} measured trials ({c['seeds']} seeds, {own} the sampler's own{raced})"
            + (f" and {failed} failed ({named})" if failed and named else f" and {failed} failed" if failed else "")
            + (f" of {asked} asked for" if asked is not None else "")
            + f", {c.get('repeats', 0)} timed repeats" + (f" of a budget of {budget_repeats}" if budget_repeats else "")
            + f"; {c['stored']} trials stored in all"
            + (f", from a space of {c['space']} plans." if c.get("space") else "."))
    if asked is not None and c["measured"] + failed < asked:
        if budget_repeats is not None and c.get("repeats", 0) >= budget_repeats:
            text += " The search stopped when its repeat budget was spent."
        elif c.get("unrun_over_memory"):
            text += (f" The search stopped when every plan left was predicted over {memory_flag}: the "
                     f"{c['unrun_over_memory']} plans without a trial were never built; a larger {memory_flag}, "
                     "more stages or a smaller dtype widen the space.")
        elif c.get("space") and c["measured"] + failed + c["pruned"] + c.get("predicted_over", 0) >= c["space"]:
            over = (f", {c['predicted_over']} predicted over {memory_flag} and not run" if c.get("predicted_over")
                    else "")
            text += (f" The space holds only {c['space']} plans ({c['measured']} measured, {c['pruned']} pruned by "
                     f"the cost model{over}): every one was tried, each once.")
        else:
            text += (f" The search stopped short: of the sampler's other proposals, {c['pruned']} were pruned by "
                     "the cost model (predicted figure, corrected by the most optimistic measured/predicted ratio "
                     f"so far, below 97 % of the best measured), {c['infeasible']} were infeasible and "
                     f"{c['duplicates']} repeated a measured plan. Run the same command with --no-prune to measure "
                     "what the cost model pruned.")
    return text


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
