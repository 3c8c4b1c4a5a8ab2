"""Build one rank's pipeline stage for a plan, through torch.distributed.pipelining or torchpippy."""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from pipeline.core.errors import one_line
from pipeline.core.plan import BACKENDS, SplitPlan
from pipeline.traces import TraceCache


@dataclass
class BuiltStage:
    """A rank's stage, ready to run whole batches: ``step(x)`` returns the output on the last rank."""

    module: nn.Module
    """The stage's own submodule, hooked to time compute."""
    step: Callable[[torch.Tensor | None], Any]
    runtime: Any = None
    """The runtime object that sends and receives (torchpippy's PipelineStage; the schedule for torch)."""


def _fresh(model: nn.Module) -> nn.Module:
    """A private copy: both runtimes' ``annotate_split_points`` rewrite the model in place."""
    return copy.deepcopy(model)


def _contiguous(mod: nn.Module, args: Any, out: Any) -> Any:
    """Stage outputs go out through send(), which needs contiguous tensors; a cut before a ViT head
    sends ``x[:, 0]``, a strided view ("input tensor has to be contiguous" from gloo otherwise)."""
    from torch.utils._pytree import tree_map

    return tree_map(lambda t: t.contiguous() if isinstance(t, torch.Tensor) else t, out)


def contiguous_receives(split_gm: Any) -> int:
    """Make every stage input that is received from another stage a contiguous buffer; returns how many.

    torch's pipelining allocates each receive buffer with the strides the trace saw (``empty_strided`` of
    the placeholder's ``meta["val"]``); a value that crosses a cut as a strided view (a ViT's ``x[:, 0]``
    before ``head``, a ConvNeXt activation after its NCHW->NHWC permute, at a BEGINNING or an END cut)
    would arrive in a non-contiguous buffer, which gloo refuses ("input tensor has to be contiguous").
    The sender's outputs are made contiguous (``_contiguous``); so are the buffers here. Eager stage code
    does not depend on the strides of its inputs.
    """
    changed = 0
    for sub in split_gm.children():
        graph = getattr(sub, "graph", None)
        if graph is None:
            continue
        for node in graph.nodes:
            val = node.meta.get("val") if node.op == "placeholder" else None
            if isinstance(val, torch.Tensor) and not val.is_contiguous():
                node.meta["val"] = torch.empty(val.shape, dtype=val.dtype, device="meta")
                changed += 1
    return changed


def use_codegen(module: nn.Module) -> None:
    """Run unflattened stage modules as generated code, not node by node through ``fx.Interpreter``.

    torch's unflatten builds ``InterpreterModule``s that interpret their graph in Python by default; on a
    tiny DeiT stage that made compute ~4x slower than torchpippy's GraphModules (measured here).
    """
    for m in module.modules():
        if hasattr(m, "_run_with_interpreter") and not _names_self(m):
            m._run_with_interpreter = False  # type: ignore[assignment]


def _names_self(module: nn.Module) -> bool:
    """Whether generated code for ``module`` would rebind ``self``: a submodule called ``self`` (BERT's
    ``attention.self``) becomes a graph value named ``self``; such a module stays interpreted."""
    graph = getattr(module, "graph", None)
    return graph is not None and any(node.name == "self" for node in graph.nodes)


def _build_torch(plan: SplitPlan, model: nn.Module, x: torch.Tensor, rank: int, device: torch.device,
                 group: dist.ProcessGroup | None, traces: TraceCache | None = None) -> BuiltStage:
    from torch.distributed.pipelining import SplitPoint, pipeline
    from torch.distributed.pipelining.schedules import get_schedule_class

    spec = {fqn: getattr(SplitPoint, kind) for fqn, kind in plan.split_spec().items()}
    mb = x.chunk(plan.chunks)[0]
    # Trace with autograd on: tracing under no_grad breaks torch's unflatten on some versions.
    pipe = traces.pipe(plan.model.key, model, mb, plan.split_spec()) if traces is not None else None
    if pipe is None:
        pipe = pipeline(_fresh(model), mb_args=(mb,), split_spec=spec)
    if pipe.num_stages != plan.stages:
        raise RuntimeError(f"tracing produced {pipe.num_stages} stages, the plan has {plan.stages}")
    contiguous_receives(pipe.split_gm)
    stage = pipe.build_stage(rank, device, group)
    del pipe
    use_codegen(stage.submod)
    schedule = get_schedule_class(plan.schedule)(stage, n_microbatches=plan.chunks)

    def step(inp: torch.Tensor | None) -> Any:
        return schedule.step(inp) if rank == 0 else schedule.step()

    stage.submod.register_forward_hook(_contiguous)
    return BuiltStage(module=stage.submod, step=step, runtime=schedule)


def _build_pippy(plan: SplitPlan, model: nn.Module, x: torch.Tensor, rank: int, device: torch.device,
                 group: dist.ProcessGroup | None) -> BuiltStage:
    import pippy
    from pippy.IR import PipeSplitWrapper

    fresh = _fresh(model)
    pippy.annotate_split_points(
        fresh, {fqn: getattr(PipeSplitWrapper.SplitPoint, kind) for fqn, kind in plan.split_spec().items()}
    )
    pipe = pippy.Pipe.from_tracing(fresh, plan.chunks, example_args=(x,))
    if pipe.num_stages != plan.stages:
        raise RuntimeError(f"tracing produced {pipe.num_stages} stages, the plan has {plan.stages}")
    stage = pippy.PipelineStage(pipe, rank, device, group)

    def step(inp: torch.Tensor | None) -> Any:
        return stage(inp) if rank == 0 else stage()

    stage.submod.register_forward_hook(_contiguous)
    return BuiltStage(module=stage.submod, step=step, runtime=stage)


def other_backend(backend: str) -> str:
    """The backend to suggest when ``backend`` cannot trace or run a model."""
    return next(b for b in BACKENDS if b != backend)


def _explained(built: BuiltStage, plan: SplitPlan) -> BuiltStage:
    """A stage whose failure to run says which backend failed on which model, and what to try."""
    step = built.step

    def run(inp: torch.Tensor | None) -> Any:
        try:
            return step(inp)
        except Exception as e:  # noqa: BLE001 - re-raised as one line with the fix
            raise RuntimeError(f"{plan.backend} backend cannot run {plan.model.label} cut at "
                               f"[{', '.join(plan.split_spec())}]: {one_line(e)}; try --backend "
                               f"{other_backend(plan.backend)}") from e

    built.step = run
    return built


def build_stage(plan: SplitPlan, model: nn.Module, x: torch.Tensor, rank: int, device: torch.device,
                group: dist.ProcessGroup | None = None, traces: TraceCache | None = None) -> BuiltStage:
    """Trace ``model`` (never modified) with the plan's cuts and keep this rank's stage; on the torch
    backend, from the worker's cached export (``traces``) where it marks the plan's cuts."""
    if plan.backend == "torch":
        return _explained(_build_torch(plan, model, x, rank, device, group, traces), plan)
    return _explained(_build_pippy(plan, model, x, rank, device, group), plan)
