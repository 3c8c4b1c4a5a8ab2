"""Two searches' winners and PiPPy's plan re-measured side by side, in interleaved rounds, on one model spec.

Do two searches with different seeds agree? Each search's confirmation round measured its own winner;
here both winners and PiPPy's equal-size plan (from the first study's confirmation) run in the same
rounds, so that machine drift slows all three alike. The speedup's median is a ratio of two noisy
timings (the serial model's and the pipeline's, paired per repeat); the pipeline seconds alone compare
plans of one model without the serial model's noise.

    python benchmarks/side_by_side.py results/deit-s2-seed1/best_split.json results/deit-s2-seed2/best_split.json \\
        --storage sqlite:///results/real.db --study deit-s2-seed1
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import replace


def main(argv: list[str] | None = None) -> int:
    import optuna

    from pipeline.core.plan import SplitPlan
    from pipeline.ranks.pool import StagePool
    from pipeline.rounds import interleaved

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("first")
    p.add_argument("second")
    p.add_argument("--storage", required=True, help="the first search's storage")
    p.add_argument("--study", required=True, help="the first search's study (its PiPPy plan is re-measured)")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--repeats", type=int, default=2)
    args = p.parse_args(argv)
    a, b = SplitPlan.load(args.first), SplitPlan.load(args.second)
    study = optuna.load_study(study_name=args.study, storage=args.storage)
    conf = study.user_attrs["confirmation"]
    row = next(r for r in conf["plans"] if "pippy" in r["source"])
    pippy = SplitPlan.from_dict(study.trials[row["trial"]].user_attrs["plan"])
    plans = {"winner 1": a, "winner 2": replace(b, model=a.model), "PiPPy equal-size": replace(pippy, model=a.model)}
    with StagePool(a.stages, threads_per_stage=a.threads_per_stage, quiet=True) as pool:
        runs = interleaved(pool, list(plans.values()), args.rounds, repeats=args.repeats)
    med, pipe = {}, {}
    for i, k in enumerate(plans):
        v = runs.speedups(i)
        secs = [t for r in runs.results[i] for t in r.pipeline_s]
        med[k], pipe[k] = statistics.median(v), statistics.median(secs)
        print(f"{k:<18} {plans[k].describe():<48} {med[k]:.3f}x  (min {min(v):.3f}, max {max(v):.3f}, n={len(v)}); "
              f"pipeline {pipe[k]:.3f}s (min {min(secs):.3f}, max {max(secs):.3f})")
    w1, w2 = med["winner 1"], med["winner 2"]
    print(f"winners agree within {abs(w1 / w2 - 1):.1%} by speedup (target 3 %), within "
          f"{abs(pipe['winner 1'] / pipe['winner 2'] - 1):.1%} by pipeline seconds; best winner / PiPPy = "
          f"{max(w1, w2) / med['PiPPy equal-size']:.2f}x")
    if a.split_points == pippy.split_points and a.chunks == pippy.chunks:
        print(f"winner 1 is PiPPy's plan: the same plan measured twice in these rounds differs by "
              f"{abs(w1 / med['PiPPy equal-size'] - 1):.1%} by speedup, "
              f"{abs(pipe['winner 1'] / pipe['PiPPy equal-size'] - 1):.1%} by pipeline seconds (the noise floor)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
