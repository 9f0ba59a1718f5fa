"""A route: one connection to a peer server of the same cluster (full mesh, one hop).

Handshake: the dialling side sends `CONNECT {json}` (credentials) and `INFO {json}`; the accepting side
sends `INFO {json}`. INFO carries server_id, server_name, cluster, tags, route_url, client_url and the
peers the sender knows (gossip). Then each side sends `RS+`/`RS-` for its local interest and `RMSG`/`HMSG`
for messages. A message that arrives over a route is delivered to local subscribers only.
Owned by the event loop thread; the ClusterManager decides what to do with a route once its INFO arrives.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import TYPE_CHECKING, Any

from zonebus.protocol import errors
from zonebus.protocol.errors import ProtocolError
from zonebus.protocol.route_parser import (
    CONNECT,
    ERR,
    INFO,
    PING,
    PONG,
    RMSG,
    RS_MINUS,
    RS_PLUS,
    MsgHeader,
    RouteParser,
)
from zonebus.server.connection import ACCOUNT, CLIENT, INTERNAL, ROUTE, Connection, replay
from zonebus.subjects.sublist import Subscription

if TYPE_CHECKING:
    from zonebus.cluster.manager import ClusterManager

PING_EVERY = 2.0
MEMO_MAX = 256


class RouteConnection(Connection, asyncio.Protocol):
    kind = ROUTE

    def __init__(self, manager: ClusterManager, solicited: bool, url: str = "", configured: bool = False) -> None:
        super().__init__(manager.server)
        self.manager = manager
        self.solicited = solicited
        self.url = url
        self.configured = configured
        self.parser = RouteParser(max_control_line=1 << 20, max_payload=1 << 30)
        self.remote_id = ""
        self.remote_name = ""
        self.remote_tags: list[str] = []
        self.remote_route_url = ""
        self.remote_client_url = ""
        self.remote_cluster = ""
        self.tag_match = False
        # an accepted route must send a valid CONNECT first when the cluster block sets credentials
        self.authorized = solicited or not manager.opts.user
        self.established = False
        self.duplicate = False
        self.remote_subs: dict[tuple[bytes, bytes | None], Subscription] = {}
        self.gateway_info: dict[str, Any] | None = None  # the peer's gateway gossip, from its INFO
        self.rtt = 0.0
        self._ping_sent = 0.0
        self._ping_timer: asyncio.TimerHandle | None = None
        self.closed_future: asyncio.Future = manager.server.loop.create_future()
        self._memos: dict[MsgHeader, tuple[int, list[tuple] | None]] = {}  # see _memo
        self.memo_sub = Subscription(self, b">", None, b"")  # counts forwards on client fast paths

    # -- asyncio.Protocol ----------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.peer_address(transport)
        self.server.routes[self.cid] = self
        m = self.manager
        if self.solicited:
            self.send(b"CONNECT " + _json(m.connect_fields(self)) + b"\r\n")
            self.send(b"INFO " + _json(m.info_fields()) + b"\r\n")
        elif self.authorized:
            self.send(b"INFO " + _json(m.info_fields()) + b"\r\n")
        # else: our INFO goes out once the dialler's CONNECT passed authorization (see _connect)
        self._ping_timer = self.server.loop.call_later(0.05, self._ping)

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        if self._ping_timer is not None:
            self._ping_timer.cancel()
        if not self.closed_future.done():
            self.closed_future.set_result(None)

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        ops, error = self.parser.feed(data)
        server = self.server
        for op in ops:
            code = op[0]
            if code == RMSG:
                if not self.established:
                    continue
                hdr, payload = op[1], op[2]
                self.in_msgs += 1
                self.in_bytes += hdr.size
                if self.ledger_in is not None:
                    server.ledger_count(self.ledger_in, hdr.subject, hdr.size + len(hdr.subject) + 16)
                if hdr.reply is None and hdr.hdr_len < 0 and not hdr.queues:
                    entries = self._memo(hdr)
                    if entries is not None:
                        replay(server, entries, hdr.subject, hdr.size, payload)
                        continue
                server.process_msg(self, hdr.subject, hdr.reply, hdr.hdr_len, payload, hdr.queues or ())
            elif code == RS_PLUS:
                if self.established:
                    self._remote_interest(op[2], op[3], op[4])
            elif code == RS_MINUS:
                if self.established:
                    self._remote_interest(op[2], op[3], 0)
            elif code == PING:
                self.send(b"PONG\r\n")
            elif code == PONG:
                if self._ping_sent:
                    self.rtt = time.monotonic() - self._ping_sent
                    self._ping_sent = 0.0
            elif code == INFO:
                if not self._info(op[1]):
                    return
            elif code == CONNECT:
                if not self._connect(op[1]):
                    return
            elif code == ERR:
                self.server.log(f"route {self.remote_name or self.url} error: {op[1].decode(errors='replace')}")
            if self.closed:
                return
        self.last_activity = time.time()
        if ops:
            server.producing(self, len(data))  # messages come in here: stall this route if a receiver backs up
        if error is not None:
            self.send(error.wire())
            self.close()

    def _memo(self, hdr: MsgHeader) -> list[tuple] | None:
        """Local deliveries of a plain, reply-less RMSG whose line repeats (the parser hands back the same
        header object): remembered per header while the sublist generation holds. None: full path."""
        generation = self.server.sublist.generation
        memo = self._memos.get(hdr)
        if memo is not None and memo[0] == generation:
            return memo[1]
        if len(self._memos) >= MEMO_MAX:
            self._memos.clear()
        entries: list[tuple] | None = []
        for sub in self.server.sublist.match(hdr.subject).psubs:
            conn = sub.conn
            if conn.kind == CLIENT and not sub.max_msgs:
                entries.append((conn, b"MSG %b %b %d\r\n" % (hdr.subject, sub.sid, hdr.size), sub))
            elif conn.kind == INTERNAL or conn.kind == CLIENT:
                entries = None  # internal subscribers and auto-unsubscribing ones take the full path
                break
            # routes and gateways: a message from a route is delivered here only
        self._memos[hdr] = (generation, entries)
        return entries

    # -- handshake -----------------------------------------------------------------------------------
    def _connect(self, raw: bytes) -> bool:
        try:
            fields = json.loads(raw)
        except ValueError:
            return self._reject(errors.UNKNOWN_OP)
        if self.authorized:
            return True
        if not self.manager.check_route_auth(fields):
            self.server.log(f"route from {self.ip}:{self.remote_port}: authentication error")
            return self._reject(errors.AUTH_VIOLATION)
        self.authorized = True
        self.send(b"INFO " + _json(self.manager.info_fields()) + b"\r\n")
        return True

    def _info(self, raw: bytes) -> bool:
        try:
            info = json.loads(raw)
        except ValueError:
            return self._reject(errors.UNKNOWN_OP)
        if not self.authorized:
            return self._reject(errors.AUTH_VIOLATION)
        self.remote_tags = [str(t) for t in info.get("tags") or []]
        self.remote_route_url = info.get("route_url", "")
        self.remote_client_url = info.get("client_url", "")
        self.remote_cluster = info.get("cluster", "")
        self.remote_name = info.get("server_name", "")
        first = not self.remote_id
        self.remote_id = info.get("server_id", "")
        if first:
            return self.manager.route_identified(self, info)
        self.manager.route_info_update(self, info)
        return True

    def _reject(self, text: str) -> bool:
        self.send(errors.err(text))
        self.close()
        return False

    # -- interest and messages -----------------------------------------------------------------------
    def _remote_interest(self, subject: bytes, queue: bytes | None, weight: int) -> None:
        key = (subject, queue)
        sub = self.remote_subs.get(key)
        server = self.server
        if weight <= 0:
            if sub is not None:
                del self.remote_subs[key]
                server.remove_subscription(sub)
            return
        if sub is None:
            sub = Subscription(self, subject, queue, b"", weight if queue else 1)
            self.remote_subs[key] = sub
            server.add_subscription(sub)
        elif queue is not None:
            sub.weight = weight

    def send_interest(self, subject: bytes, queue: bytes | None, weight: int) -> None:
        if queue is None:
            op = b"RS+" if weight > 0 else b"RS-"
            self.send(b"%b %b %b\r\n" % (op, ACCOUNT, subject))
        elif weight > 0:
            self.send(b"RS+ %b %b %b %d\r\n" % (ACCOUNT, subject, queue, weight))
        else:
            self.send(b"RS- %b %b %b\r\n" % (ACCOUNT, subject, queue))

    def drop_remote_interest(self) -> None:
        for sub in self.remote_subs.values():
            self.server.remove_subscription(sub)
        self.remote_subs.clear()

    def _ping(self) -> None:
        if self.closed:
            return
        if not self._ping_sent:
            self._ping_sent = time.monotonic()
            self.send(b"PING\r\n")
        self._ping_timer = self.server.loop.call_later(PING_EVERY, self._ping)

    def describe(self) -> str:
        return f"{self.remote_name or self.remote_id or self.url} ({self.ip}:{self.remote_port})"

    def protocol_error(self, error: ProtocolError) -> None:
        self.send(error.wire())
        self.close()


def _json(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()
