"""Price a training step, pure: the profile's per-segment times, replayed in a schedule's own action order.

A plan's stages are the profile's segments between its cuts; each stage's forward, backward (or input
grad and weight grad) and optimizer step are the sums of its segments' at the microbatch size; each cut
carries the activation forward and its gradient (the same bytes) back. The action order is what torch's
schedule ran for that schedule, ranks, stages per rank and chunk count (``TrialResult.extra["actions"]``:
it does not depend on where the cuts are, so one run of a layout prices every cut of it). The step ends
when the last rank has finished its backwards and its optimizer step (ranks step their own parameters at
once). The serial step is every segment's forward, backward and optimizer step on the whole batch.

Memory per stage: parameters, their gradients and the optimizer's state (AdamW two copies, SGD with
momentum one), plus the activations its forwards keep until their backward frees them, at the most
microbatches the action order ever holds in flight on that stage (GPipe all of them, 1F1B about one
per stage still to drain). Per rank, what a step adds walks the rank's own actions with the bytes each
holds, transients included (``costmodel.footprint``); the rank's prediction is that on top of its
parameters and optimizer state.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from costmodel.footprint import step_memory
from costmodel.replay import StageTimes, parse_action, replay
from costmodel.types import Machine, Profile, Segment, interpolate
from pipeline.core.stack import NoStack, find_stack

__all__ = ["OPTIMIZER_STATES", "TrainPrediction", "fsdp_seconds", "in_flight", "predict_train", "recomputed_segments",
           "train_stage_times"]

OPTIMIZER_STATES = {"adamw": 2, "sgd": 1}
"""Copies of the parameters an optimizer keeps (AdamW: two moments; SGD with momentum: one buffer)."""


def _bounds(cuts: Sequence[int], n: int) -> list[tuple[int, int]]:
    b = [0, *cuts, n]
    if any(not x < y for x, y in zip(b, b[1:])):
        raise ValueError(f"cuts {list(cuts)} must be increasing and inside 1..{n - 1}")
    return list(zip(b, b[1:]))


def recomputed_segments(profile: Profile, cuts: Sequence[int], counts: Sequence[int] | None) -> list[list[int]]:
    """Per stage, the segments of the first ``counts[s]`` layers of the model's stack that begin in it (what
    ``--recompute`` runs again in the backward); nothing where ``counts`` is None or the model has no stack."""
    bounds = _bounds(cuts, len(profile.segments))
    if not counts or not any(counts):
        return [[] for _ in bounds]
    try:
        stack = find_stack([s.fqn for s in profile.segments])
    except NoStack:
        return [[] for _ in bounds]
    ends = [*stack.starts[1:], stack.end]
    out = []
    for (a, b), n in zip(bounds, counts):
        layers = [i for i, st in enumerate(stack.starts) if a <= st < b][:n]
        out.append([k for i in layers for k in range(stack.starts[i], min(ends[i], b))])
    return out


def train_stage_times(profile: Profile, cuts: Sequence[int], chunks: int, *, train: bool = True,
                      recompute: Sequence[int] | None = None) -> tuple[list[StageTimes], list[float]]:
    """(each stage's times per microbatch, each stage's optimizer step) for cuts before segments ``cuts``;
    forward-only (``train`` False) needs no backward times. A stage that recomputes its first ``recompute[s]``
    layers runs their forward again in its backward (in the input-gradient half where the schedule splits it)."""
    if chunks < 1 or profile.batch_size % chunks:
        raise ValueError(f"chunks {chunks} must divide batch size {profile.batch_size}")
    segs = profile.segments
    if train and not segs[0].backward_s:
        raise ValueError("the profile has no backward times: profile for training (costmodel.profile --train)")
    m = profile.batch_size // chunks
    out, opt = [], []
    again = recomputed_segments(profile, cuts, recompute if train else None)
    for (a, b), redo in zip(_bounds(cuts, len(segs)), again):
        part: Sequence[Segment] = segs[a:b]
        link = profile.link.time(part[-1].out_bytes * m) if b < len(segs) else 0.0
        extra = sum(segs[k].latency(m) for k in redo)
        backward = sum(interpolate(s.backward_s, m) for s in part) + extra
        # torch's first stage has no input gradient to split off: its W is the whole backward
        input_grad = sum(interpolate(s.input_grad_s, m) for s in part) + extra if a else 0.0
        weight_grad = sum(interpolate(s.weight_grad_s, m) for s in part) if a else backward
        out.append(StageTimes(forward=sum(s.latency(m) for s in part), backward=backward, input_grad=input_grad,
                              weight_grad=weight_grad, link_forward=link, link_backward=link))
        opt.append(sum(s.optimizer_s or 0.0 for s in part))
    return out, opt


def in_flight(actions: Sequence[Sequence[str]]) -> dict[int, int]:
    """Per stage, the most microbatches whose activations its rank holds at once in this order: a forward
    keeps them until the backward that frees them (``W`` where the schedule splits it, else ``B``; DualPipeV
    does both on one stage)."""
    held: dict[int, int] = {}
    most: dict[int, int] = {}
    for order in actions:
        for a in map(parse_action, order):
            if a.kind == "F":
                held[a.stage] = held.get(a.stage, 0) + 1
            elif a.kind in "BW":  # a microbatch's backward is whole (B) or in halves, W the last
                held[a.stage] = held.get(a.stage, 0) - 1
            most[a.stage] = max(most.get(a.stage, 0), held.get(a.stage, 0))
    return most


@dataclass(frozen=True, kw_only=True)
class TrainPrediction:
    """What the training model expects of a plan on one schedule."""

    makespan_s: float
    serial_s: float
    bubble_fraction: float
    stage_mem_bytes: tuple[int, ...]
    """Per stage: parameters + gradients + optimizer state + activations in flight."""
    rank_mem_bytes: tuple[int, ...]
    """Per rank: its stages' parameters and optimizer state, plus the most a step adds (``rank_step_bytes``)."""
    rank_step_bytes: tuple[int, ...] = ()
    """Per rank: the most a step adds to the memory held as it starts: gradients (freed by ``zero_grad``
    between steps), activations in flight and the backward's and optimizer's temporaries
    (``costmodel.footprint``); what a trial measures as its peak less its base."""

    @property
    def speedup(self) -> float:
        return self.serial_s / self.makespan_s if self.makespan_s > 0 else 0.0


def fsdp_seconds(profile: Profile, param_bytes: int, dp_shard: int) -> float:
    """What FSDP2 adds to a sharded stage's step: all-gathering its parameters before the first forward and
    reduce-scattering its gradients after the last backward, each moving (D - 1) / D of the stage's bytes
    over the measured link (a ring's volume per rank); in bf16 mixed precision the parameters are gathered in
    bfloat16 (half the bytes) and the gradients reduced in float32, as FSDP2's policy does."""
    if dp_shard <= 1 or param_bytes <= 0:
        return 0.0
    share = param_bytes * (dp_shard - 1) / dp_shard
    gathered = share / 2 if profile.model.get("mixed_precision") == "bf16" else share
    return profile.link.time(gathered) + profile.link.time(share)


def predict_train(profile: Profile, cuts: Sequence[int], chunks: int, actions: Sequence[Sequence[str]], *,
                  optimizer: str = "adamw", train: bool = True, machine: Machine | None = None,
                  recompute: Sequence[int] | None = None, dp_shard: int = 1) -> TrainPrediction:
    """Predict one training step of the plan that cuts before ``cuts`` with ``chunks`` microbatches, on
    the schedule whose per-rank action order is ``actions`` (forward-only where not ``train``: the
    forwards of that order, no optimizer step, parameters alone in memory); ``machine`` replaces the
    profile's (a calibrated one); ``recompute``: layers each stage recomputes (``recomputed_segments``);
    ``dp_shard``: replicas of the pipeline, each on its share of the batch, every stage sharded over them (their
    processes share the machine: contention at ranks x replicas; FSDP's collectives: ``fsdp_seconds``)."""
    whole = profile
    if dp_shard > 1:
        profile = replace(profile, batch_size=profile.batch_size // dp_shard)
    times, opt = train_stage_times(profile, cuts, chunks, train=train, recompute=recompute)
    if not train:
        opt = [0.0] * len(opt)
        actions = [[a for a in order if parse_action(a).kind == "F"] for order in actions]
    busy = len(actions)
    machine = machine or profile.machine
    slow = machine.contention_at(busy * dp_shard) if machine is not None else 1.0
    scaled = [StageTimes(forward=t.forward * slow, backward=t.backward * slow, input_grad=t.input_grad * slow,
                         weight_grad=t.weight_grad * slow, link_forward=t.link_forward,
                         link_backward=t.link_backward) for t in times]
    run = replay(actions, scaled)
    rank_of = {parse_action(a).stage: r for r, order in enumerate(actions) for a in order}
    finish = [0.0] * busy
    for act, end in run.end.items():
        r = rank_of[act.stage]
        finish[r] = max(finish[r], end)
    bounds = _bounds(cuts, len(profile.segments))
    held = [sum(sum(s.param_bytes for s in profile.segments[a:b]) for k, (a, b) in enumerate(bounds)
                if rank_of.get(k) == r) for r in range(busy)]
    step_end = [finish[r] + sum(opt[s] for s, rr in rank_of.items() if rr == r) * slow / dp_shard
                + fsdp_seconds(profile, held[r], dp_shard) for r in range(busy)]
    segs = whole.segments
    n = whole.batch_size
    serial = sum(s.latency(n) + (interpolate(s.backward_s, n) + (s.optimizer_s or 0.0) if train else 0.0)
                 for s in segs)
    flight = in_flight(actions) if train else {}
    redo = recomputed_segments(profile, cuts, recompute) if train else None
    mem = step_memory(profile, bounds, chunks, actions, recompute=redo) if train else None
    copies = 1 + OPTIMIZER_STATES.get(optimizer, 2) if train else 1  # parameters + the optimizer's: between steps
    params = [sum(s.param_bytes for s in segs[lo:hi]) for lo, hi in bounds]
    # per stage: what stays, its gradients, and its activations at the most microbatches in flight
    stage_mem = [p * copies + (p + mem.stage_activation_bytes[k] * flight.get(k, 0) if mem else 0)
                 for k, p in enumerate(params)]
    rank_step = list(mem.rank_step_bytes) if mem else [0] * busy
    rank_mem = [sum(p for k, p in enumerate(params) if rank_of.get(k) == r) * copies + rank_step[r]
                for r in range(busy)]
    makespan = max(step_end)
    return TrainPrediction(makespan_s=makespan, serial_s=serial,
                           bubble_fraction=1 - sum(run.busy) / (busy * run.makespan) if run.makespan > 0 else 0.0,
                           stage_mem_bytes=tuple(stage_mem), rank_mem_bytes=tuple(rank_mem),
                           rank_step_bytes=tuple(rank_step))
