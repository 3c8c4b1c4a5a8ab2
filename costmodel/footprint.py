"""What a training step adds to each rank's memory, pure: the action order walked with the bytes each action holds.

A rank holds, as a step starts, its stages' parameters and the optimizer's state (and nothing of the
step: ``zero_grad`` freed the gradients). Walking its actions in order:

- a forward ``sFm`` keeps stage s's activations of microbatch m until the backward that frees them (``B``,
  or ``W`` where the schedule splits it): the bytes its segments save for backward, a tensor that one
  segment saves as output and the next as input counted once, and on a stage before the last its output
  (torch's stage keeps it for the backward); not its input (the batch, or a receive buffer torch
  allocates per microbatch once, before the step);
- a backward adds the stage's gradients the first time (they stay until the step ends) and, after that,
  for a moment the new gradient of its largest parameter beside the accumulated one; on a stage after
  the first, the gradient of its input it sends back;
- the optimizer step, after the last backward, holds every gradient and the update's temporaries: two of
  the largest parameter on CPU (torch steps one parameter at a time there), a copy of all the rank's
  parameters on CUDA (torch's foreach step).

The step's peak is the most any point of that walk holds.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from costmodel.replay import parse_action
from costmodel.types import Profile, Segment
from pipeline.core.stack import outer_index

__all__ = ["StepMemory", "activation_bytes", "rank_runtime_bytes", "step_memory"]


def activation_bytes(segs: Sequence[Segment], *, last: bool) -> int:
    """Bytes per sample one microbatch in flight holds on a stage of ``segs``: what they save, a tensor
    saved on both sides of a segment boundary once, the stage's input not at all (the batch, or the
    receive buffer torch's stage allocates per microbatch once, both held before the step), and the
    output where the stage is not the last and does not save it itself (torch's stage keeps it)."""
    saved = sum(s.saved_bytes for s in segs)
    shared = sum(min(a.saved_output_bytes, b.saved_input_bytes) for a, b in zip(segs, segs[1:]))
    held = saved - shared - segs[0].saved_input_bytes
    if not last:
        held += max(0, segs[-1].out_bytes - segs[-1].saved_output_bytes)
    return max(0, held)


@dataclass(frozen=True, kw_only=True)
class StepMemory:
    """Per rank: the most a training step adds to what the rank holds as it starts."""

    rank_step_bytes: tuple[int, ...]
    stage_activation_bytes: tuple[int, ...]
    """Per stage: the bytes one microbatch in flight holds."""


def _recomputed(segs: Sequence[Segment], a: int, b: int, redo: Sequence[int], last: bool) -> tuple[int, int]:
    """Per sample, what stage ``[a, b)`` holds per microbatch in flight with the segments ``redo`` (whole
    layers) recomputed: the rest as ``activation_bytes`` counts it, each recomputed layer's input instead of
    what it saves; and the most one of them holds again while it recomputes."""
    full = activation_bytes(segs[a:b], last=last)
    if not redo:
        return full, 0
    layers = [list(ks) for _, ks in itertools.groupby(redo, key=lambda k: _layer_of(segs[k].fqn))]
    saved = [activation_bytes(segs[ks[0]:ks[-1] + 1], last=False) for ks in layers]
    kept = [segs[ks[0] - 1].out_bytes if ks[0] else segs[ks[0]].saved_input_bytes for ks in layers]
    return max(0, full - sum(saved) + sum(kept)), max(saved, default=0)


def _layer_of(fqn: str) -> str:
    """``model.layers.3.mlp`` -> ``model.layers.3.``: the layer a segment belongs to."""
    got = outer_index(fqn)
    return f"{got[0]}.{got[1]}." if got else fqn


def step_memory(profile: Profile, bounds: Sequence[tuple[int, int]], chunks: int,
                actions: Sequence[Sequence[str]], recompute: Sequence[Sequence[int]] | None = None) -> StepMemory:
    """Walk each rank's ``actions`` over stages ``bounds`` (segment ranges) at ``chunks`` microbatches;
    ``recompute``: per stage, the segments it recomputes (``costmodel.train.recomputed_segments``)."""
    segs = profile.segments
    m = profile.batch_size // chunks
    last = len(bounds) - 1
    both = [_recomputed(segs, a, b, recompute[k] if recompute else (), k == last) for k, (a, b) in enumerate(bounds)]
    act = [held * m for held, _ in both]
    again = [peak * m for _, peak in both]
    params = [sum(s.param_bytes for s in segs[a:b]) for a, b in bounds]
    largest = [max((s.largest_param_bytes for s in segs[a:b]), default=0) for a, b in bounds]
    grad_in = [segs[a - 1].out_bytes * m if a else 0 for a, _ in bounds]  # the input's gradient, to send
    cuda = profile.device.startswith("cuda")
    out = []
    for order in actions:
        held = grads = peak = 0
        has_grads: set[int] = set()
        mine: set[int] = set()
        for a in map(parse_action, order):
            s = a.stage
            mine.add(s)
            if a.kind == "F":
                held += act[s]
                peak = max(peak, held + grads)
                continue
            if a.kind in "BW":  # weight gradients: made the first time, added to after
                extra = largest[s] if s in has_grads else params[s]
                peak = max(peak, held + grads + extra + grad_in[s] * (a.kind == "B") + again[s])
                if s not in has_grads:
                    has_grads.add(s)
                    grads += params[s]
                held -= act[s]
            else:  # I: the input gradient alone (and a recomputed layer's forward again)
                peak = max(peak, held + grads + grad_in[s] + again[s])
        if has_grads:
            temp = sum(params[s] for s in mine) if cuda else 2 * max(largest[s] for s in mine)
            peak = max(peak, grads + temp)
        out.append(int(peak))
    return StepMemory(rank_step_bytes=tuple(out), stage_activation_bytes=tuple(act))


def rank_runtime_bytes(measured: Sequence[tuple[Sequence[int], Sequence[int]]]) -> tuple[int, ...]:
    """The memory each rank held that its prediction does not account for (the interpreter, torch's
    libraries, and on rank 0 the serial model it times): the least (measured peak - predicted) of that
    rank over the plans ``(peaks, predicted)``, never below 0 (a search learns each rank's with
    ``search.plans.memory.learned_runtime``, which never rules out a plan that may fit)."""
    ranks = max((min(len(p), len(q)) for p, q in measured), default=0)  # every one of them measured at least once
    return tuple(max(0, min(p[r] - q[r] for p, q in measured if r < min(len(p), len(q)))) for r in range(ranks))
