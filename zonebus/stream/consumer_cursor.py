"""A consumer's cursor and the choice of the next message to deliver (a mixin of `Consumer`).

The cursor (`sseq`) is the next stream sequence to consider for a first delivery; the next message is the
lowest live sequence >= sseq matching any filter (the store's subject index answers that without a scan),
so messages of several filters arrive interleaved in stream order, each once, with contiguous consumer
sequences (`deliver_policy: last_per_subject` first serves `lps`, the last message of each subject).
Redeliveries are served before new messages; new ones stop at `max_ack_pending` and at what the store shows
(`visible_seq`: a shared store's messages only once durable). The stream's events (a new, removed or purged
message) keep `num_pending` and the cursor right. Runs on the event loop thread.
"""

from __future__ import annotations

import heapq
from collections import deque
from typing import TYPE_CHECKING

from zonebus.stream.config import parse_time
from zonebus.subjects.patterns import matches

if TYPE_CHECKING:
    from zonebus.stream.consumer import Consumer


class ConsumerCursor:
    """The cursor, filters and the next sequence, mixed into `Consumer`."""

    def matches(self: Consumer, subject: str) -> bool:
        filters = self.filters
        if filters is None:
            return True
        hit = self._match_cache.get(subject)
        if hit is None:
            hit = any(matches(f, subject) for f in filters)
            if len(self._match_cache) > 10_000:
                self._match_cache.clear()
            self._match_cache[subject] = hit
        return hit

    def _init_cursor(self: Consumer) -> None:
        idx = self.stream.store.index
        policy = self.cfg["deliver_policy"]
        first, last = idx.first_seq, idx.last_seq
        if policy == "all":
            start = first
        elif policy == "last":
            seq = idx.last_seq_for(self.filters)
            start = seq if seq else last + 1
        elif policy == "new":
            start = last + 1
        elif policy == "by_start_sequence":
            start = max(self.cfg["opt_start_seq"], 1)
        elif policy == "by_start_time":
            seq = idx.seq_at_time(parse_time(self.cfg["opt_start_time"]))
            start = seq if seq else last + 1
        else:  # last_per_subject
            self.lps = deque(idx.last_per_subject(self.filters))
            start = last + 1
        self.sseq = start

    @property
    def delivered_sseq(self: Consumer) -> int:
        """Stream sequence reported as delivered: everything below the cursor was considered."""
        return (self.lps[0] if self.lps else self.sseq) - 1

    def _count_pending(self: Consumer) -> int:
        return self.stream.store.count(self.sseq, self.filters) + len(self.lps)

    # -- stream events -------------------------------------------------------------------------------
    def on_new_msg(self: Consumer, seq: int, subject: str) -> None:
        if seq >= self.sseq and self.matches(subject):
            self.num_pending += 1
            self.kick()

    def on_new_msgs(self: Consumer, first: int, subjects: list[str | None]) -> None:
        """`on_new_msg` for messages `first`, `first` + 1, ... (their subjects; None: one no longer stored)."""
        start, n = self.sseq, 0
        for seq, subject in enumerate(subjects, first):
            if subject is not None and seq >= start and self.matches(subject):
                n += 1
        if n:
            self.num_pending += n
            self.kick()

    def on_removed(self: Consumer, seq: int, subject: str) -> None:
        if self.lps and seq in self.lps:
            self.lps.remove(seq)
            self.num_pending -= 1
        elif seq >= self.sseq and self.matches(subject):
            self.num_pending -= 1
        self.rdc.pop(seq, None)
        p = self.pending.pop(seq, None)
        if p is not None:
            self._in_redeliver.discard(seq)
            self.mark_dirty()

    def on_purged(self: Consumer, removed: list[tuple[int, str]], first_seq: int) -> None:
        for seq, _subj in removed:
            if self.pending.pop(seq, None) is not None:
                self._in_redeliver.discard(seq)
        self.lps = deque(s for s in self.lps if s >= first_seq and self.stream.store.index.has(s))
        if self.sseq < first_seq:
            self.sseq = first_seq
        for seq, _subj in removed:
            self.rdc.pop(seq, None)
        self.num_pending = self._count_pending()
        self.mark_dirty()

    def done_with(self: Consumer, seq: int) -> bool:
        """Has this consumer delivered and (if it acks) had `seq` acknowledged?"""
        if seq >= self.sseq or seq in self.lps:
            return False
        return seq not in self.pending

    def can_deliver_new(self: Consumer) -> bool:
        return self.max_ack_pending <= 0 or self.ack_policy == "none" or len(self.pending) < self.max_ack_pending

    def next_seq(self: Consumer) -> tuple[int, bool]:
        """(stream sequence of the next message to deliver, is it a redelivery); (0, False) when none."""
        if self.pause_until and self.paused():
            return 0, False
        while self._redeliver:
            seq = self._redeliver[0]
            if seq in self._in_redeliver and seq in self.pending:
                return seq, True
            heapq.heappop(self._redeliver)
            self._in_redeliver.discard(seq)
        if not self.can_deliver_new():
            return 0, False
        store = self.stream.store
        idx = store.index
        visible = store.visible_seq()  # a shared store's messages are delivered only once durable
        while self.lps:
            seq = self.lps[0]
            if idx.has(seq):
                return (seq, False) if seq <= visible else (0, False)
            self.lps.popleft()
        seq = idx.next_seq(self.sseq, self.filters)
        if seq > visible:
            return 0, False
        if not seq and self.sseq <= idx.last_seq:
            self.sseq = idx.last_seq + 1  # scanned to the end: nothing below here matches
        return seq, False

    def msg_size(self: Consumer, seq: int) -> int:
        meta = self.stream.store.index.meta(seq)
        return meta[1] if meta else 0
