"""The publish interceptor (zonebus.server.hooks.PublishInterceptor) for durable queue groups.

For a subject of a durable group it (1) removes that group's members from the match result, so the core
never routes to them (the group's primary pushes instead), and (2) captures the message when it was published
on this server (a client or an internal client): `on_capture` stores it or forwards it to the primary. A
message that came over a route or a gateway was captured where it was published. Answers are cached per
subject and per match result, so a group subject costs a dict lookup after the first message.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from zonebus.options import QueueGroupOptions
from zonebus.queue.model import group_of
from zonebus.server.connection import CLIENT, INTERNAL
from zonebus.subjects.sublist import MatchResult

# (group, subject, reply, hdr_len, data) of a captured message
Capture = Callable[[QueueGroupOptions, bytes, "bytes | None", int, bytes], None]
_CACHE_MAX = 10_000


class Interceptor:
    def __init__(self, on_capture: Capture) -> None:
        self.on_capture = on_capture
        self.groups: dict[str, QueueGroupOptions] = {}
        self._group_of: dict[bytes, QueueGroupOptions | None] = {}
        self._filtered: dict[bytes, tuple[MatchResult, MatchResult]] = {}

    def set_groups(self, groups: dict[str, QueueGroupOptions]) -> None:
        self.groups = dict(groups)
        self._group_of.clear()
        self._filtered.clear()

    def __call__(self, src: Any, subject: bytes, reply: bytes | None, hdr_len: int, data: bytes,
                 r: MatchResult) -> tuple[MatchResult, bool] | None:
        cache = self._group_of
        group = cache.get(subject, False)
        if group is False:
            if len(cache) > _CACHE_MAX:
                cache.clear()
                self._filtered.clear()
            group = cache[subject] = group_of(self.groups, subject.decode(errors="replace"))
        if group is None:
            return None
        taken = src.kind == CLIENT or src.kind == INTERNAL
        if taken:
            self.on_capture(group, subject, reply, hdr_len, data)
        return self._without(subject, r, group.name.encode()), taken

    def _without(self, subject: bytes, r: MatchResult, queue: bytes) -> MatchResult:
        hit = self._filtered.get(subject)
        if hit is not None and hit[0] is r:
            return hit[1]
        out = r
        if any(g and g[0].queue == queue for g in r.qsubs):
            out = MatchResult(r.psubs, [g for g in r.qsubs if not (g and g[0].queue == queue)])
        self._filtered[subject] = (r, out)
        return out
