"""Training steps and schedules on one model, side by side: what each schedule's best plan gives, and its memory.

Three parts, each printed as it finishes (``--out`` also writes every figure as JSON):

1. **Search** (``search.optimize --mode train --schedule all``, or ``--study`` to reuse one): a training
   search over every schedule that fits the ranks; each layout's best measured plan (schedule, V, cuts,
   chunks) is taken from it.
2. **Side by side**: those plans, the best GPipe plan on 1F1B at the same cuts and chunks, and PiPPy's
   equal-size cut (GPipe), re-measured in interleaved rounds (drift slows all alike): training speedup
   (serial step / pipeline step, median and spread), peak memory per stage, and what a step adds to the
   memory held when it starts (activations in flight, above all); then 1F1B's activation memory vs
   GPipe's at the same cuts and chunks.
3. **Inference bubble** (``--bubble-chunks``, default 16): forward-only GPipe at the cost model's cut vs
   Interleaved1F1B with two stages per rank (four balanced stages), side by side: pipeline seconds and
   the idle share of the ranks' time (1 - compute / (ranks x wall)).

    .venv/bin/python benchmarks/training.py                       # DeiT-S b32, 2 stages: all three parts
    .venv/bin/python benchmarks/training.py --study deit_small_patch16_224-s2-b32-cpu-train --skip-bubble
    .venv/bin/python benchmarks/training.py --skip-bubble         # the search and side by side alone: 50 minutes
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any


def _layout(plan: Any) -> str:
    return plan.schedule if plan.stages_per_rank == 1 else f"{plan.schedule}/V{plan.stages_per_rank}"


def _mib(values: Any) -> str:
    return ",".join(f"{v / 2**20:.0f}" for v in values)


def best_per_layout(study: Any) -> dict[str, Any]:
    """Each layout's best complete trial (by its search speedup) and PiPPy's equal-size seed."""
    import optuna

    from pipeline.core.plan import SplitPlan

    best: dict[str, tuple[float, Any]] = {}
    pippy = None
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
        plan = SplitPlan.from_dict(t.user_attrs["plan"])
        if "pippy" in str(t.user_attrs.get("source", "")) and pippy is None:
            pippy = plan
        key = _layout(plan)
        if key not in best or float(t.value or 0) > best[key][0]:
            best[key] = (float(t.value or 0), plan)
    out = {k: v[1] for k, v in sorted(best.items(), key=lambda kv: -kv[1][0])}
    if pippy is not None:
        out["PiPPy equal-size"] = pippy
    return out


def side_by_side(pool: Any, plans: dict[str, Any], rounds: int, repeats: int) -> dict[str, Any]:
    from pipeline.rounds import interleaved

    runs = interleaved(pool, list(plans.values()), rounds, repeats=repeats, drop_failed=True)
    figures: dict[str, Any] = {}
    for i, (name, plan) in enumerate(plans.items()):
        if i in runs.failures or not runs.results[i]:
            print(f"{name:<28} failed: {runs.failures.get(i)}")
            continue
        res = runs.results[i]
        v = runs.speedups(i)
        secs = [t for r in res for t in r.pipeline_s]
        ranks = len(res[0].peak_mem_bytes)
        peak = [max(r.peak_mem_bytes[k] for r in res) for k in range(ranks)]
        base = [min(r.base_mem_bytes[k] for r in res) for k in range(ranks)] if res[0].base_mem_bytes else [0] * ranks
        adds = [p - b for p, b in zip(peak, base)]
        last = res[-1]
        if last.work_events:  # forwards, backwards and weight grads, as the schedule ran them (last repeat)
            work = sum(b - a for ev in last.work_events for _, a, b in ev)
            idle = 1 - work / (ranks * last.pipeline_s[-1])
        else:
            compute = [statistics.median(r.stage_compute_s[k] for r in res) for k in range(ranks)]
            idle = 1 - sum(compute) / (ranks * statistics.median(secs))
        figures[name] = {"plan": plan.to_dict(), "speedups": v, "pipeline_s": secs, "peak_mem_bytes": peak,
                         "base_mem_bytes": base, "step_adds_bytes": adds, "idle_share": idle}
        print(f"{name:<28} {plan.describe():<70} {statistics.median(v):.2f}x (min {min(v):.2f}, max {max(v):.2f}, "
              f"n={len(v)}); step {statistics.median(secs):.3f}s; idle {idle:.1%}; peak MiB/stage {_mib(peak)}, "
              f"a step adds {_mib(adds)}", flush=True)
    return figures


def main(argv: list[str] | None = None) -> int:
    import optuna

    from costmodel.partition import ranked
    from costmodel.profile import load_for_stages
    from pipeline.cli import ModelArgs, add_model_args
    from pipeline.core.plan import SplitPlan, SplitPoint
    from pipeline.ranks.pool import StagePool
    from search.optimize import run_study
    from search.plans.layouts import parse_schedules
    from search.study.config import SearchConfig

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_args(p)
    p.add_argument("--stages", type=int, default=2, help="ranks (default 2)")
    p.add_argument("--trials", type=int, default=16, help="measured trials of the training search (default 16)")
    p.add_argument("--schedule", default="all", help="schedules the search covers (default all)")
    p.add_argument("--study", default=None, help="reuse this training study instead of searching")
    p.add_argument("--storage", default="sqlite:///results/optuna.db")
    p.add_argument("--results-dir", default="results")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds of the side-by-side parts (default 3)")
    p.add_argument("--repeats", type=int, default=1, help="timed repeats per plan and round (default 1)")
    p.add_argument("--bubble-chunks", type=int, default=16)
    p.add_argument("--skip-bubble", action="store_true")
    p.add_argument("--out", default=None, help="write every figure here as JSON")
    args = p.parse_args(argv)
    model = ModelArgs.from_args(args)
    report: dict[str, Any] = {}
    if args.study:
        study = optuna.load_study(study_name=args.study, storage=args.storage)
    else:
        cfg = SearchConfig(model=model, stages=args.stages, trials=args.trials, mode="train",
                           schedules=parse_schedules(args.schedule), storage=args.storage,
                           results_dir=args.results_dir, confirm_top=2, confirm_rounds=2, artifacts=False)
        study = run_study(cfg).study
    report["study"] = study.study_name
    plans = best_per_layout(study)
    gpipe = plans.get("GPipe")
    pair = ("GPipe", "1F1B at GPipe's best cuts")
    if gpipe is not None:
        # 1F1B needs a microbatch per stage; below 4 per stage the two hold about as many in flight
        m = gpipe.chunks if gpipe.chunks >= 4 * gpipe.stages else 4 * gpipe.stages
        if m != gpipe.chunks:
            pair = (f"GPipe at its best cuts x {m}", f"1F1B at GPipe's best cuts x {m}")
            plans[pair[0]] = replace(gpipe, chunks=m)
        plans[pair[1]] = replace(gpipe, schedule="1F1B", chunks=m)
    threads = next(iter(plans.values())).threads_per_stage
    print(f"\nside by side, {args.rounds} interleaved rounds x {args.repeats} repeat(s): training steps", flush=True)
    with StagePool(args.stages, threads_per_stage=threads, quiet=True) as pool:
        report["training"] = train = side_by_side(pool, plans, args.rounds, args.repeats)
        if pair[0] in train and pair[1] in train:
            g, o = train[pair[0]], train[pair[1]]
            print("activation memory at the same cuts and chunks (what a step adds, MiB per stage): GPipe "
                  f"{_mib(g['step_adds_bytes'])}, 1F1B {_mib(o['step_adds_bytes'])}; 1F1B / GPipe = "
                  + ", ".join(f"{b / a:.2f}" if a > 0 else "-" for a, b in zip(g["step_adds_bytes"],
                                                                              o["step_adds_bytes"])), flush=True)
        if not args.skip_bubble:
            spec = SplitPlan.from_dict(study.trials[0].user_attrs["plan"]).model
            m = args.bubble_chunks
            prof, _ = load_for_stages(spec, stages=args.stages, device="cpu", threads=threads,
                                      granularity=model.granularity, micro_sizes=[spec.batch_size // m],
                                      root=Path(args.results_dir) / "profiles", repeats=2, pool=pool)

            def cut(stages: int) -> tuple[SplitPoint, ...]:
                """The cost model's best cuts into ``stages`` stages at ``m`` chunks (balanced stages)."""
                return tuple(SplitPoint(prof.segments[c].fqn) for c in ranked(prof, stages, [m], machine=None)[0].cuts)

            one = SplitPlan(model=spec, split_points=cut(args.stages), chunks=m, threads_per_stage=threads)
            four = SplitPlan(model=spec, split_points=cut(2 * args.stages), chunks=m, schedule="Interleaved1F1B",
                             stages_per_rank=2, threads_per_stage=threads)
            print(f"\ninference bubble at {args.stages} ranks x {m} chunks, side by side", flush=True)
            report["bubble"] = side_by_side(pool, {"GPipe": one, "Interleaved1F1B/V2": four}, args.rounds + 1,
                                            max(2, args.repeats))
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1))
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
