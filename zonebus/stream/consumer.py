"""A consumer: its state, configuration, delivery of one message, pause, info and persisted state.

The roles are mixins in their own modules: the cursor over the stream's filters and the choice of the next
message (`consumer_cursor`), pending messages, acks, ack-wait timers and redelivery (`consumer_acks`), and push
delivery with flow control and heartbeats (`consumer_push`); pull requests wait in a `PullQueue` (`pull`). This
module owns the state they share (created in `Consumer.__init__`), `kick`/`_run` (one delivery pass per loop
callback, push or pull) and `deliver`, which sends a message and records it as pending.

A consumer with `pause_until` in the future delivers nothing (pull requests wait, and expire) until then.
Everything runs on the event loop thread.
"""

from __future__ import annotations

import heapq
import logging
import time
from collections import deque
from typing import TYPE_CHECKING, Any

from zonebus.stream.config import format_time, parse_time
from zonebus.stream.consumer_acks import AckTracking, Pending
from zonebus.stream.consumer_config import filters_of
from zonebus.stream.consumer_cursor import ConsumerCursor
from zonebus.stream.consumer_push import BATCH_PER_TICK, PushDelivery
from zonebus.stream.priority import PIN_HEADER, PriorityPull
from zonebus.stream.pull import PullQueue, PullRequest, status

if TYPE_CHECKING:
    from zonebus.stream.stream import Stream

log = logging.getLogger(__name__)


class Consumer(ConsumerCursor, AckTracking, PushDelivery):
    def __init__(self, stream: Stream, name: str, cfg: dict[str, Any], created: int, durable: bool,
                 state: dict[str, Any] | None = None) -> None:
        self.stream = stream
        self.service = stream.service
        self.name = name
        self.created = created
        self.durable = durable
        self.closed = False
        self.waiting = PullQueue(self)
        self.run: list[tuple[str, bytes, str, bytes | None]] | None = None  # deliveries held for `end_run`
        self.prio = PriorityPull(self)  # priority groups: the pin, the choice of request (`priority`)
        self.pending: dict[int, Pending] = {}
        self._deadlines: list[tuple[float, int, int]] = []  # (deadline, sseq, dseq)
        self._redeliver: list[int] = []
        self._in_redeliver: set[int] = set()
        self._timer = None
        self._timer_due = 0.0
        self._kick_scheduled = False
        self._match_cache: dict[str, bool] = {}
        self._fc_outstanding: dict[str, int] = {}
        self._fc_bytes = 0
        self._hb_timer = None
        self._interest_timer = None
        self._pause_timer = None
        self._last_delivery = time.monotonic()
        self.last_active = time.monotonic()
        self._no_interest_since: float | None = None
        self._dirty = False
        self.apply_config(cfg)
        self.dseq = 0
        self.sseq = 0
        self.rdc: dict[int, int] = {}  # stream seq -> deliveries, for messages delivered more than once
        self.lps: deque[int] = deque()
        self.last_delivered_ts = 0
        if state is not None:
            self._restore(state)
        else:
            self._init_cursor()
        self.num_pending = self._count_pending()
        if self.push and cfg.get("idle_heartbeat"):
            self._schedule_heartbeat()

    # -- configuration -------------------------------------------------------------------------------
    def apply_config(self, cfg: dict[str, Any]) -> None:
        self.cfg = cfg
        flt = filters_of(cfg)
        self.filters: tuple[str, ...] | None = None if not flt or ">" in flt else tuple(flt)
        self._match_cache.clear()
        self.ack_policy = cfg["ack_policy"]
        self.ack_wait = cfg.get("ack_wait", 30 * 1_000_000_000) / 1e9
        self.backoff = [b / 1e9 for b in cfg.get("backoff", ())]
        self.max_deliver = cfg.get("max_deliver", -1)
        self.max_ack_pending = cfg.get("max_ack_pending", -1)
        self.push = cfg.get("deliver_subject", "")
        self.inactive_threshold = cfg.get("inactive_threshold", 0) / 1e9
        until = cfg.get("pause_until")
        self.pause_until = parse_time(until) if until else 0  # unix ns; 0 = not paused

    def update_config(self, cfg: dict[str, Any]) -> None:
        old_filters = self.filters
        self.apply_config(cfg)
        self._arm_pause()
        if self.filters != old_filters:
            self.lps = deque(s for s in self.lps if self.stream.store.subject_matches(s, self.filters))
            self.num_pending = self._count_pending()
        self.mark_dirty()
        self.kick()

    # -- delivery ------------------------------------------------------------------------------------
    def kick(self) -> None:
        if not self._kick_scheduled and not self.closed:
            self._kick_scheduled = True
            self.service.loop.call_soon(self._run)

    def _run(self) -> None:
        self._kick_scheduled = False
        if self.closed:
            return
        try:
            more = self._run_push() if self.push else self.waiting.serve(BATCH_PER_TICK)
        except Exception:  # a bug here must not stop the consumer for good
            log.exception("consumer %s > %s: delivery failed", self.stream.name, self.name)
            more = False
        if more:
            self.kick()

    def deliver(self, seq: int, redelivery: bool, to: str, pin: str | None = None) -> int:
        """Send message `seq` to `to` (with `Nats-Pin-Id: pin` unless None); returns the bytes sent (0 if the
        message vanished)."""
        msg = self.stream.store.load(seq)
        if redelivery:
            heapq.heappop(self._redeliver)
            self._in_redeliver.discard(seq)
        if msg is None:
            if redelivery:
                self.pending.pop(seq, None)
            elif self.lps and self.lps[0] == seq:
                self.lps.popleft()
            else:
                self.sseq = seq + 1
            return 0
        now = time.monotonic()
        self.dseq += 1
        dseq = self.dseq
        if redelivery:
            p = self.pending[seq]
            p.count += 1
            p.dseq = dseq
            count = p.count
            self.rdc[seq] = count
        else:
            count = 1
            if self.lps and self.lps[0] == seq:
                self.lps.popleft()
            else:
                self.sseq = seq + 1
            self.num_pending -= 1
        if self.ack_policy != "none":
            deadline = now + self._ack_wait_for(count)
            if redelivery:
                p.deadline = deadline
                p.ts = time.time_ns()
            else:
                self.pending[seq] = Pending(dseq, 1, deadline, time.time_ns())
            heapq.heappush(self._deadlines, (deadline, seq, dseq))
            self._arm_timer()
        reply = (f"$JS.ACK.{self.stream.name}.{self.name}.{count}.{seq}.{dseq}.{msg.ts}."
                 f"{max(self.num_pending, 0)}")
        hdrs, data = msg.hdrs, msg.data
        if self.cfg.get("headers_only"):
            extra = f"Nats-Msg-Size: {len(data)}\r\n".encode()
            hdrs = (hdrs[:-2] if hdrs else b"NATS/1.0\r\n") + extra + b"\r\n"
            data = b""
        if pin is not None:
            hdrs = (hdrs[:-2] if hdrs else b"NATS/1.0\r\n") + f"{PIN_HEADER}: {pin}\r\n\r\n".encode()
        if self.run is not None:  # (a pull request's batch: sent together by `end_run`)
            self.run.append((msg.subject, data, reply, hdrs))
        else:
            self.service.deliver(to, msg.subject, data, reply, hdrs)
        self._last_delivery = now
        self.last_active = now
        self.last_delivered_ts = time.time_ns()
        self.mark_dirty()
        if self.ack_policy == "none":
            self.stream.on_consumer_ack(seq)
        return len(data) + (len(hdrs) if hdrs else 0)

    def begin_run(self) -> bool:
        """Hold what `deliver` sends until `end_run` (every delivery of the run goes to the same subject); False
        (nothing changes) when a run is open already: its opener ends it."""
        if self.run is not None:
            return False
        self.run = []
        return True

    def end_run(self, to: str) -> None:
        """Send the deliveries held since `begin_run` to `to`, in order, in one pass."""
        run, self.run = self.run, None
        if run:
            self.service.deliver_run(to, run)  # type: ignore[arg-type]

    # -- pause -----------------------------------------------------------------------------------------
    def paused(self) -> bool:
        return self.pause_until > time.time_ns()

    def _arm_pause(self) -> None:
        """While paused, a timer resumes delivery at `pause_until`."""
        if self._pause_timer is not None:
            self._pause_timer.cancel()
            self._pause_timer = None
        if self.closed or not self.pause_until:
            return
        left = (self.pause_until - time.time_ns()) / 1e9
        if left > 0:
            self._pause_timer = self.service.loop.call_later(left + 0.001, self.kick)

    def pause_state(self, with_time: bool = False) -> dict[str, Any]:
        """`paused` and `pause_remaining` (ns) as consumer info and the pause API report them."""
        out: dict[str, Any] = {"paused": self.paused()}
        if with_time:
            out["pause_until"] = self.cfg.get("pause_until") or format_time(0)
        if out["paused"]:
            out["pause_remaining"] = self.pause_until - time.time_ns()
        return out

    # -- info and state ------------------------------------------------------------------------------
    def info(self) -> dict[str, Any]:
        fl_d, fl_s = self.ack_floor()
        delivered: dict[str, Any] = {"consumer_seq": self.dseq, "stream_seq": self.delivered_sseq}
        if self.last_delivered_ts:
            delivered["last_active"] = format_time(self.last_delivered_ts)
        out: dict[str, Any] = {
            "stream_name": self.stream.name,
            "name": self.name,
            "created": format_time(self.created),
            "config": self.cfg,
            "delivered": delivered,
            "ack_floor": {"consumer_seq": fl_d, "stream_seq": fl_s},
            "num_ack_pending": len(self.pending),
            "num_redelivered": len(self.rdc),
            "num_waiting": len(self.waiting),
            "num_pending": max(self.num_pending, 0),
        }
        if self.push_bound():
            out["push_bound"] = True
        if self.pause_until and self.paused():
            out.update(self.pause_state())
        if self.service.stream_cluster is not None:  # clustered: the consumer lives with its stream's leader
            out["cluster"] = self.service.stream_cluster(self.stream)
        out["ts"] = format_time(time.time_ns())
        out.update(self.prio.info())
        return out

    def mark_dirty(self) -> None:
        if self.durable and not self._dirty:
            self._dirty = True
            self.service.schedule_state_flush(self)

    def state_dict(self) -> dict[str, Any]:
        self._dirty = False
        return {
            "sseq": self.sseq,
            "dseq": self.dseq,
            "rdc": [[s, n] for s, n in self.rdc.items()],
            "lps": list(self.lps),
            "pending": [[s, p.dseq, p.first_dseq, p.count, p.ts] for s, p in self.pending.items()],
        }

    def _restore(self, st: dict[str, Any]) -> None:
        self.sseq = st["sseq"]
        self.dseq = st["dseq"]
        self.rdc = {s: n for s, n in st.get("rdc", ())}
        self.lps = deque(st.get("lps", ()))
        now = time.monotonic()
        idx = self.stream.store.index
        for s, dseq, first, count, ts in st.get("pending", ()):
            if not idx.has(s):
                continue
            p = Pending(dseq, count, now + self._ack_wait_for(count), ts)
            p.first_dseq = first
            self.pending[s] = p
            heapq.heappush(self._deadlines, (p.deadline, s, dseq))
        if self.sseq < idx.first_seq:
            self.sseq = idx.first_seq

    def start(self) -> None:
        self._arm_timer()
        self._arm_pause()
        self.kick()

    def stop(self, deleted: bool = False) -> None:
        """Stop timers; when `deleted`, waiting pull requests hear `409 Consumer Deleted`."""
        self.closed = True
        for t in (self._timer, self._hb_timer, self._interest_timer, self._pause_timer):
            if t is not None:
                t.cancel()
        self._timer = self._hb_timer = self._interest_timer = self._pause_timer = None
        self.prio.stop()
        self.waiting.close(status(409, "Consumer Deleted") if deleted else None)

    def is_inactive(self, now: float) -> bool:
        """Past the inactive threshold: no interest (push) or no pull requests, acks or deliveries."""
        if self.inactive_threshold <= 0:
            return False
        if self.push:
            if self.service.has_interest(self.push):
                self._no_interest_since = None
                return False
            if self._no_interest_since is None:
                self._no_interest_since = now
            return now - self._no_interest_since >= self.inactive_threshold
        if len(self.waiting):
            return False
        return now - self.last_active >= self.inactive_threshold


__all__ = ["Consumer", "PullRequest"]
