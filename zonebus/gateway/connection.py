"""A gateway connection: one TCP link between a server and a server of another cluster.

Every server dials one *outbound* connection per remote cluster and accepts *inbound* ones. Handshake: the
dialling side sends `CONNECT {json}` (credentials, its gateway name) and `INFO {json}`; the accepting side
sends `INFO {json}`. INFO carries server_id, server_name, `gateway` (the cluster's gateway name),
`gateway_url`, `gateway_urls` (every gateway URL of that cluster the sender knows), `gateways` (the other
clusters it knows, for gossip) and tags. Later INFOs carry a `gateway_cmd`: 1 gossip, 2/3 the start/end of
a switch to interest-only mode (`gateway_cmd_payload` = account).

After the handshake, messages (`RMSG`/`HMSG`, the route format from `route_parser`) flow from the outbound
side to the inbound side, and interest (`RS+`, `RS-`, `A+`, `A-`) flows back. Both sides PING; the
outbound side's RTT orders the clusters for queue groups.

Test hook: `ZONEBUS_GATEWAY_DELAY_MS="<gateway name>:<ms>[,<name>:<ms>...]"` delays every write on this
server's outbound connection to that cluster (order kept), so tests can give clusters different RTTs. It is
read once at start and never used otherwise. Owned by the event loop thread; the GatewayManager decides
what a connection means once its INFO arrives.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections import deque
from typing import TYPE_CHECKING, Any

from zonebus.gateway.interest import (
    CMD_ALL_SUBS_COMPLETE,
    CMD_ALL_SUBS_START,
    CMD_GOSSIP,
    InboundInterest,
    OutboundInterest,
)
from zonebus.protocol import errors
from zonebus.protocol.route_parser import (
    A_MINUS,
    A_PLUS,
    CONNECT,
    ERR,
    INFO,
    PING,
    PONG,
    RMSG,
    RS_MINUS,
    RS_PLUS,
    RouteParser,
)
from zonebus.server.connection import ACCOUNT, GATEWAY, Connection, replay
from zonebus.subjects.sublist import Subscription

if TYPE_CHECKING:
    from zonebus.gateway.manager import GatewayManager

PING_EVERY = 1.0
STALE_AFTER = 10.0  # a PING unanswered this long: the link is dead
MEMO_MAX = 512
DELAY_ENV = "ZONEBUS_GATEWAY_DELAY_MS"


def delays_from_env(value: str | None = None) -> dict[str, float]:
    """Parse the test hook `name:ms[,name:ms]` into {gateway name: seconds}; bad entries raise ValueError."""
    text = os.environ.get(DELAY_ENV, "") if value is None else value
    out: dict[str, float] = {}
    for item in filter(None, (s.strip() for s in text.split(","))):
        name, sep, ms = item.rpartition(":")
        try:
            if not sep or not name:
                raise ValueError
            out[name] = float(ms) / 1000.0
        except ValueError:
            raise ValueError(f"{DELAY_ENV}: expected <gateway name>:<milliseconds>, got {item!r}")
    return out


class GatewayConnection(Connection, asyncio.Protocol):
    kind = GATEWAY

    def __init__(self, manager: GatewayManager, outbound: bool, remote_gateway: str = "", url: str = "") -> None:
        super().__init__(manager.server)
        self.manager = manager
        self.outbound = outbound
        self.url = url
        self.remote_gateway = remote_gateway  # the remote cluster's gateway name (expected, when dialling)
        self.parser = RouteParser(max_control_line=1 << 20, max_payload=1 << 30)
        self.remote_id = ""
        self.remote_name = ""
        self.remote_tags: list[str] = []
        self.authorized = outbound  # an accepted connection must send a valid CONNECT first when auth is set
        self.established = False
        self.rejected = ""  # why the handshake failed (a misconfiguration), for the dial loop's report
        self.oi = OutboundInterest(self) if outbound else None
        self.ii = InboundInterest(manager.threshold) if not outbound else None
        self.rtt = 0.0  # seconds; 0 = not measured yet
        self._ping_sent = 0.0
        self._ping_timer: asyncio.TimerHandle | None = None
        self.delay = manager.delays.get(remote_gateway, 0.0) if outbound else 0.0
        self._memos: dict[Any, tuple[int, list | None]] = {}  # message header -> (generation, deliveries)
        self._delayed: deque[tuple[float, bytes]] = deque()
        self._delay_timer: asyncio.TimerHandle | None = None
        self.closed_future: asyncio.Future = manager.server.loop.create_future()
        # stands in for a subscription in a client's fast-path memo entries (conn, line, sub)
        self.memo_sub = Subscription(self, b">", None, b"")

    # -- asyncio.Protocol ----------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.peer_address(transport)
        self.set_write_limits(transport)
        m = self.manager
        if self.outbound:
            self.send(b"CONNECT " + _json(m.connect_fields(self.url)) + b"\r\n")
        self.send(b"INFO " + _json(m.info_fields()) + b"\r\n")
        m.connection_made(self)
        self._ping_timer = self.server.loop.call_later(max(m.opts.auth_timeout, 0.1), self._handshake_timeout)

    def _handshake_timeout(self) -> None:
        if not self.established and not self.closed:
            self.manager.report(f"gateway connection {self.describe()}: no handshake within "
                                f"{self.manager.opts.auth_timeout}s, closing")
            self.rejected = "handshake timeout"
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        for timer in (self._ping_timer, self._delay_timer):
            if timer is not None:
                timer.cancel()
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
                if not self.established or self.outbound:
                    continue  # messages only flow into the accepting side
                hdr, payload = op[1], op[2]
                size = hdr.size
                self.in_msgs += 1
                self.in_bytes += size
                if self.ledger_in is not None:
                    server.ledger_count(self.ledger_in, hdr.subject, size + len(hdr.subject) + 16)
                if hdr.account != ACCOUNT:
                    continue
                if hdr.reply is None and hdr.hdr_len < 0 and not hdr.queues and self._fast(hdr, payload):
                    continue
                server.process_msg(self, hdr.subject, hdr.reply, hdr.hdr_len, payload, hdr.queues or ())
            elif code in (RS_PLUS, RS_MINUS, A_PLUS, A_MINUS):
                if self.established and self.oi is not None and op[1] == ACCOUNT:
                    self._interest(op)
            elif code == PING:
                self.send(b"PONG\r\n")
            elif code == PONG:
                if self._ping_sent:
                    self.rtt = max(time.monotonic() - self._ping_sent, 1e-6)
                    self._ping_sent = 0.0
                    if self.outbound and self.established:
                        self.manager.rtt_changed()
            elif code == INFO:
                if not self._info(op[1]):
                    return
            elif code == CONNECT:
                if not self._connect(op[1]):
                    return
            elif code == ERR:
                text = op[1].decode(errors="replace")
                self.manager.report(f"gateway {self.describe()} sent error: {text}")
                if not self.rejected:
                    self.rejected = text
            if self.closed:
                return
        self.last_activity = time.time()
        if ops and not self.outbound:
            server.producing(self, len(data))  # messages come in here: stall this link if a receiver backs up
        if error is not None:
            self.send(error.wire())
            self.close()

    def _fast(self, hdr: Any, payload: bytes) -> bool:
        """Fast path for a plain message whose control line repeats (the parser hands back the same header
        object): replay the delivery list built the last time, while the subscriptions are unchanged."""
        server = self.server
        generation = server.sublist.generation
        memo = self._memos.get(hdr)
        if memo is None or memo[0] != generation:
            if len(self._memos) >= MEMO_MAX:
                self._memos.clear()
            memo = self._memos[hdr] = (generation, self.manager.inbound_memo(hdr.subject, hdr.size))
        entries = memo[1]
        if entries is None:
            return False
        replay(server, entries, hdr.subject, hdr.size, payload)
        return True

    # -- handshake -----------------------------------------------------------------------------------
    def _connect(self, raw: bytes) -> bool:
        try:
            fields = json.loads(raw)
            if not isinstance(fields, dict):
                raise ValueError
        except ValueError:
            return self.reject(errors.UNKNOWN_OP)
        if self.outbound:
            return True
        if not self.manager.check_auth(fields):
            self.manager.log_error(f"gateway connection from {self.ip}:{self.remote_port}: authorization failed")
            return self.reject(errors.AUTH_VIOLATION)
        self.authorized = True
        return True

    def _info(self, raw: bytes) -> bool:
        try:
            info = json.loads(raw)
            if not isinstance(info, dict):
                raise ValueError
        except ValueError:
            return self.reject(errors.UNKNOWN_OP)
        if not self.authorized:
            return self.reject(errors.AUTH_VIOLATION)
        cmd = info.get("gateway_cmd", 0)
        if self.established:
            if cmd == CMD_GOSSIP:
                self.manager.learn_gossip(info)
            elif (cmd in (CMD_ALL_SUBS_START, CMD_ALL_SUBS_COMPLETE) and self.oi is not None
                  and str(info.get("gateway_cmd_payload", "")).encode() == ACCOUNT):
                if cmd == CMD_ALL_SUBS_START:
                    self.oi.switch_start()
                else:
                    self.oi.switch_complete()
                self.manager.routing_changed()
            return True
        self.remote_id = str(info.get("server_id", ""))
        self.remote_name = str(info.get("server_name", "")) or self.remote_id
        self.remote_tags = [str(t) for t in info.get("tags") or []]
        return self.manager.identified(self, info)

    def reject(self, text: str) -> bool:
        self.send(errors.err(text))
        self.close()
        return False

    # -- interest ------------------------------------------------------------------------------------
    def _interest(self, op: tuple) -> None:
        oi = self.oi
        code = op[0]
        if code == RS_PLUS:
            oi.rs_plus(op[2], op[3])
        elif code == RS_MINUS:
            oi.rs_minus(op[2], op[3])
        elif code == A_PLUS:
            oi.a_plus()
        else:
            oi.a_minus()
        self.manager.routing_changed()

    # -- messages ------------------------------------------------------------------------------------

    # -- RTT -----------------------------------------------------------------------------------------
    def start_pinging(self) -> None:
        if self._ping_timer is not None:
            self._ping_timer.cancel()  # the handshake timer
        self._ping()

    def _ping(self) -> None:
        if self.closed:
            return
        if self._ping_sent and time.monotonic() - self._ping_sent > STALE_AFTER:
            self.manager.log_error(f"gateway connection {self.describe()}: no PONG for {STALE_AFTER:.0f}s, closing")
            self.close(abort=True)
            return
        if not self._ping_sent:
            self._ping_sent = time.monotonic()
            self.send(b"PING\r\n")
        self._ping_timer = self.server.loop.call_later(PING_EVERY, self._ping)

    # -- test hook: delayed writes -------------------------------------------------------------------
    def flush(self) -> None:
        if not self.delay:
            super().flush()
            return
        self.dirty = False
        if self.closed or not self.out:
            self.out.clear()
            return
        data = b"".join(self.out)
        self.out.clear()
        loop = self.server.loop
        self._delayed.append((loop.time() + self.delay, data))
        if self._delay_timer is None:
            self._delay_timer = loop.call_at(self._delayed[0][0], self._write_delayed)

    def _write_delayed(self) -> None:
        self._delay_timer = None
        if self.closed:
            self._delayed.clear()
            return
        loop = self.server.loop
        now = loop.time()
        while self._delayed and self._delayed[0][0] <= now:
            self.transport.write(self._delayed.popleft()[1])
        if self._delayed:
            self._delay_timer = loop.call_at(self._delayed[0][0], self._write_delayed)

    # -- description ---------------------------------------------------------------------------------
    def describe(self) -> str:
        who = self.remote_name or self.url or "?"
        direction = "to" if self.outbound else "from"
        return f"{direction} {self.remote_gateway or '?'} ({who} {self.ip}:{self.remote_port})"


def _json(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()
