"""A consumer's acknowledgements and redeliveries (a mixin of `Consumer`).

Messages delivered and not yet acked live in `pending` (`Pending`, by stream sequence); an ack-wait timer (a
heap of deadlines, `backoff` per delivery count when set) moves expired ones to the redelivery queue, which
`next_seq` serves before new messages, until `max_deliver` attempts. Acks come as nats-server's bodies: `+ACK`
(or empty), `-NAK` (with an optional delay), `+WPI` (more time), `+NXT` (ack and pull the next) and `+TERM`;
`ack_policy: all` acknowledges everything up to the sequence. The ack floor is what consumer info reports.
Runs on the event loop thread.
"""

from __future__ import annotations

import heapq
import json
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from zonebus.stream.consumer import Consumer


class Pending:
    """A message delivered and not acknowledged yet (by its stream sequence in `Consumer.pending`)."""

    __slots__ = ("dseq", "first_dseq", "count", "deadline", "ts")

    def __init__(self, dseq: int, count: int, deadline: float, ts: int) -> None:
        self.dseq = dseq
        self.first_dseq = dseq
        self.count = count
        self.deadline = deadline
        self.ts = ts  # wall time of the last delivery (ns)


class AckTracking:
    """Pending messages, acks, ack-wait timers and the redelivery queue, mixed into `Consumer`."""

    def _ack_wait_for(self: Consumer, count: int) -> float:
        if self.backoff:
            return self.backoff[min(count - 1, len(self.backoff) - 1)]
        return self.ack_wait

    def on_ack(self: Consumer, sseq: int, dseq: int, body: bytes, reply: str | None) -> None:
        self.last_active = time.monotonic()
        verb, _, rest = body.strip().partition(b" ")
        if verb in (b"", b"+ACK"):
            self._ack(sseq)
        elif verb == b"-NAK":
            self._nak(sseq, rest)
        elif verb == b"+WPI":
            p = self.pending.get(sseq)
            if p is not None and sseq not in self._in_redeliver:
                p.deadline = time.monotonic() + self._ack_wait_for(p.count)
                heapq.heappush(self._deadlines, (p.deadline, sseq, p.dseq))
                self._arm_timer()
        elif verb == b"+NXT":
            self._ack(sseq)
            if reply and not self.push:
                self.waiting.add(reply, rest or b"")
                reply = None
        elif verb == b"+TERM" and self.pending.pop(sseq, None) is not None:
            self._in_redeliver.discard(sseq)
            self.rdc.pop(sseq, None)
            self.mark_dirty()
            self.stream.on_consumer_ack(sseq)
        if reply:
            self.service.send(reply, b"")

    def _ack(self: Consumer, sseq: int) -> None:
        if self.ack_policy == "all":
            done = [s for s in self.pending if s <= sseq]
        else:
            done = [sseq] if sseq in self.pending else []
        for s in done:
            del self.pending[s]
            self._in_redeliver.discard(s)
            self.rdc.pop(s, None)
        if done:
            self.mark_dirty()
            for s in done:
                self.stream.on_consumer_ack(s)
            self.kick()

    def _nak(self: Consumer, sseq: int, rest: bytes) -> None:
        p = self.pending.get(sseq)
        if p is None:
            return
        delay = 0.0
        if rest:
            try:
                delay = float(json.loads(rest).get("delay", 0)) / 1e9
            except (ValueError, AttributeError, TypeError):
                delay = 0.0
        if delay > 0:
            p.deadline = time.monotonic() + delay
            heapq.heappush(self._deadlines, (p.deadline, sseq, p.dseq))
            self._arm_timer()
        else:
            self._queue_redelivery(sseq)

    def _queue_redelivery(self: Consumer, sseq: int) -> None:
        if sseq not in self._in_redeliver:
            self._in_redeliver.add(sseq)
            heapq.heappush(self._redeliver, sseq)
        self.kick()

    def _arm_timer(self: Consumer) -> None:
        if not self._deadlines or self.closed:
            return
        due = self._deadlines[0][0]
        if self._timer is not None:
            if self._timer_due <= due + 0.001:
                return
            self._timer.cancel()
        self._timer_due = due
        self._timer = self.service.loop.call_later(max(due - time.monotonic(), 0.0), self._on_timer)

    def _on_timer(self: Consumer) -> None:
        self._timer = None
        now = time.monotonic()
        dl = self._deadlines
        while dl and dl[0][0] <= now:
            deadline, sseq, dseq = heapq.heappop(dl)
            p = self.pending.get(sseq)
            if p is None or p.dseq != dseq or p.deadline != deadline or sseq in self._in_redeliver:
                continue
            if 0 < self.max_deliver <= p.count:
                del self.pending[sseq]  # delivery attempts exhausted
                self.mark_dirty()
                self.stream.on_consumer_ack(sseq)
                continue
            self._queue_redelivery(sseq)
        self._arm_timer()

    def ack_floor(self: Consumer) -> tuple[int, int]:
        if self.ack_policy == "none" or not self.pending:
            return self.dseq, self.delivered_sseq
        low = min(self.pending)
        return min(p.first_dseq for p in self.pending.values()) - 1, low - 1
