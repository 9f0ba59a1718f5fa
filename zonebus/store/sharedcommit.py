"""Group commit and the upload pipeline of a stream's writer on a shared store (a mixin of `SharedStore`).

Every MSG/DEL/MARK record goes into the open batch (an in-memory object in the file store's record encoding),
and a worker thread uploads sealed batches (at most `inflight` at once). Group commit is adaptive: a batch opened
while no upload is in flight is sealed at the end of the loop turn (an idle stream acknowledges at once); one
opened while uploads run keeps filling until one of them completes or `linger` seconds have passed (then it gets
its own upload if a slot is free), so a busy stream writes fewer, bigger batches. With a `latency_budget` (a store
that bills each request) every batch instead fills for the budget less the p99 of the last PUTs' durations
(`PutTimes`), so a stream writes a few objects a second at any rate and its acks still come within the budget (a
replicated tail: `sharedtier`). `batch_bytes` seals a batch at once. A worker PUTs the object create-only
(`If-None-Match: *` on S3, `link(2)` on a file system): no LIST per upload; finding bytes in its slot that are not
its batch means a new writer fenced it (`sharedfence`). A retried PUT that finds its own earlier attempt stored
counts as done. Batches are released in batch order: the store advances `durable_seq`, calls
`on_visible(first, last)` (the stream announces the messages to its consumers only then) and the waiters
registered with `ack_when_durable` (the PubAcks). On an s3:// store the worker copies a batch into the local
cache directory, durably, before it tells the loop that the batch is stored (the replicas of a replicated tail
drop their parts of it then: the copy is the one left besides the object); on a file:// store it does not (the
batch is a file already: a second copy would double the disk writes that the next batch's fsync waits behind), and
the cache fills when a batch is read back (`SharedView._fetch`).

A failed upload is retried with backoff (the same object, so retries are idempotent); the publishers waiting on it
and on every later batch are told at once (`on_durable` callbacks get an error text) so that they retry; the
messages still appear once the retry succeeds. Without an event loop the uploads run inline (`_start`).

Only `_upload` runs in worker threads; everything else here runs on the event loop thread, which owns the state.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING

from zonebus.storage.fs import ObjectExists
from zonebus.store import sharedlayout as L
from zonebus.store.sharedfence import Fenced

if TYPE_CHECKING:
    from zonebus.store.linklog import LinkRef
    from zonebus.store.routerbatch import Message
    from zonebus.store.sharedstore import SharedStore

log = logging.getLogger("zonebus.store.sharedstore")

DurableCallback = Callable[[str | None], None]  # None: durable; else the error text


@dataclass
class CommitOptions:
    linger: float = 0.001  # while uploads run, seconds a batch waits for one to complete (0: end of loop turn)
    # > 0: every batch lingers so that an ack comes within this many seconds at p99 (budget - measured PUT p99),
    # for stores that bill each request (s3://): fewer, larger objects instead of one as soon as a slot is free
    latency_budget: float = 0.0
    batch_bytes: int = 1024 * 1024  # a batch is sealed at this size
    inflight: int = 4  # uploads in flight at once
    backlog_bytes: int = 64 * 1024 * 1024  # unreleased bytes above which publishes are refused
    close_timeout: float = 10.0
    # > 0: a replicated tail (`sharedtier`): acks once `tier_acks` replicas in other zones hold the records, and
    # the batch object fills for this many seconds (or `tier_batch_bytes`) before its one PUT
    tier_interval: float = 0.0
    tier_acks: int = 1
    tier_batch_bytes: int = 8 * 1024 * 1024
    pack_interval: float = 10.0  # linked batches (`sharedpacks`) are packed this many seconds after the first


class PutTimes:
    """The durations of the last PUTs of batches, for the latency budget's linger."""

    def __init__(self, keep: int = 200, guess: float = 0.1) -> None:
        self.times: deque[float] = deque(maxlen=keep)
        self.guess = guess

    def add(self, seconds: float) -> None:
        self.times.append(seconds)

    def quantile(self, q: float) -> float:
        if len(self.times) < 5:
            return self.guess
        ordered = sorted(self.times)
        return ordered[min(len(ordered) - 1, int(len(ordered) * q))]

    def p99(self) -> float:
        return self.quantile(0.99)

    def linger(self, budget: float) -> float:
        """How long a batch may fill so that its ack comes within `budget` (a tenth kept for the loop); when
        PUTs are too slow for that, at least a median PUT (up to half the budget), so that a batch still holds
        what the publishers acknowledged by the one before send next, rather than one object per message."""
        return max(budget * 0.9 - self.p99(), min(self.quantile(0.5), budget / 2), 0.001)


class PendingBatch:
    """A batch from its first record until it is released (durable, acknowledged, in the view)."""

    __slots__ = ("num", "buf", "nrec", "first_seq", "last_seq", "msgs", "removed", "waiters", "data", "state",
                 "future", "error", "attempts", "size", "marks", "refs", "stored")

    def __init__(self, num: int, first_seq: int) -> None:
        self.num = num
        self.buf = bytearray(L.BATCH_HDR_LEN)
        self.nrec = 0
        self.first_seq = first_seq
        self.last_seq = first_seq - 1
        self.msgs = 0
        self.removed: dict[int, int] = {}  # batch -> messages of it removed by records of this batch
        self.waiters: list[DurableCallback] = []
        self.data: bytes | None = None
        self.state = "open"  # open, queued, flight, done, released
        self.future: Future | None = None
        self.error: BaseException | None = None
        self.attempts = 0
        self.size = 0
        self.marks: list[tuple[int, int]] = []  # (end offset, seq) of each message (a replicated tail only)
        self.refs: Mapping[int, tuple[LinkRef, Message]] | None = None  # messages to store as link records
        self.stored: bytes | None = None  # the bytes the store gets (`sharedpacks`: the version-2 form)


class GroupCommit:
    """Sealing, uploading, retrying and releasing batches in order, mixed into `SharedStore`."""

    def _linger_done(self: SharedStore) -> None:
        self._linger_handle = None
        if self._open is not None and self._flight < self.opts.inflight:
            self._seal()
            self._pump()
        # else: sealed when an upload slot frees up (the batch keeps growing meanwhile)

    def _seal(self: SharedStore) -> None:
        b = self._open
        if b is None:
            return
        self._open = None
        if self._linger_handle is not None:
            self._linger_handle.cancel()
            self._linger_handle = None
        b.buf[: L.BATCH_HDR_LEN] = L.batch_header(self.epoch, b.num, b.first_seq, b.last_seq, b.nrec)
        b.data = bytes(b.buf)
        b.buf = bytearray()
        b.size = len(b.data)
        b.state = "queued"
        self._unreleased.append(b)
        self._link_at_seal(b)

    def _pump(self: SharedStore) -> None:
        """Start uploads for queued batches while slots are free; run them inline without a loop."""
        if self.fenced:
            return
        if (self.loop is not None and self._open is not None and self._linger_handle is None
                and self._flight < self.opts.inflight):
            self._seal()  # its linger passed while every slot was busy
        for b in list(self._unreleased):
            if self._flight >= self.opts.inflight or self.fenced:
                break
            if b.state == "queued":
                self._start(b)

    def _start(self: SharedStore, b: PendingBatch) -> None:
        b.state = "flight"
        b.attempts += 1
        self._flight += 1
        if self.loop is None or self.executor is None:
            try:
                self._upload(b)
                b.error = None
            except Exception as exc:  # noqa: BLE001 - reported through the batch
                b.error = exc
            self._done(b)
            return
        fut = self.executor.submit(self._upload, b, b.attempts)
        b.future = fut
        loop = self.loop
        fut.add_done_callback(lambda f, b=b: loop.call_soon_threadsafe(self._future_done, b, f))

    def _upload(self: SharedStore, b: PendingBatch, attempt: int = 0) -> None:
        """Worker thread: PUT the batch, then make sure nobody took over meanwhile; tell the loop (the PubAcks
        need nothing more), then (s3://) copy the batch into the cache directory."""
        assert b.data is not None
        key = self._key(b.num, self.epoch)
        body = self._stored_form(b)
        started = time.monotonic()
        try:
            self.objects.put(key, body, if_absent=True)
            self.put_times.add(time.monotonic() - started)
        except ObjectExists:
            try:
                stored = self.objects.get(key)
            except FileNotFoundError:  # a new writer's base move removed it: it owns the stream
                stored = b""
            if stored != body:  # a new writer fenced this slot (else: our own earlier attempt landed)
                raise Fenced(f"stream {self.stream}: taken over by epoch {self._max_epoch()} (this writer has "
                             f"epoch {self.epoch}; its batch {b.num} was fenced)")
        self.uploads += 1
        path = self._cache_path(b.num, self.epoch) if not self.objects.local else None
        if path is None:
            return  # the future's callback tells the loop
        # durable before the loop hears of it: replicas drop their parts then (a linked batch: its full form,
        # marked as linked, so that a takeover by this server knows it still needs a pack)
        self._cache_write(path, b.data, linked=body is not b.data)
        loop = self.loop
        if loop is not None and attempt:
            try:
                loop.call_soon_threadsafe(self._uploaded, b, attempt)
            except RuntimeError:  # the loop is closed: the future's callback is not coming either
                pass

    def _uploaded(self: SharedStore, b: PendingBatch, attempt: int) -> None:
        """The worker's word that attempt `attempt` of `b` is durable (before the future completes)."""
        if b.state != "flight" or b.attempts != attempt:
            return
        b.error = None
        self._done(b)

    def _future_done(self: SharedStore, b: PendingBatch, fut: Future) -> None:
        if b.state != "flight" or b.future is not fut:
            return
        b.error = fut.exception()
        self._done(b)

    def _done(self: SharedStore, b: PendingBatch) -> None:
        self._flight -= 1
        b.future = None
        if b.error is not None:
            b.state = "queued"
            if isinstance(b.error, Fenced):
                self._fence(str(b.error))
                return
            self._upload_failed(b)
            return
        b.state = "done"
        while self._unreleased and self._unreleased[0].state == "done":
            self._release(self._unreleased.popleft())
        if self._failing and not any(x.state == "queued" and x.attempts for x in self._unreleased):
            self._failing = False
            log.info("shared store %s: uploads succeed again", self.stream)
        if (self._open is not None and self._open.nrec and self.loop is not None and not self.fenced
                and self.opts.latency_budget <= 0):
            self._seal()  # it filled while that upload ran: its turn now (adaptive group commit)
        self._pump()
        self._maybe_move_base()

    def _upload_failed(self: SharedStore, b: PendingBatch) -> None:
        reason = f"{type(b.error).__name__}: {b.error}"
        if not self._failing:
            log.error("shared store %s: upload of batch %d failed (%s); retrying", self.stream, b.num, reason)
        self._failing = True
        self._failing_reason = reason
        for x in list(self._unreleased) + ([self._open] if self._open is not None else []):
            if x.num >= b.num and x.state != "open":
                waiters, x.waiters = x.waiters, []
                for cb in waiters:
                    self._call(cb, f"shared store write failed: {reason}")
        delay = min(0.05 * (2 ** min(b.attempts, 6)), 2.0)
        if self.loop is not None:
            self.loop.call_later(delay, self._retry, b)
        # without a loop the caller (sync/close) retries

    def _retry(self: SharedStore, b: PendingBatch) -> None:
        if b.state == "queued" and not self.fenced and not self.closed:
            self._pump()

    def _release(self: SharedStore, b: PendingBatch) -> None:
        b.state = "released"
        self._backlog -= b.size - L.BATCH_HDR_LEN
        self._by_num.pop(b.num, None)
        self.batches[b.num] = self.epoch
        assert b.data is not None
        self._remember(b.num, b.data)
        self.durable_batch = b.num
        self.next_batch = b.num + 1
        for target, n in b.removed.items():
            self._dec_live_n(target, n)
        self._link_released(b)
        if b.msgs:
            self.durable_seq = max(self.durable_seq, b.last_seq)
            self._tail_release(self.durable_seq)  # consumers see them (unless the replicas' quorum showed them)
            if self.on_stored is not None:
                try:
                    self.on_stored()
                except Exception:
                    log.exception("shared store %s: stored callback failed", self.stream)
        elif self.durable_seq < b.first_seq - 1:
            self.durable_seq = b.first_seq - 1
            self.announced_seq = max(self.announced_seq, self.durable_seq)
        for cb in b.waiters:  # (_call inlined: one per PubAck)
            try:
                cb(None)
            except Exception:
                log.exception("shared store: durability callback failed")
        b.waiters = []

    def _dec_live_n(self: SharedStore, target: int, n: int) -> None:
        if target in self.live:
            self.live[target] -= n

    @staticmethod
    def _call(cb: DurableCallback, err: str | None) -> None:
        try:
            cb(err)
        except Exception:
            log.exception("shared store: durability callback failed")
