"""Each schedule's per-rank action order, from torch's own schedule classes, before anything runs.

The cost model replays these orders (``costmodel.replay``); the runtime runs the same classes, and a run
records what it executed (``TrialResult.extra["actions"]``), which the tests compare with these. torch
builds the order in a schedule's constructor from the stage count alone; its ``get_schedule_ops`` does
that with stand-in stages (no process group, no model). Read from its ``pipeline_order``:

- only compute actions are kept (``F``, ``B``, ``I``, ``W``; not ``REDUCE_GRAD`` nor comms), an overlapped
  pair (DualPipeV's ``OVERLAP_F_B``) as its two actions in order;
- forward-only runs keep the forwards (a schedule without a loss runs no backward);
- torch 2.14's single-stage 1F1B lists the last rank's forwards as microbatches 1..n where its runtime runs
  0..n-1: a stage's ids that are 1..n are renumbered.

An order that is still not every stage's every microbatch once is not used (None): that layout is then
priced from the order a measured run recorded, or measured unpriced.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

__all__ = ["ActionOrder", "normalised", "schedule_order"]

_COMPUTE = re.compile(r"(\d+)([FBIW])(\d+)")


@dataclass(frozen=True, kw_only=True)
class ActionOrder:
    """One layout's per-rank action order at a chunk count: ``0F1`` stage 0's forward of microbatch 1."""

    schedule: str
    ranks: int
    per_rank: int
    chunks: int
    train: bool
    actions: tuple[tuple[str, ...], ...]


def _names(action: Any) -> list[str]:
    """The compute actions one of torch's ``_Action``s stands for, as ``0F1`` strings."""
    if action is None:
        return []
    subs = getattr(action, "sub_actions", None)
    if subs:
        return [n for sub in subs for n in _names(sub)]
    text = str(action)
    return [text] if _COMPUTE.fullmatch(text) else []


def _parse(text: str) -> tuple[int, str, int]:
    m = _COMPUTE.fullmatch(text)
    if m is None:
        raise ValueError(f"action {text!r} is not <stage><F|B|I|W><microbatch>")
    return int(m.group(1)), m.group(2), int(m.group(3))


def _ids(ranks: Sequence[Sequence[str]]) -> dict[tuple[int, str], list[int]]:
    """Per (stage, kind), the microbatch ids its actions name, in order."""
    ids: dict[tuple[int, str], list[int]] = {}
    for order in ranks:
        for text in order:
            s, kind, m = _parse(text)
            ids.setdefault((s, kind), []).append(m)
    return ids


def normalised(ranks: Sequence[Sequence[str]], *, stages: int, chunks: int,
               train: bool) -> tuple[tuple[str, ...], ...] | None:
    """The orders as the runtime runs them (see the module's rules), or None where they do not cover
    every stage's forward (and, training, backward: whole or in halves) of every microbatch once."""
    shift = {key for key, ms in _ids(ranks).items() if sorted(ms) == list(range(1, chunks + 1))}
    out = tuple(tuple(f"{s}{kind}{m - ((s, kind) in shift)}" for s, kind, m in map(_parse, order)
                      if train or kind == "F") for order in ranks)
    done = _ids(out)
    for s in range(stages):
        if sorted(done.get((s, "F"), [])) != list(range(chunks)):
            return None
        if not train:
            continue
        whole, halves, weights = (done.get((s, k), []) for k in "BIW")
        if sorted(halves) != sorted(weights) or sorted(whole + halves) != list(range(chunks)):
            return None  # each microbatch's backward once: whole (B), or input then weight grad (I, W)
    return tuple(out)


@cache
def schedule_order(schedule: str, ranks: int, per_rank: int, chunks: int, *, train: bool) -> ActionOrder | None:
    """torch's order for ``schedule`` on ``ranks`` ranks x ``per_rank`` stages and ``chunks`` microbatches;
    None where this torch cannot say (no ``get_schedule_ops``, a schedule that refuses the shape)."""
    try:
        from torch.distributed.pipelining._schedule_visualizer import get_schedule_ops
    except ImportError:  # torch before 2.6
        return None
    try:
        ops = get_schedule_ops(schedule, ranks, chunks, per_rank)
    except Exception:  # noqa: BLE001 - torch refuses a shape in its own words; the layout is measured instead
        return None
    raw = [[n for a in rank for n in _names(a)] for rank in ops]
    actions = normalised(raw, stages=ranks * per_rank, chunks=chunks, train=train)
    if actions is None:
        return None
    return ActionOrder(schedule=schedule, ranks=ranks, per_rank=per_rank, chunks=chunks, train=train, actions=actions)
