"""A plan's recomputation in the terms torchtitan, Megatron-Core and DeepSpeed users write, pure text.

Each framework has one setting for every stage: torchtitan's ``activation_checkpoint`` (``full`` or none,
applied by ``pipeline_llm`` to every model part alike), Megatron's ``--recompute-method block
--recompute-num-layers N`` (the first N layers of each stage), DeepSpeed's ``activation_checkpoint_interval``
(0: none; k: every layer, k at a time). A per-stage plan they cannot express gets one ``# not expressible``
line and the nearest setting that still fits (it recomputes at least what each stage does); torchtitan's
users also get the short policy that applies the plan's own counts per part, built on torchtitan's ``FullAC``.
"""

from __future__ import annotations

from collections.abc import Sequence

from pipeline.core.stack import Stack

__all__ = ["deepspeed_recompute", "megatron_recompute", "recomputed_layers", "torchtitan_recompute"]


def recomputed_layers(stack: Stack, cuts: Sequence[int], counts: Sequence[int]) -> list[list[int]]:
    """Per stage of ``cuts``, the stack's layers it recomputes: the first ``counts[s]`` of those that begin in it."""
    return [layers[:n] for layers, n in zip(stack.stage_layers(cuts), counts)]


def _uniform(stack: Stack, cuts: Sequence[int], counts: Sequence[int]) -> tuple[str, int]:
    """``none``, ``full`` or ``mixed`` for the counts on these cuts, and the least N covering every stage."""
    per = [len(x) for x in stack.stage_layers(cuts)]
    done = [min(n, p) for n, p in zip(counts, per)]
    if not any(done):
        return "none", 0
    if done == per:
        return "full", max(per)
    return "mixed", max(done)


def torchtitan_recompute(stack: Stack, cuts: Sequence[int], counts: Sequence[int]) -> str:
    """torchtitan's ``activation_checkpoint`` for the plan, and the per-part policy where one mode cannot say it."""
    kind, _ = _uniform(stack, cuts, counts)
    if kind != "mixed":
        mode = "full" if kind == "full" else "none"
        return "\n".join([
            f"# activation recomputation: {'every layer of every stage' if kind == 'full' else 'none'}",
            "# torchtitan <= 0.2 (TOML):", "[activation_checkpoint]", f'mode = "{mode}"',
            "# torchtitan >= 0.3: Trainer.Config(activation_checkpoint="
            + ("FullAC.Config()" if kind == "full" else "None") + ", ...)"])
    chosen = sorted(f"layers.{i}" for stage in recomputed_layers(stack, cuts, counts) for i in stage)
    return "\n".join([
        "# not expressible: torchtitan applies one activation_checkpoint mode to every pipeline part, and this "
        "plan recomputes per stage " + ",".join(map(str, counts)) + " layers",
        '# nearest: [activation_checkpoint] mode = "full" (<= 0.2), activation_checkpoint=FullAC.Config() (>= 0.3),',
        "# which recomputes every layer; or this policy (torchtitan >= 0.3), the plan's own counts per part:",
        "from dataclasses import dataclass", "",
        "from torchtitan.distributed.activation_checkpoint import FullAC", "",
        f"RECOMPUTED = {{{', '.join(repr(n) for n in chosen)}}}", "", "",
        "class PerStageAC(FullAC):",
        '    """torchtitan\'s full recomputation on the layers pipesplit recomputes, none on the others."""', "",
        "    @dataclass(kw_only=True, slots=True)",
        "    class Config(FullAC.Config):",
        "        pass", "",
        "    def _wrap_block(self, module, *, base_fqn=None):",
        "        return super()._wrap_block(module, base_fqn=base_fqn) if base_fqn in RECOMPUTED else module", "",
        "# Trainer.Config(activation_checkpoint=PerStageAC.Config(), ...)"])


def megatron_recompute(stack: Stack, cuts: Sequence[int], counts: Sequence[int]) -> list[str]:
    """Megatron-Core's recomputation flags (none where the plan recomputes nothing), a comment line first."""
    kind, n = _uniform(stack, cuts, counts)
    if kind == "none":
        return []
    flags = ["--recompute-granularity full", "--recompute-method block", f"--recompute-num-layers {n}"]
    if kind == "mixed" and any(min(n, len(x)) != min(c, len(x)) for c, x in zip(counts, stack.stage_layers(cuts))):
        return [f"# not expressible: Megatron-Core recomputes the first N layers of every stage, and this plan "
                f"recomputes per stage {','.join(map(str, counts))}; nearest: N = {n}, which recomputes at least "
                "as much on every stage", *flags]
    return [f"# the first {n} layer(s) of every stage recomputed", *flags]


def deepspeed_recompute(stack: Stack, cuts: Sequence[int], counts: Sequence[int]) -> str:
    """DeepSpeed's ``activation_checkpoint_interval`` (a PipelineModule argument) for the plan."""
    kind, _ = _uniform(stack, cuts, counts)
    if kind == "none":
        return "# no activation recomputation: PipelineModule(..., activation_checkpoint_interval=0)\n"
    line = "PipelineModule(..., activation_checkpoint_interval=1)  # every layer recomputed"
    if kind == "full":
        return f"# {line}\n"
    return (f"# not expressible: DeepSpeed checkpoints every layer of every stage or none, and this plan "
            f"recomputes per stage {','.join(map(str, counts))}; nearest (every layer):\n# {line}\n")
