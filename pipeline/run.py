"""``python -m pipeline.run``: run one split plan as a real multi-process pipeline and print its speedup."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pipeline.cli import MODEL_FLAGS, Parser, add_model_args, add_runtime_args, spec_from_args
from pipeline.core.budget import MemoryPrediction, format_size, parse_size
from pipeline.core.ceiling import above_ceiling
from pipeline.core.errors import PipesplitError
from pipeline.core.plan import SplitPlan, SplitPoint, check_ranks
from pipeline.core.policies import ALIASES
from pipeline.core.result import TrialResult
from pipeline.core.sharding import MESH_ORDERS
from pipeline.peers.registry import POLICIES

EXAMPLES = """\
examples:
  # PiPPy's split_into_equal_size on DeiT-S, 2 stages, 16 microbatches (prints where it cut)
  python -m pipeline.run --stages 2 --policy equal-size --chunks 16
  # hand-placed cuts, torchpippy runtime
  python -m pipeline.run --split-points blocks.4,blocks.8 --chunks 8 --backend pippy
  # a tiny model, for a quick check
  python -m pipeline.run --model deit_tiny_patch16_224 --model-kwargs '{"depth": 4, "img_size": 64}' \\
      --batch-size 8 --stages 2 --chunks 4
  # what torchtitan's default rule cuts, run by torchtitan's own code (pip install 'pipesplit[peers]')
  python -m pipeline.run --model hf:llama --stages 4 --policy torchtitan --chunks 4
  # a training step where stage 0 recomputes its first 2 blocks and stage 1 none (or --recompute full)
  python -m pipeline.run --stages 2 --policy uniform --chunks 8 --mode train --schedule 1F1B --recompute 2,0
  # the pipeline inside sharded data parallel: 2 stages x 2 replicas on 4 processes, FSDP2 on each stage
  python -m pipeline.run --stages 2 --policy uniform --chunks 4 --mode train --schedule 1F1B --dp-shard 2
  # a training step in bf16 over float32 weights (autocast; with --dp-shard, FSDP2's MixedPrecisionPolicy)
  python -m pipeline.run --model hf:llama --stages 2 --policy uniform --chunks 4 --mode train --mixed-precision bf16
  # 4 stages on 2 ranks, 2 per rank (--stages counts ranks in every command)
  python -m pipeline.run --stages 2 --stages-per-rank 2 --policy uniform --chunks 4 --schedule Interleaved1F1B
  # run an exported best split again and save what it measured
  python -m pipeline.run --split results/<study>/best_split.json --repeats 5 --out rerun.json
  # where the time goes: a Gantt chart of the stages and torch.profiler traces per rank
  python -m pipeline.run --stages 2 --policy equal-size --chunks 8 --timeline t.png --trace results/traces
  # the stages on two nodes: run this on each (torchrun's ranks become the stage workers)
  torchrun --nnodes 2 --nproc-per-node 1 --rdzv-backend c10d --rdzv-endpoint HOST:29500 \\
      -m pipeline.run --split-points blocks.6 --chunks 16
"""


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    """How ``run_plan`` measures one plan."""

    repeats: int = 3
    """Timed repeats, serial and pipeline interleaved."""
    warmup: int = 1
    """Untimed pipeline runs before timing."""
    timeout_s: float = 900.0
    """Seconds before a trial counts as hung."""
    serial: bool = True
    """Time the serial model beside the pipeline (off where the whole model does not fit the budget)."""
    serial_all: bool = True
    """Also time the serial model on all the pipeline's threads."""
    trace_dir: str | None = None
    """One more run under torch.profiler, a chrome trace per rank here."""

    def __post_init__(self) -> None:
        if self.repeats < 1:
            raise PipesplitError(f"--repeats must be at least 1 (got {self.repeats})")
        if self.warmup < 0:
            raise PipesplitError(f"--warmup must be 0 or more (got {self.warmup})")
        if not self.timeout_s > 0:
            raise PipesplitError(f"--timeout must be a positive number of seconds (got {self.timeout_s})")


def run_plan(plan: SplitPlan, cfg: RunConfig) -> TrialResult:
    """Measure ``plan`` once on a fresh pool (the torchrun ranks under torchrun)."""
    from pipeline.ranks.hosts import check_torchrun_world
    from pipeline.ranks.launch import open_pool

    if plan.dp_shard > 1:  # (a pipeline alone: the pool says how many ranks --stages asks for)
        check_torchrun_world(plan.world, f"--stages {plan.ranks} x --dp-shard {plan.dp_shard}")
    with open_pool(plan.world, device=plan.device, threads_per_stage=plan.threads_per_stage) as pool:
        return pool.run(plan, repeats=cfg.repeats, warmup=cfg.warmup, timeout_s=cfg.timeout_s, serial=cfg.serial,
                        serial_all=cfg.serial and cfg.serial_all, trace_dir=cfg.trace_dir)


def check_memory(plan: SplitPlan, budget: int | None, granularity: str = "block") -> MemoryPrediction:
    """Each rank's predicted peak from the model on meta, before anything is built: one line and no run
    when a rank is over ``budget`` (default: the device's, see ``pipeline.models.footprint``). Where rank 0
    can also hold the whole model beside its stage, the prediction counts it there (``RankMemory.serial``):
    the serial baseline is timed only then."""
    from pipeline.models.build import build_meta_model
    from pipeline.models.candidates import find_candidates
    from pipeline.models.footprint import predict_plan

    meta = build_meta_model(plan.model)
    cands = find_candidates(meta, plan.model, granularity)
    prediction = predict_plan(plan, meta, cands, budget)
    try:
        prediction.check(plan, recompute_fix(plan, meta, cands, prediction))
    except PipesplitError as e:
        raise PipesplitError(f"{e}{fitting_ranks(plan, meta, cands, prediction)}") from None
    if meta.built_whole and not prediction.serial_fits:
        raise PipesplitError(f"{plan.model.label} cannot be built on the meta device, and built whole it needs about "
                             f"{format_size(prediction.whole)}, over --device-memory {format_size(prediction.budget)}: "
                             "make its constructor meta-friendly (no explicit device='cpu', no reading values in "
                             "__init__)")
    if plan.backend == "pippy" and not prediction.serial_fits:
        raise PipesplitError(f"torchpippy 0.2 traces the whole model on every rank, and {plan.model.label} needs about "
                             f"{format_size(prediction.whole)}, over --device-memory {format_size(prediction.budget)}: "
                             "use --backend torch, whose ranks make only their own stages")
    if prediction.serial_fits:
        with_serial = predict_plan(plan, meta, cands, budget, runtime=prediction.ranks[0].runtime, serial=True)
        if with_serial.worst.total <= with_serial.budget:
            return with_serial
    return prediction


def recompute_fix(plan: SplitPlan, meta: Any, cands: Any, over: MemoryPrediction) -> list[str]:
    """The least ``--recompute`` with which a training plan over its budget would fit, as a fix to name."""
    from pipeline.core.recompute import describe, normal
    from pipeline.models.footprint import least_recompute

    if plan.mode != "train" or over.worst.total <= over.budget:
        return []
    counts = least_recompute(plan, meta, cands, over.budget, over.ranks[0].runtime)
    if counts is None:
        return []
    rc = normal(counts, [len(b) for b in cands.stage_blocks(plan)])
    return [f"--recompute {describe(rc)} (the fewest blocks recomputed per stage that fit)"]


def fitting_ranks(plan: SplitPlan, meta: Any, cands: Any, over: MemoryPrediction) -> str:
    """The fewest ranks at which the ``uniform`` policy's cuts of the same plan fit the budget, as a clause for
    the refusal line ("" where more ranks than the model has cut points would be needed)."""
    from pipeline.models.footprint import leaf_outputs, predict_plan

    leaves = leaf_outputs(meta, plan.model, cands)
    per = plan.stages_per_rank
    for ranks in range(plan.ranks + 1, cands.max_stages // per + 1):
        try:
            bigger = dataclasses.replace(plan, split_points=cands.policy_points("uniform", ranks * per))
        except PipesplitError:
            continue  # chunks that this many stages cannot take
        p = predict_plan(bigger, meta, cands, over.budget, runtime=over.ranks[0].runtime, leaves=leaves)
        if p.worst.total <= p.budget:
            return (f" (--stages {ranks} --policy uniform would fit: its largest rank needs about "
                    f"{format_size(p.worst.total)})")
    return f" (no stage count up to {cands.max_stages // per} fits: the runtime alone is {format_size(over.ranks[0].runtime)})" \
        if over.ranks[0].runtime >= over.budget else ""


def describe_memory(prediction: MemoryPrediction) -> str:
    """The prediction in one line per rank, and whether a serial baseline fits."""
    lines = [f"memory predicted per rank, of --device-memory {format_size(prediction.budget)}: "
             + ", ".join(f"{r.rank}: {format_size(r.total)}" for r in prediction.ranks)]
    if not prediction.serial_fits:
        lines.append(f"the whole model needs about {format_size(prediction.whole)} on one device, over the budget: "
                     "no serial baseline is timed, so no speedup; throughput and the stages' own times are the figures")
    elif not prediction.ranks[0].serial:
        lines.append(f"the whole model ({format_size(prediction.whole)}) fits one device but not beside rank 0's "
                     "stage: no serial baseline is timed, so no speedup; throughput and the stages' own times are the "
                     "figures")
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="python -m pipeline.run",
        description="Run a split plan as a real pipeline (one process per stage, gloo on CPU, NCCL on CUDA), "
        "check its output against the unsplit model, and time it against the serial model in the same run.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--split", metavar="FILE", help="a plan or best_split.json to run as saved")
    add_model_args(p)
    add_runtime_args(p)
    g = p.add_argument_group("plan (without --split)")
    g.add_argument("--stages", type=int, default=None,
                   help="the pipeline's ranks (with --policy); the model is cut into stages x --stages-per-rank pieces")
    runnable = [n for n, pol in POLICIES.items() if not pol.needs_profile]
    g.add_argument("--policy", choices=[*runnable, *ALIASES], default=None, metavar="NAME",
                   help="a reference policy: " + "; ".join(f"{n}: {POLICIES[n].summary}" for n in runnable)
                   + "; aliases: " + ", ".join(f"{a} = {n}" for a, n in ALIASES.items()))
    g.add_argument("--split-points", default=None, metavar="FQN,...",
                   help="comma-separated module FQNs to cut before (append :END to cut after), in execution order")
    g.add_argument("--chunks", type=int, default=None, help="microbatches per batch (default 1); must divide the batch")
    m = p.add_argument_group("measurement")
    m.add_argument("--repeats", type=int, default=3, help="timed repeats, serial and pipeline interleaved (default 3)")
    m.add_argument("--warmup", type=int, default=1, help="untimed pipeline runs before timing (default 1)")
    m.add_argument("--timeout", type=float, default=900.0, help="seconds before a trial counts as hung (default 900)")
    m.add_argument("--device-memory", default=None, metavar="SIZE",
                   help="memory each stage's device has, e.g. 1.5GiB (default: the GPU's total on CUDA, the host's "
                   "available memory shared among the ranks on CPU); a plan predicted over it is refused before "
                   "anything is built, and a model that does not fit whole gets no serial baseline")
    m.add_argument("--no-serial-all", action="store_true",
                   help="skip timing the serial model on all the pipeline's threads")
    m.add_argument("--out", metavar="FILE", help="write plan + measured result + provenance (best_split.json shape)")
    m.add_argument("--timeline", metavar="PNG", help="draw the measured per-stage timeline (Gantt chart) of the last repeat")
    m.add_argument("--trace", "--profile", dest="trace", nargs="?", const="results/traces", default=None, metavar="DIR",
                   help="one more run under torch.profiler: a chrome trace per rank in DIR (default results/traces; "
                   "open in https://ui.perfetto.dev)")
    return p


def plan_from_args(args: argparse.Namespace) -> SplitPlan:
    """The plan that the flags describe, validated against the model's real execution order."""
    from pipeline.models.build import build_meta_model, fit_input
    from pipeline.models.candidates import find_candidates
    from pipeline.ranks.hosts import default_threads, resolve_device

    if args.split:
        given = [f"--{f.replace('_', '-')}" for f in MODEL_FLAGS if getattr(args, f) is not None and f != "mixed_precision"]
        given += [f"--{f}" for f in ("stages", "policy", "split_points", "chunks") if getattr(args, f) is not None]
        if given:
            raise PipesplitError(f"--split runs the saved plan as it is: drop {', '.join(given)}")
        raw = SplitPlan.read(args.split)
        plan = SplitPlan.from_dict(raw)
        # a plan without model.input_shape (hand-written, or from another tool) runs at the model's own size
        plan = dataclasses.replace(plan, model=fit_input(plan.model, given="input_shape" in raw["model"]))
        device = resolve_device(plan.device, plan.world)
        if device != plan.device:
            plan = dataclasses.replace(plan, device=device)
        # the saved cuts measured another way: as training, or on another schedule
        changes = {k: getattr(args, k) for k in ("mode", "optimizer", "schedule", "stages_per_rank", "recompute",
                                                 "dp_shard", "mesh_order") if getattr(args, k) is not None}
        if args.mixed_precision is not None:
            changes["model"] = dataclasses.replace(plan.model, mixed_precision=args.mixed_precision)
        if changes:
            plan = dataclasses.replace(plan, **changes)
        cands = find_candidates(build_meta_model(plan.model), plan.model, args.granularity)
        cands.validate(plan)
        cands.recompute_counts(plan)
        return plan
    plain = args.stages == 1 and (args.dp_shard or 1) > 1  # plain FSDP: the reference a pipeline is compared with
    if plain and args.split_points is not None:
        raise PipesplitError("--stages 1 with --dp-shard is plain FSDP, the whole model on every replica: drop "
                             "--split-points")
    if not plain and (args.policy is None) == (args.split_points is None):
        raise PipesplitError("say where to cut: give --stages N --policy NAME, or --split-points FQN,..., or --split FILE")
    per_rank = args.stages_per_rank or 1
    if args.policy and args.stages is None:
        raise PipesplitError("--policy needs --stages N (the pipeline's ranks)")
    if args.stages is not None and not plain:
        check_ranks(args.stages, per_rank)
    spec = spec_from_args(args)
    cands = find_candidates(build_meta_model(spec), spec, args.granularity)
    if plain:
        points: tuple[SplitPoint, ...] = ()
    elif args.policy:
        total = args.stages * per_rank
        cands.check_stages(total, spec.label, per_rank=per_rank)
        points = cands.policy_points(args.policy, total)
    else:
        points = tuple(SplitPoint.parse(t) for t in args.split_points.split(",") if t.strip())
        pieces = len(points) + 1
        per = f" with --stages-per-rank {per_rank}" if per_rank > 1 else ""
        if pieces % per_rank:
            raise PipesplitError(f"{len(points)} split points make {pieces} stages, which do not split into {per_rank} "
                                 f"per rank: give ranks x {per_rank} - 1 split points")
        if args.stages is not None and args.stages != pieces // per_rank:
            raise PipesplitError(
                f"--stages {args.stages}{per} does not match {len(points)} split points ({pieces} stages on "
                f"{pieces // per_rank} ranks): --stages counts ranks, so give {args.stages * per_rank - 1} split points "
                f"or --stages {pieces // per_rank}")
    ranks = max(1, (len(points) + 1) // per_rank) * (args.dp_shard or 1)  # every process of the job
    plan = SplitPlan(
        model=spec, split_points=points, chunks=1 if args.chunks is None else args.chunks,
        backend=args.backend or "torch", schedule=args.schedule or "GPipe",
        device=resolve_device(args.device or "cpu", ranks),
        threads_per_stage=args.threads_per_stage or default_threads(ranks),
        stages_per_rank=per_rank, mode=args.mode or "infer", optimizer=args.optimizer or "adamw",
        recompute=args.recompute or "none", dp_shard=args.dp_shard or 1, mesh_order=args.mesh_order or MESH_ORDERS[0],
    )
    cands.validate(plan)
    cands.recompute_counts(plan)
    return plan


def format_result(result: TrialResult, ceiling: float | None = None) -> str:
    """A short human report of one trial; a speedup above ``ceiling`` (the machine's most) is flagged."""
    lines = []
    if not result.ok:
        return f"trial failed: {result.reason}"
    step = " of training steps" if result.plan.mode == "train" else ""
    tlo, thi = result.throughput_spread
    tokens = f", {result.tokens_per_s:.0f} tokens/s" if result.tokens_per_s is not None else ""
    lines.append(f"throughput{step} {result.throughput:.2f} samples/s{tokens} (spread {tlo:.2f}-{thi:.2f} over "
                 f"{len(result.pipeline_s)} repeats)")
    if result.serial_s:
        lo, hi = result.speedup_spread
        lines.append(f"speedup{step} {result.speedup:.2f}x (spread {lo:.2f}-{hi:.2f} over {len(result.pipeline_s)} "
                     "repeats) vs the serial model on one stage's threads")
        if flag := above_ceiling(result.speedup, ceiling):
            lines[-1] += (f": {flag} (the most this machine's cores can give {result.plan.ranks} stages of "
                          f"{result.plan.threads_per_stage} thread(s): a slow serial repeat, not speed)")
    else:
        lines.append("no speedup: the serial model was not timed (the whole model does not fit --device-memory)")
    if result.serial_all_s:
        lines.append(f"speedup {result.speedup_all:.2f}x vs the serial model on all the pipeline's threads")
    lines.append("repeat  pipeline_s" + ("  serial_s" if result.serial_s else "")
                 + ("  serial_all_s" if result.serial_all_s else ""))
    for i, p in enumerate(result.pipeline_s):
        extra = f"  {result.serial_s[i]:8.3f}" if result.serial_s else ""
        extra += f"  {result.serial_all_s[i]:12.3f}" if result.serial_all_s else ""
        lines.append(f"{i:6d}  {p:10.3f}{extra}")
    lines.append("rank  compute_s  comm+wait_s  peak_mem_MiB  stage_MiB  runtime_MiB  step_adds_MiB  sends_MiB")
    for r, (c, w) in enumerate(zip(result.stage_compute_s, result.stage_comm_s)):
        sent = f"{result.boundary_bytes[r] / 2**20:9.2f}" if r < len(result.boundary_bytes) else "        -"
        adds = (result.peak_mem_bytes[r] - result.base_mem_bytes[r]) / 2**20 if result.base_mem_bytes else float("nan")
        own = result.stage_bytes[r] / 2**20 if r < len(result.stage_bytes) else float("nan")
        rt = result.runtime_bytes[r] / 2**20 if r < len(result.runtime_bytes) else float("nan")
        lines.append(f"{r:4d}  {c:9.3f}  {w:11.3f}  {result.peak_mem_bytes[r] / 2**20:12.0f}  {own:9.0f}  {rt:11.0f}  "
                     f"{adds:13.0f}  {sent}")
    if result.check is not None:
        lines.append(result.check.describe())
    elif result.plan.mode == "train":
        lines.append(f"training step check (loss and every gradient vs the serial step; the worst, relative to its "
                     f"scale): max |diff| {result.max_abs_diff:.2e} <= {result.tolerance:.1e}")
    else:
        lines.append(f"output check: max |diff| {result.max_abs_diff:.2e} <= {result.tolerance:.1e}")
    if result.breakdown is not None:
        b = result.breakdown
        lines.append(f"trial {result.wall_s:.1f}s: {b.describe()}; fixed cost {b.fixed_s / b.total_s:.0%}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    from pipeline.logs import quiet_logs

    quiet_logs()
    args = parser().parse_args(argv)
    from pipeline.core.atomic import check_writable, write_json
    from pipeline.export import document
    from pipeline.ranks.hosts import cpu_ceiling
    from pipeline.ranks.launch import follower_exit

    try:
        code = follower_exit(args.device, args.threads_per_stage)  # under torchrun, ranks > 0 follow rank 0
        if code is not None:
            return code
        cfg = RunConfig(repeats=args.repeats, warmup=args.warmup, timeout_s=args.timeout,
                        serial_all=not args.no_serial_all, trace_dir=args.trace)
        for path in (args.out, args.timeline):
            if path:
                check_writable(path)  # before the trial, not after it
        budget = None if args.device_memory is None else parse_size(args.device_memory)
        plan = plan_from_args(args)
        if args.recompute not in (None, "none") and plan.mode != "train":
            print(f"--recompute {args.recompute} is ignored: inference runs no backward to recompute for", flush=True)
        print(f"plan: {plan.describe()}, {plan.threads_per_stage} thread(s)/rank on {plan.device}", flush=True)
        prediction = check_memory(plan, budget, args.granularity)
        print(describe_memory(prediction), flush=True)
        if not prediction.ranks[0].serial:  # rank 0 cannot hold the whole model beside its stage
            cfg = dataclasses.replace(cfg, serial=False)
        result = run_plan(plan, cfg)
        print(format_result(result, cpu_ceiling(plan.ranks, plan.threads_per_stage) if plan.device == "cpu" else None))
        for t in result.traces:
            print(f"wrote {t}")
        if args.timeline and result.ok:
            from pipeline.stage.timeline import Timeline, render

            render(Timeline.from_result(result), args.timeline, title=f"{plan.describe()} - {result.speedup:.2f}x")
            print(f"wrote {args.timeline}")
        if args.out and result.ok:  # a failed trial leaves no result file that could be mistaken for one
            write_json(args.out, document(plan, result, command="pipeline.run"))
            print(f"wrote {args.out}")
        return 0 if result.ok else 1
    except PipesplitError as e:
        print(f"error: {e}", file=sys.stderr)
        from pipeline.ranks.launch import release_followers

        release_followers(args.device, args.threads_per_stage)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
