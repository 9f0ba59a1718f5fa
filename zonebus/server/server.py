"""The server: listeners, the connection registry, the subscription index and the one routing point.

`process_msg` is where every published message goes, whatever connection kind it came from: match the
subject (cached), hand the message to each plain subscriber, pick one member per queue group, and forward
to routes/gateways that have interest. Outbound data is batched per connection and flushed once per loop
turn (`mark_dirty` / `_flush_dirty`). Everything here runs on the event loop thread.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import socket
import sys
import time
from typing import Any

from zonebus import SERVER_VERSION
from zonebus.ledger.zones import server_zone
from zonebus.protocol.client_parser import PubHeader
from zonebus.protocol.route_parser import msg_line
from zonebus.server.client import ClientConnection
from zonebus.server.connection import ACCOUNT, CLIENT, GATEWAY, INTERNAL, ROUTE, Connection
from zonebus.server.options import ServerOptions
from zonebus.subjects.sublist import MatchResult, Sublist, Subscription

_B32 = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"
EARLY_FLUSH = 512 * 1024


def new_server_id() -> str:
    """A 56-character id shaped like nats-server's (an nkey public key starting with N)."""
    return "N" + "".join(random.choice(_B32) for _ in range(55))


class Server:
    def __init__(self, opts: ServerOptions) -> None:
        self.opts = opts
        self.server_id = new_server_id()
        self.name = opts.server_name or self.server_id
        self.loop: asyncio.AbstractEventLoop = None  # type: ignore[assignment]
        self.sublist = Sublist()
        self.clients: dict[int, ClientConnection] = {}
        self.routes: dict[int, Connection] = {}
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
        self._shutdown = asyncio.Event()
        self.monitor = None
        self.cluster = None  # zonebus.cluster.ClusterManager when a cluster block is set
        self.gateway = None  # zonebus.gateway.GatewayManager when a gateway block is set
        self.jetstream = None
        self.ledger = None  # zonebus.ledger.LedgerHooks when a ledger block is set
        self.random = random.Random()
        self.zone = self.zone_of_tags(opts.server_tags)
        self.zone_known = bool(self.zone)

    # -- lifecycle ------------------------------------------------------------------------------------
    async def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        opts = self.opts
        if opts.port < 0:  # nats-server's "random port"
            opts.port = 0
        srv = await self.loop.create_server(
            lambda: ClientConnection(self), opts.host, opts.port, reuse_address=True, backlog=1024
        )
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
        if opts.cluster.port or opts.cluster.routes:
            from zonebus.cluster.manager import ClusterManager

            self.cluster = ClusterManager(self)
            await self.cluster.start()
        if opts.gateway.name or opts.gateway.port or opts.gateway.gateways:  # -- gateways (zonebus.gateway)
            from zonebus.gateway.manager import GatewayManager

            self.gateway = GatewayManager(self)
            await self.gateway.start()
        if opts.jetstream.enabled:
            await self._start_jetstream()
        if opts.http_port:
            from zonebus.server.monitor import Monitor

            self.monitor = Monitor(self)
            await self.monitor.start()
        self.log(f"zonebus {SERVER_VERSION} listening for clients on {opts.host}:{opts.port} ({self.name})")

    async def _start_jetstream(self) -> None:
        from zonebus.server.internal import InternalClient
        from zonebus.stream.service import JetStreamService

        js = self.opts.jetstream
        if not js.store_dir:
            import tempfile

            js.store_dir = tempfile.mkdtemp(prefix="zonebus-js-")
        self.jetstream = JetStreamService(js, self.name, InternalClient(self, "$JS"))
        await self.jetstream.start()
        self._info_base = self._build_info()
        self.log(f"JetStream enabled, store {js.store_dir}")

    async def serve_forever(self) -> None:
        await self._shutdown.wait()

    def request_shutdown(self) -> None:
        self._shutdown.set()

    async def shutdown(self) -> None:
        for srv in self._servers:
            srv.close()
        if self.monitor is not None:
            await self.monitor.stop()
        if self.gateway is not None:
            await self.gateway.stop()
        if self.cluster is not None:
            await self.cluster.stop()
        if self.jetstream is not None:
            await self.jetstream.stop()
        for conn in list(self.clients.values()):
            conn.close()
        self._flush_dirty()
        if self.ledger is not None:
            await self.ledger.close()

    def log(self, msg: str) -> None:
        ts = time.strftime("%Y/%m/%d %H:%M:%S")
        print(f"[{os.getpid()}] {ts} [INF] {msg}", file=sys.stderr, flush=True)

    def zone_of_tags(self, tags: list[str]) -> str:
        """The zone named by a server's `<prefix>:<zone>` tag, or ""."""
        return server_zone(tags, self.opts.ledger.zone_tag_prefix)[0]

    # -- connections ----------------------------------------------------------------------------------
    def next_cid(self) -> int:
        self._cid += 1
        return self._cid

    def client_admitted(self, conn: ClientConnection) -> bool:
        if len(self.clients) >= self.opts.max_connections:
            return False
        self.clients[conn.cid] = conn
        self.total_connections += 1
        return True

    def client_connected(self, conn: ClientConnection) -> None:
        """CONNECT accepted: resolve the client's zone for the ledger."""
        if self.ledger is not None:
            self.ledger.client_connected(conn)

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
            self.closed_conns.append({"cid": conn.cid, "name": conn.name, "ip": conn.ip,
                                      "stop": time.time()})
            del self.closed_conns[:-100]
        elif self.cluster is not None and conn.kind == ROUTE:
            self.cluster.route_closed(conn)
        elif self.gateway is not None and conn.kind == GATEWAY:
            self.gateway.connection_closed(conn)

    def client_info(self, conn: ClientConnection) -> bytes:
        info = dict(self._info_base)
        info["client_id"] = conn.cid
        info["client_ip"] = conn.ip
        if self.cluster is not None:
            urls = self.cluster.client_connect_urls()
            if urls:
                info["connect_urls"] = urls
        return b"INFO " + _json(info) + b"\r\n"

    def client_urls_changed(self) -> None:
        """The cluster's client URLs changed: tell the clients that take asynchronous INFO, as nats-server
        does, so that they can fail over to any server of the cluster."""
        for conn in self.clients.values():
            if conn.connected and conn.protocol >= 1 and not conn.closed:
                conn.send(self.client_info(conn))

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
            "headers": True,
            "max_payload": opts.max_payload,
        }
        if opts.auth_required:
            info["auth_required"] = True
        if opts.cluster.name:
            info["cluster"] = opts.cluster.name
        if self.jetstream is not None:
            info["jetstream"] = True
        return info

    def check_auth(self, connect: dict[str, Any]) -> bool:
        opts = self.opts
        if opts.auth_token:
            return connect.get("auth_token") == opts.auth_token
        return connect.get("user") == opts.auth_user and connect.get("pass") == opts.auth_password

    # -- subscriptions --------------------------------------------------------------------------------
    def add_subscription(self, sub: Subscription) -> None:
        self.sublist.insert(sub)
        if self.cluster is not None and sub.conn.kind in (CLIENT, INTERNAL):
            self.cluster.local_interest_added(sub)
        if self.gateway is not None:  # this cluster's interest (local and route subs), told to other clusters
            self.gateway.interest_added(sub)

    def remove_subscription(self, sub: Subscription) -> None:
        if not self.sublist.remove(sub):
            return
        if self.cluster is not None and sub.conn.kind in (CLIENT, INTERNAL):
            self.cluster.local_interest_removed(sub)
        if self.gateway is not None:
            self.gateway.interest_removed(sub)

    # -- routing --------------------------------------------------------------------------------------
    def process_msg(self, src: Connection, subject: bytes, reply: bytes | None, hdr_len: int, data: bytes,
                    queues: list[bytes] | None = None, memo_for: PubHeader | None = None) -> bool:
        """Deliver one message; `data` is the payload (header block included) plus CRLF.

        `queues` is set only for messages that arrived over a route or a gateway: the queue groups this
        server (route) or this cluster (gateway) was chosen to serve. `memo_for` is the client's cached
        control line: when the message goes only to plain client subscribers (and gateways), their lines are
        remembered there for the client's fast path. Returns whether anything received the message.
        """
        r = self.sublist.match(subject)
        if memo_for is not None:
            self._memoize(src, memo_for, r)
        if self.gateway is not None and src.kind != ROUTE:  # -- gateways: zonebus.gateway.routing
            return self.gateway.process_msg(src, subject, reply, hdr_len, data, queues, r)
        if not r:
            if reply and src.kind == CLIENT and src.no_responders:
                self._no_responders(src, subject, reply)
            return False
        delivered = self.deliver_in_cluster(src, r, subject, reply, hdr_len, data, queues)
        if not delivered and reply and src.kind == CLIENT and src.no_responders:
            self._no_responders(src, subject, reply)  # e.g. only our own subs matched, with echo off
        return delivered

    def deliver_in_cluster(self, src: Connection, r: MatchResult, subject: bytes, reply: bytes | None,
                           hdr_len: int, data: bytes, queues: list[bytes] | None) -> bool:
        """Local subscribers, routes with interest, one member per queue group in this cluster.

        From a route: local subscribers only. From a gateway: local and routes, and only the queue groups
        named in `queues`. `r` must be non-empty.
        """
        from_route = src.kind == ROUTE
        delivered = False
        routes: dict[Connection, list[bytes]] | None = None
        echo = src.kind != CLIENT or src.echo
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
            elif not from_route:
                if routes is None:
                    routes = {}
                routes.setdefault(conn, [])
        if r.qsubs:
            if from_route:
                delivered |= self._deliver_queues_locally(src, r.qsubs, queues, subject, reply, hdr_len, data)
            else:
                only = (queues or ()) if src.kind == GATEWAY else None
                routes, d = self._route_queues(src, r.qsubs, routes, subject, reply, hdr_len, data, echo, only)
                delivered |= d
        if routes:
            for conn, qnames in routes.items():
                conn.forward(subject, reply, hdr_len, data, qnames)
            delivered = True
        return delivered

    def _memoize(self, src: Connection, hdr: PubHeader, r: MatchResult) -> None:
        """Remember the delivery list of a reply-less PUB line that reaches only plain client subs."""
        if hdr.ledger_n and self.ledger is not None:
            self.ledger.settle(src, hdr)
        hdr.gen = self.sublist.generation
        hdr.memo = hdr.qmemo = None
        gw = self.gateway
        if hdr.reply is not None or hdr.hdr_len >= 0:
            return
        memo = self._memo_entries(src, hdr, r.psubs)
        if memo is None or (gw is not None and not gw.memo_entries(hdr.subject, hdr.size, memo)):
            return
        if r.qsubs:
            # queue groups: only on a lone server without a ledger (elsewhere the cluster policy, gateways
            # and the decision counts need the full path); one member is drawn per message on the fast path
            if self.cluster is not None or gw is not None or self.ledger is not None:
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
            if conn.kind == ROUTE and sub.queue is None:  # one RMSG per route with interest
                if conn not in routes:
                    routes.add(conn)
                    entries.append((conn, msg_line(ACCOUNT, hdr.subject, None, None, -1, hdr.size), conn.memo_sub))
                continue
            if conn.kind != CLIENT or sub.max_msgs:
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
        pick = self.cluster.pick_queue_member if self.cluster is not None else None
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
            conn = sub.conn
            if conn.kind == CLIENT or conn.kind == INTERNAL:
                self._deliver_one(sub, subject, reply, hdr_len, data)
                delivered = True
            else:
                if routes is None:
                    routes = {}
                routes.setdefault(conn, []).append(sub.queue)
        return routes, delivered

    def _deliver_queues_locally(self, src: Connection, groups: list[list[Subscription]],
                                queues: list[bytes] | None, subject: bytes, reply: bytes | None,
                                hdr_len: int, data: bytes) -> bool:
        if not queues:
            return False
        delivered = False
        for group in groups:
            local = [s for s in group if s.conn.kind == CLIENT or s.conn.kind == INTERNAL]
            if not local or local[0].queue not in queues:
                continue
            sub = local[self.random.randrange(len(local))] if len(local) > 1 else local[0]
            self._deliver_one(sub, subject, reply, hdr_len, data)
            delivered = True
        return delivered

    def _deliver_one(self, sub: Subscription, subject: bytes, reply: bytes | None, hdr_len: int,
                     data: bytes) -> None:
        conn = sub.conn
        sub.delivered += 1
        conn.deliver(sub, subject, reply, hdr_len, data)
        if sub.max_msgs and sub.delivered >= sub.max_msgs:
            conn.subscription_done(sub)

    def _no_responders(self, src: ClientConnection, subject: bytes, reply: bytes) -> None:
        hdr = b"NATS/1.0 503\r\nNats-Subject: " + subject + b"\r\n\r\n"
        for sub in self.sublist.match(reply).psubs:
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
        conns: list[Connection] = [*self.clients.values(), *self.routes.values()]
        if self.gateway is not None:
            conns += self.gateway.conns()
        return {
            "in_msgs": self.in_msgs + sum(c.in_msgs for c in conns),
            "in_bytes": self.in_bytes + sum(c.in_bytes for c in conns),
            "out_msgs": self.out_msgs + sum(c.out_msgs for c in conns),
            "out_bytes": self.out_bytes + sum(c.out_bytes for c in conns),
        }


def _json(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()
