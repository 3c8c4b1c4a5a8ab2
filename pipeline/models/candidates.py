"""Where a model can be cut: module FQNs in real execution order, found by running it once with hooks."""

from __future__ import annotations

import difflib
import functools
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from torch import nn

from pipeline.core.errors import PipesplitError
from pipeline.core.plan import SplitPlan, SplitPoint
from pipeline.core.policies import PolicyInputs
from pipeline.core.recompute import counts_for
from pipeline.core.spec import ModelSpec
from pipeline.core.stack import NoStack, find_stack
from pipeline.models.batch import example_input, rows
from pipeline.models.meta import MetaModel
from pipeline.models.traces import call_events
from pipeline.models.weights import with_forward
from pipeline.peers.registry import policy
from pipeline.peers.rules import PeerMissing

GRANULARITIES = ("block", "layer")
_CONTAINERS = (nn.Sequential, nn.ModuleList)


@dataclass(frozen=True, kw_only=True)
class Candidates:
    """The segments a model divides into at one granularity, and every module's place in execution order."""

    granularity: str
    blocks: tuple[str, ...]
    """Segment starts in execution order; a cut is a ``BEGINNING`` at any of ``blocks[1:]``."""
    events: tuple[str, ...]
    """``B:fqn`` / ``E:fqn`` for the start and end of every module called exactly once, in order."""
    units: tuple[tuple[str, int], ...]
    """(module whose start a cut there would take, parameter+buffer elements), in order of first use."""

    @property
    def cuts(self) -> tuple[str, ...]:
        return self.blocks[1:]

    @property
    def max_stages(self) -> int:
        return len(self.blocks)

    def check_stages(self, stages: int, model: str, *, per_rank: int = 1) -> None:
        """One line when ``stages`` pieces (``stages / per_rank`` ranks) are more than this model has places
        to cut (every command asks this, after ``pipeline.core.plan.check_ranks``)."""
        if stages > self.max_stages:
            what = (f"--stages {stages // per_rank} with --stages-per-rank {per_rank} ({stages} stages)"
                    if per_rank > 1 else f"--stages {stages}")
            raise self._too_many(what, model)

    def _too_many(self, what: str, model: str) -> PipesplitError:
        return PipesplitError(
            f"{what} is too many for {model}: it has {len(self.cuts)} cut points at {self.granularity} "
            f"granularity, so at most {self.max_stages} stages; use fewer stages"
            + (" or --granularity layer" if self.granularity == "block" else ""))

    def policy_inputs(self, segment_times: Sequence[float] | None = None,
                      segment_flops: Sequence[int] | None = None) -> PolicyInputs:
        """What the reference policies weigh, for this model (times and FLOPs come from a profile)."""
        return PolicyInputs(unit_elements=tuple(n for _, n in self.units),
                            segment_elements=tuple(self.segment_params()),
                            segment_times=None if segment_times is None else tuple(segment_times),
                            segment_flops=None if segment_flops is None else tuple(segment_flops),
                            segment_names=self.blocks)

    def policy_points(self, name: str, stages: int, inputs: PolicyInputs | None = None) -> tuple[SplitPoint, ...]:
        """The split points that the reference policy ``name`` picks for ``stages`` stages."""
        try:
            pol = policy(name)
            cuts = pol.cuts(inputs or self.policy_inputs(), stages)
        except NoStack as e:
            raise PipesplitError(f"policy {name} does not apply to this model: {e}; use uniform or params-balanced, "
                                 "pipesplit's rules over its blocks") from None
        except PeerMissing as e:
            raise PipesplitError(f"policy {name}: {e}") from None
        except ValueError as e:
            raise PipesplitError(f"policy {name} cannot split {stages} stages: {e}") from None
        return self.unit_points(cuts) if pol.on_units else self.plan_points(cuts)

    def unit_points(self, unit_indices: Sequence[int]) -> tuple[SplitPoint, ...]:
        """Split points before PiPPy's units ``unit_indices`` (a cut there may fall inside a block)."""
        return tuple(SplitPoint(self.units[i][0], "BEGINNING") for i in unit_indices)

    def segment_params(self) -> list[int]:
        """Parameter+buffer elements of each block segment (what PiPPy's size rule balances)."""
        idx = self._index()
        starts = [idx["B:" + b] for b in self.blocks]
        out = [0] * len(self.blocks)
        for fqn, n in self.units:
            pos = idx["B:" + fqn]
            k = max(i for i, s in enumerate(starts) if s <= pos) if pos >= starts[0] else 0
            out[k] += n
        return out

    def stage_positions(self, plan: SplitPlan) -> list[int]:
        """Where each of the plan's stages starts among ``events`` (a BEGINNING cut at its module's start,
        an END cut after its module's end), the first at 0."""
        idx = self._index()
        return [0, *(idx["B:" + p.fqn] if p.kind == "BEGINNING" else idx["E:" + p.fqn] + 1 for p in plan.split_points)]

    def stage_blocks(self, plan: SplitPlan) -> list[list[str]]:
        """Per stage, the blocks of the model's one stack (``model.layers.3``) that begin in it: what
        ``--recompute`` counts; one line where the model has no single stack."""
        try:
            stack = find_stack(self.blocks)
        except NoStack as e:
            raise PipesplitError(f"--recompute counts the blocks of one stack of layers, and {plan.model.label} has "
                                 f"none: {e}; use --recompute none") from None
        idx = self._index()
        starts = [*self.stage_positions(plan), len(self.events)]
        layers = [f"{stack.prefix}.{i}" for i in range(stack.layers)]
        return [[n for n in layers if lo <= idx.get("B:" + n, -1) < hi] for lo, hi in zip(starts, starts[1:])]

    def recompute_counts(self, plan: SplitPlan) -> tuple[int, ...]:
        """The plan's recomputed blocks per stage (one line where it asks for more than a stage holds)."""
        if plan.recompute == "none":
            return tuple(0 for _ in range(plan.stages))
        return counts_for(plan.recompute, [len(b) for b in self.stage_blocks(plan)])

    def stage_elements(self, plan: SplitPlan) -> list[int]:
        """Parameter+buffer elements of each of the plan's stages (validated cuts)."""
        idx = self._index()
        starts = self.stage_positions(plan)
        out = [0] * len(starts)
        for fqn, n in self.units:
            pos = idx["B:" + fqn]
            out[max(i for i, s in enumerate(starts) if s <= pos) if pos >= starts[0] else 0] += n
        return out

    def plan_points(self, cut_indices: list[int] | tuple[int, ...]) -> tuple[SplitPoint, ...]:
        """Split points for cuts before ``blocks[i]`` (``i`` >= 1, increasing)."""
        return tuple(SplitPoint(self.blocks[i], "BEGINNING") for i in cut_indices)

    def event_index(self) -> dict[str, int]:
        """Each event's position in ``events`` (made once)."""
        return self._index()

    def _index(self) -> dict[str, int]:
        cached = self.__dict__.get("_idx")
        if cached is None:
            cached = {e: i for i, e in enumerate(self.events)}
            object.__setattr__(self, "_idx", cached)
        return cached

    def validate(self, plan: SplitPlan) -> None:
        """Raise a one-line PipesplitError if ``plan``'s cuts cannot be made in this model."""
        if plan.stages > self.max_stages:
            raise self._too_many(f"{plan.stages} stages", plan.model.label)
        idx = self._index()
        positions = []
        for p in plan.split_points:
            key = ("B:" if p.kind == "BEGINNING" else "E:") + p.fqn
            if key not in idx:
                called = {e[2:] for e in self.events}
                close = difflib.get_close_matches(p.fqn, sorted(called), n=3, cutoff=0.6)
                hint = f" (did you mean {', '.join(close)}?)" if close else ""
                raise PipesplitError(
                    f"split point {p.fqn!r} is not a module that {plan.model.label} calls exactly once{hint}: "
                    f"pick one of its candidates, e.g. {', '.join(self.cuts[:4])} ..."
                )
            positions.append(idx[key])
        for (a, pa), (b, pb) in zip(zip(plan.split_points, positions), zip(plan.split_points[1:], positions[1:])):
            if pb <= pa:
                raise PipesplitError(
                    f"split points out of execution order: {b.fqn} ({b.kind}) runs before {a.fqn} ({a.kind}); "
                    "list them in the order the model runs"
                )
        leaves = {i for i, e in enumerate(self.events[:-1]) if e[0] == "B" and self.events[i + 1] == "E" + e[1:]}
        # a stage starts at a BEGINNING cut's own event (that module runs in it) or after an END cut's
        starts = [0, *(i if p.kind == "BEGINNING" else i + 1 for p, i in zip(plan.split_points, positions))]
        bounds = [-1, *positions, len(self.events)]
        for s, (lo, hi) in enumerate(zip(bounds, bounds[1:])):
            if not any(starts[s] <= i < hi for i in leaves):
                raise PipesplitError(
                    f"stage {s} of the plan would run no module (between cut {lo} and {hi} of {plan.describe()}): "
                    "move or drop a split point"
                )

    def to_dict(self) -> dict[str, Any]:
        return {
            "granularity": self.granularity,
            "blocks": list(self.blocks),
            "events": list(self.events),
            "units": [list(u) for u in self.units],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Candidates:
        return cls(
            granularity=d["granularity"],
            blocks=tuple(d["blocks"]),
            events=tuple(d["events"]),
            units=tuple((f, int(n)) for f, n in d["units"]),
        )


def _own_elements(mod: nn.Module) -> int:
    return sum(p.numel() for p in mod.parameters(recurse=False)) + sum(b.numel() for b in mod.buffers(recurse=False))


def find_candidates(model: nn.Module | MetaModel, spec: ModelSpec, granularity: str = "block",
                    calls: list[tuple[str, str]] | None = None) -> Candidates:
    """Run ``model`` once on one sample and list where it can be cut at ``granularity`` (a model on meta runs
    there, or whole and real where its forward cannot: ``pipeline.models.weights.with_forward``)."""
    if granularity not in GRANULARITIES:
        raise PipesplitError(f"granularity {granularity!r} is unknown: use one of {', '.join(GRANULARITIES)}")
    x = rows(example_input(spec), 1)
    if isinstance(model, MetaModel):  # names from the module that ran (transformers sets some up on first use)
        raw, model = with_forward(model, x, lambda m, xs: (call_events(m, xs), m))
    else:  # ``calls``: the caller's own ``call_events`` of this module, on one sample
        raw = call_events(model, x) if calls is None else calls
    counts = Counter(n for k, n in raw if k == "B")
    once = [(k, n) for k, n in raw if counts[n] == 1 and n != ""]
    events = tuple(f"{k}:{n}" for k, n in once)
    order = {n: i for i, (k, n) in enumerate(once) if k == "B"}
    # every name, a module shared under several (transformers' cached activation instances) included
    modules = dict(model.named_modules(remove_duplicate=False))

    @functools.cache
    def first_use(fqn: str) -> int | None:
        """Where a module starts; a module that is never called itself starts where its first called child
        does: a container that forward loops over (GPT-2's ``transformer.h``, Llama's ``model.layers``) or a
        wrapper whose parent calls its children directly (Blenderbot's and OPT's decoder-only ``model``)."""
        if fqn in order:
            return order[fqn]
        uses = [u for c, _ in modules[fqn].named_children() if (u := first_use(f"{fqn}.{c}")) is not None]
        return min(uses) if uses else None

    def called_children(fqn: str) -> list[str]:
        mod = modules[fqn] if fqn else model
        kids = [(k, first_use(k)) for k in (f"{fqn}.{c}" if fqn else c for c, _ in mod.named_children())]
        return [k for k, _ in sorted(((k, u) for k, u in kids if u is not None), key=lambda t: t[1])]

    def is_stack(fqn: str) -> bool:
        """A container of blocks run in order (a Sequential of one block type; a ModuleList of any, as hybrid
        language models mix attention and linear-attention layers), or a module holding one at any depth
        (Swin/ConvNeXt ``stages.i.blocks``, BERT's ``bert.encoder.layer``)."""
        mod = modules[fqn]
        kids = called_children(fqn)
        if isinstance(mod, nn.ModuleList):
            return len(kids) >= 1
        if isinstance(mod, _CONTAINERS):
            return len(kids) >= 1 and len({type(modules[k]) for k in kids}) == 1
        return any(is_stack(k) if not isinstance(modules[k], _CONTAINERS) else len(called_children(k)) >= 2 and is_stack(k)
                   for k in kids)

    def expand(fqn: str) -> list[str]:
        out: list[str] = []
        for child in called_children(fqn):
            out.extend(expand(child) if is_stack(child) or child not in order else [child])
        return out

    blocks = expand("")
    if granularity == "layer":
        blocks = [leaf for b in blocks for leaf in (called_children(b) if len(called_children(b)) >= 2 else [b])]

    def weight(fqn: str) -> int:
        return sum(p.numel() for p in modules[fqn].parameters())

    merged = [b for i, b in enumerate(blocks) if i == 0 or weight(b) > 0]

    leaves = [n for i, (k, n) in enumerate(once[:-1]) if k == "B" and once[i + 1] == ("E", n)]
    units: list[tuple[str, int]] = []
    pending = _own_elements(model)
    for k, n in once:
        if k != "B":
            continue
        pending += _own_elements(modules[n])
        if n in leaves and pending:
            units.append((n, pending))
            pending = 0
    if pending and units:
        last, cnt = units[-1]
        units[-1] = (last, cnt + pending)
    if len(merged) < 2:
        raise PipesplitError(f"{spec.label} has no place to cut at {granularity} granularity: try --granularity layer")
    return Candidates(
        granularity=granularity, blocks=tuple(merged), events=events, units=tuple(units)
    )
