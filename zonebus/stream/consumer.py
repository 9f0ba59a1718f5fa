"""A consumer: a cursor over the stream's filters, pending/ack state, redelivery timers, pull and push delivery.

The cursor (`sseq`) is the next stream sequence to consider for a first delivery; the next message is the
lowest live sequence >= sseq matching any filter (the store's subject index answers that without a scan),
so messages of several filters arrive interleaved in stream order, each once, with contiguous consumer
sequences. Messages delivered and not yet acked live in `pending`; an ack-wait timer (a heap of deadlines)
moves expired ones to the redelivery queue, which is served before new messages.

A consumer with `pause_until` in the future delivers nothing (pull requests wait, and expire) until then.
"""

from __future__ import annotations

import heapq
import json
import logging
import time
from collections import deque
from typing import TYPE_CHECKING, Any

from zonebus.stream.config import format_time, parse_time
from zonebus.stream.consumer_config import filters_of
from zonebus.stream.pull import PullQueue, PullRequest, status
from zonebus.subjects.patterns import matches

if TYPE_CHECKING:
    from zonebus.stream.stream import Stream

log = logging.getLogger(__name__)

BATCH_PER_TICK = 128  # deliveries per loop callback before yielding (and letting the server flush)
FC_EVERY_BYTES = 1024 * 1024  # push flow control: ask for a response after this many bytes
FC_MAX_OUTSTANDING = 2


class Pending:
    __slots__ = ("dseq", "first_dseq", "count", "deadline", "ts")

    def __init__(self, dseq: int, count: int, deadline: float, ts: int) -> None:
        self.dseq = dseq
        self.first_dseq = dseq
        self.count = count
        self.deadline = deadline
        self.ts = ts  # wall time of the last delivery (ns)


class Consumer:
    def __init__(self, stream: Stream, name: str, cfg: dict[str, Any], created: int, durable: bool,
                 state: dict[str, Any] | None = None) -> None:
        self.stream = stream
        self.service = stream.service
        self.name = name
        self.created = created
        self.durable = durable
        self.closed = False
        self.waiting = PullQueue(self)
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

    def matches(self, subject: str) -> bool:
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

    def _init_cursor(self) -> None:
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
    def delivered_sseq(self) -> int:
        """Stream sequence reported as delivered: everything below the cursor was considered."""
        return (self.lps[0] if self.lps else self.sseq) - 1

    def _count_pending(self) -> int:
        return self.stream.store.count(self.sseq, self.filters) + len(self.lps)

    # -- stream events -------------------------------------------------------------------------------
    def on_new_msg(self, seq: int, subject: str) -> None:
        if seq >= self.sseq and self.matches(subject):
            self.num_pending += 1
            self.kick()

    def on_removed(self, seq: int, subject: str) -> None:
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

    def on_purged(self, removed: list[tuple[int, str]], first_seq: int) -> None:
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

    def done_with(self, seq: int) -> bool:
        """Has this consumer delivered and (if it acks) had `seq` acknowledged?"""
        if seq >= self.sseq or seq in self.lps:
            return False
        return seq not in self.pending

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

    def can_deliver_new(self) -> bool:
        return self.max_ack_pending <= 0 or self.ack_policy == "none" or len(self.pending) < self.max_ack_pending

    def next_seq(self) -> tuple[int, bool]:
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

    def msg_size(self, seq: int) -> int:
        meta = self.stream.store.index.meta(seq)
        return meta[1] if meta else 0

    def deliver(self, seq: int, redelivery: bool, to: str) -> int:
        """Send message `seq` to `to`; returns the bytes sent (0 if the message vanished)."""
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
        self.service.deliver(to, msg.subject, data, reply, hdrs)
        self._last_delivery = now
        self.last_active = now
        self.last_delivered_ts = time.time_ns()
        self.mark_dirty()
        if self.ack_policy == "none":
            self.stream.on_consumer_ack(seq)
        return len(data) + (len(hdrs) if hdrs else 0)

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

    def _ack_wait_for(self, count: int) -> float:
        if self.backoff:
            return self.backoff[min(count - 1, len(self.backoff) - 1)]
        return self.ack_wait

    # -- push ----------------------------------------------------------------------------------------
    def _run_push(self) -> bool:
        if not self.service.has_interest(self.push):
            self._watch_interest()
            return False
        self._no_interest_since = None
        for _ in range(BATCH_PER_TICK):
            if len(self._fc_outstanding) >= FC_MAX_OUTSTANDING:
                return False
            seq, redelivery = self.next_seq()
            if not seq:
                return False
            sent = self.deliver(seq, redelivery, self.push)
            if self.cfg.get("flow_control"):
                self._fc_bytes += sent
                if self._fc_bytes >= FC_EVERY_BYTES:
                    self._send_flow_control()
        return True

    def _send_flow_control(self) -> None:
        self._fc_bytes = 0
        token = f"$JS.FC.{self.stream.name}.{self.name}.{self.dseq}"
        self._fc_outstanding[token] = self.dseq
        self.service.register_fc(token, self)
        self.service.send(self.push, b"", reply=token, headers=b"NATS/1.0 100 FlowControl Request\r\n\r\n")

    def on_flow_control_reply(self, token: str) -> None:
        if self._fc_outstanding.pop(token, None) is not None:
            self.kick()

    def _watch_interest(self) -> None:
        now = time.monotonic()
        if self._no_interest_since is None:
            self._no_interest_since = now
        if self._interest_timer is None and not self.closed:
            self._interest_timer = self.service.loop.call_later(0.05, self._interest_poll)

    def _interest_poll(self) -> None:
        self._interest_timer = None
        if self.closed:
            return
        if self.service.has_interest(self.push):
            self._no_interest_since = None
            self.kick()
        elif self.next_seq()[0]:
            self._interest_timer = self.service.loop.call_later(0.05, self._interest_poll)

    def push_bound(self) -> bool:
        return bool(self.push) and self.service.has_interest(self.push)

    def _schedule_heartbeat(self) -> None:
        interval = self.cfg["idle_heartbeat"] / 1e9
        self._hb_timer = self.service.loop.call_later(interval, self._heartbeat)

    def _heartbeat(self) -> None:
        self._hb_timer = None
        if self.closed:
            return
        interval = self.cfg["idle_heartbeat"] / 1e9
        if time.monotonic() - self._last_delivery >= interval * 0.95:
            hdr = (f"NATS/1.0 100 Idle Heartbeat\r\nNats-Last-Consumer: {self.dseq}\r\n"
                   f"Nats-Last-Stream: {self.delivered_sseq}\r\n")
            if self._fc_outstanding:
                hdr += f"Nats-Consumer-Stalled: {next(iter(self._fc_outstanding))}\r\n"
            self.service.send(self.push, b"", headers=(hdr + "\r\n").encode())
        self._schedule_heartbeat()

    # -- acks ----------------------------------------------------------------------------------------
    def on_ack(self, sseq: int, dseq: int, body: bytes, reply: str | None) -> None:
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

    def _ack(self, sseq: int) -> None:
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

    def _nak(self, sseq: int, rest: bytes) -> None:
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

    def _queue_redelivery(self, sseq: int) -> None:
        if sseq not in self._in_redeliver:
            self._in_redeliver.add(sseq)
            heapq.heappush(self._redeliver, sseq)
        self.kick()

    def _arm_timer(self) -> None:
        if not self._deadlines or self.closed:
            return
        due = self._deadlines[0][0]
        if self._timer is not None:
            if self._timer_due <= due + 0.001:
                return
            self._timer.cancel()
        self._timer_due = due
        self._timer = self.service.loop.call_later(max(due - time.monotonic(), 0.0), self._on_timer)

    def _on_timer(self) -> None:
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

    # -- info and state ------------------------------------------------------------------------------
    def ack_floor(self) -> tuple[int, int]:
        if self.ack_policy == "none" or not self.pending:
            return self.dseq, self.delivered_sseq
        low = min(self.pending)
        return min(p.first_dseq for p in self.pending.values()) - 1, low - 1

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
