"""``python -m costmodel.validate``: does the cost model rank and time real pipelines right?

Runs a grid of real trials on one stage-worker pool (cuts x chunk counts), predicts each with the
simulator from the model's profile, and prints predicted vs measured pipeline seconds per plan, the
mean absolute percentage error and Kendall's tau between the two orderings.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from costmodel.simulate import simulate
from costmodel.stats import kendall_tau, mape
from pipeline.errors import PipesplitError


def _grid_cuts(n_segments: int, stages: int, count: int) -> list[list[int]]:
    """Evenly spread cut sets: for 2 stages, ``count`` single cuts across the model."""
    import itertools

    every = [list(c) for c in itertools.combinations(range(1, n_segments), stages - 1)]
    if len(every) <= count:
        return every
    step = len(every) / count
    return [every[int(i * step)] for i in range(count)]


def main(argv: Sequence[str] | None = None) -> int:
    from tqdm import tqdm

    from costmodel.profile import load_or_profile
    from pipeline.cli import add_model_args, spec_from_args
    from pipeline.plan import SplitPlan, SplitPoint
    from pipeline.pool import StagePool

    p = argparse.ArgumentParser(prog="python -m costmodel.validate", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="example:\n  python -m costmodel.validate --stages 2 --chunks 1,4,8,16,32")
    add_model_args(p)
    p.add_argument("--stages", type=int, default=2)
    p.add_argument("--chunks", default="1,4,8,16,32", help="comma-separated chunk counts (default 1,4,8,16,32)")
    p.add_argument("--cuts", type=int, default=5, help="how many cut placements to try (default 5)")
    p.add_argument("--threads-per-stage", type=int, default=1)
    p.add_argument("--backend", default="torch", choices=("torch", "pippy"))
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--repeats", type=int, default=3, help="timed pipeline repeats per plan (default 3)")
    args = p.parse_args(argv)
    try:
        spec = spec_from_args(args)
        chunks = [int(c) for c in args.chunks.split(",")]
        prof, _ = load_or_profile(spec, device=args.device, threads=args.threads_per_stage,
                                  granularity=args.granularity, concurrency=args.stages)
        grid = [(cuts, m) for cuts in _grid_cuts(len(prof.segments), args.stages, args.cuts) for m in chunks
                if spec.batch_size % m == 0]
        rows = []
        with StagePool(args.stages, device=args.device, threads_per_stage=args.threads_per_stage) as pool:
            for cuts, m in tqdm(grid, desc="real trials", unit="plan"):
                plan = SplitPlan(model=spec, split_points=tuple(SplitPoint(
                    prof.segments[c].fqn) for c in cuts), chunks=m, backend=args.backend, device=args.device,
                    threads_per_stage=args.threads_per_stage)
                pred = simulate(prof, cuts, m)
                res = pool.run(plan, repeats=args.repeats, warmup=1, serial=False, serial_all=False)
                if not res.ok:
                    print(f"failed: {plan.describe()}: {res.reason}", file=sys.stderr)
                    continue
                meas = sorted(res.pipeline_s)[len(res.pipeline_s) // 2]
                rows.append((plan, pred, meas, min(res.pipeline_s), max(res.pipeline_s)))
    except (PipesplitError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"{'cut(s)':<24} {'chunks':>6} {'predicted_s':>11} {'measured_s':>10} {'spread_s':>13} {'error':>7}")
    for plan, pred, meas, lo, hi in rows:
        cuts = ",".join(pt.fqn for pt in plan.split_points)
        print(f"{cuts:<24} {plan.chunks:6d} {pred.makespan_s:11.3f} {meas:10.3f} {lo:6.3f}-{hi:6.3f} "
              f"{100 * (pred.makespan_s - meas) / meas:+6.1f}%")
    if len(rows) >= 2:
        pr, me = [r[1].makespan_s for r in rows], [r[2] for r in rows]
        print(f"MAPE {mape(pr, me):.1f}%  Kendall tau {kendall_tau(pr, me):.3f}  over {len(rows)} plans")
    return 0


if __name__ == "__main__":
    sys.exit(main())
