"""Build one rank's pipeline stage for a plan, through torch.distributed.pipelining or torchpippy."""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from pipeline.core.errors import one_line
from pipeline.core.plan import BACKENDS, MULTI_SCHEDULES, SplitPlan
from pipeline.models.batch import Batch, first_chunk
from pipeline.models.fake import fake_copies_allowed, fake_model, module_copy
from pipeline.models.kept import KeptTensors
from pipeline.models.meta import MetaModel
from pipeline.models.traces import TraceCache, compile_now
from pipeline.models.weights import empty_copy, materialise_module, module_tensors, whole_model
from pipeline.stage.mesh import MeshView, local_bytes, shard_stage
from pipeline.stage.patches import _contiguous, _no_self_warmup, contiguous_receives, use_codegen
from pipeline.stage.precision import BF16, autocast, float_outputs, in_dtype, mixed
from pipeline.stage.recompute import apply_recompute, stage_blocks
from pipeline.stage.reference import GC_BYTES, trim_heap
from pipeline.stage.skips import free_of_grad, grad_needs
from pipeline.stage.training import aliases, loss_fn, make_optimizer, tied_grads


@dataclass
class BuiltStage:
    """A rank's stage, ready to run whole batches: ``step(batch)`` returns the output on the last rank."""

    modules: list[nn.Module]
    """The rank's own stage submodules (one, or ``stages_per_rank``), hooked to time compute."""
    step: Callable[[Batch | None], Any]
    runtime: Any = None
    """The runtime object that sends and receives (torchpippy's PipelineStage; the schedule for torch)."""
    split_gm: Any = None
    """The plan's whole split, every stage on meta: the streamed reference runs it (torch backend)."""
    own_bytes: int = 0
    """Bytes of the parameters and buffers this rank materialised for its stages."""
    reused_bytes: int = 0
    """Of those, the bytes it took as they were from the tensors an earlier trial left it (``KeptTensors``)."""
    params: list[tuple[str, nn.Parameter]] = field(default_factory=list)
    """Training: this stage's parameters by their name in the unsplit model (a tied copy by its first name)."""
    update: Callable[[], None] | None = None
    """Training: the optimizer step that follows ``step``'s forward and backward."""
    work: WorkLog | None = None
    """What the schedule ran on this rank's stages in the last ``step`` (torch backend)."""

    @property
    def actions(self) -> list[str]:
        """This rank's actions in the order its last ``step`` ran them, as torch names them: ``1F0`` stage 1's
        forward of microbatch 0, ``B`` a whole backward, ``I``/``W`` its input and weight halves (zero bubble)."""
        return [name for name, _, _ in self.work.spans] if self.work is not None else []


@dataclass
class WorkLog:
    """Each forward and backward a rank's schedule runs, in order, with its start and end on ``now``'s clock
    (the trial sets its compute clock's): the per-rank action order and the timeline's backward spans."""

    now: Callable[[], Any] = time.perf_counter
    spans: list[tuple[str, Any, Any]] = field(default_factory=list)

    def run(self, name: str, fn: Callable[..., Any], *a: Any, **k: Any) -> Any:
        start = self.now()
        out = fn(*a, **k)
        self.spans.append((name, start, self.now()))
        return out


def _fresh(model: nn.Module) -> nn.Module:
    """A private copy: both runtimes' ``annotate_split_points`` rewrite the model in place."""
    return copy.deepcopy(model)


def name_in(meta: MetaModel) -> Callable[[str], str]:
    """A stage tensor's name in the model: torch's split keeps the model's names; a tied copy goes by its
    first name (GPT-2's ``lm_head.weight`` is ``transformer.wte.weight``), as its gradient is checked."""
    known = meta.tensors
    first = aliases(meta.module)

    def name_of(n: str) -> str:
        if n not in known:
            raise RuntimeError(f"stage tensor {n!r} has no tensor of that name in the model to be made from")
        return first.get(n, n)

    return name_of


def _split_real(meta: MetaModel, mb: Batch, spec: dict[str, Any], low: torch.dtype | None = None) -> Any:
    """The split of a model whose code cannot be exported on meta: traced from a whole real copy on the CPU
    (made, traced, freed), then moved to meta, so that each rank still keeps only its own stages real
    (``low``: its parameters and floating inputs in that dtype, as mixed precision computes)."""
    from torch.distributed.pipelining import pipeline

    real = whole_model(meta, torch.device("cpu")).eval()
    if low is not None:
        for p in real.parameters():
            p.data = p.data.to(low) if p.is_floating_point() else p.data
    pipe = pipeline(real, mb_args=tuple(t.cpu() for t in in_dtype(mb, low)), split_spec=spec)
    del real
    pipe.split_gm.to("meta")
    return pipe


def _build_torch(plan: SplitPlan, meta: MetaModel, x: Batch, rank: int, device: torch.device,
                 group: dist.ProcessGroup | None, traces: TraceCache | None = None,
                 target: torch.Tensor | None = None, kept: KeptTensors | None = None,
                 mesh: MeshView | None = None) -> BuiltStage:
    from torch.distributed.pipelining import SplitPoint, pipeline
    from torch.distributed.pipelining.schedules import get_schedule_class

    spec = {fqn: getattr(SplitPoint, kind) for fqn, kind in plan.split_spec().items()}
    train = plan.mode == "train"
    # The split is cut from the model with fake tensors on this rank's device type (no rank holds it real);
    # each rank then makes its own stages real by name.
    pipe = None
    low = BF16 if mixed(plan.model) and mesh is not None else None  # FSDP2 computes with bf16 weights: traced so
    if meta.runs_on_meta is not False:
        fake = fake_model(meta, device, low)
        mb = fake.inputs(in_dtype(first_chunk(x, plan.chunks), low))
        key = plan.model.key + (f"|{low}" if low is not None else "")
        with fake_copies_allowed():
            # forward only, without a mesh: nothing reads the other stages' module trees, only their graphs
            only = plan.rank_stages(rank) if not train and mesh is None else None
            pipe = traces.pipe(key, fake.module, mb, plan.split_spec(), only) if traces is not None else None
        if pipe is None:
            try:
                with fake_copies_allowed():
                    pipe = pipeline(module_copy(fake.module), mb_args=mb, split_spec=spec)
            except Exception as e:  # noqa: BLE001 - cut from a real copy below, and say why once
                meta.runs_on_meta, meta.why_not_meta = False, one_line(e)
    if pipe is None:
        pipe = _split_real(meta, first_chunk(x, plan.chunks), spec, low)
    if pipe.num_stages != plan.stages:
        raise RuntimeError(f"tracing produced {pipe.num_stages} stages, the plan has {plan.stages}")
    contiguous_receives(pipe.split_gm)
    order = first_stage_order(pipe.split_gm)
    held = plan.rank_stages(mesh.pp_rank if mesh is not None else rank)
    if mesh is not None:
        group = mesh.pp_group
        blocks = _blocks_or_none([pipe.get_stage_module(i) for i in range(pipe.num_stages)])
    name_of = name_in(meta)
    needs = grad_needs(pipe.split_gm) if train else {}
    if kept is not None:  # what the last plan left this rank and this one does not use goes before anything is made
        wanted = {name_of(n) for i in held for n, _, _ in module_tensors(pipe.get_stage_module(i))}
        if kept.keep_only(wanted) >= GC_BYTES:
            trim_heap()
    built, own, reused = [], 0, 0
    for i in held:
        on_meta = pipe.get_stage_module(i)
        target_name = next(n for n, m in pipe.split_gm.named_children() if m is on_meta)
        real = empty_copy(on_meta)
        own += materialise_module(real, meta, device, name_of, train=train, kept=kept)
        reused += kept.reused_bytes if kept is not None else 0
        setattr(pipe.split_gm, target_name, real)
        if mesh is not None:  # FSDP2 over the stage's dp_shard group, before torch's stage wraps it
            shard_stage(real, blocks[i] if blocks else (), mesh.dp_mesh, plan.model)
            own -= sum(t.numel() * t.element_size() for t in real.parameters()) - local_bytes(list(real.parameters()))
        try:
            built.append(pipe.build_stage(i, device, group))
            if target_name in needs:  # the rotary cos/sin a Llama sends to every later stage carry no gradient
                free_of_grad(built[-1], *needs[target_name])
        finally:
            setattr(pipe.split_gm, target_name, on_meta)  # the split stays on meta for the reference
    if train:
        apply_recompute(plan.recompute, [pipe.get_stage_module(i) for i in range(pipe.num_stages)],
                        {i: st.submod for i, st in zip(held, built)})
    split_gm = pipe.split_gm
    del pipe
    for st in built:
        _no_self_warmup(st)
    log = WorkLog()
    for st in built:
        use_codegen(st.submod)
        if mixed(plan.model) and mesh is None:  # sent into the float32 buffers the trace gave the peers
            st.submod.register_forward_hook(float_outputs)
        st.submod.register_forward_hook(_contiguous)
        compile_now(st.submod)  # a stage cut from a cached export: any code torch's split left to generate
        _record(st, log)
    cls = get_schedule_class(plan.schedule)
    loss = loss_fn if train else None
    if plan.schedule in MULTI_SCHEDULES:
        schedule = cls(built, n_microbatches=plan.chunks, loss_fn=loss)
    else:
        schedule = cls(built[0], n_microbatches=plan.chunks, loss_fn=loss)
    first, last = 0 in held, plan.stages - 1 in held
    modules = [st.submod for st in built]

    def args(inp: Batch | None) -> tuple[torch.Tensor, ...]:
        log.spans.clear()
        return tuple(inp[i] for i in order) if first and inp is not None else ()

    if train:
        built_stage = _trainer(plan, meta.module, modules, schedule, args, last, target,
                               mesh.pp_group if mesh is not None else None)
    else:
        def step(inp: Batch | None) -> Any:
            return schedule.step(*args(inp))

        built_stage = BuiltStage(modules=modules, step=step, runtime=schedule)
    built_stage.work = log
    built_stage.split_gm = split_gm
    built_stage.own_bytes, built_stage.reused_bytes = own, reused
    return built_stage


def _blocks_or_none(stages: list[nn.Module]) -> list[list[str]] | None:
    """Each stage's stack blocks (FSDP2 shards each as a unit), or None for a model without one stack."""
    try:
        return stage_blocks(stages)
    except RuntimeError:
        return None


def _record(stage: Any, log: WorkLog) -> None:
    """Log each forward and backward that the schedule runs on ``stage``, in order: what ran, not what the
    schedule object's ``pipeline_order`` lists (torch 2.14's 1F1B lists its last rank's microbatches as 1..n);
    a forward-only run's backward calls, which return at once, are not work."""
    i = stage.stage_index
    fwd, bwd, wgt = stage.forward_one_chunk, stage.backward_one_chunk, getattr(stage, "backward_weight_one_chunk", None)

    def forward_one_chunk(chunk: int, *a: Any, **k: Any) -> Any:
        return log.run(f"{i}F{chunk}", fwd, chunk, *a, **k)

    def backward_one_chunk(chunk: int, *a: Any, **k: Any) -> Any:
        if not getattr(stage, "has_backward", True):  # forward-only: torch's multi-stage schedules still call it
            return bwd(chunk, *a, **k)
        full = k.get("full_backward", a[1] if len(a) > 1 else True)
        return log.run(f"{i}{'B' if full else 'I'}{chunk}", bwd, chunk, *a, **k)

    stage.forward_one_chunk = forward_one_chunk
    stage.backward_one_chunk = backward_one_chunk
    if wgt is not None:
        def backward_weight_one_chunk(chunk: int, *a: Any, **k: Any) -> Any:
            return log.run(f"{i}W{chunk}", wgt, chunk, *a, **k)

        stage.backward_weight_one_chunk = backward_weight_one_chunk


def _trainer(plan: SplitPlan, model: nn.Module, modules: list[nn.Module], schedule: Any,
             args: Callable[[Batch | None], tuple[torch.Tensor, ...]], last: bool,
             target: torch.Tensor | None, group: Any = None) -> BuiltStage:
    """A stage whose ``step`` runs the schedule's forwards and backwards (the loss where the last stage is) and
    sums tied parameters' gradients across stages, and whose ``update`` steps its own optimizer."""
    if last and target is None:
        raise RuntimeError("the last training stage needs the loss's target")
    names = aliases(model)
    params = [(names.get(n, n), p) for m in modules for n, p in m.named_parameters()]
    optimizer = make_optimizer(plan.optimizer, [p for _, p in params])
    sum_tied = tied_grads(params, plan.ranks, group, sharded=plan.dp_shard > 1)
    device = torch.device(plan.device)

    def step(inp: Batch | None) -> Any:
        optimizer.zero_grad(set_to_none=True)
        losses: list[torch.Tensor] = []
        with autocast(plan.model, device, on=plan.dp_shard == 1):  # sharded: FSDP2's policy casts instead
            schedule.step(*args(inp), **({"target": target, "losses": losses} if last else {}))
        sum_tied()
        return losses

    return BuiltStage(modules=modules, step=step, runtime=schedule, params=params, update=optimizer.step)


def first_stage_order(split_gm: Any) -> list[int]:
    """Which of the model's inputs the first stage takes in which place: torch's split orders a stage's inputs
    by first use (a forward that reads its mask before its token ids gets ``(mask, ids)``), and its first
    stage passes the schedule's arguments on as they come (torchpippy's alike)."""
    graph = split_gm.graph
    inputs = [n for n in graph.nodes if n.op == "placeholder"]
    first = next(n for n in graph.nodes if n.op == "call_module")
    taken = [a for a in first.args if a in inputs]
    if len(taken) != len(inputs):
        late = [n.name for n in inputs if n not in taken]
        raise RuntimeError(f"input(s) {', '.join(late)} are first used after the first cut; torch's first stage "
                           "must take every model input: cut later")
    return [inputs.index(a) for a in taken]


def _build_pippy(plan: SplitPlan, meta: MetaModel, x: Batch, rank: int, device: torch.device,
                 group: dist.ProcessGroup | None) -> BuiltStage:
    """torchpippy 0.2 traces a real model: this rank makes the whole model (on the CPU), then keeps its stage."""
    import pippy
    from pippy.IR import PipeSplitWrapper

    fresh = whole_model(meta, torch.device("cpu")).eval()
    pippy.annotate_split_points(
        fresh, {fqn: getattr(PipeSplitWrapper.SplitPoint, kind) for fqn, kind in plan.split_spec().items()}
    )
    pipe = pippy.Pipe.from_tracing(fresh, plan.chunks, example_args=x)
    if pipe.num_stages != plan.stages:
        raise RuntimeError(f"tracing produced {pipe.num_stages} stages, the plan has {plan.stages}")
    order = first_stage_order(pipe.split_gm)
    stage = pippy.PipelineStage(pipe, rank, device, group)

    def step(inp: Batch | None) -> Any:
        return stage(*(inp[i] for i in order)) if rank == 0 and inp is not None else stage()

    stage.submod.register_forward_hook(_contiguous)
    return BuiltStage(modules=[stage.submod], step=step, runtime=stage)


def other_backend(backend: str) -> str:
    """The backend to suggest when ``backend`` cannot trace or run a model."""
    return next(b for b in BACKENDS if b != backend)


def _explained(built: BuiltStage, plan: SplitPlan) -> BuiltStage:
    """A stage whose failure to run says which backend failed on which model, and what to try."""
    step = built.step

    def run(inp: Batch | None) -> Any:
        try:
            return step(inp)
        except Exception as e:  # noqa: BLE001 - re-raised as one line with the fix
            raise RuntimeError(f"{plan.backend} backend cannot run {plan.model.label} cut at "
                               f"[{', '.join(plan.split_spec())}]: {one_line(e)}; try --backend "
                               f"{other_backend(plan.backend)}") from e

    built.step = run
    return built


def build_stage(plan: SplitPlan, meta: MetaModel, x: Batch, rank: int, device: torch.device,
                group: dist.ProcessGroup | None = None, traces: TraceCache | None = None,
                target: torch.Tensor | None = None, kept: KeptTensors | None = None,
                mesh: MeshView | None = None) -> BuiltStage:
    """Cut the model on meta (never modified) at the plan's cuts and make this rank's stages real; on the
    torch backend from the worker's cached export (``traces``) where it marks the plan's cuts, and taking the
    tensors an earlier trial left in ``kept``. A training plan's last rank takes the loss's ``target``."""
    if plan.backend == "torch":
        return _explained(_build_torch(plan, meta, x, rank, device, group, traces, target, kept, mesh), plan)
    return _explained(_build_pippy(plan, meta, x, rank, device, group), plan)
