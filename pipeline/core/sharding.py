"""Where a plan's processes sit on its (``pp``, ``dp_shard``) mesh, and what a sharded plan must satisfy; pure.

``pp,dp_shard`` (the default, torchtitan's ``ParallelDims`` order): ``pp`` outermost, so a stage's ``dp_shard``
replicas are consecutive processes. Under ``torchrun --nnodes N --nproc-per-node P`` (processes numbered node
by node) each stage's FSDP2 all-gathers and reduce-scatters stay within a node and only the pipeline's sends
cross nodes. ``dp_shard,pp`` puts a replica's whole pipeline on consecutive processes instead: the sends stay
within a node and FSDP2's collectives cross nodes (worth it only where stages are many and weights small).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pipeline.core.errors import PipesplitError

if TYPE_CHECKING:
    from pipeline.core.plan import SplitPlan

MESH_ORDERS = ("pp,dp_shard", "dp_shard,pp")
"""``--mesh-order``: the mesh's dimensions, outermost first."""


def pp_rank_of(process: int, ranks: int, dp_shard: int, order: str = MESH_ORDERS[0]) -> int:
    """The pipeline rank (which stages) of ``process`` among ``ranks x dp_shard``."""
    return process // dp_shard if order == MESH_ORDERS[0] else process % ranks


def dp_rank_of(process: int, ranks: int, dp_shard: int, order: str = MESH_ORDERS[0]) -> int:
    """The replica (which share of the batch) of ``process`` among ``ranks x dp_shard``."""
    return process % dp_shard if order == MESH_ORDERS[0] else process // ranks


def check_mixed(mixed_precision: str | None, mode: str) -> None:
    """One line for mixed precision asked of a forward-only run (a plan's, or a whole search's)."""
    if mixed_precision and mode != "train":
        raise PipesplitError(f"--mixed-precision {mixed_precision} is how a training step computes: "
                             "use --mode train, or for inference run the model in bfloat16 (--dtype bfloat16)")


def check_sharding(plan: SplitPlan) -> None:
    """One line for a plan that cannot run sharded, or in mixed precision, as asked."""
    check_mixed(plan.model.mixed_precision, plan.mode)
    if plan.mesh_order not in MESH_ORDERS:
        raise PipesplitError(f"--mesh-order {plan.mesh_order!r} is not a mesh this runs: use {' or '.join(MESH_ORDERS)}")
    if plan.dp_shard < 1:
        raise PipesplitError(f"--dp-shard must be a positive integer (got {plan.dp_shard})")
    if plan.dp_shard == 1:
        return
    if plan.backend != "torch":
        raise PipesplitError(f"--dp-shard {plan.dp_shard} runs on the torch backend (FSDP2 shards the stages "
                             "torch.distributed.pipelining builds): use --backend torch")
    if plan.mode != "train":
        raise PipesplitError(f"--dp-shard {plan.dp_shard} shards training state (weights, gradients, optimizer "
                             "state); forward-only runs are not sharded here: use --mode train, or --dp-shard 1")
    if plan.model.batch_size % (plan.dp_shard * plan.chunks):
        raise PipesplitError(f"batch size {plan.model.batch_size} does not split into {plan.dp_shard} replicas "
                             f"x {plan.chunks} chunks: use a batch size that is a multiple of "
                             f"{plan.dp_shard * plan.chunks}, or fewer chunks")
