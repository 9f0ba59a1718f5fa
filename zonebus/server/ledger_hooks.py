"""The server side of the traffic ledger: zones of connections, hot-path count dicts, and their handover.

Each counted connection holds two plain dicts (`ledger_in`, `ledger_out`: subject -> [msgs, bytes]) that
the data path updates with one dict operation per message. At every interval boundary this object swaps
them for fresh ones and hands the full ones to `LedgerAccumulator` (which reduces subjects to prefixes and
writes Parquet off the event loop). Queue routing decisions are counted here the same way. Runs on the event
loop thread; only the accumulator's flush runs in a worker thread.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

from zonebus.ledger.accumulator import LedgerAccumulator, window_start_for
from zonebus.ledger.zones import ClientZoneResolver, server_zone
from zonebus.server.connection import CLIENT, INTERNAL, Connection

if TYPE_CHECKING:
    from zonebus.server.server import Server

ACCOUNT = "$G"
DEFAULT_DIR = "zonebus-data"


class LedgerHooks:
    def __init__(self, server: Server) -> None:
        self.server = server
        opts = server.opts.ledger
        if not opts.dir:
            opts.dir = DEFAULT_DIR
        zone, known = server_zone(server.opts.server_tags, opts.zone_tag_prefix)
        self.acc = LedgerAccumulator(opts, server.name, zone, known)
        self.resolver = ClientZoneResolver(zone, opts.client_zones, opts.zone_tag_prefix)
        self.decisions: dict[tuple, list[int]] = {}
        self.window = window_start_for(time.time(), opts.interval)
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        loop = self.server.loop
        self.acc.start(loop)
        self._task = loop.create_task(self._run(), name="zonebus-ledger-handover")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        self.handover(self.window)
        await self.acc.close()

    def tags_changed(self) -> None:
        opts = self.server.opts
        zone, known = server_zone(opts.server_tags, opts.ledger.zone_tag_prefix)
        self.acc.server_zone, self.acc.server_zone_known = zone, known
        self.resolver.server_zone = zone

    # -- connections ---------------------------------------------------------------------------------
    def client_connected(self, conn: Any) -> None:
        conn.zone, conn.zone_known = self.resolver.resolve(conn.name, conn.ip)
        conn.ledger_in = {}
        conn.ledger_out = {}

    def route_connected(self, conn: Connection) -> None:
        """Routes and gateways: their zone is set from the peer's tags before this is called."""
        conn.ledger_in = {}
        conn.ledger_out = {}

    def connection_closed(self, conn: Connection) -> None:
        self._record(conn, self.window)

    # -- queue routing decisions ---------------------------------------------------------------------
    def member_zone(self, sub: Any) -> str:
        conn = sub.conn
        if conn.kind == CLIENT or conn.kind == INTERNAL:
            return self.server.zone
        return conn.zone

    def queue_decision(self, src: Any, group: list, chosen: Any, subject: bytes, size: int) -> None:
        pub_zone = src.zone if src.kind == CLIENT and src.zone else self.server.zone
        w_in = w_out = 0
        for m in group:
            if self.member_zone(m) == pub_zone:
                w_in += m.weight
            else:
                w_out += m.weight
        key = (subject, chosen.queue, pub_zone, self.member_zone(chosen), w_in, w_out)
        c = self.decisions.get(key)
        if c is None:
            self.decisions[key] = [1, size]
        else:
            c[0] += 1
            c[1] += size

    # -- handover ------------------------------------------------------------------------------------
    async def _run(self) -> None:
        interval = self.server.opts.ledger.interval
        while True:
            boundary = self.window + interval
            await asyncio.sleep(max(0.0, boundary - time.time()))
            window = self.window
            self.window = window_start_for(time.time(), interval)
            self.handover(window)

    def handover(self, window: float) -> None:
        server = self.server
        conns: list[Connection] = [*server.clients.values(), *server.routes.values(),
                                   *getattr(server, "gateway_conns", {}).values()]
        for conn in conns:
            self._record(conn, window)
        if self.decisions:
            decisions, self.decisions = self.decisions, {}
            self.acc.record_decisions(window, decisions)

    def _record(self, conn: Connection, window: float) -> None:
        cin, cout = conn.ledger_in, conn.ledger_out
        if cin is None or cout is None or (not cin and not cout):
            return
        conn.ledger_in, conn.ledger_out = {}, {}
        peer = _peer_name(conn)
        for direction, counts in (("in", cin), ("out", cout)):
            if counts:
                self.acc.record_traffic(window, conn.kind, peer, conn.zone, conn.zone_known, direction,
                                        ACCOUNT, counts)


def _peer_name(conn: Any) -> str:
    if conn.kind == CLIENT:
        return f"{conn.cid}" + (f":{conn.name}" if conn.name else "")
    return getattr(conn, "remote_name", "") or getattr(conn, "remote_id", "") or str(conn.cid)
