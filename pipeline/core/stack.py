"""The model as torchtitan, Megatron and DeepSpeed see it: an input part, one stack of layers, an output part.

Those frameworks split a language model by its stacked decoder layers (``layers.<i>``), with the embedding
as the first stage's input and the final norm + head as the last stage's output. Our candidate segments
are finer (a GPT-2 has ``wte`` and ``wpe`` before its stack, ``ln_f`` and ``lm_head`` after it); this module
maps between the two, in pure arithmetic over segment names, so that their rules can be run on our cut
points and our cuts written in their terms.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["NoStack", "Stack", "find_stack", "nearest_allowed", "outer_index"]

_INDEX = re.compile(r"(?:^|\.)(\d+)(?=\.|$)")


class NoStack(ValueError):
    """The model has no single stack of layers, so the frameworks' rules do not describe it."""


def outer_index(name: str) -> tuple[str, int] | None:
    """``model.layers.3.mlp`` -> (``model.layers``, 3): the outermost numbered container a segment is in."""
    m = _INDEX.search(name)
    return (name[: m.start(1)].rstrip("."), int(m.group(1))) if m else None


_indexed = outer_index


@dataclass(frozen=True, kw_only=True)
class Stack:
    """Where one stack of layers lies among a model's candidate segments."""

    prefix: str
    """The stack's container, e.g. ``model.layers`` (a layer is ``<prefix>.<i>``)."""
    starts: tuple[int, ...]
    """The segment where each layer begins, in order (layer ``i`` holds ``starts[i]`` up to the next start)."""
    end: int
    """The segment after the last layer: where the output part (final norm, head) begins."""
    segments: int
    """How many candidate segments the model has."""

    @property
    def layers(self) -> int:
        return len(self.starts)

    @property
    def pre(self) -> int:
        """Segments before the stack (the embedding part)."""
        return self.starts[0]

    @property
    def post(self) -> int:
        """Segments after the stack (the final norm and the head)."""
        return self.segments - self.end

    def layer_cut(self, layer: int) -> int:
        """The segment index of a stage that begins with layer ``layer`` (``layers``: with the output part)."""
        return self.starts[layer] if layer < self.layers else self.end

    def whole_cuts(self) -> tuple[int, ...]:
        """Cuts that keep the input part, each layer and the output part whole (torchtitan's, Megatron's units)."""
        return tuple(c for c in (*self.starts, self.end) if 0 < c < self.segments)

    def item_cuts(self) -> tuple[int, ...]:
        """Cuts between DeepSpeed's layers: each segment outside the stack is a layer, each stacked layer one."""
        inside = {i for a, b in zip(self.starts, (*self.starts[1:], self.end)) for i in range(a + 1, b)}
        return tuple(i for i in range(1, self.segments) if i not in inside)

    def items(self, weights: Sequence[float]) -> list[float]:
        """Segment weights summed into DeepSpeed's layers (``item_cuts`` apart)."""
        bounds = [0, *self.item_cuts(), self.segments]
        return [sum(weights[a:b]) for a, b in zip(bounds, bounds[1:])]

    def stage_layers(self, cuts: Sequence[int]) -> list[list[int]]:
        """The stacked layers each stage of ``cuts`` (segment indices) holds, in order."""
        bounds = [0, *cuts, self.segments]
        return [[i for i, s in enumerate(self.starts) if a <= s < b] for a, b in zip(bounds, bounds[1:])]


def find_stack(names: Sequence[str]) -> Stack:
    """The one stack of numbered layers that every numbered segment belongs to, or a ValueError saying why not.

    A ViT's ``blocks.<i>``, GPT-2's ``transformer.h.<i>`` and Llama's ``model.layers.<i>`` are such stacks
    (at layer granularity a layer spans several segments); a ResNet's ``layer1.<i>`` ... ``layer4.<i>`` are
    four, which the frameworks' rules do not describe.
    """
    found = [(k, _indexed(n)) for k, n in enumerate(names)]
    numbered = [(k, p, i) for k, t in found if t is not None for p, i in [t]]
    prefixes = list(dict.fromkeys(p for _, p, _ in numbered))
    if not prefixes:
        raise NoStack("it has no stack of numbered layers (such as model.layers.<i> or blocks.<i>)")
    if len(prefixes) > 1:
        shown = ", ".join(prefixes[:4]) + (" ..." if len(prefixes) > 4 else "")
        raise NoStack(f"its layers form {len(prefixes)} stacks ({shown}), not one: the frameworks' rules "
                         "split one stack of layers")
    ks = [k for k, _, _ in numbered]
    if ks != list(range(ks[0], ks[-1] + 1)):
        raise NoStack(f"its stack {prefixes[0]} is interrupted by other segments")
    starts: list[int] = []
    last = -1
    for k, _, i in numbered:
        if i != last:
            if i != last + 1:
                where = f"after layer {last}" if last >= 0 else "first"
                raise NoStack(f"its stack {prefixes[0]} runs layer {i} {where}: the layers must run in order from 0")
            starts.append(k)
            last = i
    return Stack(prefix=prefixes[0], starts=tuple(starts), end=ks[-1] + 1, segments=len(names))


def nearest_allowed(cuts: Sequence[int], allowed: Sequence[int], prefix: Sequence[float]) -> tuple[int, ...]:
    """Each cut moved to the allowed cut nearest to it in ``prefix`` (the cumulative weight before each segment,
    ``len(prefix) == segments + 1``), increasing and distinct; a ValueError where too few are allowed."""
    pool = sorted(set(allowed))
    if len(pool) < len(cuts):
        raise ValueError(f"only {len(pool) + 1} stages can be made from the allowed cuts, not {len(cuts) + 1}")
    out: list[int] = []
    for k, c in enumerate(cuts):
        room = len(cuts) - k - 1
        usable = [a for a in pool if (not out or a > out[-1]) and sum(1 for b in pool if b > a) >= room]
        # a cut already allowed stays; another goes to the nearest by weight (ties: the nearer index)
        out.append(c if c in usable else min(usable, key=lambda a: (abs(prefix[a] - prefix[c]), abs(a - c), a)))
    return tuple(out)
