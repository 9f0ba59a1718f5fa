"""The server side of the traffic ledger: zones of connections, hot-path count dicts, and their handover.

Each counted connection holds two plain dicts (`ledger_in`, `ledger_out`: subject -> [msgs, bytes]) that
the data path updates with one dict operation per message. At every interval boundary this object swaps
them for fresh ones and hands the full ones to `LedgerAccumulator` (which reduces subjects to prefixes and
writes Parquet off the event loop). Queue routing decisions, and the hops of durable queue groups
(`durable_hop`, called by zonebus.queue), are counted here the same way, and so are the requests the process
made to shared storage: at each handover what `server.storage_meter` (the process's
`zonebus.storage.meter.METER`, set by the composition root, `zonebus.node`) counted since the last one is
taken and recorded for the window that ended (each request in exactly one window; the last ones at `close`,
after the extensions that make them have stopped). With worker processes each worker takes its own process's
meter; only worker 0 runs what touches storage, so nothing is counted twice. (Several servers in one process,
as in some tests, share the meter: whichever hands over first records the requests.) Runs on the event
loop thread; only the accumulator's flush runs in a worker thread.

The handover also adds each window to running totals (`LedgerTotals`, read by `/metrics`): bytes and message
transfers per (link kind, source zone, destination zone), each crossing once as the cost pipeline counts it
(a server-to-server copy on the sending server, client traffic in both directions on the client's server),
and queue decisions per (publisher zone, chosen zone). Only the handover writes them; readers only read.

A compressing route or gateway (zonebus.link.compression) counts protocol bytes on the data path; at the
handover they are scaled by the link's wire bytes per protocol byte in that window (`take_window`), so that
`bytes` are the bytes on the wire on every link.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any

from zonebus.ledger.accumulator import LedgerAccumulator, window_start_for
from zonebus.ledger.zones import ClientZoneResolver, server_zone
from zonebus.protocol.client_parser import PubHeader, pub_wire_bytes
from zonebus.protocol.route_parser import msg_line
from zonebus.server.accounts import ledger_key, split_ledger_keys
from zonebus.server.connection import ACCOUNT, CLIENT, GATEWAY, INTERNAL, LEAF, ROUTE, WORKER, Connection

if TYPE_CHECKING:
    from zonebus.server.server import Server

log = logging.getLogger("zonebus.ledger")
ACCOUNT_NAME = ACCOUNT.decode()
DEFAULT_DIR = "zonebus-data"
SERVER_LINKS = (ROUTE, GATEWAY, LEAF)  # both ends keep a ledger: a copy is counted where it was sent


class LedgerTotals:
    """Running totals since start, advanced once per handover (never on the message path).

    `flows`: (link kind, source zone, destination zone) -> [message transfers, bytes];
    `decisions`: (publisher zone, chosen member's zone) -> queue decisions; `last_handover`: Unix time."""

    def __init__(self) -> None:
        self.flows: dict[tuple[str, str, str], list[int]] = {}
        self.decisions: dict[tuple[str, str], int] = {}
        self.last_handover = 0.0

    def link_seen(self, kind: str, server_zone: str, peer_zone: str) -> None:
        """A live connection's flows start at 0 (so a rate over them sees the first bytes that cross)."""
        keys = [(kind, server_zone, peer_zone)]
        if kind not in SERVER_LINKS:
            keys.append((kind, peer_zone, server_zone))
        for key in keys:
            if key not in self.flows:
                self.flows[key] = [0, 0]

    def add_traffic(self, kind: str, server_zone: str, peer_zone: str, direction: str,
                    counts: dict[bytes, list[int]]) -> None:
        if kind in SERVER_LINKS and direction != "out":
            return  # the peer counts this copy as its `out`
        key = (kind, server_zone, peer_zone) if direction == "out" else (kind, peer_zone, server_zone)
        row = self.flows.get(key)
        if row is None:
            row = self.flows[key] = [0, 0]
        for msgs, nbytes in counts.values():
            row[0] += msgs
            row[1] += nbytes

    def add_decisions(self, decisions: dict[tuple, list[int]]) -> None:
        for (_subject, _queue, pub_zone, chosen, _w_in, _w_out), (msgs, _bytes) in decisions.items():
            key = (pub_zone, chosen)
            self.decisions[key] = self.decisions.get(key, 0) + msgs


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
        self.durable: dict[tuple[bytes, str, str, str, str], list[int]] = {}
        self.closed: list[Connection] = []  # closed since the last handover, recorded then
        self.window = window_start_for(time.time(), opts.interval)
        self.totals = LedgerTotals()
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
        conn.ledger_hdrs = []

    def route_connected(self, conn: Connection) -> None:
        """Routes and gateways: their zone is set from the peer's tags before this is called."""
        conn.ledger_in = {}
        conn.ledger_out = {}

    def connection_closed(self, conn: Connection) -> None:
        """Kept until the next handover: fast-path counts still to be settled may name it."""
        self.closed.append(conn)

    def settle(self, src: Any, hdr: PubHeader) -> None:
        """Count the messages that took the client fast path with this PUB line (`hdr.ledger_n` of them):
        in on the publisher, out on every connection of the line's delivery memo."""
        n = hdr.ledger_n
        hdr.ledger_n = 0
        subject, size = hdr.subject, hdr.size
        _add(src.ledger_in, subject, n, n * pub_wire_bytes(hdr))
        # links count another account's messages under its ledger key (a client's rows carry its account)
        link_key = subject if src.account.name == ACCOUNT else ledger_key(src.account.name, subject)
        for conn, line, _sub in hdr.memo or ():
            if conn.ledger_out is not None:
                _add(conn.ledger_out, subject if conn.kind == CLIENT else link_key, n, n * (len(line) + size + 2))

    # -- queue routing decisions ---------------------------------------------------------------------
    def member_zone(self, sub: Any) -> str:
        """The zone of the member(s) a queue entry stands for: this server's for its clients and for another
        worker process's entry (zonebus.workers), the peer's for a route's."""
        conn = sub.conn
        if conn.kind == CLIENT or conn.kind == INTERNAL or conn.kind == WORKER:
            return self.server.zone
        return conn.zone

    def queue_decision(self, src: Any, group: list, chosen: Any, subject: bytes, size: int) -> None:
        """Count one queue routing decision. Its bytes are those of the frame that would cross to a remote
        member (an RMSG line naming the queue, the payload, CRLF), so that the pipeline's counterfactual
        prices decisions like the traffic rows price what did cross.

        With worker processes, an entry of the worker holding the routes that stands for members on other
        servers too (`members_elsewhere`) is not counted here: that worker picks among them again, and
        counts that decision."""
        if chosen.conn.kind == WORKER and chosen.conn.members_elsewhere(chosen):
            return
        pub_zone = src.zone if src.kind == CLIENT and src.zone else self.server.zone
        size = len(msg_line(ACCOUNT, subject, None, [chosen.queue], -1, size)) + size + 2
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

    def durable_hop(self, subject: bytes, queue: str, hop: str, src_zone: str, dst_zone: str, nbytes: int) -> None:
        """Count one hop of a durable queue group's message (`zonebus.ledger.schema.HOPS`)."""
        key = (subject, queue, hop, src_zone, dst_zone)
        c = self.durable.get(key)
        if c is None:
            self.durable[key] = [1, nbytes]
        else:
            c[0] += 1
            c[1] += nbytes

    # -- handover ------------------------------------------------------------------------------------
    async def _run(self) -> None:
        interval = self.server.opts.ledger.interval
        while True:
            boundary = self.window + interval
            await asyncio.sleep(max(0.0, boundary - time.time()))
            window = self.window
            self.window = window_start_for(time.time(), interval)
            try:
                self.handover(window)
            except Exception:  # one bad window must not stop the counting of every later one
                log.exception("ledger: the handover of window %s failed", window)

    def handover(self, window: float) -> None:
        server = self.server
        closed, self.closed = self.closed, []
        conns: list[Connection] = [*server.clients.values(), *server.links.values(), *closed]
        for conn in conns:
            hdrs = getattr(conn, "ledger_hdrs", None)
            if hdrs:
                for hdr in hdrs:
                    if hdr.ledger_n:
                        self.settle(conn, hdr)
                hdrs.clear()
        totals = self.totals
        for conn in conns:
            self._record(conn, window)
            if conn.ledger_in is not None and not conn.closed:
                totals.link_seen(conn.kind, self.acc.server_zone, conn.zone)
        if self.decisions:
            decisions, self.decisions = self.decisions, {}
            self.acc.record_decisions(window, decisions)
            self.totals.add_decisions(decisions)
        if self.durable:
            durable, self.durable = self.durable, {}
            self.acc.record_durable(window, durable)
        meter = getattr(server, "storage_meter", None)
        if meter is not None:
            self.acc.record_storage(window, meter.take())
        self.totals.last_handover = time.time()

    def _record(self, conn: Connection, window: float) -> None:
        cin, cout = conn.ledger_in, conn.ledger_out
        if cin is None or cout is None or (not cin and not cout):
            return
        conn.ledger_in, conn.ledger_out = {}, {}
        zc = getattr(conn, "compression", None)  # a compressing link: its counts become wire bytes
        if zc is not None and zc.deflater is not None:
            out_ratio, in_ratio = zc.take_window()
            cin, cout = _scaled(cin, in_ratio), _scaled(cout, out_ratio)
        peer = _peer_name(conn)
        # a client's traffic is its account's; a link's is `$G`'s except what it counted under `ledger_key`
        account = conn.account.display if conn.kind == CLIENT else ACCOUNT_NAME
        for direction, counts in (("in", cin), ("out", cout)):
            if counts:
                for name, part in split_ledger_keys(counts, account).items():
                    self.acc.record_traffic(window, conn.kind, peer, conn.zone, conn.zone_known, direction,
                                            name, part)
                self.totals.add_traffic(conn.kind, self.acc.server_zone, conn.zone, direction, counts)


def _scaled(counts: dict[bytes, list[int]], ratio: float) -> dict[bytes, list[int]]:
    """Protocol byte counts of a compressed link as wire bytes (`ratio`: wire per protocol byte)."""
    if ratio == 1.0:
        return counts
    return {subject: [msgs, round(nbytes * ratio)] for subject, (msgs, nbytes) in counts.items()}


def _add(counts: dict[bytes, list[int]] | None, subject: bytes, msgs: int, nbytes: int) -> None:
    if counts is None:
        return
    c = counts.get(subject)
    if c is None:
        counts[subject] = [msgs, nbytes]
    else:
        c[0] += msgs
        c[1] += nbytes


def _peer_name(conn: Any) -> str:
    if conn.kind == CLIENT:
        return f"{conn.cid}" + (f":{conn.name}" if conn.name else "")
    return getattr(conn, "remote_name", "") or getattr(conn, "remote_id", "") or str(conn.cid)
