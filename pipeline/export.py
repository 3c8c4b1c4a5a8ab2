"""The product's output document (``best_split.json`` shape), and that split in the training frameworks' formats.

    python -m pipeline.export --split best_split.json --to torchtitan|megatron|deepspeed
"""

from __future__ import annotations

import argparse
import os
import platform
import socket
import sys
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.core.atomic import write_text
from pipeline.core.errors import PipesplitError
from pipeline.core.plan import SplitPlan
from pipeline.core.result import TrialResult
from pipeline.core.stack import NoStack, find_stack
from pipeline.peers.formats import PlanView

if TYPE_CHECKING:
    from pipeline.models.candidates import Candidates


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def provenance(**extra: Any) -> dict[str, Any]:
    """Where and with what a figure was measured."""
    import torch

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {
        "host": socket.gethostname(),
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "gpu": gpu,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "timm": _version("timm"),
        "torchpippy": _version("torchpippy"),
        "pipesplit": _version("pipesplit"),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        **extra,
    }


def document(plan: SplitPlan, result: TrialResult, *, predicted: dict[str, Any] | None = None,
             **prov: Any) -> dict[str, Any]:
    """A ``best_split.json``-shaped document: the plan's keys, then measured, predicted and provenance."""
    return {**plan.to_dict(), "measured": result.measured(), "predicted": predicted or {},
            "provenance": provenance(**prov)}


Measured = Callable[[tuple[str, ...], int], "str | None"]
"""What a study measured of a plan with these split points and chunk count (None: never measured)."""


def plan_view(plan: SplitPlan, cands: Candidates) -> PlanView:
    """The plan in the terms the frameworks' formats use: its cuts among the model's segments and its stack
    of layers (a PipesplitError for a model without one)."""
    try:
        stack = find_stack(cands.blocks)
    except NoStack as e:
        raise PipesplitError(f"{plan.model.label} cannot be written in a framework's format: {e}; those formats "
                             "describe a model as an embedding, one stack of layers and a head") from None
    seg = cands.segment_params()
    total = float(sum(seg)) or 1.0
    index = {b: i for i, b in enumerate(cands.blocks)}
    per_stage = cands.stage_elements(plan)
    return PlanView(stack=stack, names=cands.blocks,
                    cuts=tuple(index.get(p.fqn, -1) if p.kind == "BEGINNING" else -1 for p in plan.split_points),
                    prefix=tuple(sum(seg[:i]) / total for i in range(len(seg) + 1)),
                    cut_shares=tuple(sum(per_stage[: k + 1]) / total for k in range(len(plan.split_points))),
                    ranks=plan.ranks, per_rank=plan.stages_per_rank, schedule=plan.schedule, chunks=plan.chunks,
                    batch_size=plan.model.batch_size, mode=plan.mode, segment_elements=tuple(seg),
                    recompute=cands.recompute_counts(plan) if plan.mode == "train" else (), dp_shard=plan.dp_shard,
                    mixed_precision=plan.model.mixed_precision)


def export_text(plan: SplitPlan, fmt: str, *, measured: Measured | None = None, figure: str = "") -> str:
    """What a user of ``fmt`` (torchtitan, megatron, deepspeed) pastes to run ``plan``, headed by where it came
    from, and one line for anything of it the format cannot express (the nearest plan it can is written)."""
    from pipeline.models.build import build_meta_model
    from pipeline.models.candidates import find_candidates
    from pipeline.peers.formats import FORMATS, export_to
    from pipeline.peers.rules import PeerMissing, deepspeed_parts

    if fmt not in FORMATS:
        raise PipesplitError(f"--to {fmt!r} is unknown: use one of {', '.join(FORMATS)}")
    cands = find_candidates(build_meta_model(plan.model), plan.model, "block")
    view = plan_view(plan, cands)
    parts: dict[str, list[int] | None] = {}
    if fmt == "deepspeed":
        for method in ("parameters", "uniform"):
            try:
                parts[f"{method}_parts"] = deepspeed_parts(view.stack, [float(e) for e in view.segment_elements],
                                                           plan.stages, method)
            except (PeerMissing, ValueError):
                parts[f"{method}_parts"] = None
    out = export_to(fmt, view, **parts)
    head = f"# pipesplit's split for {fmt}: {plan.describe()}" + (f"; measured {figure}" if figure else "") + "\n"
    if out.unexpressible:
        names = tuple(cands.blocks[c] for c in out.cuts)
        if tuple(out.cuts) != view.cuts:
            seen = measured(names, plan.chunks) if measured else None
            head += (f"# not expressible in {fmt}: {out.unexpressible}; written instead: the nearest plan it can "
                     f"express, cut at [{', '.join(names)}] ("
                     + (f"measured {seen}" if seen else "not measured by this search") + ")\n")
        else:
            head += f"# not expressible in {fmt}: {out.unexpressible}\n"
    return head + out.text


def figure_of(doc: dict[str, Any]) -> str:
    """The measured figure of a best_split.json (speedup or throughput), for the export's heading."""
    meas = doc.get("measured") or {}
    metric = meas.get("objective", "speedup")
    value = meas.get(metric)
    return f"{value:.3g}{'x' if metric == 'speedup' else ' samples/s'}" if isinstance(value, (int, float)) else ""


def study_lookup(doc: dict[str, Any]) -> Measured | None:
    """A lookup of the plans the search behind ``doc`` (its provenance's storage and study) measured."""
    prov = doc.get("provenance") or {}
    if not prov.get("storage") or not prov.get("study"):
        return None

    def find(names: tuple[str, ...], chunks: int) -> str | None:
        import optuna

        try:
            study = optuna.load_study(study_name=prov["study"], storage=prov["storage"])
        except Exception:  # the storage moved or is gone: the export still prints, without the figure
            return None
        for t in study.get_trials(deepcopy=False):
            if tuple(t.user_attrs.get("split_points") or ()) == names and t.user_attrs.get("chunks") == chunks \
                    and t.value is not None:
                metric = (study.user_attrs.get("config") or {}).get("objective") or "speedup"
                return f"{t.value:.3g}{'x' if metric == 'speedup' else ' samples/s'} in trial {t.number}"
        return None

    return find


def parser() -> argparse.ArgumentParser:
    """The command's flags, apart from running it, so the docs' reference is generated from them."""
    p = argparse.ArgumentParser(
        prog="python -m pipeline.export",
        description="Print a split (best_split.json or any plan) in the form a torchtitan, Megatron-Core or "
        "DeepSpeed user pastes: torchtitan's module_fqns_per_model_part (TOML and Python config), Megatron's "
        "--pipeline-model-parallel-layout, DeepSpeed's PipelineModule parts.",
        epilog="examples:\n  python -m pipeline.export --split results/<study>/best_split.json --to torchtitan\n"
        "  python -m pipeline.export --split best_split.json --to megatron --out layout.txt\n",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--split", required=True, metavar="FILE", help="a best_split.json or plan JSON")
    p.add_argument("--to", required=True, choices=("torchtitan", "megatron", "deepspeed"), help="the framework's format")
    p.add_argument("--out", metavar="FILE", help="also write it to FILE")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m pipeline.export --split best_split.json --to torchtitan|megatron|deepspeed``."""
    args = parser().parse_args(argv)
    try:
        doc = SplitPlan.read(args.split)
        plan = SplitPlan.from_dict(doc)
        text = export_text(plan, args.to, measured=study_lookup(doc), figure=figure_of(doc))
    except PipesplitError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(text, end="")
    if args.out:
        write_text(Path(args.out), text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
