"""The pipeline inside sharded data parallel: a (``pp``, ``dp_shard``) device mesh, as torchtitan builds it.

``ranks x dp_shard`` processes; ``pp`` outermost by default, so rank ``r`` is pipeline rank ``r // D`` of replica
``r % D`` (torchtitan's ``ParallelDims`` order; ``--mesh-order dp_shard,pp`` turns it: ``pipeline.core.sharding``).
Each replica runs the whole pipeline on its ``1/D`` of the batch over its own ``pp`` group; each stage is
``fully_shard``ed over its ``dp_shard`` group as torchtitan's
``apply_fsdp`` does it: every block of the stage's stack, then the stage module, with
``reshard_after_forward=False`` (under a pipeline the weights stay gathered across a step's microbatches
instead of being gathered again for every microbatch's backward); gradients are reduce-scattered (averaged
over the replicas) once, after the last microbatch's backward, which torch's ``PipelineStage`` arranges for
an FSDP module. The schedule averages its microbatches and FSDP its replicas: the step's gradients are the
global batch's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from pipeline.core.sharding import MESH_ORDERS, dp_rank_of, pp_rank_of
from pipeline.core.spec import ModelSpec
from pipeline.models.batch import Batch
from pipeline.stage.precision import policy

__all__ = ["MeshView", "full_grads", "mesh_view", "replica_rows", "shard_stage"]


@dataclass
class MeshView:
    """Where a rank sits in a plan's mesh, and the groups it talks over."""

    pp_rank: int
    dp_rank: int
    dp_shard: int
    pp_group: Any
    """The process group of this rank's pipeline (its replica's ranks, one per stage)."""
    dp_mesh: Any
    """The one-dimensional ``dp_shard`` mesh of this rank's stage: FSDP2 shards over it."""


_MESHES: dict[tuple[str, int, int, str], Any] = {}


def mesh_view(rank: int, ranks: int, dp_shard: int, device: torch.device, order: str = MESH_ORDERS[0]) -> MeshView:
    """This rank's place in the (``pp``, ``dp_shard``) mesh of ``ranks`` x ``dp_shard`` processes, its dimensions
    outermost first as ``order`` says (``pipeline.core.sharding``); every rank of the group calls it at once,
    and a mesh is made once per shape and kept: making its groups is collective."""
    from torch.distributed.device_mesh import init_device_mesh

    key = (device.type, ranks, dp_shard, order)
    if key not in _MESHES:
        sizes = {"pp": ranks, "dp_shard": dp_shard}
        names = tuple(order.split(","))
        _MESHES[key] = init_device_mesh(device.type, tuple(sizes[n] for n in names), mesh_dim_names=names)
    mesh = _MESHES[key]
    return MeshView(pp_rank=pp_rank_of(rank, ranks, dp_shard, order), dp_rank=dp_rank_of(rank, ranks, dp_shard, order),
                    dp_shard=dp_shard, pp_group=mesh["pp"].get_group(), dp_mesh=mesh["dp_shard"])


def replica_rows(x: Batch | torch.Tensor, dp_rank: int, dp_shard: int) -> Any:
    """Replica ``dp_rank``'s share of a batch (or of the loss's target): its contiguous ``1/dp_shard`` of the rows."""
    if isinstance(x, torch.Tensor):
        n = x.shape[0] // dp_shard
        return x[dp_rank * n:(dp_rank + 1) * n]
    return tuple(replica_rows(t, dp_rank, dp_shard) for t in x)


def shard_stage(stage: nn.Module, blocks: Sequence[str], dp_mesh: Any, spec: ModelSpec) -> None:
    """``fully_shard`` each of the stage's stack blocks, then the stage itself, over ``dp_mesh`` (with FSDP2's
    mixed-precision policy where ``spec`` computes in bfloat16: ``pipeline.stage.precision``)."""
    from torch.distributed.fsdp import fully_shard

    for name in blocks:
        fully_shard(stage.get_submodule(name), mesh=dp_mesh, reshard_after_forward=False,
                    **_mp(spec))
    fully_shard(stage, mesh=dp_mesh, reshard_after_forward=False, **_mp(spec))


def _mp(spec: ModelSpec) -> dict[str, Any]:
    mp = policy(spec)
    return {"mp_policy": mp} if mp is not None else {}


def local_bytes(params: Sequence[nn.Parameter]) -> int:
    """Bytes this rank holds of ``params``: its shard of a sharded one, all of any other."""
    total = 0
    for p in params:
        local = p.to_local() if hasattr(p, "to_local") else p
        total += local.numel() * local.element_size()
    return total


def full_grads(named: Sequence[tuple[str, nn.Parameter]]) -> list[tuple[str, nn.Parameter]]:
    """Each sharded parameter whole with its whole gradient (gathered over its ``dp_shard`` group: every rank of
    the group calls this at once, in the same order), to be checked against the unsplit model's."""
    out = []
    for name, p in named:
        full = p.full_tensor() if hasattr(p, "full_tensor") else p
        whole = nn.Parameter(full.detach(), requires_grad=False)
        g = p.grad
        whole.grad = g.full_tensor() if g is not None and hasattr(g, "full_tensor") else g
        out.append((name, whole))
    return out
