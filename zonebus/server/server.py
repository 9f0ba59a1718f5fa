"""The server: listeners, the connection registry, the subscription index, and batched output.

The one routing point (`process_msg`, where every published message goes) is `zonebus.server.routing`, a
base class of `Server`; the INFO clients get and their logins (and the reload of both) are
`zonebus.server.logins`. Outbound data is batched per connection and flushed once per loop turn
(`mark_dirty` / `_flush_dirty`). Everything here runs on the event loop thread.

The server knows nothing of its extensions (routes, gateways, streams): they register through the hooks
described in `zonebus.server.hooks`, wired by the composition root `zonebus.node`.
"""

from __future__ import annotations

import asyncio
import os
import random
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

from zonebus import SERVER_VERSION
from zonebus.ledger.zones import server_zone
from zonebus.options import ServerOptions
from zonebus.server.accounts import Account, Accounts
from zonebus.server.auth import Authenticator
from zonebus.server.client import ClientConnection
from zonebus.server.connection import CLIENT, Connection
from zonebus.server.corepath import IMPLEMENTATION as corepath_implementation
from zonebus.server.corepath import CorePath
from zonebus.server.hooks import (
    AccountForwarder,
    AccountWatcher,
    Extension,
    Forwarder,
    InterestWatcher,
    PageBuilder,
    PublishInterceptor,
    QueuePicker,
    ZoneRelay,
)
from zonebus.server.identity import new_server_id
from zonebus.server.listening import ClientListener, open_clients
from zonebus.server.logins import ClientLogins, websocket_authenticator
from zonebus.server.routing import MessageRouting
from zonebus.subjects.sublist import Sublist, Subscription

EARLY_FLUSH = 512 * 1024


class Server(ClientLogins, MessageRouting):
    """One server: its routing point (`MessageRouting`), what clients are told and how they log in
    (`ClientLogins`), and here its lifecycle, connections, subscriptions and batched flushing."""

    def __init__(self, opts: ServerOptions) -> None:
        self.opts = opts
        Sublist.caching = not opts.disable_sublist_cache  # (one server per process)
        self.server_id = new_server_id()
        self.name = opts.server_name or self.server_id
        self.loop: asyncio.AbstractEventLoop = None  # type: ignore[assignment]
        self.accounts = Accounts(self, opts)
        self.global_account = self.accounts.global_account
        self.sublist: Sublist = self.global_account.sublist  # the global account's ($G)
        self.core_path = CorePath(self)  # a client's messages straight from its reads (zonebus.server.corepath)
        self.clients: dict[int, ClientConnection] = {}
        self.links: dict[int, Connection] = {}  # connections to other servers (routes, gateways), by cid
        self.closed_conns: list[dict[str, Any]] = []
        self._cid = 0
        self._dirty: list[Connection] = []
        self.turn_producers: list[Connection] = []  # publishers whose input was processed this turn
        self.turn_bytes = 0  # input bytes processed since the last flush
        self._flush_scheduled = False
        self.start_time = time.time()
        self.in_msgs = self.in_bytes = self.out_msgs = self.out_bytes = 0  # totals of closed connections
        self.slow_consumer_kinds: dict[str, int] = {}  # slow consumers closed, by connection kind (`/varz`)
        self.stale_connections = 0
        self.total_connections = 0
        self._servers: list[ClientListener] = []
        self._listener: ClientListener | None = None  # the client port (zonebus.server.listening)
        self.websocket_listener: ClientListener | None = None  # websocket {} (zonebus.server.websocket)
        self._accepting = False  # serve_clients() ran
        self.serve_at_start = True  # False: clients are accepted from serve_clients() (zonebus.workers)
        self.lame_duck = False  # `--signal ldm`: see zonebus.server.lameduck
        self._shutdown = asyncio.Event()
        self.monitor = None
        self.ledger = None  # zonebus.ledger.LedgerHooks when a ledger block is set
        self.storage_meter: Any = None  # zonebus.storage.meter.METER, set by the node: the ledger's storage rows
        self.system: Any = None  # zonebus.server.system.SystemAccount, once started
        self.system_requests = True  # it answers $SYS.REQ.SERVER.* (one process of several does)
        self.worker_index = 0  # which of the server's worker processes this is (zonebus.workers)
        # -- extension hooks (zonebus.server.hooks) --
        self.extensions: list[Extension] = []
        self.interest_watchers: list[InterestWatcher] = []  # the global account's interest
        self.account_watchers: list[AccountWatcher] = []  # the other accounts' (zonebus.server.accounts)
        self.local_watchers: list[AccountWatcher] = []  # local-only internal subscriptions too (internal.py)
        self.forwarder: Forwarder | None = None
        self.account_forwarder: AccountForwarder | None = None  # the forwarder of the other accounts' messages
        self.queue_picker: QueuePicker | None = None
        self.connect_urls: Callable[[], list[str]] | None = None
        self.ws_connect_urls: Callable[[], list[str]] | None = None  # the peers' WebSocket URLs (hooks.py)
        self.ws_urls_told = False
        self.info_extras: dict[str, Any] = {}
        self.varz_sections: dict[str, Callable[[], dict[str, Any]]] = {}
        self.pages: dict[str, PageBuilder] = {}
        self.ledger_totals: Callable[[], Awaitable[Any]] | None = None  # /metrics: zonebus.workers sums them
        self.reload_hooks: list[Callable[[ServerOptions], None]] = []
        self.url_watchers: list[Callable[[], None]] = []  # told after client_urls_changed (hooks.py)
        self.publish_interceptor: PublishInterceptor | None = None
        self.zone_relay: ZoneRelay | None = None  # zonebus.cluster.relay: one copy per remote zone
        self.pong_gate: Callable[[ClientConnection], bool] | None = None  # e.g. zonebus.workers: PONG when synced
        self.admission: Callable[[ClientConnection], bool] | None = None  # zonebus.workers: False = not here
        self.websocket_leaf: Callable[[bool], Any] | None = None  # zonebus.leaf: a leaf on the WebSocket port
        self.websocket_leaf_elsewhere: Callable[[Any, bytes], bool] | None = None  # zonebus.workers: hand it over
        self.random = random.Random()
        self.authenticator = Authenticator(opts)
        self.websocket_authenticator = websocket_authenticator(opts)
        self.zone = self.zone_of_tags(opts.server_tags)
        self.zone_known = bool(self.zone)
        # top-level tls {}: the context clients upgrade with after the plain INFO (None: no TLS, or TLS done by
        # the listener with handshake_first); tls_map: verify_and_map logs clients in by certificate
        self.client_tls: Any = None
        self.client_tls_context: Any = None  # the clients' ssl.SSLContext when the top-level tls block is set
        self.tls_map = bool(opts.tls is not None and opts.tls.verify_and_map)

    # -- lifecycle ------------------------------------------------------------------------------------
    async def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        opts = self.opts
        self.accounts.start()
        from zonebus.server.system import SystemAccount

        self.system = SystemAccount(self)
        self.system.start()
        if opts.port < 0:  # nats-server's "random port"
            opts.port = 0
        if opts.tls is not None:
            from zonebus.server.tls import server_context

            ctx = self.client_tls_context = server_context(opts.tls)
            if not opts.tls.handshake_first:
                self.client_tls = ctx
        self._listener = await open_clients(self)  # bound now, accepting from serve_clients()
        self._servers.append(self._listener)
        opts.port = self._listener.port
        if opts.websocket.port:
            from zonebus.server.websocket import open_websocket

            self.websocket_listener = await open_websocket(self)
            self._servers.append(self.websocket_listener)
        self._info_base = self._build_info()
        if opts.ledger.enabled:
            from zonebus.server.ledger_hooks import LedgerHooks

            self.ledger = LedgerHooks(self)
            self.ledger.start()
        for ext in self.extensions:
            await ext.start()
        self._info_base = self._build_info()
        if opts.http_port or opts.https_port:
            from zonebus.server.monitor import Monitor

            self.monitor = Monitor(self)
            await self.monitor.start()
            if opts.http_port:
                self.log(f"monitoring on http://{opts.http_host or opts.host}:{opts.http_port}")
            if opts.https_port:
                self.log(f"monitoring on https://{opts.http_host or opts.host}:{opts.https_port}")
        if self.serve_at_start:
            await self.serve_clients()

    async def serve_clients(self) -> None:
        """Accept clients (once, after `start`): by `start` itself once the extensions started, or later by
        whoever set `serve_at_start` False (a worker, once it has the other workers' interest)."""
        if self._listener is None or self._accepting or self.lame_duck:
            return
        self._accepting = True
        opts = self.opts
        if self.websocket_listener is not None:
            await self.websocket_listener.serve()
            wso = opts.websocket
            scheme = "ws" if wso.tls is None else "wss"
            self.log(f"Listening for websocket clients on {scheme}://{wso.host}:{self.websocket_listener.port}")
            if wso.tls is None:
                self.log("Websocket not configured with TLS. DO NOT USE IN PRODUCTION!", "WRN")
        await self._listener.serve()
        self.log(f"zonebus {SERVER_VERSION} listening for clients on {opts.host}:{opts.port} ({self.name}; core path: "
                 f"{corepath_implementation})")
        if opts.tls is not None:
            self.log("TLS required for client connections"
                     + (" (handshake first)" if opts.tls.handshake_first else ""))

    def add_extension(self, ext: Extension) -> None:
        """Started after the client port is bound and before clients are accepted (in the order added), stopped
        at shutdown in reverse."""
        self.extensions.append(ext)

    async def serve_forever(self) -> None:
        await self._shutdown.wait()

    def request_shutdown(self) -> None:
        self._shutdown.set()

    def stop_listening(self) -> None:
        """Accept no more clients (lame duck mode); established connections stay."""
        for srv in self._servers:
            srv.close()

    def enter_lame_duck(self) -> None:
        from zonebus.server.lameduck import lame_duck

        self._lame_duck_task = asyncio.ensure_future(lame_duck(self))

    def refresh_info(self) -> None:
        """Rebuild the INFO base after `info_extras` changed."""
        self._info_base = self._build_info()

    async def shutdown(self) -> None:
        for srv in self._servers:
            srv.close()
        if self.monitor is not None:
            await self.monitor.stop()
        for ext in reversed(self.extensions):
            await ext.stop()
        for conn in list(self.clients.values()):
            conn.close()
        self._flush_dirty()
        if self.ledger is not None:
            await self.ledger.close()
        self.log(f"server {self.name} shut down")

    def log(self, msg: str, level: str = "INF") -> None:
        ts = time.strftime("%Y/%m/%d %H:%M:%S")
        print(f"[{os.getpid()}] {ts} [{level}] {msg}", file=sys.stderr, flush=True)

    def auth_log(self, conn: ClientConnection, msg: str) -> None:
        """One [ERR] line about a client, with its address, as nats-server writes them."""
        who = f' - "{conn.auth_user}"' if conn.auth_user else ""
        self.log(f"{conn.ip}:{conn.remote_port} - cid:{conn.cid}{who} - {msg.splitlines()[0] if msg else ''}",
                 "ERR")

    def zone_of_tags(self, tags: list[str]) -> str:
        """The zone named by a server's `<prefix>:<zone>` tag, or ""."""
        return server_zone(tags, self.opts.ledger.zone_tag_prefix)[0]

    # -- connections ----------------------------------------------------------------------------------
    def start_client_ids_after(self, last: int) -> None:
        """The next client id is `last + 1` (zonebus.workers gives each worker process a block of its own, so
        that ids are unique across the workers of one server)."""
        self._cid = last

    def next_cid(self) -> int:
        self._cid += 1
        return self._cid

    def client_admitted(self, conn: ClientConnection) -> bool:
        if len(self.clients) >= self.opts.max_connections or (self.admission is not None and not self.admission(conn)):
            return False
        self.clients[conn.cid] = conn
        self.total_connections += 1
        return True

    def client_connected(self, conn: ClientConnection) -> None:
        """CONNECT accepted: resolve the client's zone for the ledger."""
        if self.ledger is not None:
            self.ledger.client_connected(conn)
        if self.system is not None:
            self.system.client_connected(conn)

    def connection_closed(self, conn: Connection) -> None:
        self.in_msgs += conn.in_msgs
        self.in_bytes += conn.in_bytes
        self.out_msgs += conn.out_msgs
        self.out_bytes += conn.out_bytes
        if conn.kind == CLIENT:
            if self.clients.pop(conn.cid, None) is None:
                return
            for sub in list(conn.subs.values()):
                self.remove_subscription(sub)
            conn.subs.clear()
            if self.ledger is not None:
                self.ledger.connection_closed(conn)
            if self.system is not None and conn.connected:
                self.system.client_closed(conn)
            self.closed_conns.append({"cid": conn.cid, "name": conn.name, "ip": conn.ip,
                                      "stop": time.time()})
            del self.closed_conns[:-100]
        elif self.links.pop(conn.cid, None) is not None:
            conn.unregister()  # type: ignore[attr-defined]
            if self.system is not None:  # (its account connection counts, zonebus.server.account_conns)
                self.system.conns.peer_gone(getattr(conn, "remote_id", ""))

    # -- subscriptions --------------------------------------------------------------------------------
    def add_subscription(self, sub: Subscription, account: Account | None = None) -> None:
        """Index `sub` in its account (a local sub's: its connection's), tell the interest watchers, and
        shadow it in the accounts it imports streams from."""
        acc = account or sub.conn.account
        acc.sublist.insert(sub)
        if acc is self.global_account:
            for watcher in self.interest_watchers:
                watcher.interest_added(sub)
        else:
            for watcher in self.account_watchers:
                watcher.account_interest(acc, sub, 1)
        if acc.stream_imports and sub.conn.kind == CLIENT:
            self.accounts.subscription_added(sub)

    def remove_subscription(self, sub: Subscription, account: Account | None = None) -> None:
        acc = account or sub.conn.account
        if not acc.sublist.remove(sub):
            return
        if acc is self.global_account:
            for watcher in self.interest_watchers:
                watcher.interest_removed(sub)
        else:
            for watcher in self.account_watchers:
                watcher.account_interest(acc, sub, -1)
        if acc.shadows:
            self.accounts.subscription_removed(sub)

    # -- batched flushing -----------------------------------------------------------------------------
    def mark_dirty(self, conn: Connection) -> None:
        self._dirty.append(conn)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.loop.call_soon(self._flush_dirty)

    def _flush_dirty(self) -> None:
        self._flush_scheduled = False
        self._flush_now()
        self.turn_producers.clear()

    def _flush_now(self) -> None:
        self.turn_bytes = 0
        dirty, self._dirty = self._dirty, []
        for conn in dirty:
            conn.flush()

    def producing(self, conn: Connection, nbytes: int) -> None:
        """`conn` handed us `nbytes` of input this loop turn: it is the one to stall if a receiver backs up
        (see connection.py). The event loop may deliver several reads in one turn; past EARLY_FLUSH bytes the
        output is flushed at once, so that a backed-up receiver can stop the producer before more is read."""
        if not self.turn_producers or self.turn_producers[-1] is not conn:
            self.turn_producers.append(conn)
        self.turn_bytes += nbytes
        if self.turn_bytes > EARLY_FLUSH:
            self._flush_now()
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.loop.call_soon(self._flush_dirty)

    # -- ledger hook (hot path: one dict update) -------------------------------------------------------
    @staticmethod
    def ledger_count(counts: dict[bytes, list[int]], subject: bytes, nbytes: int) -> None:
        c = counts.get(subject)
        if c is None:
            counts[subject] = [1, nbytes]
        else:
            c[0] += 1
            c[1] += nbytes

    # -- stats ----------------------------------------------------------------------------------------
    def totals(self) -> dict[str, int]:
        conns: list[Connection] = [*self.clients.values(), *self.links.values()]
        return {
            "in_msgs": self.in_msgs + sum(c.in_msgs for c in conns),
            "in_bytes": self.in_bytes + sum(c.in_bytes for c in conns),
            "out_msgs": self.out_msgs + sum(c.out_msgs for c in conns),
            "out_bytes": self.out_bytes + sum(c.out_bytes for c in conns),
        }


