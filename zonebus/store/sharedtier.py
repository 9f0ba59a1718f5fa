"""The replicated tail of a stream on a billed shared store (a mixin of `SharedStore`).

On a store that bills each request (S3), one PUT per acknowledged batch costs more than nats-server R3 sends
over its compressed routes whenever publishers await their acks (a batch can hold at most one message per
publisher). With a replicated tail (`CommitOptions.tier_interval` > 0) the writer acknowledges a message once
`tier_acks` servers in other zones hold it in memory (nats-server R3's rule: a quorum of servers, here in
different zones), and the batch object follows in bulk: the open batch fills for `tier_interval` seconds or
`tier_batch_bytes`, then is written with one create-only PUT as before. The layout does not change: a batch
object is what it always was, only larger and later.

The replicas are the zone router's proxies of the stream (`zonebus.zonerouter`): each long-polls the leader with
its position (the batch it lacks and how many bytes of it it holds, under which writer epoch), and the answer
carries the records since (`tail_parts`). A poll is the replica's acknowledgement (`on_replica`): once `tier_acks`
replicas of this writer's epoch hold a record, the PubAcks of the messages up to it go out and consumers see
them (`visible_seq`). A replica fsyncs what it holds to its own disk before its poll reports it
(`zonebus.zonerouter.heldtail`), so a PubAck survives every server losing power at once. When fewer replicas
are fresh (none polled within `REPLICA_FRESH` seconds), the writer falls back to the storage rule: the open
batch is sealed at once and acks wait for its PUT, as without a tail.

A new writer recovers the tail of the writer it fences from the replicas (`sharedfence`, `tail_source`), so a
kill of the leader loses nothing acknowledged (nor a power loss everywhere: restarted replicas answer from their
disks); a replica that gave its tail to a new writer accepts nothing more from the old one, a fence it keeps on
disk too (`zonebus.zonerouter.snapshot`, `heldtail`).
"""

from __future__ import annotations

import bisect
import logging
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

from zonebus.store import sharedlayout as L

if TYPE_CHECKING:
    from zonebus.store.sharedcommit import DurableCallback
    from zonebus.store.sharedstore import SharedStore

log = logging.getLogger(__name__)

REPLICA_FRESH = 1.0  # seconds: a replica that polled within this counts towards the quorum
Part = tuple[int, int, int, bytes, bytes]  # (batch, epoch, offset, header when sealed else b"", record bytes)


class ReplicatedTail:
    """Replica positions, quorum and the tail's waiters, mixed into `SharedStore`."""

    def _tail_init(self: SharedStore) -> None:
        self.replicas: dict[str, tuple[int, int, float]] = {}  # peer -> (batch, offset held, when)
        self.rep_seq = 0  # the highest sequence a quorum of replicas holds
        self.announced_seq = 0  # the highest sequence shown to consumers (on_visible)
        self._rep_waiters: deque[tuple[int, DurableCallback]] = deque()
        self.on_tail: Callable[[], None] | None = None  # records were appended (the router wakes held polls)
        self.on_stored: Callable[[], None] | None = None  # a batch with messages was stored (durable_seq moved)
        self._tail_soon = False
        self._tail_on = False  # acks follow the replicas (decided when a batch opens)

    @property
    def tiered(self: SharedStore) -> bool:
        return self.opts.tier_interval > 0

    def tail_ready(self: SharedStore) -> bool:
        """Enough fresh replicas of this epoch for the tail rule."""
        return self.tiered and len(self.fresh_replicas()) >= self.opts.tier_acks

    def _tail_news(self: SharedStore) -> None:
        if self.on_tail is not None and not self._tail_soon and self.loop is not None:
            self._tail_soon = True
            self.loop.call_soon(self._fire_tail)

    def _fire_tail(self: SharedStore) -> None:
        self._tail_soon = False
        if self.on_tail is not None and not self.fenced:
            self.on_tail()

    def tail_check(self: SharedStore) -> None:
        """Periodic: when the replicas went away, seal the open batch so its acks follow its PUT."""
        if self._tail_on and not self.tail_ready():
            self._tail_on = False
            if self._open is not None and self._open.nrec and self._flight < self.opts.inflight:
                self._seal()
                self._pump()

    def fresh_replicas(self: SharedStore) -> list[str]:
        """The replicas of this writer's epoch that polled within `REPLICA_FRESH` seconds."""
        now = time.monotonic()
        return [peer for peer, (_b, _o, t) in self.replicas.items() if now - t < REPLICA_FRESH]

    # -- the replicas --------------------------------------------------------------------------------
    def on_replica(self: SharedStore, peer: str, epoch: int, batch: int, offset: int) -> None:
        """A replica's poll: it holds every batch before `batch` and `offset` bytes of `batch` (of `epoch`)."""
        if epoch != self.epoch or self.fenced:
            self.replicas.pop(peer, None)
            return
        self.replicas[peer] = (batch, offset, time.monotonic())
        if not self.tiered:
            return
        now = time.monotonic()
        held = sorted(((b, o) for b, o, t in self.replicas.values() if now - t < REPLICA_FRESH), reverse=True)
        if len(held) < self.opts.tier_acks:
            return
        seq = self._seq_at(*held[self.opts.tier_acks - 1])
        if seq > self.rep_seq:
            self.rep_seq = seq
            self._tail_release(seq)

    def _seq_at(self: SharedStore, batch: int, offset: int) -> int:
        """The last message sequence held by a replica at (batch, offset)."""
        seq = self.durable_seq
        pending = list(self._unreleased) + ([self._open] if self._open is not None else [])
        for x in pending:
            if x.num < batch:
                seq = max(seq, x.last_seq)
            elif x.num == batch:
                i = bisect.bisect_right(x.marks, offset, key=lambda m: m[0])
                if i:
                    seq = max(seq, x.marks[i - 1][1])
                break
            else:
                break
        return seq

    def _tail_release(self: SharedStore, seq: int) -> None:
        """Messages up to `seq` are held by a quorum (or stored): PubAcks, then the consumers."""
        while self._rep_waiters and self._rep_waiters[0][0] <= seq:
            self._call(self._rep_waiters.popleft()[1], None)
        self._announce(seq)

    def _announce(self: SharedStore, last: int) -> None:
        first = max(self.announced_seq + 1, self.index.first_seq)  # (a purge or a first_seq leaves no gap to walk)
        if last < first:
            self.announced_seq = max(self.announced_seq, last)
            return
        self.announced_seq = last
        if self.on_visible is not None:
            try:
                self.on_visible(first, last)
            except Exception:
                log.exception("shared store %s: visibility callback failed", self.stream)

    def _tail_wait(self: SharedStore, seq: int, cb: DurableCallback) -> bool:
        """ack_when_durable under the tail rule; False when `seq` is held by a quorum already."""
        if seq <= self.rep_seq:
            return False
        self._rep_waiters.append((seq, cb))
        return True

    def _tail_fail(self: SharedStore, err: str) -> None:
        waiters, self._rep_waiters = self._rep_waiters, deque()
        for _seq, cb in waiters:
            self._call(cb, err)

    # -- what a replica lacks ------------------------------------------------------------------------
    def tail_parts(self: SharedStore, batch: int, offset: int) -> list[Part]:
        """The records of unreleased batches from a replica's position: per batch (from `batch` on) the bytes
        after what it holds, with the batch's header once sealed (the replica then has the whole object)."""
        out: list[Part] = []
        pending = list(self._unreleased) + ([self._open] if self._open is not None else [])
        for x in pending:
            if x.num < batch:
                continue
            start = offset if x.num == batch and offset >= L.BATCH_HDR_LEN else L.BATCH_HDR_LEN
            data = x.data if x.data is not None else x.buf
            header = x.data[: L.BATCH_HDR_LEN] if x.data is not None else b""
            if len(data) > start or header:
                out.append((x.num, self.epoch, start, bytes(header), bytes(data[start:])))
        return out

    def tail_position(self: SharedStore) -> tuple[int, int]:
        """(batch, offset) of the end of what this writer holds: a `STREAM.MSG.GET` through a proxy waits for it."""
        b = self._open if self._open is not None else (self._unreleased[-1] if self._unreleased else None)
        if b is None:
            return self.durable_batch + 1, 0
        if b.data is not None:
            return b.num + 1, 0
        return b.num, len(b.buf)
