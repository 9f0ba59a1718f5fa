"""Dialling a remote cluster: one outbound connection per remote, to a server in this server's zone when it can.

`RemoteGateway` holds what this server knows of one remote cluster: its gateway URLs and, for the URLs of
zonebus servers, their zones. A zonebus server tells the zone of every gateway URL of its cluster it knows
(its own and its route peers', `zonebus.gateway.manager`) in the zonebus-only INFO field `ZONES_FIELD`
(`{"host:port": "zone"}`); nats-server ignores the field and sends none, so a nats-server cluster's URLs have
no zone and are dialled as nats-server dials them (a random URL first, then the others in turn).

`GatewayDialing` (a base of the GatewayManager) keeps the connection up (`dial_loop`) and, when the zone
preference is on (`cluster { zone_relay }`, zonebus.cluster.relay; on by default when `server_tags` name a
zone), prefers the URLs of the remote's servers in this server's zone, both when it dials and later: when a
same-zone URL becomes known while the connection goes to another zone, a second connection is dialled to it
(a *successor*); once the successor's handshake is done and its first PONG came back (the remote sends its
queue interest, and an interest-only dump, before answering that PING: nothing is missing), it becomes the
outbound connection and the old one is closed after its buffered writes. The remote keeps nats-server's
per-connection interest rules: the successor starts in the mode the remote gives a new connection, as after
any reconnect. A successor that fails is retried with a backoff (2 s doubling up to 60 s), to the same-zone
server that failed longest ago; when a server that failed sends an INFO (it is up again), it is tried at once.

Event loop thread only.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import random
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from zonebus.gateway.connection import GatewayConnection
from zonebus.link import Backoff
from zonebus.link.connection import dial
from zonebus.link.reports import should_report

if TYPE_CHECKING:
    from zonebus.options import GatewayOptions
    from zonebus.server.server import Server

IMPLICIT_RETRIES = 10
ZONES_FIELD = "zonebus_gateway_zones"  # in a gateway INFO: {"host:port": zone} of the sender's cluster
MOVE_RETRY_FIRST, MOVE_RETRY_MAX = 2.0, 60.0


def host_port(url: str) -> str:
    """`nats://user:pw@host:port` or `host:port` -> `host:port`; ValueError when there is no port."""
    parts = urlsplit(url if "://" in url else f"nats://{url}")
    if not parts.hostname or not parts.port:
        raise ValueError(f"bad gateway url {url!r}: expected host:port")
    return f"{parts.hostname}:{parts.port}"


@dataclass
class RemoteGateway:
    name: str
    configured: bool
    urls: dict[str, str] = field(default_factory=dict)  # host:port -> URL as given (may hold credentials)
    zones: dict[str, str] = field(default_factory=dict)  # host:port -> zone of that server (zonebus only)
    task: asyncio.Task | None = None
    rejections: int = 0  # consecutive outbound connections the remote rejected
    current: GatewayConnection | None = None  # the registered outbound connection
    successor: GatewayConnection | None = None  # a connection dialled to replace `current` (same zone)
    move_failures: int = 0
    move_after: float = 0.0  # loop time before which no successor is dialled (after a failed one)
    move_failed_at: dict[str, float] = field(default_factory=dict)  # host:port -> loop time of its failed move

    def url_for(self, attempt: int, rng: random.Random, zone: str = "") -> str:
        """The URL of dial attempt `attempt` (0 after a success): with `zone`, the remote's servers in that zone
        first (a random one, then in turn), then the others; without, a random URL, then each in turn."""
        urls = list(self.urls.values())
        near = [u for key, u in self.urls.items() if zone and self.zones.get(key) == zone]
        if near:
            if attempt == 0:
                return rng.choice(near)
            far = [u for u in urls if u not in near]
            return (near + far)[attempt % len(urls)]
        if attempt == 0:
            return rng.choice(urls)
        return urls[attempt % len(urls)]

    def successor_url(self, zone: str, rng: random.Random) -> str:
        """The URL to dial a successor to: of the remote's servers in `zone`, one never failed as a successor
        (or shown up since, `learn_zones`), else the one that failed longest ago; "" when none is known."""
        near = [key for key in self.urls if self.zones.get(key) == zone]
        if not near:
            return ""
        first = min(self.move_failed_at.get(key, 0.0) for key in near)
        return self.urls[rng.choice([key for key in near if self.move_failed_at.get(key, 0.0) == first])]

    def zone_of(self, conn: GatewayConnection) -> str:
        """The zone of the server behind an outbound connection: its tags, else what its cluster told."""
        if conn.zone:
            return conn.zone
        try:
            return self.zones.get(host_port(conn.url), "")
        except ValueError:
            return ""


class GatewayDialing:
    """The dial loop and the zone preference of a GatewayManager (see the module's docstring)."""

    server: Server
    opts: GatewayOptions
    remotes: dict[str, RemoteGateway]
    outbound: dict[str, GatewayConnection]
    zone_aware: bool
    _running: bool
    _rng: random.Random

    def log(self, msg: str) -> None:  # implemented by the manager
        raise NotImplementedError

    def log_error(self, msg: str) -> None:  # implemented by the manager
        raise NotImplementedError

    def register_outbound(self, conn: GatewayConnection) -> None:  # implemented by the manager
        raise NotImplementedError

    # -- zones ---------------------------------------------------------------------------------------------
    def learn_zones(self, name: str, zones: Any, sender_url: str = "") -> None:
        """A remote cluster's `ZONES_FIELD`: remember the zones, then see whether a nearer server is known.
        `sender_url` is the gateway URL of the server that sent them: it is up, so a failed move to it is
        forgotten (it is the first one tried next)."""
        remote = self.remotes.get(name)
        if remote is None or not isinstance(zones, dict):
            return
        if sender_url:  # (a recorded failure means move_failures > 0: the retry below happens anyway)
            with contextlib.suppress(ValueError):
                remote.move_failed_at.pop(host_port(sender_url), None)
        changed = False
        for url, zone in zones.items():
            try:
                key = host_port(str(url))
            except ValueError:
                continue
            if isinstance(zone, str) and zone and remote.zones.get(key) != zone:
                remote.zones[key] = zone
                changed = True
        if changed or remote.move_failures:  # (news from the remote cluster: a server may be back, try now)
            remote.move_after = 0.0
            self.consider_move(remote)

    def consider_move(self, remote: RemoteGateway) -> None:
        """Dial a successor when the outbound connection to `remote` is in another zone than this server's and
        a URL of a server of `remote` in this zone is known."""
        own = self.server.zone
        conn = remote.current
        if (not self.zone_aware or not own or not self._running or remote.successor is not None
                or conn is None or conn.closed or remote.zone_of(conn) == own):
            return
        loop = self.server.loop
        wait = remote.move_after - loop.time()
        if wait > 0:
            loop.call_later(wait, self.consider_move, remote)
            return
        url = remote.successor_url(own, self._rng)
        if url:
            remote.successor = conn  # (a placeholder until the dial returns: one successor at a time)
            loop.create_task(self._dial_successor(remote, conn, url))

    async def _dial_successor(self, remote: RemoteGateway, old: GatewayConnection, url: str) -> None:
        host, port = host_port(url).rsplit(":", 1)
        try:
            new = await dial(self.server, functools.partial(GatewayConnection, self, True, remote.name, url,
                                                            replaces=old), host, int(port), self.opts.tls)
        except OSError as exc:
            self._successor_failed(remote, url, f"cannot connect to {host_port(url)}: {exc.strerror or exc}")
            return
        except Exception as exc:  # (never leave `successor` set: no later move would be tried)
            self._successor_failed(remote, url, f"dialling {host_port(url)} failed: {exc!r}")
            raise
        remote.successor = new
        await new.closed_future
        if remote.successor is new:  # closed before it took over
            self._successor_failed(remote, url, new.rejected or self._successor_closed(remote, new))

    def _successor_closed(self, remote: RemoteGateway, new: GatewayConnection) -> str:
        """Why a successor closed before it took over, for the log: the server it reached and at which step."""
        where = f"{new.remote_name or '?'} at {host_port(new.url)}"
        if not new.established:
            return f"{where} closed during its handshake"
        zone = remote.zone_of(new)
        if zone != self.server.zone:
            return f"{where} is in zone {zone or '(unknown)'!r}"
        return f"{where} closed before its first PONG"

    def _successor_failed(self, remote: RemoteGateway, url: str, why: str) -> None:
        remote.successor = None
        remote.move_failures += 1
        delay = min(MOVE_RETRY_MAX, MOVE_RETRY_FIRST * 2 ** (remote.move_failures - 1))
        now = self.server.loop.time()
        remote.move_after = now + delay
        remote.move_failed_at[host_port(url)] = now
        self.log(f"gateway {remote.name!r}: no move to a server in zone {self.server.zone!r} ({why}); "
                 f"retrying in {delay:.0f}s")
        if self._running:
            self.server.loop.call_later(delay, self.consider_move, remote)

    def successor_ready(self, conn: GatewayConnection) -> None:
        """A successor's first PONG: it becomes the outbound connection; the one it replaces closes."""
        remote = self.remotes.get(conn.remote_gateway)
        old = conn.replaces
        conn.replaces = None
        if remote is None or remote.successor not in (conn, old) or (old is not None and old.closed
                                                              and remote.current is not old):
            if remote is not None and remote.successor in (conn, old):
                remote.successor = None  # (the dial loop has a newer connection already)
            conn.close()
            return
        if remote.zone_of(conn) != self.server.zone:  # (the URL's zone was stale: the server there says otherwise)
            if conn.zone:
                remote.zones[host_port(conn.url)] = conn.zone
            remote.successor = conn  # (so that its closing counts as a failed move, with its backoff)
            conn.close()
            return
        remote.successor = None
        remote.move_failures = 0
        remote.move_failed_at.clear()
        self.register_outbound(conn)
        self.log(f"outbound gateway connection to {remote.name!r} moved to {conn.remote_name} in zone "
                 f"{remote.zone_of(conn)!r} (was {old.remote_name if old else '?'} in zone "
                 f"{remote.zone_of(old) if old else '?'!r})")
        if old is not None:
            old.close()

    # -- the dial loop -------------------------------------------------------------------------------------
    async def dial_loop(self, remote: RemoteGateway) -> None:
        """Keep one outbound connection to `remote`: configured ones forever, implicit ones while reachable."""
        backoff = Backoff()
        connected = False  # (connect_error_reports until the gateway came up, then reconnect_error_reports)
        try:
            while self._running and self.remotes.get(remote.name) is remote:
                conn = remote.current
                if conn is None or conn.closed:
                    zone = self.server.zone if self.zone_aware else ""
                    url = remote.url_for(backoff.failures, self._rng, zone)
                    host, port = host_port(url).rsplit(":", 1)
                    try:
                        conn = await dial(self.server, functools.partial(GatewayConnection, self, True,
                                                                         remote.name, url), host, int(port),
                                          self.opts.tls)
                    except OSError as exc:
                        failures = backoff.failed()
                        self._report_unreachable(remote, url, failures, exc, connected)
                        if not remote.configured and failures >= IMPLICIT_RETRIES:
                            self.log_error(f"giving up on implicit gateway {remote.name!r} after {failures} "
                                           "attempts")
                            del self.remotes[remote.name]
                            return
                        await backoff.wait()
                        continue
                await conn.closed_future
                now = remote.current
                if now is not None and now is not conn and not now.closed:
                    continue  # a successor took over: follow it
                if conn.rejected:  # a misconfiguration (reported already): keep backing off
                    remote.rejections += 1
                    backoff.failed()
                elif conn.established:
                    connected = True
                    backoff.reset()
                    remote.rejections = 0
                    if self._running:
                        self.log(f"outbound gateway connection to {remote.name!r} closed; reconnecting")
                else:
                    backoff.failed()
                await backoff.wait()
        finally:
            remote.task = None

    def _report_unreachable(self, remote: RemoteGateway, url: str, failures: int, exc: OSError,
                            connected: bool) -> None:
        """Attempt 1, then as `connect_error_reports` / `reconnect_error_reports` say (zonebus.link.reports)."""
        report = should_report(self.server.opts, connected, failures)
        if report or self.server.opts.debug:
            kind = "configured" if remote.configured else "implicit"
            msg = (f"gateway {remote.name!r} ({kind}) unreachable: cannot connect to {host_port(url)} "
                   f"(attempt {failures}): {exc.strerror or exc}; retrying with backoff")
            if report:
                self.log_error(msg)
            else:
                self.server.log(msg, "DBG")
