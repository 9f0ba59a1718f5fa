"""The writer of one stream on a shared store: takeover by epoch, group commit, acks once durable.

`SharedStore(objects, stream, epoch)` takes the stream over (blocking; run it in a thread): it writes
`epochs/<epoch>.claim`, checks that no higher claim exists, loads the whole chain (`SharedView.reload`), and writes
`epochs/<epoch>.seal` naming the batch it continues from. From then on it is a `MsgStore`: every MSG/DEL/MARK
record goes into the open batch (an in-memory object in the file store's record encoding), and a worker thread
uploads sealed batches (at most `inflight` at once). Group commit is adaptive: a batch opened while no upload is in
flight is sealed at the end of the loop turn (an idle stream acknowledges at once); one opened while uploads run
keeps filling until one of them completes or `linger` seconds have passed (then it gets its own upload if a slot is
free), so a busy stream writes fewer, bigger batches. With a `latency_budget` (a store that bills each request)
every batch instead fills for the budget less the p99 of the last PUTs' durations (`PutTimes`), so a stream writes
a few objects a second at any rate and its acks still come within the budget (a replicated tail: `sharedtier`).
`batch_bytes` seals a batch at once. A worker PUTs the object create-only (`If-None-Match: *` on S3, `link(2)` on a
file system): no LIST per upload. A new writer fences the one before it at takeover by writing an empty batch,
create-only, into that writer's next slot (`log/<next>.<its epoch>.blk`); the old writer's own PUT of that slot
then fails, it finds bytes that are not its batch, and nothing more is acknowledged, since batches are released
strictly in order (see the layout doc for why every acknowledged batch is part of the new writer's chain). A
retried PUT that finds its own earlier attempt stored counts as done. Batches are released in batch order: the
store advances `durable_seq`, calls `on_visible(first, last)` (the stream announces the messages to its consumers
only then) and the waiters registered with `ack_when_durable` (the PubAcks). On an s3:// store the worker copies a
batch into the local cache directory after it told the loop that the batch is durable; on a file:// store it does
not (the batch is a file already: a second copy would double the disk writes that the next batch's fsync waits
behind), and the cache fills when a batch is read back (`SharedView._fetch`).

A failed upload is retried with backoff (the same object, so retries are idempotent); the publishers waiting on it
and on every later batch are told at once (`on_durable` callbacks get an error text) so that they retry; the
messages still appear once the retry succeeds. Without an event loop (`attach` not called) the store is
synchronous: batches are written inline on `sync()`, `close()` or when full.

Front batches whose messages are all gone (durably) are dropped by writing `base/<b>.<epoch>.json` and deleting the
objects below it. Stream and consumer documents go through one serial queue per store (`shareddocs.DocQueue`).

Threads only run `_upload`, `_put_base` and document jobs; all state is owned by the event loop thread.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor, Future
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass
from pathlib import Path

from zonebus.storage.fs import ObjectExists, ObjectStore
from zonebus.store import sharedlayout as L
from zonebus.store.filestore import encode_into
from zonebus.store.sharedbase import BaseMoves
from zonebus.store.shareddocs import DocQueue
from zonebus.store.sharedfence import Fenced, TailSource, WriterFencing
from zonebus.store.sharedtier import ReplicatedTail
from zonebus.store.sharedview import SharedView

log = logging.getLogger(__name__)

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


class _Batch:
    __slots__ = ("num", "buf", "nrec", "first_seq", "last_seq", "msgs", "removed", "waiters", "data", "state",
                 "future", "error", "attempts", "size", "marks")

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


class SharedStore(ReplicatedTail, WriterFencing, BaseMoves, SharedView):
    def __init__(self, objects: ObjectStore, stream: str, epoch: int, writer: str = "",
                 cache_dir: str | Path | None = None, options: CommitOptions | None = None,
                 tail_source: TailSource | None = None) -> None:
        super().__init__(objects, stream, cache_dir, load=False)
        if epoch < 1:
            raise ValueError("a writer epoch is a positive integer")
        self.epoch = epoch
        self.writer = writer
        self.opts = options or CommitOptions()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.executor: Executor | None = None
        self.on_visible: Callable[[int, int], None] | None = None
        self.on_fenced: Callable[[str], None] | None = None
        self.fenced = ""  # why, once fenced
        self.closed = False
        self.durable_seq = 0
        self.durable_batch = 0
        self._open: _Batch | None = None
        self._unreleased: deque[_Batch] = deque()
        self._by_num: dict[int, _Batch] = {}
        self._flight = 0
        self._backlog = 0
        self._linger_handle: asyncio.TimerHandle | None = None
        self._failing = False
        self._failing_reason = ""
        self._base_busy = False
        self.docs = DocQueue(objects, self.prefix, epoch, self._run_job, lambda: bool(self.fenced), self._later)
        self._last_base_move = time.monotonic()
        self.uploads = 0
        self.put_times = PutTimes()
        self._tail_init()
        self.tail_source = tail_source
        self._limit = self.opts.batch_bytes
        self._takeover()
        self.announced_seq = self.durable_seq

    def attach(self, loop: asyncio.AbstractEventLoop, executor: Executor) -> None:
        """Run asynchronously from now on: uploads on `executor`, completions on `loop`."""
        self.loop = loop
        self.executor = executor

    # -- MsgStore hooks ------------------------------------------------------------------------------
    def write_error(self) -> str | None:
        if self.fenced:
            return self.fenced
        if self.closed:
            return "stream store closed"
        if self._backlog > self.opts.backlog_bytes:
            return "shared store backlog full"
        return None

    def visible_seq(self) -> int:
        return self.rep_seq if self.rep_seq > self.durable_seq else self.durable_seq

    def count(self, start: int, filters: tuple[str, ...] | None) -> int:
        idx = self.index
        n = idx.count(start, filters)
        visible = self.visible_seq()
        if visible < idx.last_seq:
            n -= idx.count(max(start, visible + 1), filters)
        return n

    def _batch(self) -> _Batch:
        b = self._open
        if b is None:
            if self.fenced or self.closed:
                raise RuntimeError(self.fenced or "stream store closed")
            if self.loop is None and self._unreleased:
                self._pump()  # synchronous mode: upload what was sealed before opening the next batch
            num = self._unreleased[-1].num + 1 if self._unreleased else self.durable_batch + 1
            b = self._open = _Batch(num, self.index.last_seq + 1)
            self._by_num[num] = b
            self.batch_first[num] = b.first_seq
            self.live.setdefault(num, 0)
            self._tail_on = self.tail_ready()
            self._limit = self.opts.tier_batch_bytes if self._tail_on else self.opts.batch_bytes
            if self.loop is not None:
                if self._tail_on:  # acks follow the replicas: the object fills for the tier interval
                    self._linger_handle = self.loop.call_later(self.opts.tier_interval, self._linger_done)
                elif self.opts.latency_budget > 0:  # fill for what the budget leaves after a PUT
                    self._linger_handle = self.loop.call_later(self.put_times.linger(self.opts.latency_budget),
                                                               self._linger_done)
                elif self.opts.linger > 0 and self._flight:  # busy: sealed when an upload completes, or after linger
                    self._linger_handle = self.loop.call_later(self.opts.linger, self._linger_done)
                else:  # idle: sealed at the end of this loop turn
                    self._linger_handle = self.loop.call_soon(self._linger_done)  # type: ignore[assignment]
        return b

    def _append(self, rec: bytes) -> tuple[_Batch, int]:
        b = self._batch()
        off = len(b.buf)
        b.buf += rec
        b.nrec += 1
        self._backlog += len(rec)
        return b, off

    def _after_append(self, b: _Batch) -> None:
        if self.tiered:
            self._tail_news()
        if len(b.buf) >= self._limit:
            self._seal()
            self._pump()

    def _write(self, seq: int, subject: str, hdrs: bytes | None, data: bytes, ts: int) -> int:
        # L.encode's record, built in place in the batch buffer (no intermediate copies of the payload)
        b = self._open if self._open is not None else self._batch()
        buf = b.buf
        off = len(buf)
        encode_into(buf, L.MSG, seq, ts, subject.encode(), hdrs or b"", data)
        b.nrec += 1
        self._backlog += len(buf) - off
        b.last_seq = seq
        b.msgs += 1
        self.live[b.num] = self.live.get(b.num, 0) + 1
        if self._tail_on:
            b.marks.append((len(buf), seq))
            self._tail_news()
        # the index records the message after this returns: seal (and maybe upload) on the next append
        if len(buf) >= self._limit:
            self._seal()
            if self.loop is not None:
                self.loop.call_soon(self._pump)
        return (b.num << L.LOC_SHIFT) | off

    def _log_delete(self, seq: int) -> None:
        b, _ = self._append(L.encode(L.DEL, seq, 0))
        self._after_append(b)

    def _log_watermark(self, first_seq: int) -> None:
        b, _ = self._append(L.encode(L.MARK, first_seq, self.index.last_seq))
        self._after_append(b)

    def _forget(self, seq: int, loc: int) -> None:
        # the removal record was just appended: to the open batch, or to the last one sealed
        target = loc >> L.LOC_SHIFT
        b = self._open if self._open is not None else (self._unreleased[-1] if self._unreleased else None)
        if b is None:
            self._dec_live_n(target, 1)  # its batch is already released (synchronous mode)
        else:
            b.removed[target] = b.removed.get(target, 0) + 1

    def _batch_bytes(self, b: int) -> bytes | None:
        pend = self._by_num.get(b)
        if pend is not None:
            return pend.data if pend.data is not None else bytes(pend.buf)
        return super()._batch_bytes(b)

    def ack_when_durable(self, seq: int, cb: DurableCallback) -> bool:
        """Call `cb(None)` once `seq` is durable (or `cb(error)`); False (no call) when it already is."""
        if seq <= self.durable_seq:
            return False
        if self.fenced or self.closed:
            cb(f"stream fenced: {self.fenced}" if self.fenced else "stream store closed")
            return True
        target = self._open if self._open is not None and self._open.first_seq <= seq else None
        if target is None:
            for b in reversed(self._unreleased):
                if b.first_seq <= seq:
                    target = b
                    break
        if target is None:
            return False
        if (self._tail_on and target is self._open) or target.marks:  # a batch of the replicated tail
            return self._tail_wait(seq, cb)
        if self._failing and target.state != "open":
            cb(f"shared store write failed: {self._failing_reason}")
            return True
        target.waiters.append(cb)
        return True

    # -- group commit --------------------------------------------------------------------------------
    def _linger_done(self) -> None:
        self._linger_handle = None
        if self._open is not None and self._flight < self.opts.inflight:
            self._seal()
            self._pump()
        # else: sealed when an upload slot frees up (the batch keeps growing meanwhile)

    def _seal(self) -> None:
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

    def _pump(self) -> None:
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

    def _start(self, b: _Batch) -> None:
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

    def _upload(self, b: _Batch, attempt: int = 0) -> None:
        """Worker thread: PUT the batch, then make sure nobody took over meanwhile; tell the loop (the PubAcks
        need nothing more), then (s3://) copy the batch into the cache directory."""
        assert b.data is not None
        key = self._key(b.num, self.epoch)
        started = time.monotonic()
        try:
            self.objects.put(key, b.data, if_absent=True)
            self.put_times.add(time.monotonic() - started)
        except ObjectExists:
            try:
                stored = self.objects.get(key)
            except FileNotFoundError:  # a new writer's base move removed it: it owns the stream
                stored = b""
            if stored != b.data:  # a new writer fenced this slot (else: our own earlier attempt landed)
                raise Fenced(f"stream {self.stream}: taken over by epoch {self._max_claim()} (this writer has "
                             f"epoch {self.epoch}; its batch {b.num} was fenced)")
        self.uploads += 1
        path = self._cache_path(b.num, self.epoch) if not self.objects.local else None
        if path is None:
            return  # the future's callback tells the loop
        loop = self.loop
        if loop is not None and attempt:
            try:
                loop.call_soon_threadsafe(self._uploaded, b, attempt)
            except RuntimeError:  # the loop is closed: the future's callback is not coming either
                pass
        self._cache_write(path, b.data)

    def _uploaded(self, b: _Batch, attempt: int) -> None:
        """The worker's word that attempt `attempt` of `b` is durable (before the future completes)."""
        if b.state != "flight" or b.attempts != attempt:
            return
        b.error = None
        self._done(b)

    def _future_done(self, b: _Batch, fut: Future) -> None:
        if b.state != "flight" or b.future is not fut:
            return
        b.error = fut.exception()
        self._done(b)

    def _done(self, b: _Batch) -> None:
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

    def _upload_failed(self, b: _Batch) -> None:
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

    def _retry(self, b: _Batch) -> None:
        if b.state == "queued" and not self.fenced and not self.closed:
            self._pump()

    def _release(self, b: _Batch) -> None:
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
        if b.msgs:
            self.durable_seq = max(self.durable_seq, b.last_seq)
            self._tail_release(self.durable_seq)  # consumers see them (unless the replicas' quorum showed them)
        elif self.durable_seq < b.first_seq - 1:
            self.durable_seq = b.first_seq - 1
            self.announced_seq = max(self.announced_seq, self.durable_seq)
        for cb in b.waiters:  # (_call inlined: one per PubAck)
            try:
                cb(None)
            except Exception:
                log.exception("shared store: durability callback failed")
        b.waiters = []

    def _dec_live_n(self, target: int, n: int) -> None:
        if target in self.live:
            self.live[target] -= n

    @staticmethod
    def _call(cb: DurableCallback, err: str | None) -> None:
        try:
            cb(err)
        except Exception:
            log.exception("shared store: durability callback failed")

    def _fence(self, reason: str) -> None:
        if self.fenced:
            return
        self.fenced = reason
        log.error("shared store %s: fenced: %s", self.stream, reason)
        if self._linger_handle is not None:
            self._linger_handle.cancel()
            self._linger_handle = None
        for x in list(self._unreleased) + ([self._open] if self._open is not None else []):
            waiters, x.waiters = x.waiters, []
            for cb in waiters:
                self._call(cb, f"stream fenced: {reason}")
        self._tail_fail(f"stream fenced: {reason}")
        if self.on_fenced is not None:
            try:
                self.on_fenced(reason)
            except Exception:
                log.exception("shared store %s: fence callback failed", self.stream)

    def _run_job(self, fn: Callable, arg: object, then: Callable[[BaseException | None], None]) -> Future | None:
        """Run `fn(arg)` on the executor and `then(error)` on the loop (both inline without a loop)."""
        if self.loop is None or self.executor is None:
            try:
                fn(arg)
                err = None
            except Exception as exc:  # noqa: BLE001 - handed to `then`
                err = exc
            then(err)
            return None
        fut = self.executor.submit(fn, arg)
        loop = self.loop

        def done(f: Future) -> None:
            loop.call_soon_threadsafe(lambda: then(f.exception()))

        fut.add_done_callback(done)
        return fut

    def _later(self, delay: float, fn: Callable[[], None]) -> bool:
        """Call `fn` on the loop after `delay` seconds unless the store is closed by then; False without a loop."""
        if self.loop is None:
            return False
        self.loop.call_later(delay, lambda: None if self.closed else fn())
        return True

    # -- documents (stream config, consumer meta and state) -------------------------------------------
    def put_doc(self, sub: str, kind: str, doc: dict, new: bool = False) -> None:
        """Write `<sub>/<kind>.<epoch>.json` under the stream (asynchronously, in order with other documents);
        `new`: the folder was created by this writer (a new consumer), no older epoch's version to delete."""
        self.docs.put(sub, kind, doc, new)

    def delete_docs(self, sub: str) -> None:
        """Delete everything under the stream's `<sub>/` (a consumer's folder), after the writes queued before."""
        self.docs.delete(sub)

    # -- flushing and lifecycle ----------------------------------------------------------------------
    def _flush(self, timeout: float) -> bool:
        """Upload and release everything written so far (blocking); True when nothing is left."""
        self._seal()
        deadline = time.monotonic() + timeout
        while self._unreleased and not self.fenced and time.monotonic() < deadline:
            b = self._unreleased[0]
            if b.state == "flight" and b.future is not None:
                fut = b.future
                wait_futures([fut], timeout=max(deadline - time.monotonic(), 0))
                if fut.done():
                    self._future_done(b, fut)
                continue
            if b.state == "queued":
                if b.attempts:
                    time.sleep(0.05)
                saved, self.loop = self.loop, None  # run this one inline
                try:
                    self._start(b)
                finally:
                    self.loop = saved
            else:
                break
        return not self._unreleased

    def sync(self) -> None:
        if self.loop is None and not self.closed:
            if not self._flush(self.opts.close_timeout):
                raise OSError(f"stream {self.stream}: shared store write failed: {self._failing_reason}")
            self._maybe_move_base()

    def flush(self, timeout: float | None = None) -> bool:
        """Blocking: write out everything pending now; True on success."""
        return self._flush(self.opts.close_timeout if timeout is None else timeout)

    def close(self) -> None:
        if self.closed:
            return
        deadline = time.monotonic() + self.opts.close_timeout
        ok = self._flush(self.opts.close_timeout)
        if ok and not self.fenced:
            saved, self.loop = self.loop, None
            try:
                self._maybe_move_base(force=True)  # inline; skipped when a move is already running
            finally:
                self.loop = saved
        self.docs.flush(deadline)
        if not ok and not self.fenced:
            log.error("shared store %s: closing with %d batches not written", self.stream, len(self._unreleased))
            for x in self._unreleased:
                waiters, x.waiters = x.waiters, []
                for cb in waiters:
                    self._call(cb, "stream store closed before the write completed")
            self._tail_fail("stream store closed before the write completed")
        self.closed = True
        if self._linger_handle is not None:
            self._linger_handle.cancel()
            self._linger_handle = None

    def destroy(self) -> None:
        """Close and delete the stream from the shared store and the cache."""
        self._unreleased.clear()
        self._open = None
        self.docs.clear()
        self.closed = True
        if self._linger_handle is not None:
            self._linger_handle.cancel()
            self._linger_handle = None
        self.objects.delete_prefix(self.prefix)
        if self.cache_dir is not None:
            for p in self.cache_dir.glob("*"):
                p.unlink(missing_ok=True)
            try:
                self.cache_dir.rmdir()
            except OSError:
                pass
