"""Expiry of a stream's messages: `max_age` (one timer for the oldest message it applies to) and per-message TTLs
(`Nats-TTL`, a heap of due times, one timer), with subject delete markers (`subject_delete_marker_ttl`) left where
an expired message was its subject's last (a mixin of `zonebus.stream.stream.Stream`; runs on the event loop).
"""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING

from zonebus.store.msgstore import now_ns
from zonebus.stream.ttl import MARKER_REASON, NEVER, marker_headers, parse_msg_ttl

if TYPE_CHECKING:
    from zonebus.stream.stream import Stream


class Expiry:
    """`max_age` and per-message TTL timers, mixed into `Stream`."""

    def schedule_age_check(self: Stream) -> None:
        if self._age_timer is not None:
            self._age_timer.cancel()
            self._age_timer = None
        max_age = self.cfg["max_age"]
        if not max_age or self.closed:
            return
        idx = self.store.index
        seq = self._first_aging()
        meta = idx.meta(seq) if seq else None
        if meta is None:
            return
        due = (meta[2] + max_age - now_ns()) / 1e9
        self._age_timer = self.service.loop.call_later(max(due, 0.001) + 0.001, self._expire_aged)

    def _first_aging(self: Stream) -> int:
        """The oldest message max_age applies to (not `Nats-TTL: never`), or 0."""
        idx = self.store.index
        if not idx.msgs:
            return 0
        if not self._never:
            return idx.first_seq
        for seq in idx.live_seqs(idx.first_seq):
            if seq not in self._never:
                return seq
        return 0

    def _expire_aged(self: Stream) -> None:
        self._age_timer = None
        horizon = now_ns() - self.cfg["max_age"]
        idx = self.store.index
        while True:
            seq = self._first_aging()
            meta = idx.meta(seq) if seq else None
            if meta is None or meta[2] > horizon:
                break
            self._expire_msg(seq)
        self.schedule_age_check()

    # -- per-message TTL and subject delete markers ----------------------------------------------------
    def _track_ttl(self: Stream, seq: int, ts: int, ttl: int) -> None:
        if ttl == NEVER:
            self._never.add(seq)
            return
        heapq.heappush(self._ttls, (ts + ttl * 1_000_000_000, seq))
        self._arm_ttl()

    def _arm_ttl(self: Stream) -> None:
        if not self._ttls or self.closed:
            return
        due = self._ttls[0][0]
        if self._ttl_timer is not None:
            if self._ttl_due <= due:
                return
            self._ttl_timer.cancel()
        self._ttl_due = due
        self._ttl_timer = self.service.loop.call_later(max((due - now_ns()) / 1e9, 0.0) + 0.001, self._expire_ttls)

    def _expire_ttls(self: Stream) -> None:
        self._ttl_timer = None
        now = now_ns()
        while self._ttls and self._ttls[0][0] <= now:
            _due, seq = heapq.heappop(self._ttls)
            if self.store.index.has(seq):
                self._expire_msg(seq)
        self._arm_ttl()

    def _expire_msg(self: Stream, seq: int) -> None:
        """Remove an aged or TTL-expired message; with `subject_delete_marker_ttl`, leave a marker on its
        subject when it was the subject's last message (markers themselves leave none)."""
        sdm = self.cfg.get("subject_delete_marker_ttl", 0)
        subject = None
        if sdm:
            msg = self.store.load(seq)
            if msg is not None and not (msg.hdrs and MARKER_REASON in msg.hdrs):
                subject = msg.subject
        self.remove_msg(seq)
        self._never.discard(seq)
        if subject is not None:
            left = self.store.index.subject_seqs(subject)
            if left is None or not len(left):
                self._process(subject, marker_headers(sdm), b"", internal=True)

    def _rebuild_ttls(self: Stream) -> None:
        if not self.cfg.get("allow_msg_ttl"):
            return
        from zonebus.stream.stream import parse_headers  # (the stream module imports this one)

        idx = self.store.index
        for seq in idx.live_seqs(idx.first_seq):
            msg = self.store.load(seq)
            if msg is None or not msg.hdrs or b"Nats-TTL" not in msg.hdrs:
                continue
            ttl = parse_msg_ttl(parse_headers(msg.hdrs).get("Nats-TTL", ""))
            if ttl == NEVER:
                self._never.add(seq)
            elif ttl:
                heapq.heappush(self._ttls, (msg.ts + ttl * 1_000_000_000, seq))
        if self._ttls and self.service.loop is not None:
            self._arm_ttl()
