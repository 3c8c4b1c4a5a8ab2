"""``search.optimize --ranks N``: which pipeline degree to use on N processes, and whether to pipeline at all.

Each pipeline degree S that divides N (2 <= S, at most the model's cut points; ``--stages S`` pins one) is
a study of its own: S pipeline ranks x N / S data-parallel replicas (``--dp-shard``), every plan trained on
the (``pp``, ``dp_shard``) mesh, with cuts, chunks, schedule, virtual stages and recomputation searched
inside it as in any training search. Then each degree's best and plain FSDP (the whole model on every
replica, no pipeline: the reference) are re-measured side by side in interleaved rounds on the same N
processes, and ranked by the whole job's throughput; the verdict says how the best pipeline compares with
plain FSDP ("the best is 1.30x plain FSDP", or "plain FSDP is faster here: do not pipeline").
"""

from __future__ import annotations

import dataclasses
import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.core.errors import PipesplitError
from pipeline.core.plan import SplitPlan
from search.study.config import SearchConfig

__all__ = ["DegreeRow", "degrees", "run_degrees", "verdict"]


def degrees(ranks: int, most: int, pinned: int | None = None) -> list[int]:
    """The pipeline degrees a search of ``ranks`` processes covers: the divisors from 2 up to ``most`` stages
    (or the ``pinned`` one); one line where there is none."""
    if ranks < 2:
        raise PipesplitError(f"--ranks {ranks} leaves nothing to choose: give 2 or more processes")
    if pinned is not None:
        if ranks % pinned:
            ok = ", ".join(str(s) for s in range(2, ranks + 1) if ranks % s == 0)
            raise PipesplitError(f"--ranks {ranks} is not --stages {pinned} x a number of replicas: give a multiple of "
                                 f"{pinned}, or --stages among {ok}")
        return [pinned]
    out = [s for s in range(2, min(ranks, most) + 1) if ranks % s == 0]
    if not out:
        raise PipesplitError(f"--ranks {ranks} has no pipeline degree from 2 to {most} stages (the model's most) that "
                             "divides it: give a rank count with such a divisor")
    return out


@dataclass(frozen=True, kw_only=True)
class DegreeRow:
    """One degree's best plan (or plain FSDP) as re-measured side by side."""

    label: str
    plan: dict[str, Any]
    throughput: tuple[float, ...]
    """Samples/s of the whole job, every repeat of every round."""
    peak_mib: tuple[int, ...] = ()
    """The most each rank of the mesh held over the rounds."""
    predicted_mib: tuple[int, ...] = ()
    """Each pipeline rank's predicted peak (every replica of it alike), the runtime's own memory included."""
    failed: str | None = None

    @property
    def median(self) -> float:
        return statistics.median(self.throughput) if self.throughput else float("nan")

    def to_dict(self) -> dict[str, Any]:
        return {"label": self.label, "plan": self.plan, "throughput": list(self.throughput),
                "median": self.median, "peak_mib": list(self.peak_mib), "predicted_mib": list(self.predicted_mib),
                "failed": self.failed}


def verdict(rows: list[DegreeRow]) -> str:
    """How the best pipeline compares with plain FSDP, in one line."""
    plain = next((r for r in rows if r.label == "plain FSDP" and r.throughput), None)
    piped = [r for r in rows if r.label != "plain FSDP" and r.throughput]
    if not piped:
        return "no pipeline degree was measured"
    best = max(piped, key=lambda r: r.median)
    if plain is None:
        return f"the best is {best.label} at {best.median:.3g} samples/s (plain FSDP was not measured)"
    ratio = best.median / plain.median
    if ratio >= 1:
        return f"the best is {best.label}, {ratio:.2f}x plain FSDP ({best.median:.3g} vs {plain.median:.3g} samples/s)"
    return (f"plain FSDP is faster here: do not pipeline ({plain.median:.3g} samples/s, {1 / ratio:.2f}x the best "
            f"pipeline, {best.label})")


def table(rows: list[DegreeRow]) -> str:
    lines = ["| degree | plan | samples/s median (min-max) | peak MiB per rank | predicted MiB per pipeline rank |",
             "| --- | --- | --- | --- | --- |"]
    for r in rows:
        plan = SplitPlan.from_dict(r.plan).describe() if r.plan else "-"
        got = (f"{r.median:.3g} ({min(r.throughput):.3g}-{max(r.throughput):.3g})" if r.throughput
               else f"failed: {r.failed}")
        lines.append(f"| {r.label} | {plan} | {got} | {', '.join(map(str, r.peak_mib)) or '-'} "
                     f"| {', '.join(map(str, r.predicted_mib)) or '-'} |")
    return "\n".join(lines)


def _plain(best: SplitPlan) -> SplitPlan:
    """Plain FSDP on the same processes: the whole model on every replica, one microbatch per replica."""
    return dataclasses.replace(best, split_points=(), chunks=1, schedule="GPipe", stages_per_rank=1, recompute="none",
                               dp_shard=best.world)


def run_degrees(cfg: SearchConfig, ranks: int, pinned: int | None = None) -> tuple[list[DegreeRow], list[Path]]:
    """A study per degree, then every degree's best and plain FSDP re-measured side by side."""
    from pipeline.models.build import build_meta_model
    from pipeline.models.candidates import find_candidates
    from pipeline.models.footprint import predict_plan
    from pipeline.ranks.hosts import check_torchrun_world
    from pipeline.ranks.launch import open_pool
    from pipeline.ranks.pooling import references_in
    from pipeline.ranks.probe import rank_runtime
    from pipeline.rounds import interleaved
    from search.optimize import run_study

    check_torchrun_world(ranks, f"--ranks {ranks}")
    if cfg.mode != "train":
        raise PipesplitError("--ranks searches the pipeline degree of a training job (each replica's share of the "
                             "batch, sharded stages): add --mode train")
    spec = cfg.model.resolve()
    meta = build_meta_model(spec)
    cands = find_candidates(meta, spec, cfg.model.granularity)
    most = cands.max_stages
    base = cfg.study_name or (f"{spec.slug}-r{ranks}-b{spec.batch_size}-train"
                              + (f"-{spec.mixed_precision}" if spec.mixed_precision else ""))
    bests: list[tuple[str, SplitPlan]] = []
    paths: list[Path] = []
    for s in degrees(ranks, most, pinned):
        label = f"{s} stages x dp_shard {ranks // s}"
        print(f"\n== pipeline degree {s}: {label} ==", flush=True)
        run = run_study(dataclasses.replace(cfg, stages=s, dp_shard=ranks // s, study_name=f"{base}-pp{s}",
                                            out=None))
        paths += run.paths
        best = run.confirmation.best if run.confirmation is not None else None
        plan = best.plan if best is not None else None
        if plan is None:
            t = run.context.best_measured()
            plan = SplitPlan.from_dict(t.user_attrs["plan"]) if t is not None else None
        if plan is not None:
            bests.append((label, plan))
    if not bests:
        raise PipesplitError("no pipeline degree measured a plan: see each study's summary")
    plans = [p for _, p in bests] + [_plain(bests[0][1])]
    labels = [lab for lab, _ in bests] + ["plain FSDP"]
    print(f"\n== side by side on {ranks} processes: {', '.join(labels)} ==", flush=True)
    with open_pool(ranks, device=plans[0].device, threads_per_stage=plans[0].threads_per_stage) as pool, \
            references_in(pool, cfg.references):
        runs = interleaved(pool, plans, cfg.confirm_rounds, repeats=cfg.repeats, serial=False, drop_failed=True)
    runtime = rank_runtime(json.dumps(spec.to_dict(), sort_keys=True), cfg.model.granularity, plans[0].device)
    rows = []
    for i, (label, plan) in enumerate(zip(labels, plans)):
        pred = predict_plan(plan, meta, cands, budget=2**50, runtime=runtime)
        res = runs.results[i]
        peaks = tuple(round(max(r.peak_mem_bytes[k] for r in res) / 2**20) for k in range(plan.world)) \
            if res and res[0].peak_mem_bytes else ()
        rows.append(DegreeRow(label=label, plan=plan.to_dict(), throughput=tuple(runs.throughputs(i)), peak_mib=peaks,
                              predicted_mib=tuple(round(r.total / 2**20) for r in pred.ranks),
                              failed=runs.failures.get(i)))
    out = Path(cfg.results_dir) / base
    out.mkdir(parents=True, exist_ok=True)
    text = f"# {base}: pipeline degree on {ranks} processes\n\n{table(rows)}\n\n{verdict(rows)}\n"
    (out / "degrees.md").write_text(text)
    (out / "degrees.json").write_text(json.dumps({"ranks": ranks, "rows": [r.to_dict() for r in rows],
                                                  "verdict": verdict(rows)}, indent=1))
    print(f"\n{table(rows)}\n\n{verdict(rows)}", flush=True)
    return rows, [*paths, out / "degrees.md", out / "degrees.json"]
