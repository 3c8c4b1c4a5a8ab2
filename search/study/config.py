"""SearchConfig: everything one search study is asked to do, as the CLIs hand it to ``run_study``."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field

from costmodel.types import PROFILE_DIR_ENV
from pipeline.cli import ModelArgs
from pipeline.core import budget
from pipeline.core.errors import PipesplitError
from pipeline.core.plan import check_ranks, parse_chunks
from pipeline.core.sharding import check_mixed
from pipeline.peers.formats import FORMATS
from search.plans.layouts import parse_per_rank, parse_schedules
from search.trials.metric import METRICS

__all__ = ["DEFAULT_CHUNKS", "DEFAULT_STORAGE", "SearchConfig", "default_study_name"]

DEFAULT_STORAGE = "sqlite:///results/optuna.db"

DEFAULT_CHUNKS = (1, 2, 4, 8, 16, 32)


def default_study_name(model: str, stages: int, batch: int, device: str, granularity: str, mode: str = "infer",
                       mixed_precision: str | None = None) -> str:
    name = f"{model}-s{stages}-b{batch}-{device}" + ("-train" if mode == "train" else "")
    name += f"-{mixed_precision}" if mixed_precision else ""
    return name if granularity == "block" else f"{name}-{granularity}"


def parse_formats(text: str | None) -> tuple[str, ...]:
    """``--export-to torchtitan,megatron`` (or ``all``) as format names, in the order given."""
    if not text:
        return ()
    names = [t.strip() for t in text.split(",") if t.strip()]
    return FORMATS if names == ["all"] else tuple(dict.fromkeys(names))


RECOMPUTE_CHOICES = ("search", "none", "full")
"""What ``search.optimize --recompute`` takes."""

@dataclass(frozen=True, kw_only=True)
class SearchConfig:
    """One study's settings; ``search.sweep`` makes one per stage count with ``dataclasses.replace``."""

    model: ModelArgs = field(default_factory=ModelArgs)
    stages: int = 4
    chunks: tuple[int, ...] | None = None
    """Chunk counts the user typed (each must divide the batch); None: those of ``DEFAULT_CHUNKS`` that do."""
    trials: int | None = None
    """Measured trials the study should hold in total (None: 12 for 2 stages, 14 otherwise)."""
    timeout_s: float | None = None
    """Stop starting new trials after this many seconds."""
    repeats: int = 2
    """Base timed repeats per trial (raised for short models by ``min_trial_seconds``)."""
    race: bool = True
    """Race repeats: a repeat at a time, a plan clearly behind stops early, contenders earn more."""
    repeat_cap: int | None = None
    """Most repeats a contender earns (None: twice the base repeats)."""
    budget_repeats: int | None = None
    """The study's total of timed repeats over its measured trials (None: only ``trials`` limits it)."""
    min_trial_seconds: float = 4.0
    trial_timeout_s: float = 900.0
    confirm_top: int = 2
    confirm_rounds: int = 2
    prune: bool = True
    storage: str = DEFAULT_STORAGE
    study_name: str | None = None
    out: str | None = None
    """The best split's path (default ``<results_dir>/<study>/best_split.json``)."""
    export_to: tuple[str, ...] = ()
    """Frameworks whose format the best split is also written in, beside it (``best_split.<format>.txt``)."""
    results_dir: str = "results"
    profile_dir: str | None = None
    """Where profiles are cached (None: ``$PIPESPLIT_PROFILE_DIR``, else ``<results_dir>/profiles``)."""
    progress: bool = True
    trace: bool = False
    """Run the confirmed best plan once more under torch.profiler (``--trace``, also spelt ``--profile``)."""
    artifact_dir: str | None = None
    artifacts: bool = True
    backend: str = "torch"
    schedules: tuple[str, ...] = ("GPipe",)
    """Schedules to search (``--schedule``, a list or ``all``): each a layout of the space where it fits."""
    stages_per_rank: tuple[int, ...] = ()
    """V values for the multi-stage schedules (empty: 2); ``stages`` counts ranks."""
    device: str = "cpu"
    threads_per_stage: int | None = None
    mode: str = "infer"
    """``train`` measures whole training steps, priced by replaying each schedule's action order."""
    optimizer: str = "adamw"
    dp_shard: int = 1
    """Training: data-parallel replicas around the pipeline (``search.degrees`` sets it for each degree of
    ``--ranks``); the study runs on ``stages x dp_shard`` processes."""
    mesh_order: str = "pp,dp_shard"
    """Those processes' mesh, outermost dimension first (``--mesh-order``, ``pipeline.core.sharding``)."""
    recompute: str = "search"
    """Training: ``search`` gives each plan the least per-stage recomputation that fits ``device_memory`` (none
    without a limit); ``none`` or ``full`` pin it for every plan."""
    device_memory: int | None = None
    """Memory each rank's device has (``--device-memory``, also spelt ``--max-stage-memory``): a plan predicted
    over it is not run, a measured plan that peaked over it is infeasible (None: no limit)."""
    objective: str | None = None
    """The figure plans are ranked by: ``speedup`` or ``throughput`` (None: speedup where the whole model fits
    the device memory and a serial baseline is timed, throughput otherwise)."""
    memory_objective: bool = False
    """``--objectives <figure>,memory``: a two-objective study (the figure up, the largest stage's peak down)."""

    @property
    def profiles(self) -> str:
        """The profile cache this study reads and writes."""
        return self.profile_dir or os.environ.get(PROFILE_DIR_ENV) or os.path.join(self.results_dir, "profiles")

    @property
    def references(self) -> str:
        """Where the ranks keep what a trial's check compares with, made once for every study of the model
        (``pipeline.stage.refstore``): beside the profiles."""
        return os.path.join(self.profiles, "references")

    def __post_init__(self) -> None:
        check_ranks(self.stages, min(self.stages_per_rank, default=1))
        for flag in ("repeats", "confirm_rounds"):
            if getattr(self, flag) < 1:
                raise PipesplitError(f"--{flag.replace('_', '-')} must be at least 1 (got {getattr(self, flag)})")
        if not self.min_trial_seconds >= 0:
            raise PipesplitError(f"--min-trial-seconds must be 0 or more (got {self.min_trial_seconds})")
        for flag in ("repeat_cap", "budget_repeats"):
            v = getattr(self, flag)
            if v is not None and v < 1:
                raise PipesplitError(f"--{flag.replace('_', '-')} must be at least 1 (got {v})")
        if self.trials is not None and self.trials < 1:
            raise PipesplitError(f"--trials must be at least 1 (got {self.trials})")
        if self.timeout_s is not None and not self.timeout_s > 0:
            raise PipesplitError(f"--timeout must be a positive number of seconds (got {self.timeout_s})")
        if not self.trial_timeout_s > 0:
            raise PipesplitError(f"--trial-timeout must be a positive number of seconds (got {self.trial_timeout_s})")
        if self.backend == "pippy" and self.schedules != ("GPipe",):
            raise PipesplitError(f"torchpippy runs only GPipe here (got --schedule {','.join(self.schedules)}): "
                                 "use --backend torch")
        if self.objective is not None and self.objective not in METRICS:
            raise PipesplitError(f"--objective {self.objective} is not one this search knows: give speedup or "
                                 "throughput")
        if self.recompute not in RECOMPUTE_CHOICES:
            raise PipesplitError(f"--recompute {self.recompute} is not one a search takes: give search, none or full "
                                 "(pipeline.run takes per-stage counts)")
        check_mixed(self.model.mixed_precision, self.mode)
        if self.confirm_top < 0:
            raise PipesplitError(f"--confirm-top must be 0 or more (got {self.confirm_top})")
        bad = [f for f in self.export_to if f not in FORMATS]
        if bad:
            raise PipesplitError(f"--export-to {','.join(bad)} is not a format pipesplit writes: give one or more of "
                                 f"{', '.join(FORMATS)} (comma-separated) or all")

    @classmethod
    def from_args(cls, args: argparse.Namespace, stages: int) -> SearchConfig:
        """The settings the flags describe, for ``stages`` stages (cheap checks only: nothing is built)."""
        figure, two = _objectives(args)
        return cls(model=ModelArgs.from_args(args), stages=stages,
                   chunks=None if args.chunks is None else parse_chunks(args.chunks), trials=args.trials,
                   timeout_s=args.timeout, repeats=args.repeats, race=not args.no_race, repeat_cap=args.repeat_cap,
                   budget_repeats=args.budget_repeats,
                   min_trial_seconds=args.min_trial_seconds, trial_timeout_s=args.trial_timeout,
                   confirm_top=args.confirm_top, confirm_rounds=args.confirm_rounds, prune=not args.no_prune,
                   storage=args.storage, study_name=getattr(args, "study_name", None), out=getattr(args, "out", None),
                   export_to=parse_formats(getattr(args, "export_to", None)),
                   results_dir=args.results_dir, profile_dir=args.profile_dir, progress=not args.no_progress, trace=args.trace,
                   artifact_dir=args.artifact_dir, artifacts=not args.no_artifacts, backend=args.backend or "torch",
                   schedules=parse_schedules(args.schedule), stages_per_rank=parse_per_rank(args.stages_per_rank),
                   device=args.device or "cpu",
                   threads_per_stage=args.threads_per_stage, mode=args.mode or "infer",
                   optimizer=args.optimizer or "adamw", mesh_order=getattr(args, "mesh_order", None) or "pp,dp_shard",
                   recompute=(args.recompute or "search").strip().lower(),
                   device_memory=None if args.device_memory is None else budget.parse_size(args.device_memory),
                   objective=figure, memory_objective=two)


def _objectives(args: argparse.Namespace) -> tuple[str | None, bool]:
    """``--objective FIGURE`` and ``--objectives FIGURE[,memory]`` as the config's two fields."""
    names = [t.strip() for t in (args.objectives or "").split(",") if t.strip()]
    if names and (names[0] not in METRICS or names[1:] not in ([], ["memory"])):
        raise PipesplitError(f"--objectives {args.objectives} is not one this search knows: give speedup, "
                             "throughput, or either with ,memory")
    figure = names[0] if names else None
    if figure and args.objective and figure != args.objective:
        raise PipesplitError(f"--objective {args.objective} and --objectives {args.objectives} disagree: give one")
    return args.objective or figure, names[1:] == ["memory"]
