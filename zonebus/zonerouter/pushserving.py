"""The leader side of push consumers served in another zone (KV watch, object-store get, push subscriptions).

A client in another zone creates a push consumer (a `deliver_subject`, with or without a `deliver_group`) of a
stream led here: its zone's proxy sends the create request as a `PushCreate` frame (or, for a consumer created
elsewhere whose subscribers are in the proxy's zone, a claim without a request once this side offered it:
`pushclaims`; a claim of a subject that another proxy serves is ended at once). This side registers the deliver
subject for that proxy (the JetStream service's tap now takes what is sent there:
`JetStreamService.tap_subject`), then hands the request to JetStream as if it had come over a route.
What the consumer then sends to its deliver subject goes
to the proxy instead of crossing zones in full: deliveries as runs of (stream seq, consumer seq, delivery count,
pending), flow-control requests and idle heartbeats as status messages with their replies, in `Pushed` records,
one per kind of message in a row so that statuses and deliveries keep the order the consumer sent them in (an
ordered consumer compares a heartbeat's `Nats-Last-Consumer` with the last delivery it got). The proxy reads the
payloads from its snapshot of the stream and publishes them to the deliver subject in its zone (`reader`).

The consumer's state (cursor, pending acks, flow control, interest in the deliver subject) stays here; acks and
flow-control responses come back as usual (acks through the proxy as ranges). A proxy that reads only stored
objects (`spread`) gives the consumer a horizon (`JetStreamService.push_horizon`): it delivers nothing above the
stored sequence until a batch is stored or the proxy joins the tail (then it is kicked). A registration ends when
its consumer is gone (deleted, or an ephemeral one after its inactive threshold), when no consumer took the
deliver subject within `BIND_TIMEOUT` (its create failed), or when the proxy's link goes down; from then on the
subject's messages are published as usual. After a failover (or a lost link) the proxy registers the deliver
subject with the stream's new leader, without a create request: a durable consumer that lives on there is
served by the proxy again. Runs on the event loop.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from zonebus.zonerouter import readframes as rf
from zonebus.zonerouter.pushclaims import literal

if TYPE_CHECKING:
    from zonebus.stream.service import JetStreamService

BIND_TIMEOUT = 10.0  # seconds a registration waits for its consumer to exist
CREATE_PREFIXES = ("$JS.API.CONSUMER.CREATE.", "$JS.API.CONSUMER.DURABLE.CREATE.")


class _Push:
    __slots__ = ("peer", "pid", "stream", "deliver", "cons", "seen", "runs", "statuses", "queued", "since")

    def __init__(self, peer: str, pid: int, stream: str, deliver: str, since: float) -> None:
        self.peer, self.pid, self.stream, self.deliver, self.since = peer, pid, stream, deliver, since
        self.cons: Any = None  # the consumer delivering to `deliver`, once known
        self.seen = False  # a consumer delivering to `deliver` was found
        self.runs: list[list[int]] = []
        self.statuses: list[tuple[bytes, str]] = []
        self.queued = False


class PushServer:
    def __init__(self, svc: JetStreamService, send: Callable[[str, bytes], bool],
                 horizon: Callable[[str, str], int | None]) -> None:
        self.svc = svc
        self.send = send
        self.horizon_of = horizon  # (stream, proxy) -> the highest sequence that proxy reads now (None: no limit)
        # (stream, subject, reply, headers, payload): hand a create request to JetStream (set by the router)
        self.api: Callable[[str, str, str, bytes | None, bytes], None] | None = None
        self.by_subject: dict[str, _Push] = {}
        self._flush: list[_Push] = []
        self.stats = {"push_creates": 0, "push_delivered": 0, "push_deliver_bytes": 0, "push_statuses": 0,
                      "push_ended": 0, "push_claims_refused": 0}

    def on_create(self, peer: str, pc: rf.PushCreate) -> None:
        old = self.by_subject.get(pc.deliver)
        if old is not None and (old.peer, old.pid) != (peer, pc.pid):
            if not pc.subject:  # a claim (or a follow) leaves the subject with the proxy that serves it
                self.send(peer, rf.Pushed(pc.pid, rf.DONE, "", ()).encode())
                self.stats["push_claims_refused"] += 1
                return
            self._end(old)
        self.by_subject[pc.deliver] = _Push(peer, pc.pid, pc.stream, pc.deliver, self.svc.loop.time())
        self.svc.tap_subject(pc.deliver)
        self.stats["push_creates"] += 1
        if self.api is not None and pc.subject:  # (none: a registration that follows a new leader)
            self.api(pc.stream, pc.subject, pc.reply, pc.headers or None, pc.payload)

    def horizon(self, stream: str, deliver: str) -> int | None:
        """`JetStreamService.push_horizon`: the proxy's horizon for a tapped deliver subject."""
        p = self.by_subject.get(deliver)
        return self.horizon_of(stream, p.peer) if p is not None and p.stream == stream else None

    # -- what the consumer sends -----------------------------------------------------------------------
    def tap(self, to: str, msg_subject: str | None, payload: bytes, reply: str | None,
            headers: bytes | None) -> bool:
        p = self.by_subject.get(to)
        if p is None:
            return False
        if msg_subject is not None:
            tok = rf.ack_token(reply) if reply else None
            if tok is None or tok[0] != p.stream:
                return False  # (not a delivery of the stream registered: published as usual)
            if p.cons is None or p.cons.name != tok[1]:
                stream = self.svc.streams.get(p.stream)
                p.cons = stream.consumers.get(tok[1]) if stream is not None else None
            if p.statuses:
                self._send(p)  # (statuses sent before this delivery go first)
            rf.add_run(p.runs, tok[3], tok[4], tok[2], tok[6])
            self.stats["push_delivered"] += 1
            self.stats["push_deliver_bytes"] += len(payload) + (len(headers) if headers else 0)
        else:
            if p.runs:
                self._send(p)  # (deliveries sent before this status go first)
            p.statuses.append((bytes(headers or b""), reply or ""))
            self.stats["push_statuses"] += 1
        if not p.queued:
            p.queued = True
            if not self._flush:
                self.svc.loop.call_soon(self._send_all)
            self._flush.append(p)
        return True

    def _send_all(self) -> None:
        todo, self._flush = self._flush, []
        for p in todo:
            p.queued = False
            self._send(p)

    def _send(self, p: _Push, flags: int = 0) -> None:
        if not (p.runs or p.statuses or flags):
            return
        cons = p.cons
        name = cons.name if cons is not None else ""
        if cons is not None and cons.cfg.get("headers_only"):
            flags |= rf.HEADERS_ONLY
        for chunk, statuses, last in rf.in_frames(p.runs, p.statuses):
            self.send(p.peer, rf.Pushed(p.pid, flags if last else flags & ~rf.DONE, name, chunk, statuses).encode())
        p.runs, p.statuses = [], []

    # -- lifetime ----------------------------------------------------------------------------------------
    def _bound(self, p: _Push) -> Any:
        """The live consumer delivering to `p.deliver` (None: none)."""
        stream = self.svc.streams.get(p.stream)
        if stream is None:
            return None
        cons = p.cons
        if cons is None or cons.closed or stream.consumers.get(cons.name) is not cons:
            cons = p.cons = next((c for c in stream.consumers.values() if c.push == p.deliver and not c.closed),
                                 None)
        p.seen = p.seen or cons is not None
        return cons

    def _drop(self, p: _Push) -> None:
        """`p`'s subject is published as usual from now on, and nothing of `p` waits to be sent."""
        if self.by_subject.get(p.deliver) is p:
            del self.by_subject[p.deliver]
            self.svc.tap_subject(p.deliver, on=False)
        if p in self._flush:
            self._flush.remove(p)

    def _end(self, p: _Push) -> None:
        self._drop(p)
        self._send(p, rf.DONE)
        self.stats["push_ended"] += 1

    def sweep(self) -> None:
        """Periodic: registrations whose consumer is gone (or never came) end."""
        now = self.svc.loop.time()
        for p in list(self.by_subject.values()):
            if self._bound(p) is None and (p.seen or now - p.since > BIND_TIMEOUT or p.stream not in self.svc.streams):
                self._end(p)

    def readers(self, stream: str, peer: str) -> list[Any]:
        """The consumers of `stream` delivering through `peer`'s proxy to a subject with interest (`auto`'s
        readers, as pull requests are)."""
        out = []
        for p in self.by_subject.values():
            if p.peer == peer and p.stream == stream:
                cons = self._bound(p)
                if cons is not None and cons.push_bound():
                    out.append(cons)
        return out

    def kick(self, stream: str) -> None:
        """A horizon of `stream` moved: its push consumers served by proxies look again."""
        for p in self.by_subject.values():
            if p.stream == stream and p.cons is not None and not p.cons.closed:
                p.cons.kick()

    def peer_down(self, peer: str) -> None:
        """The proxy's link went down: its consumers deliver as usual from now on (past their horizon too)."""
        for p in [p for p in self.by_subject.values() if p.peer == peer]:
            self._drop(p)
            p.runs, p.statuses = [], []
            if p.cons is not None and not p.cons.closed:
                p.cons.kick()

    def info(self) -> dict[str, Any]:
        return {**self.stats, "push_consumers": len(self.by_subject)}


def push_deliver(subject: str, payload: bytes) -> str:
    """The deliver subject of a consumer create request that a proxy may serve (a push consumer on a literal
    subject, with or without a deliver group); "" for any other request."""
    if not subject.startswith(CREATE_PREFIXES):
        return ""
    try:
        cfg = json.loads(payload or b"{}").get("config") or {}
    except (ValueError, AttributeError):
        return ""
    deliver = cfg.get("deliver_subject") if isinstance(cfg, dict) else None
    return deliver if isinstance(deliver, str) and literal(deliver) else ""


def stream_of_create(toks: list[str]) -> str:
    """The stream of `$JS.API.CONSUMER.CREATE.<stream>...` or `$JS.API.CONSUMER.DURABLE.CREATE.<stream>...`."""
    i = 5 if toks[3] == "DURABLE" else 4
    return toks[i] if len(toks) > i else ""
