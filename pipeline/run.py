"""``python -m pipeline.run``: run one split plan as a real multi-process pipeline and print its speedup."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Sequence

from costmodel.policies import POLICIES, balanced_cuts, equal_size_cuts, uniform_cuts
from pipeline.candidates import Candidates
from pipeline.cli import MODEL_FLAGS, add_model_args, add_runtime_args, spec_from_args
from pipeline.errors import PipesplitError
from pipeline.plan import SplitPlan, SplitPoint
from pipeline.result import TrialResult

EXAMPLES = """\
examples:
  # PiPPy's split_into_equal_size on DeiT-S, 2 stages, 16 microbatches (prints where it cut)
  python -m pipeline.run --stages 2 --policy equal-size --chunks 16
  # hand-placed cuts, torchpippy runtime
  python -m pipeline.run --split-points blocks.4,blocks.8 --chunks 8 --backend pippy
  # a tiny model, for a quick check
  python -m pipeline.run --model deit_tiny_patch16_224 --model-kwargs '{"depth": 4, "img_size": 64}' \\
      --batch-size 8 --stages 2 --chunks 4
  # run an exported best split again and save what it measured
  python -m pipeline.run --split results/<study>/best_split.json --repeats 5 --out rerun.json
  # where the time goes: a Gantt chart of the stages and torch.profiler traces per rank
  python -m pipeline.run --stages 2 --policy equal-size --chunks 8 --timeline t.png --profile results/traces
  # the stages on two nodes: run this on each (torchrun's ranks become the stage workers)
  torchrun --nnodes 2 --nproc-per-node 1 --rdzv-backend c10d --rdzv-endpoint HOST:29500 \\
      -m pipeline.run --split-points blocks.6 --chunks 16
"""


def policy_points(cands: Candidates, policy: str, stages: int) -> tuple[SplitPoint, ...]:
    """Split points that a reference policy picks for ``stages`` stages."""
    try:
        if policy == "equal-size":
            cuts = equal_size_cuts([n for _, n in cands.units], stages)
            return tuple(SplitPoint(cands.units[i][0], "BEGINNING") for i in cuts)
        if policy == "uniform":
            return cands.plan_points(uniform_cuts(len(cands.blocks), stages))
        if policy == "params":
            return cands.plan_points(balanced_cuts(cands.segment_params(), stages))
    except ValueError as e:
        raise PipesplitError(f"policy {policy} cannot split into {stages} stages: {e}") from None
    raise PipesplitError(f"policy {policy!r} is unknown: use one of {', '.join(POLICIES)}")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
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
    g.add_argument("--stages", type=int, default=None, help="number of stages (with --policy)")
    g.add_argument("--policy", choices=POLICIES, default=None,
                   help="equal-size: PiPPy's split_into_equal_size (parameters, greedy); uniform: equal block "
                   "counts; params: parameter-balanced (DeepSpeed 'parameters')")
    g.add_argument("--split-points", default=None, metavar="FQN,...",
                   help="comma-separated module FQNs to cut before (append :END to cut after), in execution order")
    g.add_argument("--chunks", type=int, default=None, help="microbatches per batch (default 1); must divide the batch")
    m = p.add_argument_group("measurement")
    m.add_argument("--repeats", type=int, default=3, help="timed repeats, serial and pipeline interleaved (default 3)")
    m.add_argument("--warmup", type=int, default=1, help="untimed pipeline runs before timing (default 1)")
    m.add_argument("--timeout", type=float, default=900.0, help="seconds before a trial counts as hung (default 900)")
    m.add_argument("--no-serial-all", action="store_true",
                   help="skip timing the serial model on all the pipeline's threads")
    m.add_argument("--out", metavar="FILE", help="write plan + measured result + provenance (best_split.json shape)")
    m.add_argument("--timeline", metavar="PNG", help="draw the measured per-stage timeline (Gantt chart) of the last repeat")
    m.add_argument("--profile", nargs="?", const="results/traces", default=None, metavar="DIR",
                   help="one more run under torch.profiler: a chrome trace per rank in DIR (default results/traces; "
                   "open in https://ui.perfetto.dev)")
    return p


def plan_from_args(args: argparse.Namespace) -> SplitPlan:
    """The plan that the flags describe, validated against the model's real execution order."""
    from pipeline.candidates import find_candidates
    from pipeline.models import build_model
    from pipeline.pool import default_threads, resolve_device

    if args.split:
        given = [f"--{f.replace('_', '-')}" for f in MODEL_FLAGS if getattr(args, f) is not None]
        given += [f"--{f}" for f in ("stages", "policy", "split_points", "chunks") if getattr(args, f) is not None]
        if given:
            raise PipesplitError(f"--split runs the saved plan as it is: drop {', '.join(given)}")
        plan = SplitPlan.load(args.split)
        device = resolve_device(plan.device, plan.stages)
        if device != plan.device:
            plan = dataclasses.replace(plan, device=device)
        cands = find_candidates(build_model(plan.model), plan.model, args.granularity)
        cands.validate(plan)
        return plan
    if (args.policy is None) == (args.split_points is None):
        raise PipesplitError("say where to cut: give --stages N --policy NAME, or --split-points FQN,..., or --split FILE")
    spec = spec_from_args(args)
    cands = find_candidates(build_model(spec), spec, args.granularity)
    if args.policy:
        if args.stages is None:
            raise PipesplitError("--policy needs --stages N")
        if args.stages < 2:
            raise PipesplitError(f"--stages must be at least 2 (got {args.stages})")
        if args.stages > cands.max_stages:
            raise PipesplitError(
                f"--stages {args.stages} is too many for {spec.name}: it has {len(cands.cuts)} cut points at "
                f"{cands.granularity} granularity, so at most {cands.max_stages} stages"
            )
        points = policy_points(cands, args.policy, args.stages)
    else:
        points = tuple(SplitPoint.parse(t) for t in args.split_points.split(",") if t.strip())
        if args.stages is not None and args.stages != len(points) + 1:
            raise PipesplitError(
                f"--stages {args.stages} does not match {len(points)} split points ({len(points) + 1} stages): "
                "give stages - 1 split points"
            )
    stages = len(points) + 1
    plan = SplitPlan(
        model=spec, split_points=points, chunks=1 if args.chunks is None else args.chunks,
        backend=args.backend or "torch", schedule=args.schedule or "GPipe",
        device=resolve_device(args.device or "cpu", stages),
        threads_per_stage=args.threads_per_stage or default_threads(stages),
    )
    cands.validate(plan)
    return plan


def format_result(result: TrialResult) -> str:
    """A short human report of one trial."""
    lines = []
    if not result.ok:
        return f"trial failed: {result.reason}"
    lo, hi = result.speedup_spread
    lines.append(f"speedup {result.speedup:.2f}x (spread {lo:.2f}-{hi:.2f} over {len(result.pipeline_s)} repeats) "
                 "vs the serial model on one stage's threads")
    if result.serial_all_s:
        lines.append(f"speedup {result.speedup_all:.2f}x vs the serial model on all the pipeline's threads")
    lines.append("repeat  serial_s  pipeline_s" + ("  serial_all_s" if result.serial_all_s else ""))
    for i, (s, p) in enumerate(zip(result.serial_s, result.pipeline_s)):
        extra = f"  {result.serial_all_s[i]:12.3f}" if result.serial_all_s else ""
        lines.append(f"{i:6d}  {s:8.3f}  {p:10.3f}{extra}")
    lines.append("stage  compute_s  comm+wait_s  peak_mem_MiB  sends_MiB")
    for r, (c, w) in enumerate(zip(result.stage_compute_s, result.stage_comm_s)):
        sent = f"{result.boundary_bytes[r] / 2**20:9.2f}" if r < len(result.boundary_bytes) else "        -"
        lines.append(f"{r:5d}  {c:9.3f}  {w:11.3f}  {result.peak_mem_bytes[r] / 2**20:12.0f}  {sent}")
    lines.append(f"output check: max |diff| {result.max_abs_diff:.2e} <= {result.tolerance:.1e}; "
                 f"build {result.build_s:.1f}s; trial {result.wall_s:.1f}s of which overhead {result.overhead_s:.3f}s")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from pipeline.export import document, write_json
    from pipeline.launch import follower_exit, open_pool

    try:
        code = follower_exit(args)  # under torchrun, ranks > 0 follow rank 0, which runs the plan
        if code is not None:
            return code
        plan = plan_from_args(args)
        print(f"plan: {plan.describe()}, {plan.threads_per_stage} thread(s)/stage on {plan.device}", flush=True)
        with open_pool(plan.stages, device=plan.device, threads_per_stage=plan.threads_per_stage) as pool:
            result = pool.run(plan, repeats=args.repeats, warmup=args.warmup, timeout_s=args.timeout,
                              serial_all=not args.no_serial_all, trace_dir=args.profile)
        print(format_result(result))
        for t in result.traces:
            print(f"wrote {t}")
        if args.timeline and result.ok:
            from pipeline.timeline import Timeline, render

            render(Timeline.from_result(result), args.timeline, title=f"{plan.describe()} - {result.speedup:.2f}x")
            print(f"wrote {args.timeline}")
        if args.out:
            write_json(args.out, document(plan, result, command="pipeline.run"))
            print(f"wrote {args.out}")
        return 0 if result.ok else 1
    except PipesplitError as e:
        print(f"error: {e}", file=sys.stderr)
        from pipeline.launch import release_followers

        release_followers(args)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
