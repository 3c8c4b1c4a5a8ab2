"""The unsplit model's forward output made by the ranks together, from the tensors each already holds.

A forward-only trial whose rank 0 does not hold the whole model compares the pipeline's output with the
model's streamed through its finest split (``pipeline.stage.reference``): before, the last rank made every
weight of the model, one block at a time, while the others waited (147 s of a 4-rank search's first trial of
an 11 GiB Llama). Where every rank made its stage afresh in this trial, the ranks relay instead: each runs the
finest split's segments that fall in its own stage, with its own stage's tensors (taken by name, not made
again), and sends the values still to be read to the rank of the next segment. The finest split is its own
trace, cut before every block, so the check still compares the plan's traced stages, schedule and sends with
a computation that shares none of them; the weights are the same by name as a streamed reference would make.
A rank that reused tensors kept from an earlier plan does not relay (the reference would then share them).
"""

from __future__ import annotations

import gc
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import fx
from torch.utils._pytree import tree_map

from pipeline.core.plan import SplitPlan
from pipeline.models.batch import Batch
from pipeline.models.candidates import find_candidates
from pipeline.models.kept import KeptTensors
from pipeline.models.meta import MetaModel
from pipeline.stage.build import name_in
from pipeline.stage.checks import finest_split
from pipeline.stage.precision import run_stage
from pipeline.stage.rank import RankState
from pipeline.stage.reference import _chunks, _first, _stage

__all__ = ["Relay", "relay_output", "segment_stages", "plan_relay"]


def segment_stages(fine_cuts: Sequence[str], plan_cuts: Sequence[str]) -> list[int] | None:
    """The plan's stage of each segment of a split cut before every one of ``fine_cuts`` (segment 0 begins the
    model, segment j begins at ``fine_cuts[j - 1]``); None where a plan cut is not among them, or repeats."""
    at = {c: j for j, c in enumerate(fine_cuts, start=1)}
    if len(set(plan_cuts)) != len(plan_cuts) or any(c not in at for c in plan_cuts):
        return None
    starts = sorted(at[c] for c in plan_cuts)
    if [at[c] for c in plan_cuts] != starts:
        return None  # cuts out of the model's order
    return [sum(1 for s in starts if s <= j) for j in range(len(fine_cuts) + 1)]


class Relay:
    """The finest split and, per segment, the rank that runs it: what every rank agreed to relay."""

    def __init__(self, fine: fx.GraphModule, ranks: list[int]) -> None:
        self.fine = fine
        self.ranks = ranks


def _agree(flag: bool, world: int) -> bool:
    every: list[Any] = [None] * world
    dist.all_gather_object(every, flag)
    return all(bool(f) for f in every)


def plan_relay(state: RankState, plan: SplitPlan, got: tuple[MetaModel, Batch] | None) -> Relay | None:
    """Before any rank builds (every rank of a forward-only torch-backend trial calls it, ``got``: its model and
    batch, None where it failed to make them): a ``Relay`` where the last rank lacks the output reference, every
    rank holds no kept tensors (all will be made afresh) and the plan's cuts are among the finest split's; else
    None (the last rank streams the reference, as before)."""
    needed = got is not None and (state.rank != plan.last_rank or state.output_ref(plan.model, None)[0] is None)
    if not _agree(needed and plan.dp_shard == 1 and not state.weights.tensors, state.world) or got is None:
        return None
    meta, x = got
    fine, stages = None, None
    try:
        cands = find_candidates(meta, plan.model, "block")
        stages = segment_stages(cands.cuts, [fqn for fqn, kind in plan.split_spec().items() if kind == "BEGINNING"]) \
            if all(kind == "BEGINNING" for kind in plan.split_spec().values()) else None
        fine = finest_split(plan, meta, x, state.device) if stages is not None else None
        if fine is not None and len([n for n in fine.graph.nodes if n.op == "call_module"]) != len(stages or []):
            fine = None
    except Exception:  # noqa: BLE001 - the streamed reference is the fallback
        fine = None
    if not _agree(fine is not None, state.world) or fine is None or stages is None:
        return None
    rank_of = {s: r for r in range(plan.ranks) for s in plan.rank_stages(r)}
    return Relay(fine, [rank_of[s] for s in stages])


def _owners(graph: fx.Graph, ranks: list[int]) -> list[int]:
    """The rank that computes each node: a segment's owner runs it and the getitems after it; the inputs are
    everyone's (each rank has the batch), counted as the first segment's."""
    out, seg, owner = [], 0, ranks[0]
    for node in graph.nodes:
        if node.op == "call_module":
            owner, seg = ranks[seg], seg + 1
        out.append(owner)
    return out


def _to(v: Any, device: torch.device) -> Any:
    return tree_map(lambda t: t.to(device) if isinstance(t, torch.Tensor) else t, v)


def relay_output(state: RankState, plan: SplitPlan, meta: MetaModel, x: Batch, relay: Relay) -> torch.Tensor | None:
    """Every microbatch through the finest split, each segment on its owner's rank with the tensors the rank
    holds (``state.weights``); the output for the whole batch on the last rank, None elsewhere."""
    nodes = list(relay.fine.graph.nodes)
    owners = _owners(relay.fine.graph, relay.ranks)
    last_use: dict[fx.Node, int] = {}
    for i, n in enumerate(nodes):
        for a in n.all_input_nodes:
            last_use[a] = i
    mbs = _chunks(x, plan.chunks)
    envs: list[dict[fx.Node, Any]] = [{} for _ in mbs]
    placeholders = [n for n in nodes if n.op == "placeholder"]
    own = KeptTensors()
    own.tensors = dict(state.weights.tensors)  # a view: a tensor the stage lacks (a tied copy) is made here only
    name_of = name_in(meta)
    outs: list[Any] = [None] * len(mbs)
    for i, node in enumerate(nodes):
        if i > 0 and owners[i] != owners[i - 1]:
            _hand_over(state, nodes, i, last_use, envs, owners[i - 1], owners[i])
        if owners[i] != state.rank:
            continue
        if node.op == "call_module":
            mod = _stage(relay.fine, str(node.target), meta, state.device, name_of, train=False, kept=own)
            with torch.no_grad():
                for env in envs:
                    env[node] = run_stage(mod, None, False, state.device, *fx.node.map_arg(node.args, env.__getitem__),
                                          **fx.node.map_arg(node.kwargs, env.__getitem__))
            for m in mod.modules():
                m._parameters.clear()
                m._buffers.clear()
        for c, env in enumerate(envs):
            if node.op == "placeholder":
                env[node] = mbs[c][placeholders.index(node)]
            elif node.op == "call_function":
                env[node] = node.target(*fx.node.map_arg(node.args, env.__getitem__),
                                        **fx.node.map_arg(node.kwargs, env.__getitem__))
            elif node.op == "output":
                outs[c] = fx.node.map_arg(node.args[0], env.__getitem__)
            for a in node.all_input_nodes:
                if last_use.get(a) == i:
                    env.pop(a, None)
    del own
    gc.collect()  # the segments' traced modules refer to each other in cycles
    if state.rank != owners[-1]:
        return None
    return torch.cat([_first(o) for o in outs], dim=0)


def _hand_over(state: RankState, nodes: list[fx.Node], i: int, last_use: dict[fx.Node, int],
               envs: list[dict[fx.Node, Any]], src: int, dst: int) -> None:
    """The values made before node ``i`` and read at or after it, from ``src`` to ``dst`` (on the CPU)."""
    if state.rank == src:
        live = [n.name for n in nodes[:i] if last_use.get(n, -1) >= i]
        by_name = {n.name: n for n in nodes[:i]}
        payload = [[_to(env[by_name[k]], torch.device("cpu")) for k in live] for env in envs]
        dist.send_object_list([live, payload], dst=dst)
        for env in envs:
            env.clear()
    elif state.rank == dst:
        got: list[Any] = [None, None]
        dist.recv_object_list(got, src=src)
        live, payload = got
        by_name = {n.name: n for n in nodes[:i]}
        for env, values in zip(envs, payload, strict=True):
            env.update({by_name[k]: _to(v, state.device) for k, v in zip(live, values, strict=True)})
