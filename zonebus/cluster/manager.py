"""The cluster: the route listener, dialling seeds and gossiped peers, duplicate routes, interest, queue picks.

State owned here (event loop thread only):
- `peers`: server_id -> the one live RouteConnection to that peer (a full mesh has one per peer);
- `plain_refs` / `queue_refs`: local interest counts, so RS+/RS- go out on the first/last local sub;
- dial loops per URL: configured seeds retry forever with backoff, gossiped peers a few times.
Two routes to one peer (both sides dialled at once) are resolved the same way on both ends: keep the route
dialled by the server with the smaller server_id.

It is an extension of the server core (`zonebus.server.hooks`): it watches local interest, picks queue
members (`pick_queue_member`), gives clients the cluster's `connect_urls` and the leaf layer the peers'
leafnode URLs (`peer_leafnode_urls`, `on_leafnode_urls`), carries other extensions' fields in its route INFO
(`set_info_extra`), and offers the routes' channels (`channels`, `zonebus.link.channels`) to other
extensions. Monitoring lives in `monitoring.py`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from zonebus import SERVER_VERSION
from zonebus.cluster.queue_policy import LOCAL, MATCHING, OTHER, pick_member, tags_overlap
from zonebus.cluster.relay import ZoneRelay, relay_enabled
from zonebus.cluster.route import RouteConnection
from zonebus.link import Backoff, LinkChannels, json_line
from zonebus.link.compression import offer_fields
from zonebus.link.connection import dial, listen, warn_open_port
from zonebus.link.interest import InterestCounts
from zonebus.link.reports import dial_error, should_report
from zonebus.options import advertised_host
from zonebus.server.connection import ACCOUNT, CLIENT, INTERNAL, LEAF, ROUTE, WORKER
from zonebus.subjects.sublist import Subscription

if TYPE_CHECKING:
    import ssl

    from zonebus.options import RouteOptions
    from zonebus.server.accounts import Account
    from zonebus.server.server import Server

IMPLICIT_RETRIES = 5
INTERIM_MAX = 5.0  # seconds a dropped duplicate's interest stays with the kept route unconfirmed (`take_interest`)


def parse_route_url(url: str) -> tuple[str, int]:
    u = urlparse(url if "://" in url else f"nats-route://{url}")
    if not u.hostname or not u.port:
        raise ValueError(f"bad route url {url!r}")
    return u.hostname, u.port


class ClusterManager:
    def __init__(self, server: Server) -> None:
        self.server = server
        self.opts = server.opts.cluster
        self.peers: dict[str, RouteConnection] = {}
        self.routes_up: dict[tuple[str, int], int] = {}  # (host, port) -> routes to it that went live
        self.plain_refs: dict[bytes, int] = {}
        self.queue_refs: dict[tuple[bytes, bytes], int] = {}
        self.account_refs = InterestCounts()  # the same for accounts other than $G (zonebus.server.accounts)
        self._dialing: set[str] = set()
        self._tasks: set[asyncio.Task] = set()
        self._listener: asyncio.base_events.Server | None = None
        self._tls_context: ssl.SSLContext | None = None  # the route listener's, reloaded on SIGHUP
        self._running = False
        self.route_url = ""
        self.gateway_gossip: dict[str, Any] | None = None  # this server's gateway facts, sent in route INFO
        self.on_gateway_gossip: Callable[[Any], None] | None = None  # set by the gateway layer when there is one
        self.channels = LinkChannels()
        self.info_extras: dict[str, Any] = {}  # fields other extensions add to this server's route INFO
        # the leaf layer's: told when the peers' leafnode URLs (`peer_leafnode_urls`) may have changed
        self.on_leafnode_urls: Callable[[], None] | None = None
        # configured route URL -> (server name found there, whether it runs JetStream); ours for a self-seed
        self.configured_peers: dict[str, tuple[str, bool]] = {}
        self.zone_local_urls = False  # zone router: clients get only the client URLs of this server's zone
        self.relay = ZoneRelay(server, relay_enabled(self.opts.zone_relay, server.zone))  # one copy per zone

    # -- lifecycle -----------------------------------------------------------------------------------
    async def start(self) -> None:
        self._running = True
        self.relay.start()
        server = self.server
        opts = self.opts
        if opts.port:
            if opts.tls is not None:
                from zonebus.server.tls import server_context

                self._tls_context = server_context(opts.tls, "cluster tls: ")
            self._listener, self.route_url = await listen(
                server, lambda: RouteConnection(self, solicited=False), opts.host, opts.port, opts.tls,
                what="cluster routes", ssl_context=self._tls_context)
            server.log(f"listening for route connections on {opts.host}:{self.route_url.rsplit(':', 1)[1]}"
                       + (" (TLS)" if opts.tls is not None else ""))
            warn_open_port(server, "cluster", opts.host, bool(opts.user), opts.tls)
        for url in opts.routes:
            self.dial(url, configured=True)

    async def stop(self) -> None:
        self._running = False
        self.relay.stop()
        if self._listener is not None:
            self._listener.close()
        for t in list(self._tasks):
            t.cancel()
        for conn in list(self.server.links.values()):
            if isinstance(conn, RouteConnection):
                conn.close()

    def reloaded(self, opts: Any) -> None:
        """SIGHUP: `server_tags` and `prefer_matching_tags` were reloaded."""
        self.tags_changed()

    def reload_tls(self, new: RouteOptions) -> None:
        """SIGHUP: routes accepted or dialled from now on use the certificate, key and CA of the reloaded
        `cluster { tls {} }`; the routes up now stay up (zonebus.server.tls.reload_links)."""
        from zonebus.server.tls import reload_links

        self.opts.tls = reload_links(self.server, "cluster", self._tls_context, self.opts.tls, new.tls)

    # -- identity and gossip -------------------------------------------------------------------------
    @property
    def tags(self) -> list[str]:
        return list(self.server.opts.server_tags)

    def connect_fields(self, conn: RouteConnection) -> dict[str, Any]:
        """Credentials as nats-server sends them: a configured route uses those in its URL, a route learned
        by gossip uses this server's own `cluster { authorization }`."""
        if conn.configured:
            u = urlparse(conn.url if "://" in conn.url else f"nats-route://{conn.url}")
            user, password = u.username or "", u.password or ""
        else:
            user, password = self.opts.user, self.opts.password
        return {"name": self.server.server_id, "cluster": self.opts.name, "user": user, "pass": password,
                "headers": True, "verbose": False, "pedantic": False}

    def info_fields(self) -> dict[str, Any]:
        server = self.server
        sopts = server.opts
        peers = [{"id": c.remote_id, "url": c.remote_route_url} for c in self.peers.values() if c.remote_route_url]
        return {
            "server_id": server.server_id,
            "server_name": server.name,
            "cluster": self.opts.name,
            "tags": self.tags,
            "route_url": "" if self.opts.no_advertise else self.route_url,
            "client_url": f"{advertised_host(sopts.host)}:{sopts.port}",
            **({"ws_connect_url": ws_url} if (ws_url := server.websocket_url()) else {}),
            "peers": peers,
            "headers": True,
            "version": SERVER_VERSION,
            **offer_fields(self.opts.compression, nats_field=True),
            **self.relay.info_fields(),
            **({"gateway": self.gateway_gossip} if self.gateway_gossip else {}),
            **self.info_extras,
        }

    def route_identified(self, conn: RouteConnection, info: dict[str, Any]) -> bool:
        """A route's first INFO arrived: reject self/cluster mismatch, resolve duplicates, then go live."""
        server = self.server
        if conn.configured:
            self.configured_peers[conn.url] = (conn.remote_name, info.get("jetstream") is True)
        if conn.remote_id == server.server_id:
            conn.duplicate = True  # a seed that points at ourselves
            conn.close()
            return False
        if self.opts.name and conn.remote_cluster and conn.remote_cluster != self.opts.name:
            server.log(f"route {conn.describe()}: cluster name mismatch "
                       f"({conn.remote_cluster!r} != {self.opts.name!r}), closing")
            conn.close()
            return False
        existing = self.peers.get(conn.remote_id)
        if existing is not None and not existing.closed:
            keep = min((existing, conn), key=lambda c: (self._dialer(c), 0 if c is existing else 1))
            drop = conn if keep is existing else existing
            drop.duplicate = True
            if drop is existing:
                self.peers[conn.remote_id] = conn
                self._go_live(conn, info)
                if existing.established and conn.infos < 2:
                    # (dropped with it at once, the peer's subscribers got nothing routed to them until its RS+
                    # came over this route: tests/gateway/test_gateway_zones.py lost 10 of 2,880 so)
                    conn.take_interest(existing)
                    if conn.interim:
                        self.server.loop.call_later(INTERIM_MAX, conn.end_interim)
            drop.close()
            return drop is existing
        self.peers[conn.remote_id] = conn
        self._go_live(conn, info)
        return True

    def _zone_facts(self, conn: RouteConnection) -> None:
        """What the peer's tags say: a tag in common, its zone."""
        conn.tag_match = tags_overlap(self.tags, conn.remote_tags)
        conn.zone = self.server.zone_of_tags(conn.remote_tags)
        conn.zone_known = bool(conn.zone)

    def _dialer(self, conn: RouteConnection) -> str:
        return self.server.server_id if conn.solicited else conn.remote_id

    def _go_live(self, conn: RouteConnection, info: dict[str, Any]) -> None:
        conn.established = True
        for url in (conn.url, conn.remote_route_url):  # (dial loops: a route to that URL has been up)
            try:
                key = parse_route_url(url) if url else None
            except ValueError:
                key = None
            if key is not None:
                self.routes_up[key] = self.routes_up.get(key, 0) + 1
        conn.msgs_in = True
        self._zone_facts(conn)
        self.relay.route_live(conn, info)
        if self.server.ledger is not None:
            self.server.ledger.route_connected(conn)
        self.server.log(f"route established with {conn.describe()} tags={conn.remote_tags}")
        if conn.remote_client_url or conn.remote_ws_url:
            self.server.client_urls_changed()
        for subject, n in self.plain_refs.items():
            if n > 0:
                conn.send_interest(subject, None, 1)
        for (subject, queue), n in self.queue_refs.items():
            if n > 0:
                conn.send_interest(subject, queue, n)
        for name, subject, queue, weight in self.account_refs.current():
            conn.send_interest(subject, queue, weight, name)
        self._gossip()
        self._learn_peers(conn, info.get("peers"))
        self._gateway_info(conn, info)
        self._leafnode_url(conn, info)
        self.channels.link_up(conn)

    def route_info_update(self, conn: RouteConnection, info: dict[str, Any]) -> None:
        if conn.interim:
            conn.end_interim()
        self._zone_facts(conn)
        self.relay.route_live(conn, info)
        self._learn_peers(conn, info.get("peers"))
        self._gateway_info(conn, info)
        self._leafnode_url(conn, info)

    def _leafnode_url(self, conn: RouteConnection, info: dict[str, Any]) -> None:
        """The peer's leafnode URL from its own INFO (nats-server sends it in the first one; an INFO that
        tells about another server, or has none, changes nothing); the leaf layer is told of a change."""
        urls = info.get("leafnode_urls")
        if not isinstance(urls, list) or len(urls) != 1 or str(info.get("server_id") or "") != conn.remote_id:
            return
        url = str(urls[0])
        if url != conn.remote_leafnode_url:
            conn.remote_leafnode_url = url
            if self.on_leafnode_urls is not None and self.peers.get(conn.remote_id) is conn:
                self.on_leafnode_urls()

    def peer_leafnode_urls(self) -> list[str]:
        """The leafnode URLs the peers advertise (nats-server's hub tells its leaf nodes these and its own)."""
        return [c.remote_leafnode_url for c in self.peers.values() if c.remote_leafnode_url and not c.closed]

    def set_info_extra(self, key: str, value: Any) -> None:
        """Another extension's field of this server's route INFO, told to the peers up now (gossip) and sent
        to every later one."""
        if self.info_extras.get(key) != value:
            self.info_extras[key] = value
            self._gossip()

    def _learn_peers(self, conn: RouteConnection, peers: Any) -> None:
        for p in peers if isinstance(peers, list) else ():
            if not isinstance(p, dict):
                continue
            pid, url = str(p.get("id") or ""), str(p.get("url") or "")
            if not url or pid == self.server.server_id or pid in self.peers:
                continue
            self.dial(url, configured=False)

    def _gossip(self) -> None:
        """Tell every peer whom we know, so any seed grows into a full mesh."""
        line = json_line(b"INFO", self.info_fields())
        for c in self.peers.values():
            if c.established and not c.closed:
                c.send(line)

    def set_gateway_gossip(self, body: dict[str, Any]) -> None:
        """The gateway layer's facts for the other servers of this cluster: sent now and on every new route."""
        if body != self.gateway_gossip:
            self.gateway_gossip = body
            self._gossip()

    def _gateway_info(self, conn: RouteConnection, info: dict[str, Any]) -> None:
        body = info.get("gateway")
        if body:
            conn.gateway_info = body
            if self.on_gateway_gossip is not None:
                self.on_gateway_gossip(body)

    def replay_gateway_gossip(self) -> None:
        """The gateway layer started after some routes told us theirs: hand it what they said."""
        for conn in list(self.peers.values()):
            if conn.gateway_info and self.on_gateway_gossip is not None:
                self.on_gateway_gossip(conn.gateway_info)

    def tags_changed(self) -> None:
        for c in self.peers.values():
            c.tag_match = tags_overlap(self.tags, c.remote_tags)
        self._gossip()

    def route_closed(self, conn: RouteConnection) -> None:
        self.relay.route_gone(conn)
        conn.drop_remote_interest()
        self.channels.link_down(conn)
        if self.peers.get(conn.remote_id) is conn:
            del self.peers[conn.remote_id]
            self.server.log(f"route closed: {conn.describe()}")
            if conn.remote_client_url or conn.remote_ws_url:
                self.server.client_urls_changed()
            if conn.remote_leafnode_url and self.on_leafnode_urls is not None:
                self.on_leafnode_urls()
        if self.server.ledger is not None:
            self.server.ledger.connection_closed(conn)

    # -- dialling ------------------------------------------------------------------------------------
    def dial(self, url: str, configured: bool) -> None:
        if url in self._dialing or not self._running:
            return
        self._dialing.add(url)
        task = self.server.loop.create_task(self._dial_loop(url, configured))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _dial_loop(self, url: str, configured: bool) -> None:
        """Keep a route to `url`: seeds forever (with backoff), gossiped peers until one route formed."""
        try:
            host, port = parse_route_url(url)
        except ValueError as exc:
            self.server.log(str(exc))
            self._dialing.discard(url)
            return
        backoff = Backoff()
        # connect_error_reports until a route to `url` (ours or the peer's) had been up, then
        # reconnect_error_reports, the attempts counted again from 1 after each such route
        connected = False
        seen = self.routes_up.get((host, port), 0)
        try:
            while self._running:
                try:
                    conn = await dial(self.server, lambda: RouteConnection(self, solicited=True, url=url,
                                                                           configured=configured),
                                      host, port, self.opts.tls)
                except OSError as exc:
                    if self.opts.tls is not None and not isinstance(exc, ConnectionRefusedError):
                        self.server.log(f"route {url}: TLS route handshake error: {exc}", "ERR")
                    if self.routes_up.get((host, port), 0) != seen:
                        seen = self.routes_up[(host, port)]
                        connected = True
                        backoff.reset()
                    attempts = backoff.failed()
                    report = should_report(self.server.opts, connected, attempts)
                    if report or self.server.opts.debug:
                        self.server.log(f"Error trying to connect to route (attempt {attempts}): "
                                        f"{dial_error(host, port, exc)}", "ERR" if report else "DBG")
                    if attempts >= IMPLICIT_RETRIES and not configured:
                        return
                    await backoff.wait()
                    continue
                await conn.closed_future
                if conn.established:
                    backoff.reset()  # a refused or failed handshake keeps backing off
                if conn.remote_id == self.server.server_id:
                    return  # the seed is ourselves
                if conn.duplicate:  # the peer dialled us: redial only once that route is gone
                    other = self.peers.get(conn.remote_id)
                    if other is not None:
                        await other.closed_future
                if not configured:
                    return  # a restarted peer dials its own seeds and learns the mesh again by gossip
                await backoff.wait()
        finally:
            self._dialing.discard(url)

    # -- interest (an InterestWatcher of the server: local subscriptions go out as RS+/RS-) -------------
    def interest_added(self, sub: Subscription) -> None:
        if sub.conn.kind not in _LOCAL or sub.conn.spoke:
            return
        if sub.queue is None:
            n = self.plain_refs.get(sub.subject, 0) + 1
            self.plain_refs[sub.subject] = n
            if n == 1:
                self._broadcast(sub.subject, None, 1)
        else:
            key = (sub.subject, sub.queue)
            n = self.queue_refs.get(key, 0) + sub.weight
            self.queue_refs[key] = n
            self._broadcast(sub.subject, sub.queue, n)

    def interest_removed(self, sub: Subscription) -> None:
        if sub.conn.kind not in _LOCAL or sub.conn.spoke:
            return
        if sub.queue is None:
            n = self.plain_refs.get(sub.subject, 0) - 1
            if n <= 0:
                self.plain_refs.pop(sub.subject, None)
                self._broadcast(sub.subject, None, 0)
            else:
                self.plain_refs[sub.subject] = n
        else:
            key = (sub.subject, sub.queue)
            n = self.queue_refs.get(key, 0) - sub.weight
            if n <= 0:
                self.queue_refs.pop(key, None)
                n = 0
            else:
                self.queue_refs[key] = n
            self._broadcast(sub.subject, sub.queue, n)

    def account_interest(self, account: Account, sub: Subscription, delta: int) -> None:
        """Local interest of an account other than `$G` (an AccountWatcher): counted per account, RS+/RS-
        name the account."""
        if sub.conn.kind not in _LOCAL or sub.conn.spoke:
            return
        send = self.account_refs.change(account.name, sub, delta * sub.weight)
        if send is not None:
            self._broadcast(*send, account.name)

    def _broadcast(self, subject: bytes, queue: bytes | None, weight: int, account: bytes = ACCOUNT) -> None:
        for c in self.peers.values():
            if c.established and not c.closed:
                c.send_interest(subject, queue, weight, account)

    # -- queue routing -------------------------------------------------------------------------------
    def pick_queue_member(self, src: Any, group: list[Subscription], subject: bytes, size: int) -> Subscription | None:
        if src.kind == CLIENT and not src.echo:
            group = [s for s in group if s.conn is not src]
        sub = pick_member(group, _tier, self.opts.prefer_matching_tags, self.server.random)
        ledger = self.server.ledger
        # a route's message names the groups this server serves: the sending server made (and counted) the
        # routing decision; the pick here is among this server's own members (its clients, its other workers)
        if ledger is not None and sub is not None and src.kind != ROUTE:
            ledger.queue_decision(src, group, sub, subject, size)
        return sub

    # -- monitoring ----------------------------------------------------------------------------------
    def client_connect_urls(self) -> list[str]:
        peers = self.peers.values()
        if self.zone_local_urls:  # a route's zone is set from its tags when it goes live
            peers = [c for c in peers if c.zone == self.server.zone]
        return [c.remote_client_url for c in peers if c.remote_client_url]

    def ws_connect_urls(self) -> list[str]:
        """The peers' WebSocket URLs (their `websocket { advertise }`), chosen as `client_connect_urls`."""
        peers = self.peers.values()
        if self.zone_local_urls:
            peers = [c for c in peers if c.zone == self.server.zone]
        return [c.remote_ws_url for c in peers if c.remote_ws_url]


_LOCAL = (CLIENT, INTERNAL, WORKER, LEAF)  # this server's interest: its own, its other worker processes', its
# leaf nodes' (the interest of a connection to a hub is not told: zonebus.server.connection.link_allows)


def _tier(sub: Subscription) -> int:
    conn = sub.conn
    kind = conn.kind
    if kind in _LOCAL:
        if kind == WORKER and conn.members_elsewhere(sub) >= sub.weight:
            return MATCHING  # only other servers' members: the worker holding the routes picks among them
        return LOCAL
    return MATCHING if getattr(conn, "tag_match", False) else OTHER
