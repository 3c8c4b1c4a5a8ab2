"""Every policy name in one place: the pure rules of ``pipeline.core.policies`` and the frameworks' rules."""

from __future__ import annotations

from pipeline.core.policies import ALIASES, PIPPY, Policy
from pipeline.core.policies import POLICIES as PURE
from pipeline.peers.rules import PEERS

__all__ = ["DEFAULT_RULES", "PIPPY", "POLICIES", "policy"]

POLICIES: dict[str, Policy] = {**PURE, **PEERS}
"""What ``pipeline.run --policy``, the search's seeds and the sweep's report know by name."""
DEFAULT_RULES = tuple(n for n, p in PEERS.items() if p.default_rule)
"""What each framework does when its user sets nothing: torchtitan, megatron, deepspeed-parameters."""


def policy(name: str) -> Policy:
    """The policy called ``name`` (or an older alias of it); a ValueError lists the names there are."""
    found = POLICIES.get(ALIASES.get(name, name))
    if found is None:
        raise ValueError(f"policy {name!r} is unknown: use one of {', '.join(POLICIES)}")
    return found
