"""Which member of a queue group gets a message, across a cluster.

Stock NATS: a weighted random draw over every member in the cluster (a local member counts 1, a route
counts the number of members behind it). With `prefer_matching_tags` the draw happens in the first
non-empty tier: members on this server > members on peers whose server_tags share a tag with ours >
any other member. Nothing is dropped: if a tier is empty the next one is used.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from operator import attrgetter
from typing import Any

LOCAL, MATCHING, OTHER = 0, 1, 2
_WEIGHT = attrgetter("weight")


def weighted_choice(members: Sequence[Any], rng: random.Random,
                    weight_of: Callable[[Any], int] | None = None) -> Any:
    """Pick a member with probability proportional to its `weight` (or to `weight_of(member)`)."""
    if len(members) == 1:
        return members[0]
    weight = _WEIGHT if weight_of is None else weight_of
    x = rng.random() * sum(map(weight, members))
    for m in members:
        x -= weight(m)
        if x < 0:
            return m
    return members[-1]


def pick_member(members: Sequence[Any], tier_of: Callable[[Any], int], prefer_tags: bool,
                rng: random.Random) -> Any:
    """One member of a queue group; `tier_of(member)` is LOCAL, MATCHING or OTHER."""
    if not members:
        return None
    if not prefer_tags:
        return weighted_choice(members, rng)
    tiers: list[list[Any]] = [[], [], []]
    for m in members:
        tiers[tier_of(m)].append(m)
    for tier in tiers:
        if tier:
            return weighted_choice(tier, rng)
    return None


def tags_overlap(a: Sequence[str], b: Sequence[str]) -> bool:
    return bool(set(a) & set(b))
