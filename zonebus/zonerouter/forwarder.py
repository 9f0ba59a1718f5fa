"""The server-core hook that takes client publishes for streams led in another zone (a `Forwarder`).

The core calls `process_msg` for every message that did not come over a route. For a client's message on a
subject of a stream whose leader is in another zone, the router takes the message (it goes to this zone's
proxy for that leader) and the route to the leader is left out of the delivery; every other subscriber gets
the message as before. A message from a local link (`WORKER`: another worker process of this server,
zonebus.workers) is a client's message of this server: the other workers run no router, and what their
clients publish or ack reaches worker 0's router that way (pull requests and direct gets reach it as API
requests, `$JS.API.>` being worker 0's interest); PubAcks and deliveries go to the client's inbox, which
worker 0 knows as that worker's interest. A client's ack (`$JS.ACK.<stream>...`) of a stream led in
another zone goes to the proxy too, which sends the leader ranges of acks. Everything else goes to the
forwarder that was installed before (gateways) or to the core's own cluster delivery. Such subjects are kept
off the clients' fast path (`memo_entries`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from zonebus.server.connection import CLIENT, ROUTE, WORKER
from zonebus.subjects.sublist import MatchResult

if TYPE_CHECKING:
    from zonebus.server.connection import Connection
    from zonebus.server.hooks import Forwarder
    from zonebus.server.server import Server
    from zonebus.zonerouter.router import ZoneRouter


_CLIENTS = (CLIENT, WORKER)  # what clients of this server publish: here, or on another worker process


class RouterForwarder:
    def __init__(self, server: Server, router: ZoneRouter, inner: Forwarder | None) -> None:
        self.server = server
        self.router = router
        self.inner = inner

    def process_msg(self, src: Connection, subject: bytes, reply: bytes | None, hdr_len: int, data: bytes,
                    queues: Any, r: MatchResult) -> bool:
        taken = False
        if src.kind in _CLIENTS:
            if subject.startswith(b"$JS.ACK."):
                target = self.router.ack_target(subject) if not data.startswith(b"+NXT", max(hdr_len, 0)) \
                    else None
                if target is not None:
                    self.router.take_ack(subject, reply, bytes(data[max(hdr_len, 0) : len(data) - 2]), target)
            else:
                target = self.router.target(subject)
                if target is not None:
                    self.router.take(src, subject, reply, hdr_len, data, target)
            if target is not None:
                leader = target[1]
                if any(s.conn.kind == ROUTE and getattr(s.conn, "remote_name", "") == leader for s in r.psubs):
                    r = MatchResult([s for s in r.psubs if not (s.conn.kind == ROUTE and getattr(
                        s.conn, "remote_name", "") == leader)], r.qsubs)
                taken = True
        if taken and not r:  # only the leader wanted it: nothing else to deliver (and no "no responders")
            return True
        if self.inner is not None:
            return self.inner.process_msg(src, subject, reply, hdr_len, data, queues, r) or taken
        if not r:
            if reply and src.kind == CLIENT and src.no_responders:  # type: ignore[attr-defined]
                self.server._no_responders(src, subject, reply)  # type: ignore[arg-type]
            return False
        return self.server.deliver_in_cluster(src, r, subject, reply, hdr_len, data, queues) or taken

    def memo_entries(self, subject: bytes, size: int, memo: list) -> bool:
        if subject.startswith(b"$JS.ACK.") or self.router.target(subject) is not None:
            return False
        return self.inner.memo_entries(subject, size, memo) if self.inner is not None else True
