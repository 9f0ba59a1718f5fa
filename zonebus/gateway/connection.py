"""A gateway connection: one TCP link between a server and a server of another cluster.

Every server dials one *outbound* connection per remote cluster and accepts *inbound* ones. Handshake: the
dialling side sends `CONNECT {json}` (credentials, its gateway name) and `INFO {json}`; the accepting side
sends `INFO {json}`. INFO carries server_id, server_name, `gateway` (the cluster's gateway name),
`gateway_url`, `gateway_urls` (every gateway URL of that cluster the sender knows), `gateways` (the other
clusters it knows, for gossip), tags and, zonebus only, `zonebus_gateway_zones` (zonebus.gateway.dialing).
Later INFOs carry a `gateway_cmd`: 1 gossip, 2/3 the start/end of
a switch to interest-only mode (`gateway_cmd_payload` = account).

After the handshake, messages (`RMSG`/`HMSG`, the route format from `route_parser`) flow from the outbound
side to the inbound side, and interest (`RS+`, `RS-`, `A+`, `A-`) flows back. Both sides PING; the
outbound side's RTT orders the clusters for queue groups. Framing, PING/RTT, stale links and the
repeated-line fast path are the link layer's (`zonebus.link`); this module adds what is gateway-specific.

Test hook: `ZONEBUS_GATEWAY_DELAY_MS="<gateway name>:<ms>[,<name>:<ms>...]"` delays every write on this
server's outbound connection to that cluster (order kept), so tests can give clusters different RTTs. It is
read once at start and never used otherwise. Owned by the event loop thread; the GatewayManager decides
what a connection means once its INFO arrives.
"""

from __future__ import annotations

import asyncio
import os
from collections import deque
from typing import TYPE_CHECKING, Any

from zonebus.gateway.interest import (
    CMD_ALL_SUBS_COMPLETE,
    CMD_ALL_SUBS_START,
    CMD_GOSSIP,
    InboundInterest,
    OutboundInterest,
)
from zonebus.link.connection import LinkConnection
from zonebus.protocol.route_parser import A_PLUS, RS_MINUS, RS_PLUS
from zonebus.server.connection import ACCOUNT, GATEWAY

if TYPE_CHECKING:
    from zonebus.gateway.manager import GatewayManager

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


class GatewayConnection(LinkConnection):
    kind = GATEWAY
    PING_EVERY = 1.0
    STALE_AFTER = 10.0  # a PING unanswered this long: the link is dead
    MEMO_MAX = 512

    def __init__(self, manager: GatewayManager, outbound: bool, remote_gateway: str = "", url: str = "",
                 replaces: GatewayConnection | None = None) -> None:
        super().__init__(manager.server)
        self.replaces = replaces  # outbound: the connection this one takes over from (zonebus.gateway.dialing)
        self.manager = manager
        self.outbound = outbound
        self.url = url
        self.remote_gateway = remote_gateway  # the remote cluster's gateway name (expected, when dialling)
        self.authorized = outbound  # an accepted connection must send a valid CONNECT first when auth is set
        self.rejected = ""  # why the handshake failed (a misconfiguration), for the dial loop's report
        self.oi = OutboundInterest(self) if outbound else None
        self.account_oi: dict[bytes, OutboundInterest] = {}  # outbound: other accounts' (zonebus.gateway.accounts)
        self.ii = InboundInterest(manager.threshold) if not outbound else None
        self.delay = manager.delays.get(remote_gateway, 0.0) if outbound else 0.0
        self._delayed: deque[tuple[float, bytes]] = deque()
        self._delay_timer: asyncio.TimerHandle | None = None
        self.enable_compression(manager.opts.compression, nats_field=False)

    # -- link hooks ----------------------------------------------------------------------------------
    def greet(self) -> None:
        self.set_write_limits(self.transport)
        m = self.manager
        if self.outbound:
            self.send_json(b"CONNECT", m.connect_fields(self.url))
        self.send_json(b"INFO", m.info_fields())
        m.connection_made(self)
        self.handshake_deadline(m.opts.auth_timeout)

    def handshake_timed_out(self) -> None:
        self.manager.report(f"gateway connection {self.describe()}: no handshake within "
                            f"{self.manager.opts.auth_timeout}s, closing")
        self.rejected = "handshake timeout"
        self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        if self._delay_timer is not None:
            self._delay_timer.cancel()

    def build_memo(self, subject: bytes, size: int) -> list[tuple] | None:
        return self.manager.inbound_memo(self, subject, size)

    def on_rtt(self) -> None:
        if self.outbound and self.established:
            if self.replaces is not None:  # a successor's first PONG: the remote's interest has arrived
                self.manager.successor_ready(self)
            self.manager.rtt_changed()

    def on_error(self, text: str) -> None:
        self.manager.report(f"gateway {self.describe()} sent error: {text}")
        if not self.rejected:
            self.rejected = text

    def log_error(self, msg: str) -> None:
        self.manager.log_error(msg)

    def unregister(self) -> None:
        self.manager.connection_closed(self)

    # -- handshake -----------------------------------------------------------------------------------
    def credentials(self) -> tuple[str, str]:
        opts = self.manager.opts
        return opts.user, opts.password

    def on_info(self, info: dict[str, Any]) -> bool:
        cmd = info.get("gateway_cmd", 0)
        if self.established:
            if cmd == CMD_GOSSIP:
                self.manager.learn_gossip(info)
            elif cmd in (CMD_ALL_SUBS_START, CMD_ALL_SUBS_COMPLETE) and self.oi is not None:
                oi = self.interest_of(str(info.get("gateway_cmd_payload", "")).encode())
                if oi is not None:
                    if cmd == CMD_ALL_SUBS_START:
                        oi.switch_start()
                    else:
                        oi.switch_complete()
                    self.manager.routing_changed()
            return True
        self.take_identity(info)
        return self.manager.identified(self, info)

    # -- interest ------------------------------------------------------------------------------------
    def interest_of(self, account: bytes) -> OutboundInterest | None:
        """The remote's interest in `account` (outbound side; None inbound or for an account unknown here)."""
        if self.oi is None or account == ACCOUNT:
            return self.oi
        oi = self.account_oi.get(account)
        if oi is None and self.server.accounts.get(account) is not None:
            oi = self.account_oi[account] = OutboundInterest(self)
        return oi

    def on_interest(self, op: tuple) -> None:
        oi = self.interest_of(op[1])
        if oi is None:
            return
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

    # -- test hook: delayed writes -------------------------------------------------------------------
    def flush(self) -> None:
        if not self.delay:
            super().flush()
            return
        self.dirty = False
        if self.closed or not self.out:
            self.out.clear()
            return
        self.deflate_out()
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
