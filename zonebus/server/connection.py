"""What every connection kind shares: the batched outbound buffer, byte/message stats, and backpressure.

Writes are appended to `out` and the connection is marked dirty; the server flushes every dirty connection
once per event-loop turn (one `transport.write` per connection per turn). A connection whose unsent bytes
exceed `max_pending`, or whose writes stay blocked past `write_deadline` (the server's, or the connection's
own: `leafnodes { write_deadline }` for leaf connections), is a slow consumer: it is closed here, in one
place, and counted (by connection kind too, for `/varz` `slow_consumer_stats`).

Fast producers are stalled rather than letting a busy receiver's buffer run into `max_pending`: when a
receiver's transport buffer passes its high-water mark (a quarter of max_pending) the publishers of that
loop turn stop being read (nats-server's "fast producer stall"), in slices of `STALL_SLICE` seconds: the
other subscribers of what they publish wait that long at most (nats-server: a few ms). After a slice, a
receiver that drained some lets its producers read for `STALL_GAP` and stalls them again (backpressure,
until it is below its low-water mark); one that did not read at all lets them go, and is then cut off as a
slow consumer.
Owned by the event loop thread.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from zonebus.server.server import Server

CLIENT, ROUTE, GATEWAY, INTERNAL = "client", "route", "gateway", "internal"
WORKER = "worker"  # a local link to another process of this very server (zonebus.workers)
LEAF = "leaf"  # a leaf node connection (zonebus.leaf): its own message lines, so none of LINKS
LINKS = (ROUTE, WORKER)  # links that forward one hop per kind: a route's message to no route, a worker's to no worker
ACCOUNT = b"$G"  # the global account: every connection's when no accounts are configured
STALL_SLICE = 0.01  # seconds a producer stays stalled at a time
STALL_GAP = 0.002  # seconds it reads between two slices while the receiver still drains


class Connection:
    kind = CLIENT
    spoke = False  # a leaf connection this server dialled (its peer is the hub): see `link_allows`
    # seconds a blocked write may take on this connection; None: the server's `write_deadline`. A class
    # default (clients carry no slot for it); links that have their own (leaf connections) set it per instance
    write_deadline: float | None = None
    # per-connection state without a __dict__ (5,000 idle clients, bench/scale.py); subclasses that declare
    # no __slots__ of their own (links, internal clients) keep a __dict__ for their extra fields
    __slots__ = ("server", "cid", "transport", "out", "dirty", "closed", "paused_since", "stalled_by", "_stalling",
                 "in_msgs", "in_bytes", "out_msgs", "out_bytes", "start", "last_activity", "ip", "remote_port",
                 "zone", "zone_known", "ledger_in", "ledger_out", "account")

    def __init__(self, server: Server) -> None:
        self.server = server
        self.cid = server.next_cid()
        self.transport: asyncio.Transport | None = None
        self.out: list[bytes] = []  # frames queued this loop turn
        self.dirty = False
        self.closed = False
        self.paused_since = 0.0
        self.stalled_by = 0  # receivers currently stalling this connection's reads
        self._stalling: list[Connection] = []  # producers this receiver stalled
        self.in_msgs = self.in_bytes = self.out_msgs = self.out_bytes = 0
        self.start = time.time()
        self.last_activity = self.start
        self.ip = ""
        self.remote_port = 0
        self.zone = ""
        self.zone_known = False
        # ledger counts (subject -> [msgs, bytes]), swapped out by the ledger task once per window
        self.ledger_in: dict[bytes, list[int]] | None = None
        self.ledger_out: dict[bytes, list[int]] | None = None
        self.account = server.global_account  # zonebus.server.accounts: the subject space it publishes in

    # -- outbound ------------------------------------------------------------------------------------
    def send(self, data: bytes) -> None:
        """Queue bytes for this connection; they go out at the end of the loop turn."""
        if self.closed:
            return
        self.out.append(data)
        if not self.dirty:
            self.dirty = True
            self.server.mark_dirty(self)

    def write_frame(self, line: bytes, data: bytes, subject: bytes) -> None:
        """Queue one message: its control line and its payload (with CRLF); count it for stats and ledger."""
        out = self.out
        out.append(line)
        out.append(data)
        size = len(data) - 2
        self.out_msgs += 1
        self.out_bytes += size
        if self.ledger_out is not None:
            self.server.ledger_count(self.ledger_out, subject, len(line) + size + 2)
        if not self.dirty:
            self.dirty = True
            self.server.mark_dirty(self)

    @property
    def out_pending(self) -> int:
        """Bytes queued here or in the transport, not yet written to the socket."""
        buffered = self.transport.get_write_buffer_size() if self.transport is not None else 0
        return buffered + sum(len(b) for b in self.out)

    def flush(self) -> None:
        self.dirty = False
        if self.closed or not self.out:
            self.out.clear()
            return
        data = b"".join(self.out) if len(self.out) > 1 else self.out[0]
        self.out.clear()
        transport = self.transport
        transport.write(data)
        if transport.get_write_buffer_size() > self.server.opts.max_pending:
            self.slow_consumer()

    def slow_consumer(self) -> None:
        server = self.server
        server.slow_consumer_kinds[self.kind] = server.slow_consumer_kinds.get(self.kind, 0) + 1
        self.server.log(f"{self.kind} {self.cid} slow consumer: closing (pending {self._buffered()} bytes)")
        self.close(abort=True)

    def set_write_limits(self, transport: asyncio.BaseTransport) -> None:
        high = max(64 * 1024, self.server.opts.max_pending // 4)
        transport.set_write_buffer_limits(high=high, low=high // 4)  # type: ignore[attr-defined]

    # asyncio flow control: the transport tells us when its buffer backs up and when it drains
    def pause_writing(self) -> None:
        self.paused_since = time.monotonic()
        server = self.server
        deadline = self.write_deadline
        if deadline is None:
            deadline = server.opts.write_deadline
        if deadline > 0:
            server.loop.call_later(deadline, self._check_write_deadline, self.paused_since)
        for producer in server.turn_producers:
            if producer is not self and not producer.closed and producer not in self._stalling:
                producer.stall()
                self._stalling.append(producer)
        if self._stalling:
            server.loop.call_later(STALL_SLICE, self._stall_check, self.paused_since, self._buffered())

    def resume_writing(self) -> None:
        self.paused_since = 0.0
        self._release_producers()

    def _buffered(self) -> int:
        return self.transport.get_write_buffer_size() if self.transport is not None else 0

    def _stall_check(self, since: float, buffered: int) -> None:
        """A slice is over and this receiver is still backed up: release the producers; if it drained some
        (it reads, only slowly), stall them again after STALL_GAP; if it did not read at all, for good (it
        will become a slow consumer)."""
        if since != self.paused_since or not self._stalling:
            return
        progressed = self._buffered() < buffered and not self.closed
        producers = list(self._stalling)
        self._release_producers()
        if progressed:
            self.server.loop.call_later(STALL_GAP, self._restall, since, producers)

    def _restall(self, since: float, producers: list[Connection]) -> None:
        if since != self.paused_since or self.closed:
            return  # drained below the low-water mark meanwhile (resume_writing), or gone
        for producer in producers:
            if not producer.closed and producer not in self._stalling:
                producer.stall()
                self._stalling.append(producer)
        if self._stalling:
            self.server.loop.call_later(STALL_SLICE, self._stall_check, since, self._buffered())

    def _release_producers(self) -> None:
        stalling, self._stalling = self._stalling, []
        for producer in stalling:
            producer.unstall()

    def stall(self) -> None:
        self.stalled_by += 1
        if self.stalled_by == 1 and self.transport is not None:
            self.transport.pause_reading()

    def unstall(self) -> None:
        self.stalled_by -= 1
        if self.stalled_by == 0 and not self.closed and self.transport is not None:
            self.transport.resume_reading()

    def _check_write_deadline(self, since: float) -> None:
        if not self.closed and self.paused_since == since:
            self.slow_consumer()

    # -- lifecycle -----------------------------------------------------------------------------------
    def connection_lost(self, exc: Exception | None) -> None:
        """asyncio: the socket is gone (whoever closed it). Subclasses add their own timers."""
        if not self.closed:
            self.closed = True
            self.server.connection_closed(self)
        self._release_producers()

    def close(self, abort: bool = False) -> None:
        if self.closed:
            return
        if not abort:
            self.flush()
        self.closed = True
        self._release_producers()
        if self.transport is not None:
            if abort:
                self.transport.abort()
            else:
                self.transport.close()
        self.server.connection_closed(self)

    def peer_address(self, transport: asyncio.BaseTransport) -> None:
        peer = transport.get_extra_info("peername")
        if peer:
            self.ip, self.remote_port = peer[0], peer[1]


def link_allows(src: Connection, dest: Connection) -> bool:
    """Whether a message that came from `src` may go on to the link `dest` (of another kind than `src`'s,
    or a leaf connection): nats-server's leaf one-hop rules. Never back to the leaf it came from; a route's
    message reaches only the leaf nodes this server is the hub of; what a hub sent a leaf (over a connection
    this server dialled, `spoke`) goes to no route."""
    if dest is src:
        return False
    if dest.kind == LEAF:
        return src.kind != ROUTE or not dest.spoke
    if dest.kind == ROUTE:
        return not src.spoke
    return True
