"""Push consumers created elsewhere: the leader offers each to the proxy of the zone its subscribers are in.

A push consumer that a client of another zone creates comes through that zone's proxy (`Reader.push_create`).
One created elsewhere (an admin in the leader's zone, a deploy script, a dead proxy's consumer whose clients
reconnected to the zone's next server) would deliver from the stream's leader, in full, to wherever its
subscribers are. So every `SCAN_EVERY` the leader (`PushOffers`, beside `pushserving`) looks at the push
consumers of its streams on the shared store that no proxy serves. When a consumer's deliver subject has no
subscriber in the leader's zone and has some in another zone, the leader sends that zone's proxy for it a
`PushOffer`. The proxy claims the consumer with a push create without a request, as after a failover
(`Reader.push_claim`), and serves it from then on. An offer not taken (the proxy's link was down, its claim was
refused because another proxy took the subject first) is made again `OFFER_RETRY` later.

Subscribers: subscriptions to the deliver subject itself (a wildcard tap such as `>` is not the consumer's
subscriber). This server's own clients (on any worker process) are in the leader's zone; a route's are in the
zone of the server at its other end. A deliver group is served like a plain subscription: the proxy publishes
each delivery in its zone, whose members are preferred. Runs on the event loop, in the worker process that
holds the routes and JetStream (worker 0).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from zonebus.server.connection import ROUTE
from zonebus.zonerouter import readframes as rf

if TYPE_CHECKING:
    from zonebus.server.server import Server
    from zonebus.stream.service import JetStreamService
    from zonebus.zonerouter.pushserving import PushServer

OFFER_RETRY = 10.0  # seconds before a consumer still not served by a proxy is offered again
SCAN_EVERY = 1.0  # seconds between two looks at the push consumers


class PushOffers:
    def __init__(self, server: Server, svc: JetStreamService, pushes: PushServer,
                 proxy_of: Callable[[str], str | None], send: Callable[[str, bytes], bool]) -> None:
        self.server = server
        self.svc = svc
        self.pushes = pushes
        self.proxy_of = proxy_of  # zone -> this leader's proxy there (None: none live)
        self.send = send
        self.offered: dict[tuple[str, str], float] = {}  # (stream, deliver subject) -> when last offered
        self.stats = {"push_offers": 0}
        self._last = -SCAN_EVERY

    def scan(self, now: float) -> None:
        if now - self._last < SCAN_EVERY:
            return
        self._last = now
        seen: set[tuple[str, str]] = set()
        for stream in list(self.svc.streams.values()):
            if stream.cfg.get("storage") == "memory":
                continue
            for cons in list(stream.consumers.values()):
                deliver = cons.push
                if not deliver or cons.closed or not literal(deliver) or deliver in self.pushes.by_subject:
                    continue
                key = (stream.name, deliver)
                seen.add(key)
                if now - self.offered.get(key, -OFFER_RETRY) < OFFER_RETRY:
                    continue
                zone = self.subscribers_zone(deliver)
                proxy = self.proxy_of(zone) if zone else None
                if proxy and self.send(proxy, rf.PushOffer(stream.name, deliver).encode()):
                    self.offered[key] = now
                    self.stats["push_offers"] += 1
        for key in [k for k in self.offered if k not in seen]:
            del self.offered[key]

    def subscribers_zone(self, subject: str) -> str:
        """The zone with the most subscribers of `subject` when none is in this server's zone; "" otherwise."""
        want = subject.encode()
        found = self.server.sublist.match(want)
        zones: dict[str, int] = {}
        own = self.server.zone
        for sub in [*found.psubs, *(s for group in found.qsubs for s in group)]:
            if sub.subject != want:
                continue
            zone = getattr(sub.conn, "zone", "") if sub.conn.kind == ROUTE else own
            if not zone or zone == own:
                return ""
            zones[zone] = zones.get(zone, 0) + 1
        return max(sorted(zones), key=lambda z: zones[z]) if zones else ""


def literal(subject: str) -> bool:
    """A deliver subject a proxy can publish to: no wildcard, no space."""
    return bool(subject) and "*" not in subject and ">" not in subject and " " not in subject
