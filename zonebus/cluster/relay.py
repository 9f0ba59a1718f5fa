"""The zone relay: a message crosses into another zone once, and a server of that zone fans it out there.

When a message has plain interest on two or more servers of another zone, the origin sends it once, as a
relay frame (`ZMSG`/`ZHMSG`, `zonebus.protocol.route_parser`), to one server of that zone: the *relay*. The
relay delivers it to its own subscribers and forwards it, as an ordinary RMSG, to the other servers of its zone
that have plain interest (those are delivered locally only: the one-hop rule, so no loops). A queue-group pick
still goes straight from the origin to the server of the picked member: to the relay within its relay frame,
to another server of that zone as a queue-only frame (`QMSG`/`QHMSG`: deliver to the named groups only, its
plain subscribers get the relay's copy), so every group still gets each message exactly once.

Only between zonebus servers that both offer it: a route offers `zonebus_zone_relay: true` in its INFO when
`cluster { zone_relay }` is on (the default when `server_tags` name a zone); a nats-server peer, or a zonebus
one with it off, gets the normal one-hop traffic and is never forwarded to by a relay.

The relay of a zone is chosen per subject by rendezvous hashing over the zone's live relay-capable routes, so
it moves only when a server of that zone comes or goes, and a publisher's messages on a subject take one path
(its order holds). A zone where just one server has interest gets its copy straight, as without the relay.
A route whose PING has gone unanswered for its ping interval (`PING_EVERY`) counts as dead: it is no relay
until its PONG comes (a crashed relay's routes close at once; one that went silent is passed over within two
ping intervals, checked every `CHECK_EVERY`). Every change of the live sets touches the sublist, so the
delivery lists memoized by the fast paths are rebuilt. Owned by the event loop thread; wired by
`zonebus.node` as the server's `zone_relay` (`zonebus.server.hooks.ZoneRelay`).
"""

from __future__ import annotations

import asyncio
import zlib
from typing import TYPE_CHECKING, Any

from zonebus.protocol.route_parser import QUEUES_ONLY, RELAY, msg_line
from zonebus.server.connection import ROUTE

if TYPE_CHECKING:
    from zonebus.server.connection import Connection
    from zonebus.server.server import Server

RELAY_FIELD = "zonebus_zone_relay"  # in a route's INFO: this zonebus server takes and sends relay frames
COVERED = QUEUES_ONLY  # a plan's mark for a route its zone's relay serves (only queue picks go to it straight)
_MIX = 0x9E3779B1
CHECK_EVERY = 0.25  # seconds between two looks for routes whose PING went unanswered


def rendezvous_score(subject_crc: int, seed: int) -> int:
    """A server's score for a subject (`zlib.crc32` of each): the zone's live server with the highest relays."""
    return ((subject_crc ^ seed) * _MIX) & 0xFFFFFFFF


def relay_among(subject: bytes, server_ids: list[str]) -> str:
    """The relay a server would pick for `subject` among servers of one zone (for tests and tools)."""
    h = zlib.crc32(subject)
    return max(server_ids, key=lambda sid: rendezvous_score(h, zlib.crc32(sid.encode())))


def relay_enabled(setting: bool | None, zone: str) -> bool:
    """`cluster { zone_relay }`: on when set true, off when set false, else on when this server has a zone."""
    return bool(zone) if setting is None else setting


class ZoneRelay:
    """The live relay-capable routes per zone, the choice of a zone's relay, and the plans built from it."""

    def __init__(self, server: Server, enabled: bool) -> None:
        self.server = server
        self.enabled = enabled
        self.zones: dict[str, list[Any]] = {}  # zone -> its live relay-capable routes (RouteConnection)
        self.silent: set[Any] = set()  # routes among those whose PING is overdue: no relay for now
        self._timer: asyncio.TimerHandle | None = None

    def start(self) -> None:
        if self.enabled:
            self._timer = self.server.loop.call_later(CHECK_EVERY, self._check_silent)

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _check_silent(self) -> None:
        silent = {conn for conns in self.zones.values() for conn in conns
                  if conn.unanswered_for() > conn.PING_EVERY}
        if silent != self.silent:
            for conn in silent - self.silent:
                self.server.log(f"zone relay: route {conn.describe()} went silent: no relay until it answers")
            self.silent = silent
            self._changed()
        self._timer = self.server.loop.call_later(CHECK_EVERY, self._check_silent)

    # -- the routes (called by the cluster manager) ----------------------------------------------------
    def info_fields(self) -> dict[str, Any]:
        return {RELAY_FIELD: True} if self.enabled else {}

    def route_live(self, conn: Any, info: dict[str, Any]) -> None:
        """A route went live or told new tags: whether relay frames go over it, and into which zone's set."""
        self.route_gone(conn)
        conn.zone_relay = self.enabled and info.get(RELAY_FIELD) is True and bool(conn.zone)
        if conn.zone_relay:
            conn.relay_seed = zlib.crc32(conn.remote_id.encode())
            self.zones.setdefault(conn.zone, []).append(conn)
            self._changed()

    def route_gone(self, conn: Any) -> None:
        self.silent.discard(conn)
        for zone, conns in list(self.zones.items()):
            if conn in conns:
                conns.remove(conn)
                if not conns:
                    del self.zones[zone]
                self._changed()

    def _changed(self) -> None:
        """Plans depend on the live sets: drop the delivery lists memoized with the old ones, in every account."""
        server = self.server
        server.sublist.touch()
        for acc in server.accounts.by_name.values():
            if acc.sublist is not server.sublist:
                acc.sublist.touch()

    # -- the hook the routing point calls (zonebus.server.hooks.ZoneRelay) --------------------------------
    def relay_of(self, zone: str, subject: bytes) -> Any | None:
        """The relay of `zone` for `subject`: the highest rendezvous score among the zone's live routes."""
        best = None
        top = -1
        h = zlib.crc32(subject)
        silent = self.silent
        for conn in self.zones.get(zone, ()):
            if conn.closed or conn in silent:
                continue
            score = rendezvous_score(h, conn.relay_seed)
            if score > top:
                best, top = conn, score
        return best

    def plan(self, subject: bytes, plain: list[Connection]) -> dict[Connection, int] | None:
        """For the links with plain interest in a message (`plain`): None when it goes to each as before;
        else route -> RELAY (send one relay frame, with the queue groups picked there) or COVERED (its zone's
        relay brings it: send only a queue-only frame, and only when a member there was picked). The relay
        may be a route without interest (it is chosen among the zone's live servers)."""
        own = self.server.zone
        by_zone: dict[str, list[Connection]] | None = None
        for conn in plain:
            if conn.kind == ROUTE and conn.zone_relay and conn.zone != own:  # type: ignore[attr-defined]
                if by_zone is None:
                    by_zone = {}
                by_zone.setdefault(conn.zone, []).append(conn)
        if by_zone is None:
            return None
        plan: dict[Connection, int] | None = None
        for zone, conns in by_zone.items():
            if len(conns) < 2:
                continue
            relay = self.relay_of(zone, subject)
            if relay is None:
                continue
            if plan is None:
                plan = {}
            for conn in conns:
                plan[conn] = COVERED
            plan[relay] = RELAY
        return plan

    def fans_out_to(self, conn: Connection) -> bool:
        """A relay frame came in: does its copy go on to `conn`, a route with plain interest in it?"""
        return conn.kind == ROUTE and conn.zone_relay and conn.zone == self.server.zone  # type: ignore[attr-defined]

    def memo_entries(self, subject: bytes, size: int, account: bytes, entries: list[tuple]) -> list[tuple]:
        """A fast path's delivery list of a plain, reply-less message (`(conn, line, sub)`, one RMSG entry
        per link with interest) with the plan applied: one relay frame per zone instead of the copies."""
        plain = [conn for conn, _, sub in entries if conn.kind == ROUTE and sub is conn.memo_sub]
        plan = self.plan(subject, plain) if len(plain) > 1 else None
        if plan is None:
            return entries
        line = msg_line(account, subject, None, None, -1, size, RELAY)
        out = [e for e in entries if e[0] not in plan]
        out += [(conn, line, conn.memo_sub) for conn, mark in plan.items() if mark == RELAY]
        return out

    def monitoring(self) -> dict[str, Any]:
        return {"enabled": self.enabled,
                "zones": {zone: sorted(c.remote_name for c in conns) for zone, conns in sorted(self.zones.items())}}
