"""The server-core hook that takes client publishes for streams led in another zone (a `Forwarder`).

The core calls `take` for every message that did not come over a route. For a client's message on a
subject of a stream whose leader is in another zone, the router takes the message (it goes to this zone's
proxy for that leader) and the stream's queue group (`$JSQ.<stream>`, whose only member is the leader: the
router sets the JetStream service's `stream_queue`) is left out of the delivery; every subscriber gets the
message as without the router, the core subscribers of the leader's server too (over the route, which
carries it only when they exist, and which names no stream group: the leader's stream does not store it
again). A message from a local link (`WORKER`: another worker process of this server,
zonebus.workers) is a client's message of this server: the other workers run no router, and what their
clients publish or ack reaches worker 0's router that way (pull requests and direct gets reach it as API
requests, `$JS.API.>` being worker 0's interest); PubAcks and deliveries go to the client's inbox, which
worker 0 knows as that worker's interest. A client's ack (`$JS.ACK.<stream>...`) of a stream led in
another zone goes to the proxy too, which sends the leader ranges of acks. Then the forwarder that was
installed before (gateways) takes its part, and the core delivers what is left in the cluster. Such subjects
are kept off the clients' fast path (`memo_entries`).

A client's message for a stream this server leads goes to this server's member of the stream's group, never to
another server's: a leader cut off by a partition cannot withdraw its interest across it, and a random pick
would hand half the publishes of the new leader's own zone to the old one (they time out) until the route
dies (`_here`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from zonebus.server.connection import CLIENT, INTERNAL, WORKER
from zonebus.stream.service import STREAM_QUEUE
from zonebus.subjects.sublist import MatchResult

if TYPE_CHECKING:
    from zonebus.server.connection import Connection
    from zonebus.server.hooks import Forwarder
    from zonebus.zonerouter.router import ZoneRouter


_STREAM_QUEUE = STREAM_QUEUE.encode()
_FILTERED_MAX = 10_000
Cache = dict[bytes, tuple[MatchResult, MatchResult]]  # subject -> (match, what is delivered of it)
_HERE = (INTERNAL, CLIENT)  # a stream group's member on this server (the stream's own subscription)
_CLIENTS = (CLIENT, WORKER)  # what clients of this server publish: here, or on another worker process


class RouterForwarder:
    def __init__(self, router: ZoneRouter, inner: Forwarder | None) -> None:
        self.router = router
        self.inner = inner
        self._filtered: Cache = {}  # subject -> (match, without the stream groups)
        self._here: Cache = {}  # subject -> (match, stream groups narrowed to this server's member)

    def take(self, src: Connection, subject: bytes, reply: bytes | None, hdr_len: int, data: bytes,
             queues: list[bytes] | None, r: MatchResult) -> tuple[MatchResult, bool]:
        """The server's `Forwarder` (`zonebus.server.hooks`): take a client's publish or ack for a stream led in
        another zone; returns what the core delivers in the cluster (`r` without the stream's group, or with it
        narrowed to this server's member) and whether the router took the message (or the inner forwarder)."""
        taken = False
        if src.kind in _CLIENTS:
            ack = subject.startswith(b"$JS.ACK.")
            if ack:
                target = self.router.ack_target(subject) if not data.startswith(b"+NXT", max(hdr_len, 0)) \
                    else None
                if target is not None:
                    self.router.take_ack(subject, reply, bytes(data[max(hdr_len, 0) : len(data) - 2]), target)
            else:
                target = self.router.target(subject)
                if target is not None:
                    self.router.take(src, subject, reply, hdr_len, data, target)
            if target is not None:
                if r.qsubs:
                    r = self._without_stream(subject, r, not ack)
                taken = True
            elif r.qsubs:
                r = self._leader_here(subject, r, not ack)
        if taken and not r:  # only the leader wanted it: nothing else to deliver (nor to send to other clusters)
            return r, True
        if self.inner is not None:
            r, sent = self.inner.take(src, subject, reply, hdr_len, data, queues, r)
            return r, sent or taken
        return r, taken

    def _without_stream(self, subject: bytes, r: MatchResult, keep: bool) -> MatchResult:
        """`r` without the streams' queue groups (`$JSQ.<stream>`): the router stores the message (or takes
        the ack). `keep`: remember the result for `subject` (not for an ack's subject, seen once)."""
        return _cached(self._filtered, subject, r, keep, _no_stream_groups)

    def _leader_here(self, subject: bytes, r: MatchResult, keep: bool) -> MatchResult:
        """`r` with each stream group that has a member on this server (the leader's stream subscription)
        narrowed to it. `keep`: remember the result for `subject`."""
        return _cached(self._here, subject, r, keep, _stream_groups_here)

    def memo_entries(self, subject: bytes, size: int, memo: list) -> bool:
        if subject.startswith(b"$JS.ACK.") or self.router.target(subject) is not None:
            return False
        return self.inner.memo_entries(subject, size, memo) if self.inner is not None else True



def _cached(cache: Cache, subject: bytes, r: MatchResult, keep: bool,
            narrow: Callable[[MatchResult], MatchResult]) -> MatchResult:
    """`narrow(r)`, remembered for `subject` while the sublist hands out the same match (`keep`)."""
    hit = cache.get(subject) if keep else None
    if hit is not None and hit[0] is r:
        return hit[1]
    out = narrow(r)
    if keep:
        if len(cache) >= _FILTERED_MAX:
            cache.clear()
        cache[subject] = (r, out)
    return out


def _is_stream_group(g: list[Any]) -> bool:
    return bool(g) and g[0].queue.startswith(_STREAM_QUEUE)


def _no_stream_groups(r: MatchResult) -> MatchResult:
    if not any(_is_stream_group(g) for g in r.qsubs):
        return r
    return MatchResult(r.psubs, [g for g in r.qsubs if not _is_stream_group(g)])


def _stream_groups_here(r: MatchResult) -> MatchResult:
    if not any(len(g) > 1 and _is_stream_group(g) for g in r.qsubs):
        return r
    return MatchResult(r.psubs, [([s for s in g if s.conn.kind in _HERE] or g)
                                 if len(g) > 1 and _is_stream_group(g) else g for g in r.qsubs])
