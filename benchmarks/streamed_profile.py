"""Does a profile made one segment at a time (a model bigger than the device) time segments as the whole-model
profile does? Both profiles of one model, measured alternately, each several times, and every segment's
median compared with the run-to-run spread of the whole-model profile.

    python benchmarks/streamed_profile.py                    # DeiT-S, batch 32, microbatches 2 and 8, ~3 min
    python benchmarks/streamed_profile.py --rounds 2 --model deit_tiny_patch16_224
"""

from __future__ import annotations

import argparse
import statistics
import sys

import torch


def main(argv: list[str] | None = None) -> int:
    from pipeline.logs import quiet_logs
    from pipeline.models.build import resolve_spec
    from pipeline.stage.probes import time_segments

    quiet_logs()
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="deit_small_patch16_224")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--micro", default="2,8")
    p.add_argument("--rounds", type=int, default=3, help="profiles of each kind, alternating (default 3)")
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    spec = resolve_spec(args.model, batch_size=args.batch_size)
    micro = [int(m) for m in args.micro.split(",")]
    runs: dict[bool, list[dict[int, tuple[float, ...]]]] = {False: [], True: []}
    blocks: tuple[str, ...] = ()
    for r in range(args.rounds):
        for streamed in (False, True) if r % 2 == 0 else (True, False):  # alternate: the machine drifts
            out = time_segments(spec, granularity="block", micro=micro, repeats=args.repeats, warmup=1,
                                device=torch.device("cpu"), streamed=streamed)
            runs[streamed].append(out.latency_s)
            blocks = out.blocks
            print(f"round {r}: {'one segment at a time' if streamed else 'whole model'} measured", file=sys.stderr)
    print(f"{spec.label}, batch {spec.batch_size}, 1 thread, {args.rounds} profiles of each kind, alternating")
    for m in micro:
        inside, ratios = 0, []
        print(f"\nmicrobatch {m}: segment, whole-model median ms [min..max over profiles], one-at-a-time median ms, ratio")
        for k, fqn in enumerate(blocks):
            w = [run[m][k] for run in runs[False]]
            s = [run[m][k] for run in runs[True]]
            mw, ms = statistics.median(w), statistics.median(s)
            lo, hi = min(w), max(w)
            ok = lo <= ms <= hi
            inside += ok
            ratios.append(ms / mw)
            print(f"  {fqn:14s} {mw * 1e3:8.3f} [{lo * 1e3:.3f}..{hi * 1e3:.3f}]  {ms * 1e3:8.3f}  {ms / mw:5.2f}"
                  f"{'' if ok else '  outside'}")
        total_w = sum(statistics.median(run[m][k] for run in runs[False]) for k in range(len(blocks)))
        total_s = sum(statistics.median(run[m][k] for run in runs[True]) for k in range(len(blocks)))
        print(f"  {inside} of {len(blocks)} segments' one-at-a-time medians inside the whole-model profiles' spread; "
              f"median ratio {statistics.median(ratios):.3f}; sum of medians {total_s / total_w:.3f}x the whole model's")
    return 0


if __name__ == "__main__":
    sys.exit(main())
