"""``python -m costmodel.profile``: measure what the cost model needs, per candidate segment.

One trace of the model with a cut at *every* candidate gives the segments exactly as a pipeline runs
them (torch's ``pipeline(split_spec=...)``); each is then counted (fvcore, fused attention included),
weighed (parameter bytes, bytes crossing each cut) and timed at every microbatch size on the target
device and thread count (each size over at least one whole batch of samples). The timing runs in the
stage workers (``pipeline.stage.probes``, sent as a ``ProfileSegments`` command); the FLOPs are counted here.
The link between two ranks of the real backend is measured by ping-pong and fitted to latency + bytes / bandwidth. Profiles
are cached under ``results/profiles/``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import sys
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from costmodel.flops import count_flops, torch_flops
from costmodel.link import fit_link
from costmodel.types import PROFILE_DIR_ENV, Link, Machine, Profile, Segment
from pipeline.core.errors import PipesplitError
from pipeline.core.spec import ModelSpec
from pipeline.models.batch import example_input, rows
from pipeline.models.build import build_meta_model, build_model
from pipeline.models.candidates import find_candidates
from pipeline.models.fake import fake_model
from pipeline.ranks.launch import open_pool
from pipeline.stage.messages import SegmentReply
from pipeline.stage.probes import SegmentRunner, stage_targets, time_segments, trace_all_cuts

PROFILE_DIR = Path("results/profiles")


_BYTE_FIELDS = ("saved_bytes", "saved_input_bytes", "saved_output_bytes", "largest_param_bytes")
"""Per-segment byte counts a training profile's reply carries (empty in a forward one)."""


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def segment_flops(spec: ModelSpec, granularity: str, m: int, streamed: bool = False) -> list[int]:
    """Multiply-accumulates per sample of every candidate segment, counted at microbatch size ``m``: fvcore's on
    the real model, or (``streamed``) torch's ``FlopCounterMode`` on the model's fake-tensor copy, no storage."""
    if streamed:
        return _fake_segment_flops(spec, granularity, m)
    model = build_model(spec)
    cands = find_candidates(model, spec, granularity)
    x = rows(example_input(spec), m)
    gm = trace_all_cuts(model, cands, x)
    runner = SegmentRunner(gm, lambda: None)
    with torch.no_grad():
        runner.run(*x)
    mods = dict(gm.named_children())
    return [count_flops(mods[t], runner.inputs[t]) // m for t in stage_targets(gm)]


def _fake_segment_flops(spec: ModelSpec, granularity: str, m: int) -> list[int]:
    meta = build_meta_model(spec)
    cands = find_candidates(meta, spec, granularity)
    fake = fake_model(meta, torch.device("cpu"))
    x = fake.inputs(rows(example_input(spec), m))
    gm = trace_all_cuts(fake.module, cands, x)
    runner = SegmentRunner(gm, lambda: None)
    with torch.no_grad():
        runner.run(*x)
    mods = dict(gm.named_children())
    return [torch_flops(mods[t], runner.inputs[t]) // m for t in stage_targets(gm)]


def profile_key(spec: ModelSpec, device: str, threads: int, granularity: str, micro_sizes: Sequence[int],
                concurrency: int = 1, train: bool = False, streamed: bool = False) -> str:
    from importlib import metadata

    blob = json.dumps({"model": spec.key, "device": device, "threads": threads, "granularity": granularity,
                       "micro": list(micro_sizes), "concurrency": concurrency, "torch": torch.__version__,
                       "timm": metadata.version("timm"), **({"train": True} if train else {}),
                       **({"streamed": True} if streamed else {})}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def cache_path(spec: ModelSpec, key: str, root: Path = PROFILE_DIR) -> Path:
    return root / f"{spec.slug}-b{spec.batch_size}-{key}.json"


def measure_link(device: str, sizes: Sequence[int], repeats: int = 5) -> Link:
    """Ping-pong between two ranks of the real backend (gloo on CPU, NCCL on CUDA)."""
    with open_pool(2, device=device, threads_per_stage=1, quiet=True) as pool:
        samples = pool.measure_link(list(sizes), repeats)
    return fit_link(samples, "nccl" if device == "cuda" else "gloo")


def profile_model(spec: ModelSpec, *, device: str = "cpu", threads: int = 1, granularity: str = "block",
                  micro_sizes: Sequence[int] | None = None, repeats: int = 3, warmup: int = 1,
                  concurrency: int = 1, link: Link | None = None, pool: Any = None, train: bool = False,
                  streamed: bool = False) -> Profile:
    """Measure a fresh profile (see the module docstring); ``streamed`` never makes the whole model real (one
    segment at a time, FLOPs counted on fake tensors): a model bigger than one device.

    With ``concurrency`` S > 1 the segments are timed in S stage workers at once, each on its own
    threads, as the stages of an S-stage pipeline run: on a machine whose cores the stages share, a
    segment is slower beside its neighbours than alone (measured here on 2 cores: about 20 % at
    microbatch 2 for DeiT-S), and the prediction should see that.
    """
    micro = sorted(set(micro_sizes or divisors(spec.batch_size)))
    if any(m < 1 or m > spec.batch_size for m in micro):
        raise PipesplitError(f"microbatch sizes {micro} must lie in 1..{spec.batch_size}")
    if spec.batch_size not in micro:
        micro.append(spec.batch_size)
    if concurrency > 1:
        # a search's own pool (same stage count) is reused: under torchrun it is the only one there is
        own = pool is not None and pool.stages == concurrency
        with nullcontext(pool) if own else open_pool(concurrency, device=device, threads_per_stage=threads,
                                                     quiet=True) as p:
            ranks = p.profile(spec, granularity, micro, repeats, warmup, streamed=streamed)
            samples = p.measure_link(_link_sizes(ranks[0], micro)) if link is None else None
        if samples is not None:
            link = fit_link(samples, "nccl" if device == "cuda" else "gloo")
        first = ranks[0]
        k_all = range(len(first.blocks))
        lat = {m: [statistics.median(r.latency_s[m][k] for r in ranks) for k in k_all] for m in micro}
        spread = {m: [(min(r.spread[m][k][0] for r in ranks), max(r.spread[m][k][1] for r in ranks)) for k in k_all]
                  for m in micro}
    else:
        before = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            first = time_segments(spec, granularity=granularity, micro=micro, repeats=repeats, warmup=warmup,
                                  device=torch.device("cuda" if device == "cuda" else "cpu"), train=train,
                                  streamed=streamed)
        finally:
            torch.set_num_threads(before)
        lat = {m: list(v) for m, v in first.latency_s.items()}
        spread = {m: list(v) for m, v in first.spread.items()}
        if link is None and pool is not None:  # the search's own pool: under torchrun the only one there is
            link = fit_link(pool.measure_link(_link_sizes(first, micro)), "nccl" if device == "cuda" else "gloo")
        elif link is None:
            link = measure_link(device, _link_sizes(first, micro))
    assert link is not None
    flops = segment_flops(spec, granularity, micro[0], streamed)
    n = len(first.blocks)
    segments = tuple(
        Segment(fqn=first.blocks[k], flops=int(flops[k]), param_bytes=int(first.param_bytes[k]),
                out_bytes=int(first.cross_bytes[k]) if k < n - 1 else 0,
                latency_s={m: lat[m][k] for m in micro}, latency_spread={m: (spread[m][k][0], spread[m][k][1]) for m in micro},
                backward_s={m: first.backward_s[m][k][0] for m in first.backward_s},
                input_grad_s={m: first.backward_s[m][k][1] for m in first.backward_s},
                weight_grad_s={m: first.backward_s[m][k][2] for m in first.backward_s},
                optimizer_s=first.optimizer_s[k] if first.optimizer_s else None,
                **{f: int(getattr(first, f)[k]) if getattr(first, f) else 0 for f in _BYTE_FIELDS})
        for k in range(n)
    )
    from pipeline.export import provenance

    return Profile(model=spec.to_dict(), device=device, threads=threads, granularity=granularity,
                   batch_size=spec.batch_size, segments=segments, link=link, concurrency=concurrency,
                   versions=provenance(), key=profile_key(spec, device, threads, granularity, micro, concurrency, train,
                                                          streamed))


def _link_sizes(measured: SegmentReply, micro: Sequence[int]) -> list[int]:
    return sorted({max(4, b * m) for b in measured.cross_bytes for m in micro} | {4, 1 << 20})


def load_or_profile(spec: ModelSpec, *, device: str = "cpu", threads: int = 1, granularity: str = "block",
                    micro_sizes: Sequence[int] | None = None, reprofile: bool = False, root: Path = PROFILE_DIR,
                    repeats: int = 3, concurrency: int = 1, quiet: bool = False,
                    pool: Any = None, train: bool = False, streamed: bool = False) -> tuple[Profile, bool]:
    """(profile, whether it came from the cache): reuse ``results/profiles/`` unless told to measure again;
    ``train`` (one stage at a time only) also times each segment's backward and optimizer step; ``streamed``
    makes one segment real at a time."""
    from pipeline.core.atomic import write_json

    micro = sorted(set(micro_sizes or divisors(spec.batch_size)) | {spec.batch_size})
    key = profile_key(spec, device, threads, granularity, micro, concurrency, train, streamed)
    path = cache_path(spec, key, root)
    if path.exists() and not reprofile:
        try:
            return Profile.from_dict(json.loads(path.read_text())), True
        except Exception as e:  # noqa: BLE001 - a truncated, old or hand-edited cache entry is measured again
            print(f"profile cache {path} is unreadable ({type(e).__name__}): profiling again", file=sys.stderr)
    if not quiet:
        print(f"profiling {spec.label} (batch {spec.batch_size}, {threads} thread(s), {device}, {concurrency} "
              f"stage(s) at once) at microbatch sizes {micro} ...", file=sys.stderr, flush=True)
    prof = profile_model(spec, device=device, threads=threads, granularity=granularity, micro_sizes=micro,
                         repeats=repeats, concurrency=concurrency, pool=pool, train=train, streamed=streamed)
    write_json(path, prof.to_dict())
    return prof, False


def contention(alone: Profile, together: Profile, machine: Machine) -> float:
    """Slowdown beyond the share of cores when ``together.concurrency`` stages compute at once: the median
    over segments and microbatch sizes of (latency together / latency alone) x (their share of cores)."""
    busy = together.concurrency
    share = min(1.0, machine.cores / (busy * machine.threads))
    ratios = [t.latency_s[m] / a.latency_s[m] * share for a, t in zip(alone.segments, together.segments)
              for m in t.latency_s if m in a.latency_s and a.latency_s[m] > 0]
    return float(statistics.median(ratios)) if ratios else 1.0


def load_for_stages(spec: ModelSpec, *, stages: int, device: str = "cpu", threads: int = 1,
                    granularity: str = "block", micro_sizes: Sequence[int] | None = None, reprofile: bool = False,
                    root: Path = PROFILE_DIR, repeats: int = 3, quiet: bool = False,
                    pool: Any = None, train: bool = False, streamed: bool = False) -> tuple[Profile, bool]:
    """The profile a search or a validation of ``stages`` stages predicts with: every segment timed alone
    (what the serial model runs like, and a stage whose neighbours wait), plus a machine model whose
    contention at ``stages`` busy stages comes from timing the segments in ``stages`` workers at once
    (at the smallest and largest microbatch size, which is enough for one factor). ``streamed``: one
    segment made real at a time on each worker, for a model that does not fit one device."""
    from pipeline.ranks.hosts import available_cores

    micro = sorted(set(micro_sizes or divisors(spec.batch_size)) | {spec.batch_size})
    alone, cached = load_or_profile(spec, device=device, threads=threads, granularity=granularity, micro_sizes=micro,
                                    reprofile=reprofile, root=root, repeats=repeats, quiet=quiet, pool=pool,
                                    train=train, streamed=streamed)
    cores = available_cores() if device == "cpu" else stages
    machine = Machine(device=device, cores=cores, threads=threads)
    if device == "cpu" and stages > 1:
        together, cached_too = load_or_profile(spec, device=device, threads=threads, granularity=granularity,
                                               micro_sizes=sorted({micro[0], micro[-1]}), reprofile=reprofile,
                                               root=root, repeats=repeats, concurrency=stages, quiet=quiet, pool=pool,
                                               streamed=streamed)
        machine = Machine(device=device, cores=cores, threads=threads,
                          contention={stages: contention(alone, together, machine)})
        cached = cached and cached_too
    return replace(alone, machine=machine), cached


def format_profile(prof: Profile) -> str:
    sizes = sorted(prof.segments[0].latency_s)
    head = f"{'segment':<22} {'MACs(M)':>9} {'params(MB)':>10} {'out(KB/sample)':>14} " + \
        " ".join(f"{'m=' + str(m) + '(ms)':>10}" for m in sizes)
    rows = [head]
    for s in prof.segments:
        rows.append(f"{s.fqn:<22} {s.flops / 1e6:9.1f} {s.param_bytes / 1e6:10.2f} {s.out_bytes / 1e3:14.1f} "
                    + " ".join(f"{s.latency_s[m] * 1e3:10.2f}" for m in sizes))
    tot = " ".join(f"{sum(s.latency_s[m] for s in prof.segments) * 1e3:10.2f}" for m in sizes)
    rows.append(f"{'total':<22} {prof.total_flops / 1e6:9.1f} "
                f"{sum(s.param_bytes for s in prof.segments) / 1e6:10.2f} {'':>14} {tot}")
    rows.append(f"link ({prof.link.backend}): latency {prof.link.latency_s * 1e6:.1f} us, "
                f"bandwidth {prof.link.bandwidth_Bps / 1e9:.2f} GB/s")
    if prof.segments[0].backward_s:
        m = max(prof.segments[0].backward_s)
        rows.append(f"training, at microbatch {m} (ms): {'segment':<22} {'forward':>8} {'backward':>8} {'input':>8} "
                    f"{'weight':>8} {'optimizer':>9}")
        for s in prof.segments:
            rows.append(f"{'':<35}{s.fqn:<22} {s.latency_s[m] * 1e3:8.2f} {s.backward_s[m] * 1e3:8.2f} "
                        f"{s.input_grad_s[m] * 1e3:8.2f} {s.weight_grad_s[m] * 1e3:8.2f} {(s.optimizer_s or 0) * 1e3:9.2f}")
    return "\n".join(rows)


def add_cache_args(p: argparse.ArgumentParser) -> None:
    """``--reprofile`` and ``--cache-dir``, for every command that loads a profile from the cache."""
    p.add_argument("--reprofile", action="store_true", help="measure again even if a cached profile exists")
    p.add_argument("--cache-dir", default=os.environ.get(PROFILE_DIR_ENV) or str(PROFILE_DIR),
                   help=f"profile cache folder (default ${PROFILE_DIR_ENV}, else {PROFILE_DIR})")


def add_device_memory_arg(p: argparse.ArgumentParser, *, streams: bool = False) -> None:
    p.add_argument("--device-memory", default=None, metavar="SIZE",
                   help="memory one device has (1.5GiB), checked from the model on meta before anything is built: "
                   + ("where the whole model does not fit, each segment is made real and timed one at a time"
                      if streams else "the serial baseline runs the whole model in one process, so it must fit"))


def whole_fits(spec: ModelSpec, device_memory: str | None, granularity: str, *, device: str = "cpu",
               mode: str = "infer") -> bool:
    """Whether the whole model fits ``--device-memory`` (True without one)."""
    try:
        check_whole_fits(spec, device_memory, granularity, device=device, mode=mode)
    except PipesplitError as e:
        if "over --device-memory" in str(e):
            return False
        raise
    return True


def check_whole_fits(spec: ModelSpec, device_memory: str | None, granularity: str, *, device: str = "cpu",
                     mode: str = "infer") -> None:
    """One line, before anything is built, where the whole model does not fit ``--device-memory``."""
    if device_memory is None:
        return
    from pipeline.core.budget import parse_size
    from pipeline.models.build import build_meta_model
    from pipeline.models.footprint import require_whole_fits

    meta = build_meta_model(spec)
    require_whole_fits(meta, find_candidates(meta, spec, granularity), spec, parse_size(device_memory),
                       "the serial baseline runs the whole model in one process", mode=mode, device=device)


def parser() -> argparse.ArgumentParser:
    """The command's flags, apart from running it, so the docs' reference is generated from them."""
    from pipeline.cli import Parser, add_model_args, positive_int

    p = Parser(prog="python -m costmodel.profile", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="example:\n  python -m costmodel.profile --threads 1 --out deit_profile.json")
    add_model_args(p)
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--threads", type=positive_int, default=1, help="intra-op threads, as each stage will use (default 1)")
    p.add_argument("--micro-sizes", default=None, help="comma-separated microbatch sizes (default: divisors of batch)")
    p.add_argument("--repeats", type=int, default=3, help="timed repeats per size (default 3; median kept)")
    p.add_argument("--stages", type=int, default=1,
                   help="time the segments in this many stage workers at once, as a pipeline of that many ranks "
                   "would run them (default 1: alone)")
    p.add_argument("--train", action="store_true",
                   help="also time each segment's backward (whole, input grad, weight grad) and an AdamW step, "
                   "as a training search's profile does (with --stages 1)")
    add_cache_args(p)
    add_device_memory_arg(p, streams=True)
    p.add_argument("--out", default=None, help="also write the profile JSON here")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    from pipeline.logs import quiet_logs

    quiet_logs()
    from pipeline.cli import spec_from_args
    from pipeline.core.atomic import write_json

    args = parser().parse_args(argv)
    try:
        spec = spec_from_args(args)
        streamed = not whole_fits(spec, args.device_memory, args.granularity, device=args.device,
                                  mode="train" if args.train else "infer")
        if streamed:
            print("the whole model does not fit --device-memory: timing one segment at a time, each made real "
                  "by name, never the whole model", file=sys.stderr, flush=True)
        micro = [int(t) for t in args.micro_sizes.split(",")] if args.micro_sizes else None
        if args.train and args.stages > 1:
            raise PipesplitError("--train times segments one stage at a time: drop --stages or --train")
        if args.device == "cuda" and not torch.cuda.is_available():
            raise PipesplitError("--device cuda but no GPU is visible: use --device cpu")
        prof, cached = load_or_profile(spec, device=args.device, threads=args.threads, granularity=args.granularity,
                                       micro_sizes=micro, reprofile=args.reprofile, repeats=args.repeats,
                                       concurrency=args.stages, root=Path(args.cache_dir), train=args.train,
                                       streamed=streamed)
    except (PipesplitError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(format_profile(prof))
    print(f"({'cached' if cached else 'measured'}: {cache_path(spec, prof.key, Path(args.cache_dir))})")
    if args.out:
        write_json(args.out, prof.to_dict())
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
