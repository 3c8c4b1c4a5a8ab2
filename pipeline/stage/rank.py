"""A stage worker's lasting state: its rank in the process group, its device, and the models it caches.

Shared by the local pool's worker processes and torchrun's ranks; the commands of ``pipeline.ranks.protocol``
run against it.
"""

from __future__ import annotations

import gc
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from pipeline.core.errors import PipesplitError, one_line
from pipeline.core.spec import ModelSpec
from pipeline.logs import quiet_logs
from pipeline.models.batch import Batch, example_input
from pipeline.models.build import build_meta_model
from pipeline.models.kept import KeptTensors
from pipeline.models.meta import MetaModel
from pipeline.models.traces import TraceCache
from pipeline.models.weights import whole_model
from pipeline.stage import refstore
from pipeline.stage.instrument import CommClock, Peak, hook_torch_p2p
from pipeline.stage.training import Reference

OUTPUT = "output"
"""The name the unsplit model's output goes by in a reference file."""

__all__ = ["OUTPUT", "TRACING_STACK", "RankState", "WorkerConfig", "gpu_index", "join_group", "one_line"]


@dataclass(frozen=True, kw_only=True)
class WorkerConfig:
    """How every rank of one pool joins its process group."""

    world_size: int
    device: str
    init_method: str
    timeout_s: float
    threads: int = 1
    local_rank: int | None = None
    """This rank's GPU index on its host (torchrun's LOCAL_RANK); the rank modulo the GPU count otherwise."""


def gpu_index(rank: int, cfg: WorkerConfig) -> int:
    """The GPU a rank drives: torchrun's LOCAL_RANK when given, else the rank modulo this host's GPUs."""
    return cfg.local_rank if cfg.local_rank is not None else rank % max(1, torch.cuda.device_count())


class RankState:
    """A worker's state that lives across trials: its rank, device, cached models and reference outputs."""

    def __init__(self, rank: int, cfg: WorkerConfig) -> None:
        self.rank = rank
        self.cfg = cfg
        self.world = cfg.world_size
        self.device = torch.device(f"cuda:{gpu_index(rank, cfg)}") if cfg.device == "cuda" else torch.device("cpu")
        self.models: dict[str, MetaModel] = {}
        """The model on meta, one at a time: every stage is cut from it and made real by name."""
        self.serial_models: dict[str, nn.Module] = {}
        """The whole model, real, for the serial baseline (rank 0, only where a trial times one)."""
        self.refs: dict[str, torch.Tensor] = {}
        self.batches: dict[str, Batch] = {}
        """The model's example batch, drawn once per model (``batch``)."""
        self.grad_refs: dict[tuple[str, frozenset[str]], Reference] = {}
        """The serial training step's loss and the gradients of a set of parameters, per model."""
        self.warm: set[tuple[str, int]] = set()
        self.traces = TraceCache()
        """The model's exports, reused to build torch-backend stages (``pipeline.models.traces``)."""
        self.peak = Peak(self.device)
        self.comm: CommClock | None = None
        self.weights = KeptTensors()
        """The real tensors of the last stage this rank built, by name, for the next plan (forward-only trials)."""
        self.output_made = False
        """Whether this trial made the output reference (rather than reading an earlier trial's or the file)."""
        self.output_how: str | None = None
        """How it was made: ``streamed`` or ``relayed`` (``pipeline.stage.relay``)."""
        self.ref_dir: str | None = None
        """The study's reference folder (``pipeline.stage.refstore``), set by each trial; None: memory only."""
        self.kept: tuple[str, Any, float, float, int, Any] | None = None
        """(plan identity, built stage, output difference, tolerance, bytes sent, its OutputCheck) kept by a
        trial for a resumed one."""
        hook_torch_p2p(self)

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def model(self, spec: ModelSpec) -> MetaModel:
        """The unsplit model of ``spec`` on meta, built once (one model cached at a time)."""
        if spec.key not in self.models:
            self.models.clear()
            self.serial_models.clear()
            self.kept = None
            self.weights.clear()
            self.refs.clear()
            self.batches.clear()
            self.grad_refs.clear()
            self.warm.clear()
            self.traces = TraceCache()
            self.models[spec.key] = build_meta_model(spec)
        return self.models[spec.key]

    def batch(self, spec: ModelSpec) -> Batch:
        """The model's whole example batch on this rank's device, drawn from the seed once per model (DeiT-S's
        batch of 32: ~0.1 s of every rank's every trial); each trial gets its own copy, so that a model that
        writes into its input changes no later trial's."""
        if spec.key not in self.batches:
            self.batches[spec.key] = example_input(spec, self.device)
        return tuple(t.clone() for t in self.batches[spec.key])

    def serial_model(self, spec: ModelSpec) -> nn.Module:
        """The whole model real on this rank's device (the serial baseline), made once per model."""
        if spec.key not in self.serial_models:
            self.serial_models[spec.key] = whole_model(self.model(spec), self.device).eval()
        return self.serial_models[spec.key]

    def output_ref(self, spec: ModelSpec, make: Callable[[], torch.Tensor] | None, how: str = "streamed"
                   ) -> tuple[torch.Tensor | None, bool]:
        """The unsplit model's output for ``spec``'s batch and whether it was made now: made once per model, and
        kept in the study's reference folder (``ref_dir``) for later pools and processes (``make`` None: only
        look; ``how``: what ``make`` does, for the trial's record)."""
        if spec.key not in self.refs:
            key = refstore.reference_key(spec.key, "output", self.device.type, checkpoint=spec.checkpoint)
            stored = refstore.load(self.ref_dir, key, device=self.device) if self.ref_dir else None
            if stored is not None and OUTPUT in stored.tensors:
                self.refs[spec.key] = stored.tensors[OUTPUT]
                return self.refs[spec.key], False
            if make is None:
                return None, False
            self.refs[spec.key] = make()
            self.output_made, self.output_how = True, how
            self._store(key, refstore.StoredReference(tensors={OUTPUT: self.refs[spec.key]}))
            return self.refs[spec.key], True
        return self.refs[spec.key], False

    def cached(self, key: str, make: Callable[[], torch.Tensor]) -> torch.Tensor:
        """A tensor made once per key and model (``refs`` is cleared with the model)."""
        if key not in self.refs:
            self.refs[key] = make()
        return self.refs[key]

    def reference(self, spec: ModelSpec, names: frozenset[str], make: Callable[[], Reference] | None,
                  variant: str = "", every: frozenset[str] | None = None) -> tuple[Reference | None, bool]:
        """The serial training step's loss and the gradients of (at least) ``names``, and whether it was made now:
        a kept reference of the same model that holds them serves (the step does not depend on the split), or
        the study's file of it (``ref_dir``); else ``make`` makes it (None: only look), and one that holds
        ``every`` gradient is written there. ``variant`` names what else it depends on (mixed precision: sharded
        stages compute as FSDP2 does)."""
        want = spec.key + variant
        for (key, have), ref in self.grad_refs.items():
            if key == want and names <= have:
                return ref, False
        file_key = refstore.reference_key(spec.key, "step", self.device.type, variant, spec.checkpoint)
        stored = refstore.load(self.ref_dir, file_key, names, self.device) if self.ref_dir else None
        if stored is not None and stored.loss is not None:
            self.grad_refs.clear()
            ref = Reference(loss=stored.loss, grads=stored.tensors)
            self.grad_refs[(want, frozenset(ref.grads))] = ref
            return ref, False
        if make is None:
            return None, False
        self.grad_refs.clear()  # one reference kept at a time
        ref = make()
        self.grad_refs[(want, frozenset(ref.grads))] = ref
        if every is not None and every <= frozenset(ref.grads):
            self._store(file_key, refstore.StoredReference(tensors=ref.grads, loss=ref.loss))
        return ref, True

    def _store(self, key: str, ref: refstore.StoredReference) -> None:
        """Write a reference to the study's folder; one this host cannot write is kept in memory only (the
        trial does not fail for a cache)."""
        if self.ref_dir:
            try:
                refstore.save(self.ref_dir, key, ref)
            except (OSError, PipesplitError):
                pass  # read by no later process: made again there, as without a folder

    def reference_once(self, spec: ModelSpec, names: frozenset[str], make: Callable[[], Reference],
                       variant: str, every: frozenset[str]) -> tuple[Reference, bool]:
        """``reference`` of every gradient made by rank 0 alone where a reference folder is shared: it writes it,
        then the other ranks read it (a rank on a host that cannot see the file makes its own); every rank
        calls this at once."""
        if not self.ref_dir:
            ref, made = self.reference(spec, names, make, variant, every)
            assert ref is not None
            return ref, made
        have = self.reference(spec, names, None, variant)[0] is not None
        flags: list[object] = [None] * self.world
        dist.all_gather_object(flags, have)
        ref, made = (None, False) if have or self.rank != 0 else self.reference(spec, names, make, variant, every)
        if not all(flags):
            dist.barrier()  # rank 0's file is written
        if ref is None:
            ref, made = self.reference(spec, names, make, variant, every)
        assert ref is not None
        return ref, made

    def serial(self, work: Callable[[], object], threads: int | None) -> float:
        """Time ``work`` (the unsplit model's forward, or its training step) on rank 0 while every other rank
        waits in the barrier (NaN elsewhere)."""
        dist.barrier()
        elapsed = float("nan")
        if self.rank == 0:
            before = torch.get_num_threads()
            if threads:
                torch.set_num_threads(threads)
            self.sync()
            t = time.perf_counter()
            work()
            self.sync()
            elapsed = time.perf_counter() - t
            torch.set_num_threads(before)
        dist.barrier()
        return elapsed


TRACING_STACK = ("pippy", "torch._dynamo", "torch.distributed.pipelining", "torch.export")
"""What a rank imports before its first trial (``_preload``), and a forkserver before any rank (``PRELOAD``)."""


def _preload() -> None:
    """Import the tracing stack once per worker, so the first trial's build time is its own."""
    import importlib

    for name in TRACING_STACK:
        importlib.import_module(name)


def _thread_lock_for_tqdm() -> None:
    """torch.fx's interpreter opens a (disabled) tqdm bar on every run, and tqdm's first bar makes a named
    multiprocessing lock: a rank killed mid-trial (or by a pool restart) could never unlink it, and the run
    ended with "resource_tracker: There appear to be N leaked semaphore objects". A rank draws no bars
    across processes, so a thread lock does."""
    import threading

    from tqdm import tqdm

    tqdm.set_lock(threading.RLock())


def join_group(rank: int, cfg: WorkerConfig) -> RankState:
    """Join the pipeline's process group (gloo on CPU, NCCL on CUDA) and set up this rank's state."""
    # What this rank has loaded so far (torch, timm, transformers: ~460,000 objects) is never garbage: frozen out
    # of the collector, a full collection (``release`` after each big stage) scans only what was made since
    # (0.35 s -> ~0 s a collection; a 430 MiB Llama's profile and trials ran ~45 of them)
    gc.freeze()
    _thread_lock_for_tqdm()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("KINETO_LOG_LEVEL", "5")  # torch.profiler (--trace) is chatty on stderr otherwise
    quiet_logs()
    backend = "nccl" if cfg.device == "cuda" else "gloo"
    if cfg.device == "cuda":
        torch.cuda.set_device(gpu_index(rank, cfg))
    dist.init_process_group(backend, init_method=cfg.init_method, rank=rank, world_size=cfg.world_size,
                            timeout=timedelta(seconds=cfg.timeout_s))
    if cfg.device == "cpu":
        torch.set_num_threads(cfg.threads)
    state = RankState(rank, cfg)
    _preload()
    return state
