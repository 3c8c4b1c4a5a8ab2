"""What a trial checks before it times: the pipeline's output (or training step) against the unsplit model.

Where rank 0 holds the whole model anyway (it times the serial baseline), the output is checked against the
whole model's own, which the serial baseline's first run made. Elsewhere the reference never holds the whole
model: it is streamed (``pipeline.stage.reference``), one block real at a time, made on the last rank before
its own stage is real.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from pipeline.core.plan import SplitPlan
from pipeline.core.result import OutputCheck
from pipeline.models.batch import Batch, first_chunk, rows
from pipeline.models.candidates import find_candidates
from pipeline.models.fake import fake_model
from pipeline.models.meta import MetaModel
from pipeline.models.weights import whole_model
from pipeline.stage.build import BuiltStage, name_in
from pipeline.stage.mesh import MeshView, full_grads
from pipeline.stage.messages import ErrorReply
from pipeline.stage.rank import RankState
from pipeline.stage.reference import streamed_output, streamed_step
from pipeline.stage.segments import trace_all_cuts
from pipeline.stage.training import Reference, check_grads, make_target

__all__ = ["ALL_GRADS_BYTES", "check_output", "check_step", "first_out", "loss_target", "mismatch", "reference_first",
           "whole_key"]

ALL_GRADS_BYTES = 256 * 2**20
"""A training reference keeps every parameter's gradient where they take at most this many bytes, so that a
study makes it once and every later plan's ranks compare with it; a bigger model's rank keeps only its own
stage's, made again when its stage changes."""


def unsplit_output(state: RankState, plan: SplitPlan, stage: BuiltStage, meta: MetaModel, x: Batch
                    ) -> torch.Tensor:
    """The unsplit model's output: streamed stage by stage from the split on meta (``pipeline.stage.reference``),
    or from the whole model where the backend left no split (torchpippy, which holds it whole anyway)."""
    if stage.split_gm is not None:
        return streamed_output(finest_split(plan, meta, x, state.device) or stage.split_gm, meta, x, plan.chunks,
                               state.device, name_in(meta))
    out = whole_model(meta, state.device).eval()(*x)
    first: torch.Tensor = out[0] if isinstance(out, (tuple, list)) else out
    return first


def finest_split(plan: SplitPlan, meta: MetaModel, x: Batch, device: torch.device) -> Any:
    """The model cut before every candidate block, on fake tensors, so that the streamed reference makes one
    block real at a time beside this rank's own stage, not a whole stage of the plan (the last rank of a 13 GiB
    Llama at 4 stages would hold two 3.4 GiB stages at once); None where it cannot be traced so (the plan's own
    split streams instead)."""
    if meta.runs_on_meta is False:
        return None
    try:
        cands = find_candidates(meta, plan.model, "block")
        if len(cands.blocks) <= plan.stages:
            return None
        fake = fake_model(meta, device)
        return trace_all_cuts(fake.module, cands, fake.inputs(first_chunk(x, plan.chunks)))
    except Exception:  # noqa: BLE001 - the plan's own split is a correct, coarser reference
        return None


def reference_first(state: RankState, plan: SplitPlan, meta: MetaModel, x: Batch) -> None:
    """The streamed reference output, made before this rank's own stage is real (once per model): its blocks
    are made real one at a time into memory the stage does not hold yet, so the rank never holds both."""
    if state.output_ref(plan.model, None)[0] is not None:
        return  # an earlier trial's, or the study's file
    fine = finest_split(plan, meta, x, state.device)
    if fine is not None:
        with torch.no_grad():
            state.output_ref(plan.model, lambda: streamed_output(fine, meta, x, plan.chunks, state.device,
                                                                 name_in(meta)))


def whole_output(state: RankState, plan: SplitPlan, y: Any, whole: Any, x: Batch) -> torch.Tensor | None:
    """The whole model's own output on the last rank, where rank 0 holds the whole model (it times the serial
    model): made once per model on rank 0 and sent; this checks the export itself, which the streamed
    reference (the same traced stages) cannot. None elsewhere."""
    if state.rank == 0:
        with torch.no_grad():
            out = state.cached(whole_key(plan), lambda: first_out(whole(*x)).contiguous())
        if plan.last_rank == 0:
            return out
        dist.send(out, dst=plan.last_rank)
        return None
    if state.rank == plan.last_rank:
        got = first_out(y)
        buf = torch.empty(got.shape, dtype=got.dtype, device=got.device)
        dist.recv(buf, src=0)
        return buf
    return None


def whole_key(plan: SplitPlan) -> str:
    """Where rank 0 keeps the whole model's output: made by the serial baseline's first run, or by the check."""
    return f"whole:{plan.model.key}"


def first_out(out: Any) -> torch.Tensor:
    first: torch.Tensor = out[0] if isinstance(out, (tuple, list)) else out
    return first


def check_output(state: RankState, plan: SplitPlan, y: Any, stage: BuiltStage, meta: MetaModel, x: Batch,
                  whole: Any = None, whole_on_rank0: bool = False) -> OutputCheck:
    """max |pipeline - unsplit| and its tolerance, computed on the last rank and shared with every rank: against
    the whole model's own output where rank 0 holds it (``whole_on_rank0``, the same on every rank), which also
    checks the export that the streamed reference (the same traced stages) cannot; else against the streamed
    reference."""
    verdict: list[Any] = [None]
    eager = whole_output(state, plan, y, whole, x) if whole_on_rank0 else None
    if state.rank == plan.last_rank:
        got = first_out(y)
        made, how = None, None
        if eager is not None:
            ref, streamed = eager, None
        else:
            with torch.no_grad():
                have, _ = state.output_ref(plan.model, lambda: unsplit_output(state, plan, stage, meta, x))
            assert have is not None
            # made now, before this rank's stage (``reference_first``) or by the ranks after it (``relay``)
            ref, made, how = have, state.output_made, state.output_how if state.output_made else None
            streamed = float((got.float() - ref.float()).abs().max())
        diff = float((got.float() - ref.float()).abs().max())
        rtol = 1e-4 if plan.model.dtype == "float32" else 2e-2
        verdict = [(diff, rtol * max(1.0, float(ref.float().abs().max())), streamed, made, how)]
    dist.broadcast_object_list(verdict, src=plan.last_rank)
    diff, tol, streamed, made, how = verdict[0]
    return OutputCheck(diff=float(diff), tolerance=float(tol), streamed_diff=streamed,
                       whole_diff=float(diff) if whole_on_rank0 else None, reference_made=made, made_by=how)


def mismatch(rank: int, diff: float, tol: float, what: str) -> ErrorReply:
    kind = "output" if what.startswith("pipeline output") else "training step"
    return ErrorReply(rank=rank, max_abs_diff=diff, tolerance=tol,
                      error=f"{kind} check failed: {what} by {diff:.3g} (allowed {tol:.3g})")


def loss_target(plan: SplitPlan, meta: MetaModel, x: Batch) -> torch.Tensor:
    """The loss's fixed target for the whole batch, the same on every rank (the output's shape from one
    sample, run on meta)."""
    one = fake_model(meta, torch.device("cpu")).run(rows(x, 1))
    out = one[0] if isinstance(one, (tuple, list)) else one
    shape = (plan.model.batch_size, *out.shape[1:])
    return make_target(plan.model, x, torch.empty(shape, dtype=out.dtype, device=x[0].device))


def _ratio(v: tuple[float, float, str, str]) -> float:
    return v[0] / v[1] if v[0] == v[0] else float("inf")


def check_step(state: RankState, plan: SplitPlan, stage: BuiltStage, losses: Any, meta: MetaModel, x: Batch,
                target: torch.Tensor, mesh: MeshView | None = None) -> tuple[float, float, str, OutputCheck]:
    """(difference, tolerance, what differs, what was compared) of the worst of the pipeline step's loss and
    every rank's gradients against the serial step from the same weights (streamed, this rank's gradients
    kept), the same on every rank. On a mesh (``mesh``) the step is the global batch's: each sharded gradient
    is gathered whole and compared, and the loss is the mean of the replicas' (each its share's mean)."""
    names = frozenset(n for n, _ in stage.params)
    every_name = frozenset(n for n, _ in meta.module.named_parameters())
    # every gradient is kept where they are small (the study then makes its reference once); else this stage's
    want = every_name if meta.nbytes(every_name) <= ALL_GRADS_BYTES else names
    # the traced microbatch is a replica's: the reference runs the global batch in microbatches of that size
    chunks = plan.chunks * plan.dp_shard
    mp, sharded = plan.model.mixed_precision, plan.dp_shard > 1
    variant = "|fsdp" if mp and sharded else ""

    def make() -> Reference:
        return streamed_step(stage.split_gm, meta, x, target, chunks, state.device, want, name_in(meta), mp, sharded)

    if want is every_name:  # the study's whole reference: made once, by rank 0 where the ranks share its file
        ref, made = state.reference_once(plan.model, names, make, variant, every_name)
    else:
        got_ref, made = state.reference(plan.model, names, make, variant)
        assert got_ref is not None
        ref = got_ref
    # bfloat16 compute: a tolerance of bfloat16's order (tighter than a bfloat16 model's: the reference computes
    # in the same precision, and differs only in the order its microbatches' gradients are summed)
    rtol = (1e-2 if mp else 1e-3) if plan.model.dtype == "float32" else 5e-2
    worst = check_grads(full_grads(stage.params) if mesh is not None else stage.params, ref, rtol)
    grad = (worst.diff, worst.tol, f"gradient of {worst.name} differs from the unsplit model's", worst.name)
    mine = None
    pp_rank = mesh.pp_rank if mesh is not None else state.rank
    if pp_rank == plan.last_rank:
        mine = float(torch.stack([v.detach().float() for v in losses]).mean()) if losses else float("nan")
    every: list[Any] = [None] * state.world
    dist.all_gather_object(every, (grad, mine, len(stage.params), made))
    worst_grad = max((g for g, _, n, _ in every if n), key=_ratio, default=grad)  # ranks whose stage has parameters
    got_all = [m for _, m, _, _ in every if m is not None]  # one per replica
    last = None
    if got_all:
        got = sum(got_all) / len(got_all)
        last = (abs(got - ref.loss), rtol * max(1.0, abs(ref.loss)),
                f"loss {got:.6g} differs from the unsplit model's {ref.loss:.6g}", "loss")
    diff, tol, what, _ = max([worst_grad] + ([last] if last else []), key=_ratio)
    check = OutputCheck(compared="loss and gradients", gradients=sum(n for _, _, n, _ in every) // plan.dp_shard,
                        worst=worst_grad[3],
                        diff=float(worst_grad[0]), tolerance=float(worst_grad[1]),
                        loss_diff=float(last[0]) if last else None, loss_tolerance=float(last[1]) if last else None,
                        reference_made=any(m for _, _, _, m in every),
                        precision=(f"{mp} {'FSDP2 policy' if sharded else 'autocast'}" if mp else None))
    return float(diff), float(tol), str(what), check
