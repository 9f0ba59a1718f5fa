"""Pull requests (`$JS.API.CONSUMER.MSG.NEXT.<stream>.<consumer>`): the waiting queue of one consumer.

A request asks for `batch` messages (optionally at most `max_bytes`), waits up to `expires`, or with
`no_wait` answers at once; the replies are the messages themselves and status messages without payload:
`404 No Messages`, `408 Request Timeout` (with the unfilled batch and bytes), `409 ...` (limits, deleted
consumer) and `100 Idle Heartbeat` while a request waits. A consumer with a priority policy checks, queues
and serves its requests by the rules of `zonebus.stream.priority`. A request may carry a horizon
(`zonebus.stream.hooks.Horizon`, the zone router's): it gets no message above that sequence until the horizon
rises, and the requests behind it are served meanwhile.
"""

from __future__ import annotations

import json
import time
from collections import deque
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from zonebus.stream.consumer import Consumer
    from zonebus.stream.hooks import Horizon

FILL_SLICE = 128  # messages delivered per loop callback; outbound data is flushed between slices


def status(code: int, desc: str, extra: dict[str, Any] | None = None) -> bytes:
    lines = [f"NATS/1.0 {code} {desc}"]
    for k, v in (extra or {}).items():
        lines.append(f"{k}: {v}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


class PullRequest:
    __slots__ = ("reply", "batch", "max_bytes", "expires", "no_wait", "hb", "sent", "done", "timers",
                 "last_sent", "pg", "horizon")

    def __init__(self, reply: str, batch: int, max_bytes: int, expires: float, no_wait: bool, hb: float):
        self.reply = reply
        self.batch = batch  # messages still wanted
        self.max_bytes = max_bytes  # bytes still allowed (0 = no limit)
        self.expires = expires  # seconds, 0 = never
        self.no_wait = no_wait
        self.hb = hb
        self.horizon: Horizon | None = None  # the highest sequence it may get now (zonebus.stream.hooks)
        self.sent = 0
        self.done = False
        self.timers: list = []
        self.last_sent = time.monotonic()
        self.pg: Any = None  # the request's priority fields (priority.PullGroup), None without a JSON body

    def took(self, size: int) -> None:
        """A message of `size` bytes went to this request: one fewer wanted, its bytes off the budget."""
        self.sent += 1
        self.batch -= 1
        self.last_sent = time.monotonic()
        if self.max_bytes:
            self.max_bytes -= size
            if self.max_bytes <= 0:
                self.batch = 0


def parse_request(body: bytes) -> tuple[int, int, float, bool, float]:
    """(batch, max_bytes, expires seconds, no_wait, heartbeat seconds); bad bodies read as batch 1."""
    body = body.strip()
    if not body:
        return 1, 0, 0.0, False, 0.0
    if body.isdigit():
        return max(int(body), 1), 0, 0.0, False, 0.0
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return 1, 0, 0.0, False, 0.0
    if not isinstance(doc, dict):
        return 1, 0, 0.0, False, 0.0

    def num(key: str) -> int:
        v = doc.get(key, 0)
        return int(v) if isinstance(v, int | float) and not isinstance(v, bool) and v > 0 else 0

    return max(num("batch"), 1), num("max_bytes"), num("expires") / 1e9, doc.get("no_wait") is True, \
        num("idle_heartbeat") / 1e9


class PullQueue:
    def __init__(self, consumer: Consumer) -> None:
        self.c = consumer
        self.q: deque[PullRequest] = deque()
        self.held_back = False  # the last `_fill` stopped at its request's horizon

    def __len__(self) -> int:
        return len(self.q)

    def add(self, reply: str, body: bytes, horizon: Horizon | None = None) -> None:
        c = self.c
        svc = c.service
        if c.push:
            svc.send(reply, b"", headers=status(409, "Consumer is push based"))
            return
        batch, max_bytes, expires, no_wait, hb = parse_request(body)
        cfg = c.cfg
        if cfg.get("max_batch") and batch > cfg["max_batch"]:
            svc.send(reply, b"", headers=status(409, f"Exceeded MaxRequestBatch of {cfg['max_batch']}"))
            return
        if cfg.get("max_expires") and (expires == 0 or expires * 1e9 > cfg["max_expires"]):
            svc.send(reply, b"", headers=status(409, f"Exceeded MaxRequestExpires of {cfg['max_expires'] / 1e9}s"))
            return
        if cfg.get("max_bytes") and max_bytes > cfg["max_bytes"]:
            svc.send(reply, b"", headers=status(409, f"Exceeded MaxRequestMaxBytes of {cfg['max_bytes']}"))
            return
        prio = c.prio if cfg.get("priority_policy") else None
        pg, refusal = c.prio.read(body)
        if refusal is not None:
            svc.send(reply, b"", headers=refusal)
            return
        c.last_active = time.monotonic()
        req = PullRequest(reply, batch, max_bytes, expires, no_wait, hb)
        req.pg = pg
        req.horizon = horizon
        if len(self.q) >= cfg.get("max_waiting", 512):
            svc.send(reply, b"", headers=status(409, "Exceeded MaxWaiting"))
            return
        if prio is not None:  # served one message at a time, to the request the policy picks
            prio.add(self, req)
            return
        more = False
        if not self.q:
            # deliver a first slice now; the rest follows from the loop so the server can flush meanwhile
            more = self._fill(req, FILL_SLICE) >= FILL_SLICE
            if req.done:
                return
        if no_wait and not more and (not expires or req.sent):
            self.finish(req, status(404, "No Messages"))
            return
        self.q.append(req)
        self.arm(req)
        if more:
            c.kick()

    def arm(self, req: PullRequest) -> None:
        """Start a waiting request's expiry and heartbeat timers."""
        loop = self.c.service.loop
        if req.expires:
            req.timers.append(loop.call_later(req.expires, self._expire, req))
        if req.hb:
            req.timers.append(loop.call_later(req.hb, self._heartbeat, req))

    def _fill(self, req: PullRequest, limit: int) -> int:
        """Deliver to one request until it is satisfied, nothing is available or `limit` is used up."""
        c = self.c
        svc = c.service
        n = 0
        if not svc.has_interest(req.reply):
            self.finish(req, None)
            return 0
        top = req.horizon() if req.horizon is not None else None
        own = c.begin_run()  # (the batch goes out in one pass, before any status that ends the request)
        try:
            while n < limit and req.batch > 0:
                seq, redelivery = c.next_seq()
                if not seq:
                    break
                if top is not None and seq > top:
                    self.held_back = True
                    break
                size = c.msg_size(seq)
                if req.max_bytes and size > req.max_bytes:
                    extra = {"Nats-Pending-Messages": req.batch, "Nats-Pending-Bytes": req.max_bytes}
                    if own:
                        c.end_run(req.reply)
                    self.finish(req, None if req.sent else status(409, "Message Size Exceeds MaxBytes", extra))
                    return n
                if not c.deliver(seq, redelivery, req.reply):
                    continue  # the message vanished under us; the cursor moved past it
                n += 1
                req.took(size)
        finally:
            if own:
                c.end_run(req.reply)
        if req.batch <= 0:
            self.finish(req, None)
        return n

    def serve(self, limit: int) -> bool:
        """Serve waiting requests in arrival order; True when more work may be left."""
        if self.c.cfg.get("priority_policy"):
            return self.c.prio.serve(self, limit)
        used = 0
        while self.q and self.q[0].done:
            self.q.popleft()
        for req in list(self.q):  # (a request held back by its horizon lets the ones behind it have the message)
            if used >= limit:
                break
            if req.done:
                continue
            self.held_back = False
            used += self._fill(req, limit - used)
            if not req.done:
                if req.no_wait and (req.sent or not req.expires) and used < limit:
                    self.finish(req, status(404, "No Messages"))
                    continue
                if not self.held_back:
                    return used >= limit
        return used >= limit

    def finish(self, req: PullRequest, final: bytes | None) -> None:
        if req.done:
            return
        req.done = True
        for t in req.timers:
            t.cancel()
        req.timers.clear()
        try:
            self.q.remove(req)
        except ValueError:
            pass
        if final is not None:
            self.c.service.send(req.reply, b"", headers=final)

    def _expire(self, req: PullRequest) -> None:
        if req.done:
            return
        extra = {"Nats-Pending-Messages": req.batch, "Nats-Pending-Bytes": req.max_bytes}
        self.finish(req, status(408, "Request Timeout", extra))

    def _heartbeat(self, req: PullRequest) -> None:
        if req.done:
            return
        c = self.c
        if time.monotonic() - req.last_sent >= req.hb * 0.95:
            extra = {"Nats-Last-Consumer": c.dseq, "Nats-Last-Stream": c.delivered_sseq}
            c.service.send(req.reply, b"", headers=status(100, "Idle Heartbeat", extra))
        req.timers.append(c.service.loop.call_later(req.hb, self._heartbeat, req))

    def close(self, final: bytes | None) -> None:
        for req in list(self.q):
            self.finish(req, final)
        self.q.clear()
