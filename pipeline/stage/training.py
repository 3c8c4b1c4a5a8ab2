"""Training steps: the loss and its fixed targets, the optimizer, the serial step, and the gradient check.

Modules stay in eval mode while they train (dropout off, batch norm on its running statistics): the work
timed is the same, and a pipeline step's loss and gradients can then equal the serial step's, which a
check of correctness needs (batch norm over a microbatch is not batch norm over the batch).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from pipeline.core.errors import PipesplitError
from pipeline.core.spec import ModelSpec
from pipeline.models.batch import Batch

__all__ = ["IGNORE", "GradCheck", "Reference", "SerialTrainer", "aliases", "check_grads", "loss_fn",
           "make_optimizer", "make_target", "reference", "tied_grads"]

IGNORE = -100
"""Label of a position without a next token (the last of each sequence): left out of the loss."""


def make_target(spec: ModelSpec, x: Batch, out: torch.Tensor) -> torch.Tensor:
    """Fixed labels for the loss: next-token ids for a language model's logits, seeded random classes for a
    classifier's (or a per-position classifier's) logits, a seeded random tensor for any other output."""
    g = torch.Generator().manual_seed(spec.seed + 2)
    ids = x[0]
    if spec.source == "hf" and out.dim() == 3 and ids.dim() == 2 and not ids.is_floating_point():
        labels = torch.full(ids.shape, IGNORE, dtype=torch.int64)
        labels[:, :-1] = ids[:, 1:].cpu()
        return labels.to(out.device)
    if out.dim() in (2, 3) and out.is_floating_point():
        return torch.randint(0, out.shape[-1], tuple(out.shape[:-1]), generator=g).to(out.device)
    return torch.randn(tuple(out.shape), generator=g).to(device=out.device, dtype=torch.float32)


def loss_fn(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Cross-entropy against class labels (mean over the labelled positions), else mean squared error."""
    if target.dtype == torch.int64:
        return F.cross_entropy(out.flatten(0, -2).float(), target.flatten(), ignore_index=IGNORE)
    return F.mse_loss(out.float(), target)


def make_optimizer(name: str, params: Iterable[nn.Parameter]) -> torch.optim.Optimizer:
    """The optimizer every stage (and the serial model) steps: ``adamw`` or ``sgd`` with momentum."""
    params = list(params)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=1e-4)
    if name == "sgd":
        return torch.optim.SGD(params, lr=1e-3, momentum=0.9)
    raise PipesplitError(f"optimizer {name!r} is unknown: use adamw or sgd")


def aliases(model: nn.Module) -> dict[str, str]:
    """Every parameter name, tied copies included (GPT-2's ``lm_head.weight``), -> the parameter's first name."""
    first: dict[int, str] = {}
    out: dict[str, str] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        out[name] = first.setdefault(id(p), name)
    return out


@dataclass(frozen=True)
class Reference:
    """The serial step's loss and every parameter's gradient (by first name), from the same weights."""

    loss: float
    grads: dict[str, torch.Tensor]


def reference(model: nn.Module, x: Batch, target: torch.Tensor) -> Reference:
    """One serial forward and backward of the whole batch on a private copy (``model`` keeps no gradients)."""
    m = copy.deepcopy(model)
    with torch.enable_grad():
        loss = loss_fn(m(*x), target)
        loss.backward()  # type: ignore[no-untyped-call]
    grads = {name: p.grad.detach() if p.grad is not None else torch.zeros_like(p)
             for name, p in m.named_parameters()}
    return Reference(loss=float(loss.detach()), grads=grads)


class SerialTrainer:
    """The unsplit model taking whole training steps (forward, loss, backward, optimizer) on a private copy."""

    def __init__(self, model: nn.Module, optimizer: str, target: torch.Tensor, mixed_precision: str | None = None) -> None:
        self.model = model
        """The trainer's own model: its steps change its weights."""
        self.optimizer = make_optimizer(optimizer, self.model.parameters())
        self.target = target
        self.mixed = mixed_precision == "bf16"
        """One device trains in mixed precision under ``torch.autocast`` (FSDP2's policy needs a mesh)."""

    def step(self, x: Batch) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        with torch.enable_grad(), torch.autocast(self.target.device.type, dtype=torch.bfloat16, enabled=self.mixed):
            loss_fn(self.model(*x), self.target).backward()  # type: ignore[no-untyped-call]
        self.optimizer.step()


def tied_grads(named: list[tuple[str, nn.Parameter]], world: int, group: dist.ProcessGroup | None = None,
               sharded: bool = False) -> Callable[[], None]:
    """A call that gives every copy of a tied parameter (GPT-2's ``lm_head.weight`` is ``transformer.wte.weight``)
    the sum of all copies' gradients: torch's pipelining replicates such a parameter, on one stage or on
    several, and accumulates each copy's gradient apart, so the copies would drift apart under the optimizer.
    The ranks agree on which names are shared on the first call (every rank makes it), once per stage; ``group``:
    the pipeline's ranks (one replica's, on a mesh), ``world`` of them. Sharded stages (``--dp-shard``) with tied
    parameters are refused in one line: their gradients are shards, not summed here yet."""
    groups: dict[str, list[nn.Parameter]] = {}
    for n, p in named:
        groups.setdefault(n, []).append(p)
    device = named[0][1].device if named else torch.device("cpu")
    agreed: list[tuple[str, tuple[int, ...], str, bool]] = []  # (name, shape, dtype, shared across ranks)
    started = False

    def agree() -> None:
        every: list[dict[str, tuple[tuple[int, ...], str]] | None] = [None] * world
        dist.all_gather_object(every, {n: (tuple(ps[0].shape), str(ps[0].dtype).removeprefix("torch."))
                                       for n, ps in groups.items()}, group=group)
        counts: dict[str, int] = {}
        meta: dict[str, tuple[tuple[int, ...], str]] = {}
        for rank_names in every:
            for n, m in (rank_names or {}).items():
                counts[n] = counts.get(n, 0) + 1
                meta[n] = m
        shared = sorted(n for n, c in counts.items() if c > 1)  # the same order on every rank: one all_reduce each
        local = sorted(n for n, ps in groups.items() if len(ps) > 1 and counts[n] == 1)
        agreed.extend((n, *meta[n], n in shared) for n in shared + local)
        if agreed and sharded:
            raise PipesplitError(f"tied parameters ({', '.join(n for n, *_ in agreed)}) are not summed across sharded "
                                 "stages yet: use --dp-shard 1 for this model")

    def run() -> None:
        nonlocal started
        if not started:
            agree()
            started = True
        for n, shape, dtype, shared in agreed:
            ps = groups.get(n, [])
            total = torch.zeros(shape, device=device, dtype=getattr(torch, dtype))
            for p in ps:
                if p.grad is not None:
                    total += p.grad
            if shared:
                dist.all_reduce(total, group=group)
            for p in ps:
                p.grad = total.clone()

    return run


@dataclass(frozen=True)
class GradCheck:
    """The worst gradient of a stage against the serial step's: its name, max |difference| and tolerance."""

    diff: float
    tol: float
    name: str


def check_grads(named: list[tuple[str, nn.Parameter]], ref: Reference, rtol: float) -> GradCheck:
    """The parameter whose gradient is furthest from the serial one, relative to its own scale (a missing
    gradient counts as zeros)."""
    worst = GradCheck(diff=0.0, tol=1.0, name="")
    for name, p in named:
        want = ref.grads.get(name)
        if want is None:
            raise PipesplitError(f"stage parameter {name!r} is not a parameter of the unsplit model")
        got = p.grad if p.grad is not None else torch.zeros_like(p)
        diff = float((got.float() - want.float()).abs().max()) if got.numel() else 0.0
        tol = rtol * float(want.float().abs().max()) + 1e-6 if want.numel() else 1.0
        if diff / tol > worst.diff / worst.tol or not diff == diff or not worst.name:
            worst = GradCheck(diff=diff, tol=tol, name=name)
    return worst
