"""SplitPlan: where to cut a model, how many microbatches, on which runtime; JSON in, JSON out."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.core.errors import PipesplitError
from pipeline.core.fields import read
from pipeline.core.recompute import Recompute, check_stages, describe, parse_recompute, to_json
from pipeline.core.sharding import MESH_ORDERS, check_sharding, pp_rank_of
from pipeline.core.spec import ModelSpec

PLAN_VERSION = 3
"""3: a training plan carries ``recompute`` (``none``, ``full`` or a count per stage; older files load as ``none``).
2: ``stages`` counts the pipeline's ranks, as ``--stages`` does in every command (torchtitan's
``pipeline_parallel_degree``, Megatron's ``--pipeline-model-parallel-size``), beside ``stages_per_rank`` (V)
and ``total_stages`` (ranks x V, the pieces the model is cut into). 1: ``stages`` counted the pieces, and
``stages_per_rank`` was written only when not 1; version-1 files still load and run as they did."""
READ_VERSIONS = (1, 2, 3)
KINDS = ("BEGINNING", "END")
BACKENDS = ("torch", "pippy")
SINGLE_SCHEDULES = ("GPipe", "1F1B")
"""torch's schedules that run one stage per rank."""
MULTI_SCHEDULES = ("Interleaved1F1B", "LoopedBFS", "InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV")
"""torch's schedules that run several stages per rank (``stages_per_rank``, V), placed round-robin or in a V."""
V_SCHEDULES = ("ZBVZeroBubble", "DualPipeV")
"""Schedules that place exactly two stages per rank in a V: rank r holds stages r and 2 * ranks - 1 - r."""
SCHEDULES = SINGLE_SCHEDULES + MULTI_SCHEDULES
DEVICES = ("cpu", "cuda")
MODES = ("infer", "train")
OPTIMIZERS = ("adamw", "sgd")


def parse_chunks(text: str) -> tuple[int, ...]:
    """``--chunks 1,4,16`` as integers, or one line that says how to write it."""
    try:
        return tuple(int(c) for c in text.split(",") if c.strip())
    except ValueError:
        raise PipesplitError(f"--chunks {text!r} must be comma-separated integers, e.g. 1,4,16") from None


def choose_chunks(typed: Sequence[int] | None, batch: int, default: Sequence[int]) -> list[int]:
    """The chunk counts to try: those the user typed, each of which must divide the batch (the pipeline
    splits it evenly), or else the defaults that divide it (a default never fails on a batch size)."""
    if typed is None:
        return [c for c in dict.fromkeys(default) if c >= 1 and batch % c == 0] or [1]
    bad = [c for c in typed if c < 1 or batch % c]
    if bad and len(bad) == len(typed):
        shown = ",".join(map(str, typed))
        raise PipesplitError(f"none of --chunks {shown} divides batch size {batch}: use divisors such as "
                             f"{','.join(str(d) for d in range(1, batch + 1) if batch % d == 0)}")
    if bad:
        raise PipesplitError(f"--chunks {','.join(map(str, bad))} do not divide batch size {batch}: use divisors of "
                             f"{batch} ({', '.join(str(d) for d in range(1, batch + 1) if batch % d == 0)})")
    return list(dict.fromkeys(typed))


def schedule_rule(schedule: str, stages: int, per_rank: int, chunks: int, mode: str = "infer") -> str | None:
    """Why ``schedule`` cannot run ``stages`` stages, ``per_rank`` to a rank, over ``chunks`` microbatches in
    ``mode`` (the rules torch's schedule classes enforce), or None when it can."""
    if schedule not in SCHEDULES:
        return f"schedule {schedule!r} is not supported: use one of {', '.join(SCHEDULES)}"
    if schedule in V_SCHEDULES and mode != "train":
        return (f"schedule {schedule} trains only (its action list splits every backward, and torch 2.14 fails "
                "it forward-only): use --mode train, or Interleaved1F1B for inference")
    if per_rank < 1 or stages % per_rank:
        return f"{stages} stages do not split into {per_rank} per rank: give a stage count that is a multiple of it"
    ranks = stages // per_rank
    if schedule in SINGLE_SCHEDULES and per_rank != 1:
        return f"schedule {schedule} runs one stage per rank (got {per_rank}): use Interleaved1F1B or LoopedBFS"
    if schedule in V_SCHEDULES and per_rank != 2:
        return f"schedule {schedule} needs exactly 2 stages per rank, placed in a V (got {per_rank})"
    if schedule == "1F1B" and chunks < stages:
        return f"schedule 1F1B needs at least as many chunks as stages (got chunks {chunks}, {stages} stages)"
    if schedule == "DualPipeV" and chunks < stages:
        return f"schedule DualPipeV needs at least as many chunks as stages (got chunks {chunks}, {stages} stages)"
    if schedule in ("Interleaved1F1B", "InterleavedZeroBubble"):
        rounds = max(1, chunks // ranks)
        if chunks % rounds:
            return (f"schedule {schedule} needs chunks to be a multiple of its rounds, max(1, chunks // ranks) = "
                    f"{rounds} (got chunks {chunks}, {ranks} ranks)")
    return None


def schedule_chunks(chunks: Sequence[int], schedule: str, stages: int, per_rank: int = 1,
                    mode: str = "infer") -> list[int]:
    """The chunk counts ``schedule`` can run (1F1B: at least one per stage), or one line with the rule."""
    kept = [c for c in chunks if schedule_rule(schedule, stages, per_rank, c, mode) is None]
    if not kept:
        why = schedule_rule(schedule, stages, per_rank, max(chunks, default=1), mode)
        raise PipesplitError(f"no chunk count in {','.join(map(str, chunks))} fits: {why}")
    return kept


@dataclass(frozen=True)
class SplitPoint:
    """A cut before (``BEGINNING``) or after (``END``) the module ``fqn``: what ``annotate_split_points`` takes."""

    fqn: str
    kind: str = "BEGINNING"

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise PipesplitError(f"split point kind {self.kind!r} for {self.fqn!r} is unknown: use BEGINNING or END")
        if not self.fqn:
            raise PipesplitError("split point has an empty module name: give a module FQN such as blocks.6")

    def to_dict(self) -> dict[str, str]:
        return {"fqn": self.fqn, "kind": self.kind}

    @classmethod
    def parse(cls, text: str) -> SplitPoint:
        """``blocks.6`` or ``blocks.6:END``, the CLI form."""
        fqn, _, kind = text.strip().partition(":")
        return cls(fqn.strip(), (kind.strip().upper() or "BEGINNING"))


def check_ranks(stages: int, per_rank: int = 1) -> None:
    """One line when ``--stages`` (the pipeline's ranks) with ``--stages-per-rank`` cannot make a pipeline."""
    if per_rank < 1:
        raise PipesplitError(f"--stages-per-rank must be a positive integer (got {per_rank})")
    if stages < 2:
        given = f"--stages {stages}" + (f" with --stages-per-rank {per_rank}" if per_rank > 1 else "")
        ranks = "no rank" if stages < 1 else "one rank"
        raise PipesplitError(f"a pipeline needs at least 2 ranks: {given} is {ranks}; use --stages 2"
                             + (f" (--stages counts ranks: {2 * per_rank} stages on 2 ranks)" if per_rank > 1 else
                                " (or --stages 1 --dp-shard N --mode train: plain FSDP, no pipeline)" if stages == 1
                                else ""))


def _check_counts(d: dict[str, Any], version: Any, plan: SplitPlan) -> None:
    """A plan file's stated counts agree with its split points: ``stages`` is the ranks from version 2 on,
    the pieces in version 1, and either in a hand-written file without a version."""
    if "total_stages" in d and read(d, "total_stages", int) != plan.stages:
        raise PipesplitError(f"the plan says total_stages {d['total_stages']} but has {len(plan.split_points)} split "
                             f"points ({plan.stages} stages): give total_stages - 1 split points")
    if "stages" not in d:
        return
    stated = read(d, "stages", int)
    ok = {1: (plan.stages,), 2: (plan.ranks,), 3: (plan.ranks,)}.get(version, (plan.ranks, plan.stages))
    if stated not in ok:
        raise PipesplitError(
            f"the plan says {stated} stages but its {len(plan.split_points)} split points make {plan.layout()}: "
            "give ranks x stages_per_rank - 1 split points"
            + ("" if version == 1 else " (stages counts ranks from plan version 2)"))


@dataclass(frozen=True, kw_only=True)
class SplitPlan:
    """One pipeline configuration to build and measure."""

    model: ModelSpec
    split_points: tuple[SplitPoint, ...]
    """Cuts in execution order: ``len(split_points) + 1`` stages (``stages``), held ``stages_per_rank`` to a
    rank by ``ranks`` processes (what ``--stages`` counts on the command line)."""
    chunks: int = 1
    """Microbatches per batch; must divide the batch size."""
    backend: str = "torch"
    """``torch`` (torch.distributed.pipelining) or ``pippy`` (torchpippy)."""
    schedule: str = "GPipe"
    """A torch schedule name; forward-only inference runs GPipe and 1F1B alike."""
    device: str = "cpu"
    """``cpu`` (gloo) or ``cuda`` (NCCL, one GPU per stage)."""
    threads_per_stage: int = 1
    """Intra-op threads each stage process uses (CPU)."""
    stages_per_rank: int = 1
    """Virtual stages per rank (V): the plan's stages run on ``stages // V`` ranks, as a multi-stage schedule
    (Interleaved1F1B, LoopedBFS, zero-bubble, DualPipeV) places them."""
    mode: str = "infer"
    """``infer`` (forward only) or ``train`` (forward, loss, backward and an optimizer step on every stage)."""
    optimizer: str = "adamw"
    """The optimizer a training step runs on every stage (and the serial model): ``adamw`` or ``sgd``."""
    recompute: Recompute = "none"
    """Training: activation recomputation, ``none``, ``full`` or how many of its first blocks each stage
    recomputes, in stage order (``pipeline.core.recompute``); forward-only plans have none."""
    dp_shard: int = 1
    """Training: the pipeline inside sharded data parallel, ``ranks x dp_shard`` processes on a (``pp``,
    ``dp_shard``) mesh, each stage ``fully_shard``ed over its ``dp_shard`` group, each replica running the
    pipeline on its share of the batch (``pipeline.stage.mesh``)."""
    mesh_order: str = MESH_ORDERS[0]
    """The mesh's dimensions, outermost first: ``pp,dp_shard`` (torchtitan's) or ``dp_shard,pp``
    (``pipeline.core.sharding``)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "split_points", tuple(self.split_points))
        rc = parse_recompute(self.recompute)
        object.__setattr__(self, "recompute", rc if self.mode == "train" else "none")
        check_stages(rc, self.stages)
        if self.chunks < 1:
            raise PipesplitError(f"chunks must be a positive integer (got {self.chunks})")
        if self.model.batch_size % self.chunks:
            ok = [c for c in range(1, self.model.batch_size + 1) if self.model.batch_size % c == 0]
            raise PipesplitError(
                f"chunks {self.chunks} does not divide batch size {self.model.batch_size}: use one of {ok}"
            )
        if self.backend not in BACKENDS:
            raise PipesplitError(f"backend {self.backend!r} is unknown: use one of {', '.join(BACKENDS)}")
        if self.backend == "pippy" and self.schedule != "GPipe":
            raise PipesplitError(f"torchpippy runs only GPipe here (got {self.schedule!r}): use --backend torch")
        if self.mode not in MODES:
            raise PipesplitError(f"mode {self.mode!r} is unknown: use infer or train")
        if self.optimizer not in OPTIMIZERS:
            raise PipesplitError(f"optimizer {self.optimizer!r} is unknown: use one of {', '.join(OPTIMIZERS)}")
        if self.mode == "train" and self.backend != "torch":
            raise PipesplitError("training runs on the torch backend (torch.distributed.pipelining's schedules run "
                                 "the backward): use --backend torch with --mode train")
        why = schedule_rule(self.schedule, self.stages, self.stages_per_rank, self.chunks, self.mode)
        if why is not None:
            raise PipesplitError(why)
        if self.device not in DEVICES:
            raise PipesplitError(f"device {self.device!r} is unknown: use cpu or cuda")
        check_sharding(self)
        if self.threads_per_stage < 1:
            raise PipesplitError(f"threads per stage must be a positive integer (got {self.threads_per_stage})")
        seen: set[tuple[str, str]] = set()
        for p in self.split_points:
            if (p.fqn, p.kind) in seen:
                raise PipesplitError(f"split point {p.fqn}:{p.kind} is repeated: give each cut once")
            seen.add((p.fqn, p.kind))

    @property
    def stages(self) -> int:
        """The pieces the model is cut into (every stage of every rank): ``ranks x stages_per_rank``."""
        return len(self.split_points) + 1

    @property
    def ranks(self) -> int:
        """The pipeline's ranks: one per stage, or one per ``stages_per_rank`` stages (per data-parallel replica)."""
        return self.stages // self.stages_per_rank

    @property
    def world(self) -> int:
        """Processes the plan runs on: the pipeline's ranks times its data-parallel replicas (``dp_shard``)."""
        return self.ranks * self.dp_shard

    def pp_rank(self, process: int) -> int:
        """The pipeline rank of process ``process`` of the job (itself without ``dp_shard``)."""
        return pp_rank_of(process, self.ranks, self.dp_shard, self.mesh_order)

    def rank_stages(self, rank: int) -> tuple[int, ...]:
        """The stage indices ``rank`` holds: round-robin (rank, rank + ranks, ...), or in a V for V-schedules."""
        if self.schedule in V_SCHEDULES:
            return (rank, 2 * self.ranks - 1 - rank)
        return tuple(rank + k * self.ranks for k in range(self.stages_per_rank))

    @property
    def last_rank(self) -> int:
        """The rank that holds the last stage: it computes the loss and returns the output."""
        return next(r for r in range(self.ranks) if self.stages - 1 in self.rank_stages(r))

    def split_spec(self) -> dict[str, str]:
        """FQN -> kind name, the dictionary both runtimes' ``annotate_split_points`` take (as enum names)."""
        return {p.fqn: p.kind for p in self.split_points}

    def describe(self) -> str:
        if self.stages == 1 and self.dp_shard > 1:
            mp = f", {self.model.mixed_precision} mixed precision" if self.model.mixed_precision else ""
            return (f"plain FSDP: the whole model on each of {self.dp_shard} replicas, chunks {self.chunks}, "
                    f"{self.backend}, training ({self.optimizer}{mp})")
        cuts = ", ".join(p.fqn if p.kind == "BEGINNING" else f"{p.fqn}:END" for p in self.split_points) or "(none)"
        rc = f", recompute {describe(self.recompute)}" if self.recompute != "none" else ""
        rc += f", dp_shard {self.dp_shard}" if self.dp_shard > 1 else ""
        rc += f" ({self.mesh_order} outermost first)" if self.mesh_order != MESH_ORDERS[0] else ""
        rc += f", {self.model.mixed_precision} mixed precision" if self.model.mixed_precision else ""
        train = f", training ({self.optimizer}{rc})" if self.mode == "train" else ""
        return (f"{self.layout()} cut at [{cuts}], chunks {self.chunks}, {self.backend}/{self.schedule}{train}")

    def layout(self) -> str:
        """Both numbers a user types and reads: ``4 stages on 2 ranks, 2 per rank``."""
        per = f", {self.stages_per_rank} per rank" if self.stages_per_rank > 1 else ""
        return f"{self.stages} stages on {self.ranks} rank{'s' if self.ranks != 1 else ''}{per}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": PLAN_VERSION,
            "model": self.model.to_dict(),
            "stages": self.ranks,
            "stages_per_rank": self.stages_per_rank,
            "total_stages": self.stages,
            "split_points": [p.to_dict() for p in self.split_points],
            "chunks": self.chunks,
            "backend": self.backend,
            "schedule": self.schedule,
            "device": self.device,
            "threads_per_stage": self.threads_per_stage,
            "mode": self.mode,
            **({"optimizer": self.optimizer, "recompute": to_json(self.recompute)} if self.mode == "train" else {}),
            **({"dp_shard": self.dp_shard} if self.dp_shard > 1 else {}),
            **({"mesh_order": self.mesh_order} if self.mesh_order != MESH_ORDERS[0] else {}),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SplitPlan:
        """Read a plan, or any document of the ``best_split.json`` shape (extra keys are ignored)."""
        if not isinstance(d, dict):
            raise PipesplitError(f"a split plan must be a JSON object, not {type(d).__name__}")
        version = d.get("version")
        if version is not None and version not in READ_VERSIONS:
            raise PipesplitError(f"plan version {version!r} is not supported (this pipesplit reads versions "
                                 f"{', '.join(map(str, READ_VERSIONS))})")
        for key in ("model", "split_points"):
            if key not in d:
                raise PipesplitError(f"the plan has no {key!r} key: export plans with pipesplit or see results/README.md")
        raw = d["split_points"]
        if not isinstance(raw, list):
            raise PipesplitError(f"split_points {raw!r} must be a list of {{\"fqn\": ..., \"kind\": \"BEGINNING\"|\"END\"}} "
                                 "objects, e.g. [{\"fqn\": \"blocks.6\", \"kind\": \"BEGINNING\"}]")
        points = []
        for p in raw:
            if isinstance(p, str):
                points.append(SplitPoint.parse(p))
            elif isinstance(p, dict) and "fqn" in p:
                points.append(SplitPoint(read(p, "fqn", str, where="split point "),
                                         read(p, "kind", str, "BEGINNING", where=f"split point {p.get('fqn')!r} ")))
            else:
                raise PipesplitError(f"split point {p!r} must be {{'fqn': ..., 'kind': 'BEGINNING'|'END'}}")
        plan = cls(
            model=ModelSpec.from_dict(d["model"]),
            split_points=tuple(points),
            chunks=read(d, "chunks", int, 1),
            backend=read(d, "backend", str, "torch"),
            schedule=read(d, "schedule", str, "GPipe"),
            device=read(d, "device", str, "cpu"),
            threads_per_stage=read(d, "threads_per_stage", int, 1),
            stages_per_rank=read(d, "stages_per_rank", int, 1),
            mode=read(d, "mode", str, "infer"),
            optimizer=read(d, "optimizer", str, "adamw"),
            recompute=d.get("recompute", "none"),
            dp_shard=read(d, "dp_shard", int, 1),
            mesh_order=read(d, "mesh_order", str, MESH_ORDERS[0]),
        )
        _check_counts(d, version, plan)
        return plan

    def save(self, path: str | Path) -> None:
        from pipeline.core.atomic import write_json

        write_json(path, self.to_dict())

    @staticmethod
    def read(path: str | Path) -> Any:
        """A plan file's JSON, or one line for a file that is missing, unreadable or not JSON."""
        p = Path(path)
        try:
            return json.loads(p.read_text())
        except FileNotFoundError:
            raise PipesplitError(f"plan file {p} does not exist: pass the path of a best_split.json or plan JSON") from None
        except (OSError, UnicodeDecodeError) as e:
            raise PipesplitError(f"plan file {p} cannot be read ({type(e).__name__}): pass a plan JSON file") from None
        except json.JSONDecodeError as e:
            raise PipesplitError(f"plan file {p} is not valid JSON ({e.msg} at line {e.lineno})") from None

    @classmethod
    def load(cls, path: str | Path) -> SplitPlan:
        return cls.from_dict(cls.read(path))
