"""The unsplit model's forward output made by the ranks together, from the tensors each already holds.

A forward-only trial whose rank 0 does not hold the whole model compares the pipeline's output with the
model's streamed block by block (``pipeline.stage.reference``): the last rank made every weight of the model,
one block at a time, while the others waited (147 s of a 4-rank search's first trial of an 11 GiB Llama).
Where every rank made its stage afresh in this trial, the ranks relay instead: the model is split before every
block and at each of the plan's cuts (from the worker's export, ``pipeline.models.traces``, every piece one flat
graph), each rank runs the pieces that fall in its own stage with its own stage's tensors (taken by name, not
made again), and sends the values still to be read to the rank of the next piece. The check then compares the
plan's stages (torch's unflattened modules, its schedule, its sends) with a computation that shares only the
export and the weights by name with them, as the streamed reference did. A rank that reused tensors kept from
an earlier plan does not relay (the reference would then share them); nor does a plan cut after a module.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import fx
from torch.utils._pytree import tree_map

from pipeline.core.plan import SplitPlan
from pipeline.models.batch import Batch, first_chunk
from pipeline.models.candidates import find_candidates
from pipeline.models.fake import fake_copies_allowed, fake_model
from pipeline.models.kept import KeptTensors
from pipeline.models.meta import MetaModel
from pipeline.models.weights import module_tensors
from pipeline.stage.build import name_in
from pipeline.stage.precision import run_stage
from pipeline.stage.rank import RankState
from pipeline.stage.reference import _chunks, _first, _stage, step_node

__all__ = ["Relay", "piece_owners", "plan_relay", "relay_output"]


def piece_owners(can: Sequence[Sequence[bool]], first: int) -> list[int]:
    """The rank that runs each piece (``can[r][j]``: rank ``r`` holds every tensor of piece ``j``): the rank of the
    piece before where it can (no hand-over; ``first`` starts), else the first rank that can, else the one before
    (which then makes the piece's few tensors it lacks: a piece with no holder costs memory, never correctness)."""
    owners, prev = [], first
    for j in range(len(can[0]) if can else 0):
        if not can[prev][j]:
            prev = next((r for r in range(len(can)) if can[r][j]), prev)
        owners.append(prev)
    return owners


class Relay:
    """The model split before every block and at the plan's cuts: what every rank agreed to relay."""

    def __init__(self, fine: fx.GraphModule, first: int) -> None:
        self.fine = fine
        self.first = first
        """The rank of the plan's first stage: it holds the batch and begins."""


def _agree(flag: bool, world: int) -> bool:
    every: list[Any] = [None] * world
    dist.all_gather_object(every, flag)
    return all(bool(f) for f in every)


def plan_relay(state: RankState, plan: SplitPlan, got: tuple[MetaModel, Batch] | None) -> Relay | None:
    """Before any rank builds (every rank of a forward-only torch-backend trial calls it, ``got``: its model and
    batch, None where it failed to make them): a ``Relay`` where the last rank lacks the output reference, every
    rank holds no kept tensors (all will be made afresh) and the plan cuts before modules; else None (the last
    rank streams the reference, as before)."""
    needed = got is not None and (state.rank != plan.last_rank or state.output_ref(plan.model, None)[0] is None)
    if not _agree(needed and plan.dp_shard == 1 and not state.weights.tensors, state.world) or got is None:
        return None
    meta, x = got
    fine = None
    try:
        cuts = _cuts(meta, plan)
        if cuts is not None:
            fake = fake_model(meta, state.device)
            with fake_copies_allowed():
                pipe = state.traces.pipe(plan.model.key, fake.module, fake.inputs(first_chunk(x, plan.chunks)),
                                         dict.fromkeys(cuts, "BEGINNING"), held=())
            fine = pipe.split_gm if pipe is not None else None
    except Exception:  # noqa: BLE001 - the streamed reference is the fallback
        fine = None
    if not _agree(fine is not None, state.world) or fine is None:
        return None
    return Relay(fine, next(r for r in range(plan.ranks) if 0 in plan.rank_stages(r)))


def _cuts(meta: MetaModel, plan: SplitPlan) -> list[str] | None:
    """A cut before every block and at each of the plan's cuts (a cut inside a block, PiPPy's, included), in the
    model's order; None where the plan cuts after a module (``END``)."""
    if any(p.kind != "BEGINNING" for p in plan.split_points):
        return None
    cands = find_candidates(meta, plan.model, "block")
    at = {e: i for i, e in enumerate(cands.events)}
    every = set(cands.cuts) | {p.fqn for p in plan.split_points}
    if any("B:" + c not in at for c in every):
        return None
    return sorted(every, key=lambda c: at["B:" + c])


def _owners(graph: fx.Graph, pieces: list[int], last: int) -> list[int]:
    """The rank that computes each node: a piece's owner runs it and the getitems after it; the inputs are the
    first piece's owner's, the output the last stage's rank's (``last``: where the check reads it)."""
    out, k, owner = [], 0, pieces[0]
    for node in graph.nodes:
        if node.op == "call_module":
            owner, k = pieces[k], k + 1
        out.append(last if node.op == "output" else owner)
    return out


def _pieces(state: RankState, relay: Relay, name_of: Callable[[str], str]) -> list[int]:
    """Every piece's owner, the same on every rank (each says which pieces its own tensors cover)."""
    mine = set(state.weights.tensors)
    can = [{name_of(n) for n, _, _ in module_tensors(relay.fine.get_submodule(str(node.target)))} <= mine
           for node in relay.fine.graph.nodes if node.op == "call_module"]
    every: list[Any] = [None] * state.world
    dist.all_gather_object(every, can)
    return piece_owners(every, relay.first)


def _to(v: Any, device: torch.device) -> Any:
    return tree_map(lambda t: t.to(device) if isinstance(t, torch.Tensor) else t, v)


def relay_output(state: RankState, plan: SplitPlan, meta: MetaModel, x: Batch, relay: Relay) -> torch.Tensor | None:
    """Every microbatch through the relay's split, each piece on its owner's rank with the tensors the rank
    holds (``state.weights``); the output for the whole batch on the last rank, None elsewhere."""
    nodes = list(relay.fine.graph.nodes)
    name_of = name_in(meta)
    owners = _owners(relay.fine.graph, _pieces(state, relay, name_of), plan.last_rank)
    last_use: dict[fx.Node, int] = {}
    for i, n in enumerate(nodes):
        for a in n.all_input_nodes:
            last_use[a] = i
    mbs = _chunks(x, plan.chunks)
    envs: list[dict[fx.Node, Any]] = [{} for _ in mbs]
    placeholders = [n for n in nodes if n.op == "placeholder"]
    own = KeptTensors()
    own.tensors = dict(state.weights.tensors)  # a view: a tensor the stage lacks is made here only, and let go
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
        step_node(node, i, envs, mbs, placeholders, outs, last_use)
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
