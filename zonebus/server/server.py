"""The server: listeners, the connection registry, the subscription index and the one routing point.

`process_msg` is where every published message goes, whatever connection kind it came from: match the
subject (cached), hand the message to each plain subscriber, pick one member per queue group, and forward
to routes/gateways that have interest. Outbound data is batched per connection and flushed once per loop
turn (`mark_dirty` / `_flush_dirty`). Everything here runs on the event loop thread.

The server knows nothing of its extensions (routes, gateways, streams): they register through the hooks
described in `zonebus.server.hooks`, wired by the composition root `zonebus.node`.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import socket
import sys
import time
from collections.abc import Callable
from typing import Any

from zonebus import SERVER_VERSION
from zonebus.ledger.zones import server_zone
from zonebus.protocol.client_parser import PubHeader
from zonebus.protocol.route_parser import msg_line
from zonebus.server import account_limits
from zonebus.server.accounts import Account, Accounts
from zonebus.server.auth import Authenticator, ClientPermissions
from zonebus.server.client import ClientConnection
from zonebus.server.connection import CLIENT, GATEWAY, INTERNAL, LINKS, ROUTE, Connection
from zonebus.server.hooks import (
    AccountForwarder,
    AccountWatcher,
    Extension,
    Forwarder,
    InterestWatcher,
    PageBuilder,
    PublishInterceptor,
    QueuePicker,
)
from zonebus.server.identity import new_server_id
from zonebus.server.listening import naming, reuse_port
from zonebus.server.options import ServerOptions
from zonebus.subjects.sublist import MatchResult, Sublist, Subscription

EARLY_FLUSH = 512 * 1024


class Server:
    def __init__(self, opts: ServerOptions) -> None:
        self.opts = opts
        Sublist.caching = not opts.disable_sublist_cache  # (one server per process)
        self.server_id = new_server_id()
        self.name = opts.server_name or self.server_id
        self.loop: asyncio.AbstractEventLoop = None  # type: ignore[assignment]
        self.accounts = Accounts(self, opts)
        self.global_account = self.accounts.global_account
        self.sublist: Sublist = self.global_account.sublist  # the global account's ($G)
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
        self.slow_consumers = 0
        self.stale_connections = 0
        self.total_connections = 0
        self._servers: list[asyncio.base_events.Server] = []
        self.lame_duck = False  # `--signal ldm`: see zonebus.server.lameduck
        self._shutdown = asyncio.Event()
        self.monitor = None
        self.ledger = None  # zonebus.ledger.LedgerHooks when a ledger block is set
        self.storage_meter: Any = None  # zonebus.storage.meter.METER, set by the node: the ledger's storage rows
        self.system: Any = None  # zonebus.server.system.SystemAccount, once started
        self.system_requests = True  # it answers $SYS.REQ.SERVER.* (one process of several does)
        # -- extension hooks (zonebus.server.hooks) --
        self.extensions: list[Extension] = []
        self.interest_watchers: list[InterestWatcher] = []  # the global account's interest
        self.account_watchers: list[AccountWatcher] = []  # the other accounts' (zonebus.server.accounts)
        self.local_watchers: list[AccountWatcher] = []  # local-only internal subscriptions too (internal.py)
        self.forwarder: Forwarder | None = None
        self.account_forwarder: AccountForwarder | None = None  # the forwarder of the other accounts' messages
        self.queue_picker: QueuePicker | None = None
        self.connect_urls: Callable[[], list[str]] | None = None
        self.info_extras: dict[str, Any] = {}
        self.varz_sections: dict[str, Callable[[], dict[str, Any]]] = {}
        self.pages: dict[str, PageBuilder] = {}
        self.reload_hooks: list[Callable[[ServerOptions], None]] = []
        self.url_watchers: list[Callable[[], None]] = []  # told after client_urls_changed (hooks.py)
        self.publish_interceptor: PublishInterceptor | None = None
        self.pong_gate: Callable[[ClientConnection], bool] | None = None  # e.g. zonebus.workers: PONG when synced
        self.admission: Callable[[ClientConnection], bool] | None = None  # zonebus.workers: False = not here
        self.random = random.Random()
        self.authenticator = Authenticator(opts)
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
        tls_kw: dict[str, Any] = {}
        if opts.tls is not None:
            from zonebus.server.tls import server_context

            ctx = self.client_tls_context = server_context(opts.tls)
            if opts.tls.handshake_first:
                tls_kw = {"ssl": ctx, "ssl_handshake_timeout": opts.tls.timeout}
            else:
                self.client_tls = ctx
        if self.client_tls is not None:  # INFO in the clear, then TLS (zonebus.server.tls)
            from zonebus.server.tls import InfoFirstListener

            listener = InfoFirstListener(self, self.client_tls, opts.tls.timeout)  # type: ignore[union-attr]
            with naming("clients", opts.host, opts.port):
                opts.port = listener.start(opts.host, opts.port)
            self._servers.append(listener)  # type: ignore[arg-type]
        else:
            with naming("clients", opts.host, opts.port):
                srv = await self.loop.create_server(
                    lambda: ClientConnection(self), opts.host, opts.port, reuse_address=True, backlog=1024,
                    reuse_port=reuse_port(opts.workers), **tls_kw)
            for sock in srv.sockets:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._servers.append(srv)
            if opts.port == 0:
                opts.port = srv.sockets[0].getsockname()[1]
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
        self.log(f"zonebus {SERVER_VERSION} listening for clients on {opts.host}:{opts.port} ({self.name})")
        if opts.tls is not None:
            self.log("TLS required for client connections"
                     + (" (handshake first)" if opts.tls.handshake_first else ""))

    def add_extension(self, ext: Extension) -> None:
        """Started after the client listener (in the order added), stopped at shutdown in reverse."""
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

    def client_info(self, conn: ClientConnection) -> bytes:
        info = dict(self._info_base)
        info["client_id"] = conn.cid
        info["client_ip"] = conn.ip
        if self.authenticator.needs_nonce:
            conn.nonce = info["nonce"] = self.authenticator.new_nonce()
        if self.connect_urls is not None:
            urls = self.connect_urls()
            if urls:
                info["connect_urls"] = urls
        info.update(account_limits.info_fields(conn))
        return b"INFO " + _json(info) + b"\r\n"

    def client_urls_changed(self) -> None:
        """The cluster's client URLs changed: tell the clients that take asynchronous INFO, as nats-server
        does, so that they can fail over to any server of the cluster."""
        for conn in self.clients.values():
            if conn.connected and conn.protocol >= 1 and not conn.closed:
                conn.info_changed()  # (after the client's first PONG, as nats-server)
        for watcher in self.url_watchers:
            watcher()

    def _build_info(self) -> dict[str, Any]:
        opts = self.opts
        info: dict[str, Any] = {
            "server_id": self.server_id,
            "server_name": self.name,
            "version": SERVER_VERSION,
            "proto": 1,
            "go": f"python{sys.version_info.major}.{sys.version_info.minor}",
            "host": opts.host,
            "port": opts.port,
            "headers": not opts.no_header_support,
            "max_payload": opts.max_payload,
        }
        if opts.auth_required:
            info["auth_required"] = True
        if opts.tls is not None:
            info["tls_required"] = True
            if opts.tls.verify or opts.tls.verify_and_map:
                info["tls_verify"] = True
        if opts.cluster.name:
            info["cluster"] = opts.cluster.name
        info.update(self.info_extras)
        return info

    def check_auth(self, conn: ClientConnection, connect: dict[str, Any]) -> bool:
        """Log `conn` in with its CONNECT fields: sets its user and permissions, or logs the refusal."""
        login, why = self.authenticator.authenticate(connect, conn.nonce, conn.peercert)
        if login is None:
            self.auth_log(conn, "authentication error" + why)
            return False
        conn.connect_opts = connect
        conn.auth_user = login.user
        conn.account = self.accounts.lookup(login.account)
        conn.perms = ClientPermissions(login.perms) if login.perms is not None else None
        return True

    def reload_tls(self, new: ServerOptions) -> None:
        """SIGHUP: a changed certificate, key, CA or `verify` of the top-level tls block applies to the
        handshakes that follow. Turning TLS on or off needs a restart (the listener changes kind)."""
        if self.client_tls_context is None or new.tls is None:
            if (self.client_tls_context is None) != (new.tls is None):
                self.log("reload: adding or removing the tls block needs a restart; TLS left as it was", "WRN")
            return
        from zonebus.server.tls import TLSConfigError, reload_context

        try:
            reload_context(self.client_tls_context, new.tls, "tls: ")
        except TLSConfigError as exc:
            self.log(f"reload: {exc}; the previous certificate stays", "ERR")
            return
        self.opts.tls = new.tls
        self.log(f"reload: client TLS certificate {new.tls.cert_file}")

    def reload_auth(self, new: ServerOptions) -> None:
        """Apply changed users, permissions, token and `no_auth_user` (SIGHUP): each logged-in client is
        checked again with the CONNECT it sent; refused ones are closed, the others get their (maybe new)
        permissions, and subscriptions these no longer allow are removed with a Permissions Violation."""
        opts = self.opts
        if new.accounts or opts.accounts or new.mappings or opts.mappings:
            opts.accounts, opts.system_account, opts.mappings = new.accounts, new.system_account, new.mappings
            self.accounts.reload(new)
            if self.system is not None:
                self.system.conns.start()
        opts.auth_user, opts.auth_password, opts.auth_token = new.auth_user, new.auth_password, new.auth_token
        opts.users, opts.default_permissions = new.users, new.default_permissions
        opts.no_auth_user, opts.auth_timeout = new.no_auth_user, new.auth_timeout
        self.authenticator = Authenticator(opts)
        self._info_base = self._build_info()
        for conn in list(self.clients.values()):
            if not conn.connected or conn.closed:
                continue
            if not opts.auth_required:
                conn.perms, conn.auth_user = None, ""
                continue
            login, _ = self.authenticator.authenticate(conn.connect_opts, conn.nonce, conn.peercert)
            if login is None:
                self.auth_log(conn, "authorization removed on reload")  # closed without -ERR, as nats-server
                conn.close()
                continue
            if self.accounts.lookup(login.account) is not conn.account:
                self.auth_log(conn, "account changed on reload")
                conn.close()
                continue
            conn.auth_user = login.user
            conn.perms = perms = ClientPermissions(login.perms) if login.perms is not None else None
            if perms is None:
                continue
            for sub in list(conn.subs.values()):
                if not perms.can_subscribe(sub.subject, sub.queue):
                    conn.send(b"-ERR 'Permissions Violation for Subscription to \"%b\" (sid \"%b\")'\r\n"
                              % (sub.subject, sub.sid))
                    del conn.subs[sub.sid]
                    self.remove_subscription(sub)
        for acc in self.accounts.by_name.values():
            acc.sublist.touch()  # cached fast-path deliveries were built under the old permissions

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

    # -- routing --------------------------------------------------------------------------------------
    def process_msg(self, src: Connection, subject: bytes, reply: bytes | None, hdr_len: int, data: bytes,
                    queues: list[bytes] | None = None, memo_for: PubHeader | None = None,
                    account: Account | None = None) -> bool:
        """Deliver one message; `data` is the payload (header block included) plus CRLF.

        `queues` is set only for messages that arrived over a route or a gateway: the queue groups this
        server (route) or this cluster (gateway) was chosen to serve. `memo_for` is the client's cached
        control line: when the message goes only to plain client subscribers (and gateways), their lines are
        remembered there for the client's fast path. `account`: the account a link named (default: the
        source connection's). Returns whether anything received the message.
        """
        acc = account or src.account
        if acc is not self.global_account:
            return self._process_in_account(src, acc, subject, reply, hdr_len, data, queues, memo_for)
        r = self.sublist.match(subject)
        taken = False
        if self.publish_interceptor is not None:  # e.g. durable queue groups (zonebus.queue), see hooks.py
            took = self.publish_interceptor(src, subject, reply, hdr_len, data, r)
            if took is not None:
                r, taken = took
                if memo_for is not None:
                    memo_for.memo = memo_for.qmemo = None
                    memo_for = None
                if not r:
                    return taken
        if memo_for is not None:
            self._memoize(src, memo_for, r)
        if self.forwarder is not None and src.kind != ROUTE:  # e.g. gateways: zonebus.gateway.routing
            return self.forwarder.process_msg(src, subject, reply, hdr_len, data, queues, r)
        if not r:
            if reply and src.kind == CLIENT and src.no_responders:
                self._no_responders(src, subject, reply)
            return False
        delivered = self.deliver_in_cluster(src, r, subject, reply, hdr_len, data, queues) or taken
        if not delivered and reply and src.kind == CLIENT and src.no_responders:
            self._no_responders(src, subject, reply)  # e.g. only our own subs matched, with echo off
        return delivered

    def _process_in_account(self, src: Connection, acc: Account, subject: bytes, reply: bytes | None,
                            hdr_len: int, data: bytes, queues: list[bytes] | None,
                            memo_for: PubHeader | None) -> bool:
        """`process_msg` in an account other than `$G`: service imports first (for what clients publish),
        then the account's own subscribers in the cluster, and other clusters through the account forwarder
        (gateways). Durable queue groups and the zone router serve the global account only."""
        delivered = False
        took = None
        if acc.service_imports is not None and src.kind == CLIENT:
            took = self.accounts.service_request(src, acc, subject, reply, hdr_len, data)
            if took is not None:
                delivered = took
                memo_for = None
        r = acc.sublist.match(subject)
        fwd = self.account_forwarder
        if fwd is not None and src.kind != ROUTE and took is None:  # gateways (a service request stays here)
            return fwd.process_msg(src, subject, reply, hdr_len, data, queues, r, acc)
        if memo_for is not None and fwd is None:
            self._memoize(src, memo_for, r)
        if r:
            delivered = self.deliver_in_cluster(src, r, subject, reply, hdr_len, data, queues, acc) or delivered
        if not delivered and reply and src.kind == CLIENT and src.no_responders:
            self._no_responders(src, subject, reply)
        return delivered

    def deliver_in_cluster(self, src: Connection, r: MatchResult, subject: bytes, reply: bytes | None,
                           hdr_len: int, data: bytes, queues: list[bytes] | None, acc: Account | None = None) -> bool:
        """Local subscribers, routes with interest, one member per queue group in this cluster.

        From a route: local subscribers only, and the queue groups named in `queues`. From a gateway: local
        and routes, and only the queue groups named in `queues`. One hop per link kind: a message from a route
        goes to no other route, one from another worker process of this server (`WORKER`, zonebus.workers) to
        no other worker, but the worker that holds the routes passes a route's message on to the other
        workers and a worker's message on to the routes. `r` must be non-empty.
        """
        src_kind = src.kind
        from_link = src_kind in LINKS
        delivered = False
        routes: dict[Connection, list[bytes]] | None = None
        echo = src_kind != CLIENT or src.echo
        for sub in r.psubs:
            conn = sub.conn
            kind = conn.kind
            if kind in (CLIENT, INTERNAL):
                if conn is src and not echo:
                    continue
                if sub.max_msgs and sub.delivered >= sub.max_msgs:
                    continue
                self._deliver_one(sub, subject, reply, hdr_len, data)
                delivered = True
            elif kind != src_kind:
                if routes is None:
                    routes = {}
                routes.setdefault(conn, [])
        if r.qsubs:
            if from_link:
                routes, d = self._serve_named_queues(src, r.qsubs, routes, queues, subject, reply, hdr_len, data)
                delivered |= d
            else:
                only = (queues or ()) if src.kind == GATEWAY else None
                routes, d = self._route_queues(src, r.qsubs, routes, subject, reply, hdr_len, data, echo, only)
                delivered |= d
        if routes:
            name = self.global_account.name if acc is None else acc.name
            for conn, qnames in routes.items():
                conn.forward(subject, reply, hdr_len, data, qnames, name)
            delivered = True
        return delivered

    def _memoize(self, src: Connection, hdr: PubHeader, r: MatchResult) -> None:
        """Remember the delivery list of a reply-less PUB line that reaches only plain client subs."""
        if hdr.ledger_n and self.ledger is not None:
            self.ledger.settle(src, hdr)
        acc = src.account
        hdr.gen = acc.sublist.generation
        hdr.memo = hdr.qmemo = None
        fwd = self.forwarder if acc is self.global_account else None
        if hdr.reply is not None or hdr.hdr_len >= 0:
            return
        memo = self._memo_entries(src, hdr, r.psubs)
        if memo is None or (fwd is not None and not fwd.memo_entries(hdr.subject, hdr.size, memo)):
            return
        if r.qsubs:
            # queue groups: only on a lone server without a ledger (elsewhere the cluster policy, gateways
            # and the decision counts need the full path); one member is drawn per message on the fast path
            if self.queue_picker is not None or fwd is not None or self.ledger is not None:
                return
            qmemo = []
            for group in r.qsubs:
                entries = self._memo_entries(src, hdr, group)
                if entries is None:
                    return
                if entries:
                    qmemo.append(entries)
            hdr.qmemo = qmemo
        hdr.memo = memo

    @staticmethod
    def _memo_entries(src: Connection, hdr: PubHeader, subs: list[Subscription]) -> list[tuple] | None:
        """(conn, line, sub) per client subscription (MSG) and per route with interest (RMSG), or None when
        one of them needs the full path."""
        entries = []
        routes: set[Connection] = set()
        for sub in subs:
            conn = sub.conn
            if conn.kind in LINKS and sub.queue is None:  # one RMSG per route (or worker) with interest
                if conn not in routes:
                    routes.add(conn)
                    entries.append((conn, msg_line(src.account.name, hdr.subject, None, None, -1, hdr.size),
                                    conn.memo_sub))
                continue
            if conn.kind != CLIENT or sub.max_msgs or (conn.perms is not None and conn.perms.deliver_deny):
                return None
            if conn is src and not src.echo:
                continue
            entries.append((conn, b"MSG %b %b %d\r\n" % (hdr.subject, sub.sid, hdr.size), sub))
        return entries

    def _route_queues(self, src: Connection, groups: list[list[Subscription]], routes, subject: bytes,
                      reply: bytes | None, hdr_len: int, data: bytes, echo: bool, only=None):
        """Pick one member per queue group: local clients and remote routes alike (cluster policy).

        `only`: serve just these queue names (a message a gateway sent for the groups it named)."""
        delivered = False
        pick = self.queue_picker
        for group in groups:
            if only is not None and group[0].queue not in only:
                continue
            if pick is not None:
                sub = pick(src, group, subject, len(data) - 2)
            else:
                members = group if echo else [s for s in group if s.conn is not src]
                if not members:
                    continue
                sub = members[self.random.randrange(len(members))] if len(members) > 1 else members[0]
            if sub is None:
                continue
            if self._serve_member(sub, subject, reply, hdr_len, data):
                delivered = True
            else:
                if routes is None:
                    routes = {}
                routes.setdefault(sub.conn, []).append(sub.queue)
        return routes, delivered

    def _serve_named_queues(self, src: Connection, groups: list[list[Subscription]], routes,
                            queues: list[bytes] | None, subject: bytes, reply: bytes | None, hdr_len: int,
                            data: bytes):
        """A link named the queue groups this server is to serve: one member of each, among the local ones
        and those behind links of another kind than the sender's (see `deliver_in_cluster`)."""
        delivered = False
        if not queues:
            return routes, delivered
        src_kind = src.kind
        for group in groups:
            if group[0].queue not in queues:
                continue
            members = [s for s in group if s.conn.kind != src_kind]
            if not members:
                continue
            if self.queue_picker is not None and any(s.conn.kind in LINKS for s in members):
                sub = self.queue_picker(src, members, subject, len(data) - 2)
                if sub is None:
                    continue
            else:  # local members only: each as likely
                sub = members[self.random.randrange(len(members))] if len(members) > 1 else members[0]
            if self._serve_member(sub, subject, reply, hdr_len, data):
                delivered = True
            else:
                if routes is None:
                    routes = {}
                routes.setdefault(sub.conn, []).append(sub.queue)
        return routes, delivered

    def _serve_member(self, sub: Subscription, subject: bytes, reply: bytes | None, hdr_len: int,
                      data: bytes) -> bool:
        """The queue member picked: delivered here when it is local (True); else (False) the caller names
        its queue to the link it stands for."""
        if sub.conn.kind in (CLIENT, INTERNAL):
            self._deliver_one(sub, subject, reply, hdr_len, data)
            return True
        return False

    def _deliver_one(self, sub: Subscription, subject: bytes, reply: bytes | None, hdr_len: int,
                     data: bytes) -> None:
        conn = sub.conn
        sub.delivered += 1
        conn.deliver(sub, subject, reply, hdr_len, data)
        if sub.max_msgs and sub.delivered >= sub.max_msgs:
            conn.subscription_done(sub)

    def _no_responders(self, src: ClientConnection, subject: bytes, reply: bytes) -> None:
        hdr = b"NATS/1.0 503\r\nNats-Subject: " + subject + b"\r\n\r\n"
        for sub in src.account.sublist.match(reply).psubs:
            if sub.conn is src:
                src.deliver(sub, reply, None, len(hdr), hdr + b"\r\n")
                return

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


def _json(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()
