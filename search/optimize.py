"""``python -m search.optimize``: an Optuna study whose trials are real pipeline runs.

The cost model (``costmodel``) profiles the model once and seeds the study with PiPPy's equal-size plan
and its own optimum and runner-up (``search.sweep`` seeds every reference policy). The search's own
sampler then proposes only valid plans not tried before: the calibrated cost model's ranking, best
first, with some exploration (``search.plans.proposals``). Each trial builds and times a real multi-process
pipeline on a persistent pool, a few repeats at a time: a plan clearly behind the best stops early, a
plan that beats the best earns more repeats. A confirmation round then re-measures the top plans,
interleaved, before one is declared best and exported."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

from pipeline.core.errors import PipesplitError
from pipeline.core.plan import SplitPlan, choose_chunks
from search.judging.confirm import Confirmation
from search.plans.fitting import device_fit
from search.study.config import DEFAULT_CHUNKS, DEFAULT_STORAGE, SearchConfig, default_study_name
from search.study.context import SearchContext
from search.trials.coordination import others_running
from search.trials.metric import Metric

SPACE_VERSION = 2  # cuts as module names, proposed in order by search.plans.sampler (1: integer cut_i + a constraint)
EXAMPLES = """\
examples:
  python -m search.optimize --stages 4                       # DeiT-S, batch 32, CPU: what `make optimize` runs
  python -m search.optimize --stages 2 --trials 12 --chunks 4,8,16
  python -m search.optimize --stages 8 --granularity layer --trials 40   # a space too big for a grid
  python -m search.optimize --stages 2 --budget-repeats 60   # stop after 60 timed repeats in all
  python -m search.optimize --model resnet50 --image-size 160 --batch-size 8 --stages 2
  python -m search.optimize --stages 2 --storage results/study.log   # a journal file instead of SQLite
  # resume: run the same command again; --trials is the study's total of measured trials
  python -m search.optimize --stages 2 --trace              # + torch.profiler traces of the best plan
  python -m search.optimize --stages 2 --mode train --schedule all --device-memory 2GiB   # training steps
  # 4 processes: 4 stages, 2 stages x 2 replicas (FSDP2) or plain FSDP? each degree searched, then compared
  python -m search.optimize --model hf:llama --ranks 4 --mode train --schedule 1F1B --trials 6
  python -m search.optimize --model hf:llama --ranks 4 --mode train --mixed-precision bf16   # bf16 over fp32 weights
  # training under a budget: each plan recomputes the fewest blocks per stage that fit (--recompute search)
  python -m search.optimize --model hf:llama --stages 4 --mode train --schedule 1F1B --device-memory 1.1GiB
  # a model bigger than one device: plans that fit 4 ranks of 4.75 GiB, ranked by throughput
  python -m search.optimize --model hf:llama --model-kwargs '{"num_hidden_layers": 16, "hidden_size": 4096}' \
      --seq-len 16 --batch-size 4 --stages 4 --trials 6 --device-memory 4.75GiB
  python -m search.optimize --stages 2 --schedule GPipe,Interleaved1F1B --stages-per-rank 2,3 --chunks 8,16
  # several workers on one study (run the same command on each; --trials is the study's total)
  python -m search.optimize --stages 2 --storage results/study.log            # one host: a journal file
  python -m search.optimize --stages 2 --storage postgresql://user@db/pipesplit  # many hosts
  # stage workers from torchrun, one per node (the same command on every node)
  torchrun --nnodes 2 --nproc-per-node 1 --rdzv-backend c10d --rdzv-endpoint HOST:29500 \\
      -m search.optimize --stages 2 --storage postgresql://user@db/pipesplit
  optuna-dashboard sqlite:///results/optuna.db --artifact-dir results/artifacts   # the study in a browser
"""

def parser() -> argparse.ArgumentParser:
    return build_parser("python -m search.optimize", __doc__ or "", EXAMPLES)


def build_parser(prog: str, description: str, epilog: str, *, sweep: bool = False) -> argparse.ArgumentParser:
    """The search flags; ``sweep`` takes several stage counts and leaves out the one-study flags."""
    from pipeline.cli import Parser, add_mesh_order_arg, add_model_args, add_runtime_args

    p = Parser(prog=prog, description=description, epilog=epilog,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_args(p)
    add_runtime_args(p, search=True)
    s = p.add_argument_group("search")
    if sweep:
        s.add_argument("--stages", type=int, nargs="+", default=[2, 3, 4, 6],
                       help="rank counts to sweep, one study each (default 2 3 4 6)")
    else:
        s.add_argument("--stages", type=int, default=None,
                       help="the pipeline's ranks (default 4), as in every command; with --stages-per-rank V a "
                       "layout cuts the model into stages x V pieces; with --ranks it pins the pipeline degree")
        s.add_argument("--ranks", type=int, default=None, metavar="N",
                       help="training on N processes: search the pipeline degree among N's divisors (stages x "
                       "dp_shard = N, each stage FSDP2-sharded over its replicas), each degree a study of its own, "
                       "then every degree's best and plain FSDP re-measured side by side (results/<study>/degrees.md)")
        add_mesh_order_arg(s, "--ranks")
    s.add_argument("--chunks", default=None, help="candidate chunk counts, comma-separated, each dividing the batch "
                   f"(default: those of {','.join(map(str, DEFAULT_CHUNKS))} that divide it)")
    s.add_argument("--trials", type=int, default=None,
                   help="measured trials each study should hold in total (default 12 for 2 stages, 14 otherwise"
                   + ("; 10 per stage count in a sweep)" if sweep else ")"))
    s.add_argument("--timeout", type=float, default=None, help="stop starting new trials after this many seconds")
    s.add_argument("--repeats", type=int, default=2,
                   help="base timed repeats per trial (default 2; raised for short models, see --min-trial-seconds)")
    s.add_argument("--repeat-cap", type=int, default=None,
                   help="most repeats a plan that beats the best earns (default twice the base repeats)")
    s.add_argument("--no-race", action="store_true",
                   help="give every plan the base repeats (default: race, half the base repeats at a time; a plan "
                   "clearly behind the best stops after its first repeats)")
    s.add_argument("--budget-repeats", type=int, default=None,
                   help="stop when the study's measured trials have spent this many timed repeats in all")
    s.add_argument("--min-trial-seconds", type=float, default=4.0,
                   help="a short model is repeated more, so that each trial times about this many seconds of the "
                   "serial model (predicted by the profile), at most 5x --repeats; 0 turns it off (default 4)")
    s.add_argument("--trial-timeout", type=float, default=900.0, help="seconds before a trial counts as hung")
    s.add_argument("--confirm-top", type=int, default=2,
                   help="best plans re-measured in the confirmation round, with PiPPy's equal-size plan (default 2)")
    s.add_argument("--confirm-rounds", type=int, default=2, help="interleaved rounds of confirmation (default 2)")
    s.add_argument("--no-prune", action="store_true",
                   help="measure every plan the sampler proposes (default: the cost model may skip a plan it predicts "
                   "clearly behind, at most 3 in a row)")
    s.add_argument("--device-memory", "--max-stage-memory", dest="device_memory", default=None, metavar="SIZE",
                   help="memory each rank's device has (1.5GiB, 512MiB): every plan's per-rank peak is predicted from the "
                   "model on meta (and the runtime's own memory measured on earlier trials) and a plan over it is not "
                   "run; a measured plan that peaked over it is infeasible (kept, never declared best). The model "
                   "need not fit one device: then no serial baseline is timed and plans are ranked by throughput")
    s.add_argument("--objective", choices=("speedup", "throughput"), default=None,
                   help="the figure plans are ranked by: speedup over the serial model timed beside each run, or "
                   "throughput (samples/s for the whole batch, no serial run); default speedup where the whole "
                   "model fits --device-memory, throughput otherwise")
    s.add_argument("--objectives", default=None, metavar="FIGURE[,memory]",
                   help="speedup or throughput, optionally with ,memory: a two-objective study (the figure up, the "
                   "largest stage's peak memory down; no racing, one value per trial); the summary lists the Pareto front")
    s.add_argument("--storage", default=DEFAULT_STORAGE, help=f"Optuna storage URL or journal file (default {DEFAULT_STORAGE})")
    if not sweep:
        s.add_argument("--study-name", default=None, help="default: <model>-s<stages>-b<batch>-<device>")
        s.add_argument("--out", default=None, help="best split JSON (default results/<study>/best_split.json)")
        s.add_argument("--export-to", default=None, metavar="FORMATS",
                       help="also write the best split for torchtitan, megatron and/or deepspeed (comma-separated, or "
                       "all) beside best_split.json, as best_split.<format>.txt (python -m pipeline.export prints it)")
    s.add_argument("--results-dir", default="results", help="where results/<study>/ goes (default results)")
    s.add_argument("--profile-dir", default=None, metavar="DIR",
                   help="where the cost model's profiles are cached, shared by every study that names it (default "
                   "$PIPESPLIT_PROFILE_DIR, else <results-dir>/profiles)")
    s.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_output_args(p)
    return p


def add_output_args(p: argparse.ArgumentParser) -> None:
    """Flags for what a search leaves to look at besides its tables (shared with ``search.sweep``)."""
    o = p.add_argument_group("what to look at")
    o.add_argument("--trace", "--profile", dest="trace", action="store_true",
                   help="after the search, run the best plan once more under torch.profiler and save a chrome "
                   "trace per rank under results/<study>/traces/ (open in https://ui.perfetto.dev)")
    o.add_argument("--artifact-dir", default=None,
                   help="Optuna artifact store for per-trial timeline PNGs (default <results-dir>/artifacts); "
                   "view with optuna-dashboard <storage> --artifact-dir <dir>")
    o.add_argument("--no-artifacts", action="store_true", help="do not upload timelines as Optuna artifacts")


def main(argv: Sequence[str] | None = None) -> int:
    from pipeline.logs import quiet_logs

    quiet_logs()
    args = parser().parse_args(argv)
    from pipeline.ranks.launch import follower_exit, release_followers

    try:
        code = follower_exit(args.device, args.threads_per_stage)  # under torchrun, ranks > 0 follow rank 0
        if code is not None:
            return code
        if args.ranks is not None:
            from search.degrees import run_degrees

            _, paths = run_degrees(SearchConfig.from_args(args, args.stages or 2), args.ranks, args.stages)
            for p in paths:
                print(f"wrote {p}")
            return 0
        run = run_study(SearchConfig.from_args(args, args.stages if args.stages is not None else 4))
    except PipesplitError as e:
        print(f"error: {e}", file=sys.stderr)
        release_followers(args.device, args.threads_per_stage)
        return 2
    for p in run.paths:
        print(f"wrote {p}")
    return 130 if run.interrupted else 0


@dataclass(frozen=True, kw_only=True)
class StudyRun:
    """What one search left behind, for the caller to report on (``search.sweep`` reads all of it)."""

    study: Any
    context: SearchContext
    confirmation: Confirmation | None
    outdir: Path
    paths: list[Path]
    interrupted: bool
    storage_url: str


def run_study(cfg: SearchConfig, *, references: bool = False) -> StudyRun:
    """Run or resume the study ``cfg`` describes, confirm, export; ``references`` confirms every
    reference policy beside the best (``search.sweep``)."""
    import optuna

    from costmodel.partition import ranked
    from costmodel.profile import load_for_stages
    from pipeline.core.atomic import check_writable
    from pipeline.models.build import build_meta_model
    from pipeline.models.candidates import find_candidates
    from pipeline.peers.remembered import RememberedRules
    from pipeline.ranks.hosts import default_threads, resolve_device
    from pipeline.ranks.launch import open_pool
    from pipeline.ranks.pooling import references_in
    from search.judging.confirm import confirm
    from search.judging.racing import RacingPruner
    from search.outputs.export import check_formats, export, export_formats, export_timelines
    from search.plans.layouts import choose_layouts
    from search.plans.memory import constraint
    from search.plans.sampler import PlanSampler
    from search.plans.space import PlanPoint, PlanSpace
    from search.study.notes import save_study_note, study_note
    from search.study.runner import check_on_first_repeat, run_loop, seed_count, seed_study, trial_repeats
    from search.trials.storage import open_storage

    check_writable(cfg.results_dir, folder=True)
    if cfg.out:
        check_writable(cfg.out)
    world = cfg.stages * cfg.dp_shard  # every process of the job: the pipeline's ranks times its replicas
    device = resolve_device(cfg.device, world)
    storage = open_storage(cfg.storage)
    spec = cfg.model.resolve()
    granularity = cfg.model.granularity
    meta = build_meta_model(spec)
    cands = find_candidates(meta, spec, granularity)
    cands.check_stages(cfg.stages, spec.label)
    check_formats(cfg.export_to, cands.blocks, spec.label)
    stages = cfg.stages
    choice = choose_layouts(cfg.schedules, cfg.stages_per_rank, ranks=stages, mode=cfg.mode,
                            chunks=choose_chunks(cfg.chunks, spec.batch_size // cfg.dp_shard, DEFAULT_CHUNKS),
                            segments=cands.max_stages)
    chunks = list(choice.chunks)
    first = choice.layouts[0]
    fit = device_fit(cfg.device_memory, meta, cands, spec, ranks=stages, chunks=max(first.chunks),
                     schedule=first.schedule, per_rank=first.per_rank, mode=cfg.mode, optimizer=cfg.optimizer,
                     device=device, backend=cfg.backend, objective=cfg.objective,
                     recompute=cfg.recompute if cfg.mode == "train" else "none", dp_shard=cfg.dp_shard)
    metric = Metric(name=fit.metric, batch=spec.batch_size)
    threads = cfg.threads_per_stage or default_threads(world)
    trials = cfg.trials or (12 if stages == 2 else 14)
    if cfg.trials is None and cfg.budget_repeats is not None:
        trials = 10**9  # the repeat budget alone limits the study (the space's size bounds it too)
    name = cfg.study_name or default_study_name(spec.slug, stages, spec.batch_size, device, granularity, cfg.mode,
                                                   spec.mixed_precision)
    outdir = Path(cfg.results_dir) / name
    artifacts = None
    if cfg.artifacts:
        from optuna.artifacts import FileSystemArtifactStore

        art_dir = Path(cfg.artifact_dir or Path(cfg.results_dir) / "artifacts")
        art_dir.mkdir(parents=True, exist_ok=True)
        artifacts = FileSystemArtifactStore(art_dir)
    config = {"model": spec.key, "stages": stages, "granularity": granularity, "device": device,
              "threads_per_stage": threads, "backend": cfg.backend, "schedule": ",".join(cfg.schedules),
              **({"stages_per_rank": list(cfg.stages_per_rank)} if cfg.stages_per_rank else {}), "space": SPACE_VERSION,
              **({"device_memory": cfg.device_memory} if cfg.device_memory else {}),
              **({"objective": metric.name} if not metric.speedup else {}),
              **({"objectives": [metric.name, "memory"]} if cfg.memory_objective else {}),
              **({"mode": "train", "optimizer": cfg.optimizer} if cfg.mode == "train" else {}),
              **({"recompute": cfg.recompute} if cfg.mode == "train" and cfg.recompute != "search" else {}),
              **({"dp_shard": cfg.dp_shard} if cfg.dp_shard > 1 else {}),
              **({"mesh_order": cfg.mesh_order} if cfg.dp_shard > 1 and cfg.mesh_order != "pp,dp_shard" else {})}
    # failed trials are reported in one line by the search loop, not with optuna's traceback
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    # the sampler needs the profile: it replaces this placeholder once the profile is loaded
    two = cfg.memory_objective
    study = optuna.create_study(study_name=name, storage=storage, load_if_exists=True,
                                directions=["maximize", "minimize"] if two else ["maximize"],
                                sampler=optuna.samplers.RandomSampler(seed=cfg.model.seed), pruner=RacingPruner())
    old = study.user_attrs.get("config")
    if old is not None and old != config:
        diff = [k for k in config if old.get(k) != config[k]]
        raise PipesplitError(f"study {name!r} in {cfg.storage} was run with other settings ({', '.join(diff)}): "
                             "pass --study-name to start a new study, or the same flags to resume it")
    study.set_user_attr("config", config)
    study.set_user_attr("model_spec", spec.to_dict())
    if study.metric_names is None:
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)  # stable API since 3.2 in practice
            # the dashboard shows "speedup" (or the throughput's name), not "Objective 0"
            study.set_metric_names([metric.label, "peak_memory_MiB"] if two else [metric.label])
    extra: list[Path] = []
    asked = trials
    confirmation = None
    interrupted = False
    with open_pool(world, device=device, threads_per_stage=threads) as pool, \
            references_in(pool, cfg.references):
        prof, cached = load_for_stages(spec, stages=stages, device=device, threads=threads, granularity=granularity,
                                       micro_sizes=[spec.batch_size // c for c in chunks],
                                       root=Path(cfg.profiles), repeats=2, pool=pool,
                                       train=cfg.mode == "train", streamed=not fit.serial_fits)
        study.set_user_attr("segments", [seg.fqn for seg in prof.segments])
        if cfg.mode == "train" and fit.use_profile([seg.saved_bytes for seg in prof.segments], cands):
            print("memory: each plan's activations from the profile's measured saved tensors", flush=True)
        if prof.machine is not None:
            study.set_user_attr("ceiling", prof.machine.ceiling(stages))
            study.set_user_attr("machine", prof.machine.to_dict())
        serial_s = sum(seg.latency(spec.batch_size) for seg in prof.segments)
        if cfg.mode == "train":
            serial_s *= 3  # a training step: the forward, a backward of about twice its work, the optimizer
        repeats = trial_repeats(cfg.repeats, serial_s, cfg.min_trial_seconds)
        # Optuna prunes single-objective studies only: a two-objective one gives every plan its base repeats
        cap = (cfg.repeat_cap or 2 * repeats) if cfg.race and not two else None
        space = PlanSpace(names=tuple(seg.fqn for seg in prof.segments), stages=stages, chunks=tuple(chunks),
                          layouts=choice.layouts)
        study.set_user_attr("space_size", space.size)
        print(f"study {name} in {cfg.storage}: {len(cands.cuts)} cut points, chunks {chunks}, {space.size} plans, "
              f"{threads} thread(s)/rank, " + (f"{repeats} repeats per trial (racing, up to {cap})" if cap else
                                                f"{repeats} repeats per trial") +
              f"; profile {'from cache' if cached else 'measured'}"
              + ("" if fit.serial_fits else " (streamed: the whole model does not fit --device-memory)")
              + f"; ranked by {metric.words}", flush=True)
        if space.multi or choice.skipped:
            print(f"layouts: {', '.join(f'{lay.label} (chunks {list(lay.chunks)})' for lay in space.layouts)}"
                  + "".join(f"\n  left out: {why}" for why in choice.skipped), flush=True)
        started = time.monotonic()
        ctx = SearchContext(study=study, pool=pool, profile=prof, cands=cands, spec=spec, space=space,
                            threads=threads, backend=cfg.backend, schedule=space.layouts[0].schedule, device=device,
                            mode=cfg.mode, optimizer=cfg.optimizer, recompute=cfg.recompute, dp_shard=cfg.dp_shard,
                            mesh_order=cfg.mesh_order, least_recompute=fit.least_recompute,
                            repeats=repeats, repeat_cap=cap, budget_repeats=cfg.budget_repeats,
                            trial_timeout_s=cfg.trial_timeout_s, prune=cfg.prune,
                            progress=cfg.progress, metric=metric, memory_objective=two,
                            device_memory=cfg.device_memory, memory_of=fit.memory_of,
                            first_runtime=fit.first_runtime, lean_cuts=fit.lean_cuts,
                            artifacts=artifacts, budget=trials, check_first_repeat=check_on_first_repeat(serial_s),
                            peer_rules=RememberedRules(folder=cfg.profiles))
        model_best = [PlanPoint(cuts=p.cuts, chunks=p.chunks, layout=k) for k, lay in enumerate(space.layouts)
                      for p in ranked(prof, stages * lay.per_rank, list(lay.chunks))]
        limit = cfg.device_memory
        model_best = [p for p in model_best if ctx.fits(p)]
        study.sampler = PlanSampler(space, ctx.predictor(), model_best, seed=cfg.model.seed,
                                    constraints=None if limit is None else partial(constraint, limit=limit),
                                    fits=ctx.fits if limit is not None else None)
        save_study_note(study, study_note(config, space.size, study.user_attrs.get("ceiling")))
        try:
            seed_study(ctx, policies=references)
            outside = sum(1 for t in study.get_trials(deepcopy=False) if t.user_attrs.get("fixed_plan"))
            asked = trials
            if trials > space.size + outside:  # PiPPy's mid-block plan is outside the block space
                trials = space.size + outside
                ctx = replace(ctx, budget=trials)
            if references:  # every reference policy is measured, however few trials were asked for
                trials = max(trials, seed_count(study))
                ctx = replace(ctx, budget=trials)
            run_loop(ctx, trials, timeout=cfg.timeout_s, started=started)
            busy = others_running(study)
            if busy:  # the last worker to finish confirms, so that confirmation runs are not timed side by side
                print(f"other workers are still measuring trials {busy}: the last one to finish confirms")
            else:
                confirmation = confirm(study, pool, top=cfg.confirm_top, rounds=cfg.confirm_rounds, repeats=repeats,
                                       timeout_s=cfg.trial_timeout_s, references=references, progress=cfg.progress,
                                       metric=metric)
                save_study_note(study, study_note(config, space.size, study.user_attrs.get("ceiling"),
                                                  decided=confirmation.verdict()))
            if cfg.trace:
                extra += _trace_best(ctx, confirmation, outdir / "traces")
        except KeyboardInterrupt:
            interrupted = True
            confirmation = None
            print("\ninterrupted: keeping every finished trial and exporting the best so far", file=sys.stderr)
    paths = export(study, ctx, outdir, confirmation=confirmation, out=cfg.out, storage_url=cfg.storage,
                   asked=None if cfg.trials is None and cfg.budget_repeats is not None else asked)
    paths += export_timelines(study, outdir, confirmation, artifacts)
    best_path = Path(cfg.out) if cfg.out else outdir / "best_split.json"
    if cfg.export_to and best_path in paths:
        paths += export_formats(best_path, cfg.export_to)
    return StudyRun(study=study, context=ctx, confirmation=confirmation, outdir=outdir, paths=paths + extra,
                    interrupted=interrupted, storage_url=cfg.storage)


def _trace_best(ctx: SearchContext, confirmation: Confirmation | None, folder: Path) -> list[Path]:
    """One more run of the confirmed best plan under torch.profiler: a chrome trace per rank."""
    best = confirmation.best_trial if confirmation else None
    if best is None:
        return []
    plan = SplitPlan.from_dict(ctx.study.trials[best].user_attrs["plan"])
    res = ctx.pool.run(plan, repeats=1, warmup=0, timeout_s=ctx.trial_timeout_s, serial_all=False,
                       trace_dir=str(folder))
    if not res.ok:
        print(f"warning: the profiled run of the best plan failed: {res.reason}", file=sys.stderr)
        return []
    return [Path(t) for t in res.traces]


if __name__ == "__main__":
    sys.exit(main())
