"""``python -m search.sweep``: the lab's questions in one command, over several stage counts.

For each stage count it runs (or resumes) the search study of ``search.optimize``, then re-measures the
optimizer's best and every reference policy (PiPPy's equal-size, uniform, parameter-, time- and
FLOP-balanced, the cost model's optimum, torchtitan's, Megatron-Core's and DeepSpeed's rules) in the same
interleaved confirmation rounds. It writes
``results/<sweep>/report.md`` with a table per stage count and a generated reading of where each policy
loses (imbalance, per-microbatch compute, bubbles, communication), plus PNGs linked from the report:
speedup vs stages, predicted vs measured, measured per-stage timelines of the best and of PiPPy's plan,
and per-stage compute vs communication. The plots are also uploaded to each study as Optuna artifacts.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from pipeline.core.errors import PipesplitError

EXAMPLES = """\
examples:
  python -m search.sweep --stages 2 3 4 6                   # DeiT-S, batch 32, CPU (long: ~15 min per count here)
  python -m search.sweep --stages 2 3 4 --trials 8 --trace
  python -m search.sweep --model resnet50 --image-size 160 --batch-size 8 --stages 2 3
  # re-running resumes every study; the report is rebuilt from the new confirmation round
  python -m search.sweep --stages 2 3 4 --report-only         # rebuild the report from the stored studies
  optuna-dashboard sqlite:///results/optuna.db --artifact-dir results/artifacts
"""

SWEEP_TRIALS = 10


def parser() -> argparse.ArgumentParser:
    from search.optimize import build_parser

    p = build_parser("python -m search.sweep", __doc__ or "", EXAMPLES, sweep=True)
    p.add_argument("--name", default=None, help="sweep folder under --results-dir (default sweep-<model>-b<batch>-<device>)")
    p.add_argument("--report-only", action="store_true",
                   help="measure nothing: rebuild report.md and the plots from the studies' last confirmation rounds")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    from pipeline.logs import quiet_logs

    quiet_logs()
    args = parser().parse_args(argv)
    try:
        return _run(args)
    except PipesplitError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace) -> int:
    from pipeline.ranks.launch import torchrun_env

    if torchrun_env() is not None:
        raise PipesplitError("a sweep needs a different number of processes per stage count: under torchrun, "
                             "run python -m search.optimize --stages <nnodes x nproc-per-node> instead")
    from pipeline.models.build import build_meta_model
    from pipeline.models.candidates import find_candidates
    from search.optimize import run_study
    from search.study.config import SearchConfig

    counts = list(dict.fromkeys(args.stages))
    bad = [s for s in counts if s < 2]
    if bad:
        raise PipesplitError(f"--stages {' '.join(map(str, bad))}: every stage count must be at least 2")
    base = SearchConfig.from_args(args, counts[0])
    if base.trials is None:
        base = replace(base, trials=SWEEP_TRIALS)
    spec = base.model.resolve()
    cands = find_candidates(build_meta_model(spec), spec, base.model.granularity)
    too_many = [s for s in counts if s > cands.max_stages]
    if too_many:
        cands.check_stages(too_many[0], spec.label)
    device = base.device
    name = args.name or f"sweep-{spec.slug}-b{spec.batch_size}-{device}"
    outdir = Path(args.results_dir) / name
    studies: dict[int, Any] = {}
    artifacts = None
    interrupted = False
    if args.report_only:
        import optuna

        from search.study.config import default_study_name
        from search.trials.storage import open_storage

        db = args.storage.removeprefix("sqlite:///")
        if args.storage.startswith("sqlite:///") and not Path(db).exists():
            raise PipesplitError(f"--report-only: {db} does not exist; run the sweep first (without --report-only)")
        storage = open_storage(args.storage)
        for s in counts:
            study_name = default_study_name(spec.slug, s, spec.batch_size, device, args.granularity)
            try:
                studies[s] = optuna.load_study(study_name=study_name, storage=storage)
            except KeyError:
                raise PipesplitError(f"--report-only: no study {study_name!r} in {args.storage}; run the sweep "
                                     f"for --stages {s} first") from None
    else:
        for s in counts:
            print(f"\n=== {s} stages ===", flush=True)
            run = run_study(replace(base, stages=s), references=True)
            studies[s] = run.study
            artifacts = run.context.artifacts
            if run.interrupted:
                interrupted = True
                break
    paths = write_report(studies, outdir, spec=spec, device=device, title=f"pipesplit sweep: {spec.label}",
                         artifacts=artifacts)
    for p in paths:
        print(f"wrote {p}")
    return 130 if interrupted else 0


def _memory_and_schedule(attrs: dict[str, Any], runtime: tuple[int, ...]) -> dict[str, Any]:
    """A trial's peak MiB per stage, its predicted one (with each rank's ``runtime`` bytes of the runtime's
    own), its predicted and measured step seconds and its schedule label, as a report row carries them."""
    from search.outputs.summary import layout_label

    predicted = attrs.get("predicted_mem_bytes") or ()
    extra = list(runtime) + [0] * (len(predicted) - len(runtime))
    return {"peak_mib": tuple(round(b / 2**20) for b in attrs.get("peak_mem_bytes") or ()),
            "predicted_mib": tuple(round((b + e) / 2**20) for b, e in zip(predicted, extra)),
            "predicted_s": attrs.get("predicted_s"), "measured_s": attrs.get("measured_s"),
            "schedule": layout_label(attrs.get("plan") or {})}


def study_runtime_bytes(study: Any) -> tuple[int, ...]:
    """What the study's measured trials held beyond their memory prediction, at least, rank by rank
    (``costmodel.footprint``)."""
    from costmodel.footprint import rank_runtime_bytes

    return rank_runtime_bytes([(t.user_attrs["peak_mem_bytes"], t.user_attrs["predicted_mem_bytes"])
                               for t in study.get_trials(deepcopy=False)
                               if t.user_attrs.get("peak_mem_bytes") and t.user_attrs.get("predicted_mem_bytes")])


def rows_for(stages: int, study: Any) -> list[Any]:
    """A stage count's confirmation round (kept in its study) as report rows, plus reference policies
    whose trial failed."""
    import optuna

    from search.judging.confirm import Confirmation
    from search.trials.coordination import is_seed
    from search.trials.report import PolicyRow, stage_ranges

    conf = Confirmation.of(study)
    plans = conf.plans if conf else ()
    segments = list(study.user_attrs.get("segments") or [])
    runtime = study_runtime_bytes(study)
    out = []
    for r in plans:
        detail = r.detail or {}
        compute = tuple(detail.get("stage_compute_s") or ())
        tl = r.timeline
        send = tuple(tl.totals(k)["send"] for k in range(tl.stages)) if tl is not None else ()
        pts = list(r.split_points)
        out.append(PolicyRow(stages=stages, source=r.source, trial=r.trial, best=conf is not None and r.trial == conf.best_trial,
                             split_points=tuple(pts), stage_ranges=tuple(stage_ranges(pts, segments)),
                             chunks=r.chunks, predicted=r.predicted, measured=r.median, spread=r.spread,
                             compute_s=compute, send_s=send, serial_s=float(detail.get("serial_s", float("nan"))),
                             **_memory_and_schedule(study.trials[r.trial].user_attrs, runtime)))
    confirmed = {r.trial for r in plans}
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.FAIL,)):
        if not is_seed(t) or not t.user_attrs.get("fail_reason") or t.number in confirmed:
            continue
        pts = list(t.user_attrs.get("split_points") or [])
        out.append(PolicyRow(stages=stages, source=str(t.user_attrs.get("source")), trial=t.number, best=False,
                             split_points=tuple(pts),
                             stage_ranges=tuple(stage_ranges(pts, segments)), chunks=int(t.user_attrs["chunks"]),
                             predicted=t.user_attrs.get("predicted_value", t.user_attrs.get("predicted_speedup")),
                             measured=float("nan"),
                             spread=(float("nan"), float("nan")), failed=str(t.user_attrs["fail_reason"])))
    return out


def write_report(studies: dict[int, Any], outdir: Path, *, spec: Any, device: str, title: str,
                 artifacts: Any = None) -> list[Path]:
    """report.md, sweep.json and the PNGs from each stage count's study (its confirmation round), so a
    report can be rebuilt at any time (``--report-only``); the plots go to the artifact store too."""
    import optuna

    from pipeline.core.atomic import write_json, write_text
    from pipeline.stage.timeline import Timeline, render
    from search.judging.confirm import Confirmation
    from search.outputs import plots
    from search.outputs.export import figure_label, timeline_runs
    from search.trials.coordination import value_of
    from search.trials.report import markdown

    outdir.mkdir(parents=True, exist_ok=True)
    rows = [row for s, study in studies.items() for row in rows_for(s, study)]
    points = []
    for s, study in studies.items():
        for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
            predicted = t.user_attrs.get("predicted_value", t.user_attrs.get("predicted_speedup"))
            if t.user_attrs.get("measured") and predicted is not None:
                points.append((s, float(predicted), float(value_of(t) or 0.0)))
    made: dict[str, str] = {}
    timelines: dict[str, Timeline] = {}
    for s, study in studies.items():
        for role, _, tl, row in timeline_runs(Confirmation.of(study)):
            label = "best" if role == "best" else "PiPPy equal-size"
            key = f"timeline_{role}_s{s}"
            render(tl, outdir / f"{key}.png", title=f"{label}: {row.plan.describe()} - {figure_label(row.detail)}")
            made[key] = f"{key}.png"
            timelines[f"{s} stages, {label}"] = tl
    figure = next((str((st.user_attrs.get("config") or {}).get("objective", "speedup")) for st in studies.values()),
                  "speedup")
    if rows:
        plots.speedup_vs_stages(rows, outdir / "speedup_vs_stages.png", figure)
        made["speedup_vs_stages"] = "speedup_vs_stages.png"
    if points:
        ceilings = {s: float(st.user_attrs["ceiling"]) for s, st in studies.items()
                    if st.user_attrs.get("ceiling") and figure == "speedup"}
        plots.predicted_vs_measured(points, outdir / "predicted_vs_measured.png", ceilings, figure)
        made["predicted_vs_measured"] = "predicted_vs_measured.png"
    if timelines:
        plots.compute_comm(timelines, outdir / "compute_comm.png")
        made["compute_comm"] = "compute_comm.png"
    threads = sorted({int((st.user_attrs.get("config") or {}).get("threads_per_stage") or 0) for st in studies.values()}
                     - {0})
    meta = {"model": spec.label, "batch_size": spec.batch_size, "device": device,
            "threads": f"{'/'.join(map(str, threads))} thread(s) per stage",
            "date": time.strftime("%Y-%m-%d %H:%M"), "studies": {s: st.study_name for s, st in studies.items()},
            "objective": figure, "ceilings": {str(s): float(st.user_attrs["ceiling"]) for s, st in studies.items()
                                              if st.user_attrs.get("ceiling") and figure == "speedup"}}
    text = markdown(title, rows, plots=made, meta=meta)
    report = write_text(outdir / "report.md", text)
    write_json(outdir / "sweep.json", {"meta": meta, "rows": [r.to_dict() for r in rows],
                                       "predicted_vs_measured": points})
    if artifacts is not None:
        from optuna.artifacts import upload_artifact

        for study in studies.values():
            for key in ("speedup_vs_stages", "predicted_vs_measured", "compute_comm"):
                if key in made:
                    upload_artifact(artifact_store=artifacts, file_path=str(outdir / made[key]),
                                    study_or_trial=study, mimetype="image/png")
    return [report, outdir / "sweep.json", *[outdir / v for v in made.values()]]


if __name__ == "__main__":
    sys.exit(main())
