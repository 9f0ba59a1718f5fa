"""`LeafManager`: this server's leaf node connections, as a hub (the listener) and as a leaf (the remotes).

- Listener (`leafnodes { listen }`): every accepted connection is a leaf of this server, bound to the global
  account, checked against `leafnodes { authorization }` (else the server's users, binding the user's account).
- Remotes (`leafnodes { remotes }`): one dial loop each (none for a `disabled` one), over its URLs in turn
  (shuffled once unless `no_randomize`), `reconnect_interval` between attempts; a connection closed for a loop
  waits `LOOP_DELAY` before the next attempt, as nats-server.
- Interest: an interest and account watcher of the server. Each live connection is told (`LS+`/`LS-`) the
  interest of its account, but never its own subscriptions, and a connection to a hub is not told what came
  over routes (the route one-hop rule: a hub's message reaches no route here, so a route's interest is not
  this server's to offer). Counted per connection (`zonebus.link.interest.InterestCounts`).
- Interest isolation (nats-server 2.12): an isolated connection is not told the interest that came over this
  server's other leaf connections (a client's, a route's, a gateway's still goes to it), their `$LDS.` subjects
  too; its own peer's interest still goes to the others. Every connection of a server with `leafnodes {
  isolate_leafnode_interest }` is isolated, a remote's connection with its own `isolate_leafnode_interest`,
  and an accepted one whose CONNECT says `isolate` (a leaf's remote `request_isolation`, sent here likewise).
  Shown as `/leafz` `is_isolated`. Per server: a leaf's interest that came over a route is a route's here
  (nats-server 2.15 marks it on its routes, `LS+` with an origin, and isolates it too).
- JetStream domains (`zonebus.stream.domain`): each side tells its domain (INFO / CONNECT `domain`); when either
  has one, the link denies `$JS.API.>`, `$KV.>`, `$OBJ.>` both ways (and this server's own `$JS.<domain>.API.>`
  outgoing), set in `go_live` before any interest is told, as nats-server's addLeafNodeConnection.
- Roles: a dialled link is this server's spoke side unless the remote says `hub: true` (CONNECT `is_hub`: this
  server is the hub); an accepted link is the hub side unless the CONNECT says `is_hub` (`LeafConnection.spoke`).
- WebSocket (`zonebus.leaf.websocket`): a remote with `ws://` / `wss://` URLs dials the hub's WebSocket
  listener; the listener's `/leafnode` upgrades come here (`accept_websocket`, the server's `websocket_leaf`
  hook) when this server listens for leaf nodes. A remote mixing both kinds of URL stops the start.
- `jetstream_cluster_migrate` (`zonebus.leaf.jsmigrate`): failed dials of such a remote tell the account's
  clustered JetStream (`jetstream_observer`, wired by zonebus.node) to lead none of its replicated streams.
- Loops: each account has a loop-detection subject `$LDS.<id>` this server sends on every connection; one
  that comes back closes the link with nats-server's error.
- URLs told to leaf nodes (INFO `leafnode_urls`, what a nats-server leaf dials next): the listener's
  `host:port`, or `advertise` (its port defaulting to the listener's), and, in a cluster, the leafnode URL of
  every peer (each route's INFO carries its server's). `no_advertise` leaves this server's URL out of both,
  as nats-server 2.15 (2.12 still listed it in its own INFO); with no URL at all the field is left out, and
  the INFO's `info_on_connect` tells a nats-server leaf that it did reach a leafnode port. A change goes to
  the accepted leaf nodes as an INFO.
- After an accepted leaf's CONNECT: an INFO with `connect_info` (and `remote_account`), which a nats-server
  leaf told `info_on_connect` waits for before it finishes its side of the handshake.
- `min_version`: an accepted leaf whose CONNECT `version` is older is refused (`version_allowed`); a remote
  refused so waits `MIN_VERSION_DELAY` before it dials again.
Registered by `zonebus.node` (before the cluster, so that the first route INFO carries the leafnode URL, as
in nats-server); owned by the event loop thread.
"""

from __future__ import annotations

import asyncio
import functools
import json
import random
import secrets
import ssl
from collections.abc import Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

from zonebus import SERVER_VERSION
from zonebus.credentials import read_creds, sign
from zonebus.leaf.connection import LDS_PREFIX, MIN_VERSION_REJECTED, LeafConnection
from zonebus.leaf.jsmigrate import LeaderMigration
from zonebus.leaf.websocket import WebSocketDialError, dial_websocket
from zonebus.link import Backoff
from zonebus.link.compression import offer_fields
from zonebus.link.connection import dial, listen, warn_open_port
from zonebus.link.interest import InterestCounts
from zonebus.link.reports import dial_error, should_report
from zonebus.protocol.jsdomain import leaf_deny
from zonebus.protocol.urls import advertised_address, is_ws_url, leaf_url
from zonebus.protocol.versions import version_at_least, version_components
from zonebus.server.connection import LEAF, ROUTE
from zonebus.server.tls import client_context, server_context
from zonebus.subjects.sublist import Subscription

if TYPE_CHECKING:
    from zonebus.cluster.manager import ClusterManager
    from zonebus.options import RemoteLeafOptions, TLSOptions
    from zonebus.server.accounts import Account
    from zonebus.server.server import Server

LOOP_DELAY = 30.0  # seconds a remote waits after a loop was detected (nats-server's)
MIN_VERSION_DELAY = 5.0  # seconds a remote waits after the hub refused its version (nats-server's)


class LeafConfigError(OSError):
    """A leafnodes block the server cannot run with (reported like a port already in use)."""


class LeafManager:
    def __init__(self, server: Server) -> None:
        self.server = server
        self.opts = server.opts.leafnodes
        self.url = ""  # host:port of the listener
        self.advertised = ""  # host:port told to leaf nodes and routes: `advertise`, else the listener's
        self.cluster: ClusterManager | None = None  # set by `join_cluster`
        self.min_version: tuple[int, int, int] | None = None  # leafnodes { min_version }, parsed at start
        self._told_urls: list[str] = []  # the leafnode_urls accepted leaf nodes were told last
        self.connections: dict[int, LeafConnection] = {}  # live ones, by cid
        self._listener: asyncio.base_events.Server | None = None
        self._tasks: list[asyncio.Task] = []
        self._running = False
        self._lds: dict[bytes, bytes] = {}  # account name -> its loop-detection subject
        self._server_ctx: ssl.SSLContext | None = None
        # jetstream_cluster_migrate: (account, on) -> the clustered JetStream of that account ("" = global) leads
        # none of its replicated streams while on (set by zonebus.node; zonebus.leaf.jsmigrate)
        self.jetstream_observer: Callable[[str, bool], None] | None = None
        self._migrations: list[LeaderMigration] = []

    # -- lifecycle (an Extension) ----------------------------------------------------------------------
    async def start(self) -> None:
        self._running = True
        opts = self.opts
        server = self.server
        if opts.min_version:
            try:
                self.min_version = version_components(opts.min_version)
            except ValueError as exc:
                raise LeafConfigError(f"invalid leafnode's minimum version: {exc}") from None
        if opts.port:
            self._listener, self.url = await listen(
                server, lambda: LeafConnection(self, False, server.global_account), opts.host, max(opts.port, 0),
                what="leafnodes")
            warn_open_port(server, "leafnodes", opts.host, bool(opts.user or opts.nkey), opts.tls)
            server.log(f"Listening for leafnode connections on {self.url}")
            server.websocket_leaf = self.accept_websocket  # (leaf nodes on the WebSocket port too, as nats-server)
            self.advertised = self.url
            if opts.advertise:
                try:
                    self.advertised = advertised_address(opts.advertise, int(self.url.rpartition(":")[2]))
                except ValueError as exc:
                    raise LeafConfigError(f"Error setting leafnode INFO with LeafNode.Advertise value of "
                                          f"{opts.advertise}, err={exc}") from None
                server.log(f"Advertise address for leafnode is set to {self.advertised}")
            self._told_urls = self.leafnode_urls()
            if self.cluster is not None and not opts.no_advertise:
                self.cluster.set_info_extra("leafnode_urls", [self.advertised])
        for remote in opts.remotes:
            if len({is_ws_url(u) for u in remote.urls}) > 1:  # (nats-server checks it at start, not with -t)
                shown = " ".join(json.dumps(u) for u in remote.urls)
                raise LeafConfigError(f"remote leaf node configuration cannot have a mix of websocket and "
                                      f"non-websocket urls: [{shown}]")
        for remote in opts.remotes:
            if remote.disabled:  # (configured, never dialled: nats-server's `disabled`)
                server.log(f"leafnode remote {remote.urls[0]} is disabled")
                continue
            account = server.global_account
            if remote.account and remote.account != "$G":
                found = server.accounts.get(remote.account.encode())
                if found is None:
                    raise LeafConfigError(f"leafnode remote {remote.urls[0]}: local account {remote.account!r} "
                                          f"is not defined")
                account = found
            self._tasks.append(server.loop.create_task(self._dial_loop(remote, account)))

    async def stop(self) -> None:
        self._running = False
        self.server.websocket_leaf = None
        for task in self._tasks:
            task.cancel()
        for migration in self._migrations:
            migration.stop()
        if self._listener is not None:
            self._listener.close()
        for conn in list(self.connections.values()):
            conn.close()

    def accept_websocket(self, compressed: bool) -> LeafConnection:
        """A leaf node upgraded on the WebSocket port (`zonebus.server.websocket`): its connection, accepted as
        on the leafnode port, in frames (`compressed`: permessage-deflate, so no link compression)."""
        conn = LeafConnection(self, False, self.server.global_account)
        conn.websocket, conn.ws_compressed = True, compressed
        return conn

    # -- the cluster and the URLs told to leaf nodes ------------------------------------------------------
    def join_cluster(self, cluster: ClusterManager) -> None:
        """This server has routes: its leafnode URL goes to the peers (`start`), theirs to its leaf nodes."""
        self.cluster = cluster
        cluster.on_leafnode_urls = self.cluster_urls_changed

    def leafnode_urls(self) -> list[str]:
        """INFO `leafnode_urls`: this server's advertised URL (not with `no_advertise`), then those its route
        peers advertise."""
        urls = [self.advertised] if self.advertised and not self.opts.no_advertise else []
        if self.cluster is not None:
            urls += [u for u in self.cluster.peer_leafnode_urls() if u not in urls]
        return urls

    def cluster_urls_changed(self) -> None:
        """A route peer's leafnode URL came or went: the accepted leaf nodes get an INFO with the new list
        (as nats-server's sendAsyncLeafNodeInfo; a dialled link's peer is a hub, told nothing)."""
        urls = self.leafnode_urls()
        if urls == self._told_urls or not self.url:
            return
        self._told_urls = urls
        info = self._base_info()
        for conn in self.connections.values():
            if not conn.solicited and not conn.closed:
                conn.send_json(b"INFO", info)

    # -- the handshake ---------------------------------------------------------------------------------
    def _base_info(self) -> dict[str, Any]:
        """The hub's INFO without what is one connection's (nats-server's leafNodeInfo)."""
        server = self.server
        host, _, port = self.advertised.rpartition(":")
        info: dict[str, Any] = {
            "server_id": server.server_id, "server_name": server.name, "version": SERVER_VERSION, "proto": 1,
            "host": host.strip("[]"), "port": int(port or 0), "headers": True,
            "max_payload": server.opts.max_payload, "info_on_connect": True, "tags": server.opts.server_tags,
        }
        if self._told_urls:
            info["leafnode_urls"] = self._told_urls
        if self._js_domain():
            info["domain"] = self._js_domain()
        if self.opts.user or self.opts.nkey or server.opts.auth_required:
            info["auth_required"] = True
        if self.opts.tls is not None:
            info["tls_required"] = True
            info["tls_verify"] = self.opts.tls.verify
        return info

    def info_fields(self, conn: LeafConnection) -> dict[str, Any]:
        """The hub's INFO (nats-server's fields a leaf reads; `compression: off` for a nats-server leaf, and
        zonebus's own offer)."""
        conn.nonce = secrets.token_urlsafe(11)
        info = self._base_info()
        info["client_id"], info["nonce"] = conn.cid, conn.nonce
        if conn.compression is not None:  # `off` for nats-server (no S2 here), the mode for a zonebus leaf
            info.update(offer_fields(conn.compression.opts, nats_field=True))
        return info

    def server_tls_context(self) -> ssl.SSLContext:
        """The listener's TLS context (`leafnodes { tls {} }`), made once."""
        if self._server_ctx is None:
            assert self.opts.tls is not None
            self._server_ctx = server_context(self.opts.tls, "leafnodes tls: ")
        return self._server_ctx

    @staticmethod
    def remote_tls_context(tls: TLSOptions | None) -> ssl.SSLContext:
        """A remote's TLS context: its `tls {}` block (the certificate optional), or the system's CAs when
        the hub asks for TLS and the remote has no block (as nats-server)."""
        if tls is None:
            return ssl.create_default_context()
        return client_context(tls, "leafnode remote tls: ", cert_optional=True)

    def connect_fields(self, conn: LeafConnection) -> dict[str, Any]:
        """The leaf's CONNECT (nats-server's fields)."""
        server = self.server
        fields: dict[str, Any] = {
            "version": SERVER_VERSION, "server_id": server.server_id, "name": server.name,
            "headers": True, "remote_account": conn.bound.display, "protocol": 1, "tags": server.opts.server_tags,
        }
        user, password = conn.login
        if user:
            fields["user"], fields["pass"] = user, password
        remote = conn.remote
        if remote is not None and remote.credentials:  # the user JWT and the seed's signature of the nonce
            jwt, seed = read_creds(remote.credentials)
            fields["jwt"], fields["sig"] = jwt, sign(seed, conn.nonce)[1]
        elif remote is not None and remote.nkey:
            fields["nkey"], fields["sig"] = sign(remote.nkey, conn.nonce)
        if self._js_domain():
            fields["domain"] = self._js_domain()  # (the hub's JetStream domain rules: zonebus.stream.domain)
        if conn.remote is not None and conn.remote.deny_imports:
            fields["deny_pub"] = list(conn.remote.deny_imports)  # the hub sends nothing on these
        if conn.remote is not None and conn.remote.hub:
            fields["is_hub"] = True  # this side is the hub of the link (nats-server's field, left out when false)
        if conn.remote is not None and conn.remote.request_isolation:
            fields["isolate"] = True  # the hub tells this link no other leaf's interest
        return fields

    def version_allowed(self, conn: LeafConnection, version: str) -> bool:
        """`leafnodes { min_version }`: an accepted leaf whose CONNECT reports an older version (or none that
        parses) gets an INFO (`connect_info`, so that a recent nats-server leaf takes the refusal cleanly),
        nats-server's `-ERR 'connection rejected since minimum version required is "<v>"'` and a close."""
        minimum = self.min_version
        if minimum is None or version_at_least(version, minimum):
            return True
        self._send_connect_info(conn)
        text = f'{MIN_VERSION_REJECTED} "{self.opts.min_version}"'
        self.log_error(f"leafnode connection from {conn.ip}:{conn.remote_port}: {text} (it reports "
                       f"{version or 'no version'})")
        return conn.reject(text)

    def _send_connect_info(self, conn: LeafConnection) -> None:
        """nats-server's answer to an accepted leaf's CONNECT: the INFO again, with `connect_info`."""
        info = self._base_info()
        info.update(client_id=conn.cid, remote_account=conn.bound.display, connect_info=True)
        conn.send_json(b"INFO", info)

    def go_live(self, conn: LeafConnection) -> bool:
        """The handshake is done: messages may flow, each side tells the other its interest (a hub first
        answers the CONNECT with its `connect_info` INFO)."""
        if not conn.solicited:
            self._send_connect_info(conn)
        conn.established = True
        conn.msgs_in = True
        conn.zone = self.server.zone_of_tags(conn.remote_tags)
        conn.zone_known = bool(conn.zone)
        if self.server.ledger is not None:  # counted like routes, with the remote server's zone
            self.server.ledger.route_connected(conn)
        self.connections[conn.cid] = conn
        js = self.server.opts.jetstream
        pub_deny, sub_deny = leaf_deny(self._js_domain(), js.enabled, conn.remote_domain)
        if pub_deny or sub_deny:  # (JetStream domains: each side's JetStream stays its own)
            conn.deny_more(pub_deny, sub_deny)
            self.server.log(f"leafnode {conn.describe()}: JetStream using domains: local {self._js_domain()!r}, "
                            f"remote {conn.remote_domain!r}")
        told = conn.told = InterestCounts()
        name = conn.bound.name
        conn.send_interest(self.lds_subject(conn.bound), None, 1)
        for sub in conn.bound.sublist.all_subscriptions():
            if self._tells(conn, sub):
                send = told.change(name, sub, sub.weight)
                if send is not None:
                    conn.send_interest(*send)
        role = "hub" if conn.spoke else "leaf"
        self.server.log(f"leafnode connection {conn.describe()} registered ({role} {conn.remote_name!r}, "
                        f"account {conn.bound.display})")
        conn.start_pinging()
        return True

    def _js_domain(self) -> str:
        """This server's JetStream domain ("" without JetStream or without a domain)."""
        js = self.server.opts.jetstream
        return js.domain if js.enabled else ""

    def lds_subject(self, account: Account) -> bytes:
        subject = self._lds.get(account.name)
        if subject is None:
            subject = self._lds[account.name] = LDS_PREFIX + secrets.token_urlsafe(16).replace("-", "A").encode()
        return subject

    def loop_detected(self, conn: LeafConnection) -> None:
        """The peer offered this server's own loop-detection subject: the links form a loop."""
        text = (f"Loop detected for leafnode account=\"{conn.bound.display}\". Delaying attempt to reconnect "
                f"for {LOOP_DELAY:.0f}s")
        self.log_error(f"leafnode {conn.describe()}: {text}")
        conn.loop_detected = True
        conn.reject(text)

    def connection_closed(self, conn: LeafConnection) -> None:
        if self.connections.pop(conn.cid, None) is not None:
            conn.drop_remote_interest()
            if self._running:
                self.server.log(f"leafnode connection {conn.describe()} closed")
            if self.server.ledger is not None:
                self.server.ledger.connection_closed(conn)

    # -- interest (InterestWatcher, AccountWatcher) -------------------------------------------------------
    def interest_added(self, sub: Subscription) -> None:
        self.account_interest(self.server.global_account, sub, 1)

    def interest_removed(self, sub: Subscription) -> None:
        self.account_interest(self.server.global_account, sub, -1)

    def account_interest(self, account: Account, sub: Subscription, delta: int) -> None:
        for conn in self.connections.values():
            if conn.bound is account and conn.told is not None and not conn.closed and self._tells(conn, sub):
                send = conn.told.change(account.name, sub, delta * sub.weight)
                if send is not None:
                    conn.send_interest(*send)

    @staticmethod
    def _tells(conn: LeafConnection, sub: Subscription) -> bool:
        other = sub.conn
        if other is conn:
            return False
        if conn.spoke and other.kind == ROUTE:
            return False
        if conn.isolated and other.kind == LEAF:  # (interest isolation: none of another leaf connection's)
            return False
        return conn.perms is None or conn.perms.can_receive(sub.subject)  # (deny_imports: no interest offered)

    # -- dialling ----------------------------------------------------------------------------------------
    async def _dial_loop(self, remote: RemoteLeafOptions, account: Account) -> None:
        """Keep one connection to the remote's hub, over its URLs in turn (shuffled once, as nats-server,
        unless `no_randomize`); `reconnect_interval` (a second) between attempts, as nats-server (also after a
        hub refused the login: it says so once per attempt)."""
        server = self.server
        interval = self.opts.reconnect_interval
        backoff = Backoff(start=interval, ceiling=interval)
        connected = False
        attempt = 0
        urls = list(remote.urls)
        if not remote.no_randomize:
            random.shuffle(urls)
        migration = None
        if remote.js_cluster_migrate:  # (zonebus.leaf.jsmigrate)
            name = "" if account is server.global_account else account.display
            migration = LeaderMigration(server.loop, name, remote.js_cluster_migrate_delay, self.jetstream_observer)
            self._migrations.append(migration)
        while self._running:
            url = urls[attempt % len(urls)]
            attempt += 1
            host, port = leaf_url(url)
            parts = urlsplit(url if "://" in url else f"nats-leaf://{url}")
            login = (unquote(parts.username or ""), unquote(parts.password or ""))
            make = functools.partial(LeafConnection, self, True, account, url, login, remote)
            try:
                if is_ws_url(url):  # (zonebus.leaf.websocket: the upgrade, then the link in frames)
                    tls = remote.tls is not None or url.lower().startswith("wss")
                    conn = await dial_websocket(server, url, remote, make,
                                                self.remote_tls_context(remote.tls) if tls else None,
                                                remote.first_info_timeout)
                else:
                    conn = await dial(server, make, host, port)
            except OSError as exc:
                failures = backoff.failed()
                if should_report(server.opts, connected, failures):
                    ws = isinstance(exc, WebSocketDialError)  # (the upgrade was refused: nats-server's words)
                    self.log_error(f"Error soliciting websocket connection: {exc}" if ws
                                   else f"Error trying to connect as leafnode to remote server \"{host}:{port}\" "
                                        f"(attempt {failures}): {dial_error(host, port, exc)}")
                if migration is not None:
                    migration.dial_failed()
                await backoff.wait()
                if migration is not None:
                    migration.still_down()
                continue
            if migration is not None:
                migration.connected()
            assert isinstance(conn, LeafConnection)
            await conn.closed_future
            if conn.loop_detected:
                await asyncio.sleep(LOOP_DELAY)
                continue
            if conn.below_min_version:
                self.log_error(f"Leafnode connection dropped due to minimum version requirement. Delaying attempt "
                               f"to reconnect for {MIN_VERSION_DELAY:.0f}s")
                await asyncio.sleep(MIN_VERSION_DELAY)
                continue
            if conn.established:
                connected = True
                backoff.reset()
            else:
                backoff.failed()
            await backoff.wait()

    # -- logging -------------------------------------------------------------------------------------------
    def log_error(self, msg: str) -> None:
        self.server.log(msg, "ERR")
