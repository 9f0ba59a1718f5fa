"""The writer of one stream on a shared store: takeover by epoch, group commit, acks once durable.

`SharedStore(objects, stream, epoch)` takes the stream over (blocking; run it in a thread): it writes
`epochs/<epoch>.claim`, checks that no higher claim exists, loads the whole chain (`SharedView.reload`), and writes
`epochs/<epoch>.seal` naming the batch it continues from. From then on it is a `MsgStore`: every MSG/DEL/MARK
record goes into the open batch, which this module opens (and schedules its sealing); the roles are mixins in
their own modules:

- `sharedcommit` (`GroupCommit`): group commit and the upload pipeline: sealing, create-only PUTs, retries, and
  the release of batches in order (`durable_seq`, `on_visible`, the PubAcks of `ack_when_durable`);
- `sharedfence` (`WriterFencing`): takeover, and fencing: a new writer writes an empty batch, create-only, into
  the writer before's next slot (`log/<next>.<its epoch>.blk`); the old writer's own PUT of that slot then fails,
  and nothing more is acknowledged, since batches are released strictly in order (see the layout doc for why every
  acknowledged batch is part of the new writer's chain);
- `sharedbase` (`BaseMoves`): front batches whose messages are all gone (durably) are dropped by writing
  `base/<b>.<epoch>.json` and deleting the objects below it;
- `sharedtier` (`ReplicatedTail`): acks once replicas in other zones hold the records (a billed store);
- `sharedpacks` (`LatePacks`): link records instead of a second copy (zone router), packed late and in bulk;
- `sharedview` (`SharedView`): the reader this writer is, too.

Stream and consumer documents go through one serial queue per store (`shareddocs.DocQueue`). Without an event
loop (`attach` not called) the store is synchronous: batches are written inline on `sync()`, `close()` or when
full.

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
from pathlib import Path

from zonebus.storage.fs import ObjectStore
from zonebus.store import sharedlayout as L
from zonebus.store.cachecopies import COPIES
from zonebus.store.records import encode_into
from zonebus.store.sharedbase import BaseMoves
from zonebus.store.sharedcommit import CommitOptions, DurableCallback, GroupCommit, PendingBatch, PutTimes
from zonebus.store.shareddocs import DocQueue
from zonebus.store.sharedfence import TailSource, WriterFencing
from zonebus.store.sharedpacks import LatePacks
from zonebus.store.sharedtier import ReplicatedTail
from zonebus.store.sharedview import SharedView

log = logging.getLogger(__name__)


class SharedStore(ReplicatedTail, LatePacks, WriterFencing, BaseMoves, GroupCommit, SharedView):
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
        self._open: PendingBatch | None = None
        self._unreleased: deque[PendingBatch] = deque()
        self._by_num: dict[int, PendingBatch] = {}
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
        self._packs_init()
        self.tail_source = tail_source
        self._limit = self.opts.batch_bytes
        self._takeover()
        self._adopt_links()
        self.announced_seq = self.durable_seq

    def attach(self, loop: asyncio.AbstractEventLoop, executor: Executor) -> None:
        """Run asynchronously from now on: uploads on `executor`, completions on `loop`."""
        self.loop = loop
        self.executor = executor
        if self.unpacked:  # linked batches of the writer before: their pack comes first
            self._pack_later(0.0)

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

    def _batch(self) -> PendingBatch:
        b = self._open
        if b is None:
            if self.fenced or self.closed:
                raise RuntimeError(self.fenced or "stream store closed")
            if self.loop is None and self._unreleased:
                self._pump()  # synchronous mode: upload what was sealed before opening the next batch
            num = self._unreleased[-1].num + 1 if self._unreleased else self.durable_batch + 1
            b = self._open = PendingBatch(num, self.index.last_seq + 1)
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

    def _append(self, rec: bytes) -> tuple[PendingBatch, int]:
        b = self._batch()
        off = len(b.buf)
        b.buf += rec
        b.nrec += 1
        self._backlog += len(rec)
        return b, off

    def _after_append(self, b: PendingBatch) -> None:
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

    def repair_batch(self, b: int, e: int, recent: bytes | None = None) -> str:
        """A reader found the object of batch `b` (epoch `e`) damaged on the store: put the good bytes back, an
        unconditional PUT over it, from a copy that passes every check of the layout (`recent`, the bytes this
        writer holds in memory, taken on the loop thread, or its cache directory's copy); never anything else.
        Blocking (run it in a thread). "repaired", "whole" (the store's object passes: nothing written),
        "gone" (not in this writer's chain any more, or the object is not there: nothing written) or
        "no copy" (no checked copy here)."""
        if b < self.chain_start or self.batches.get(b) != e:
            return "gone"
        key = self._key(b, e)
        try:
            L.check_batch(self.objects.get(key), b, e)
            return "whole"
        except FileNotFoundError:
            return "gone"  # (deleted by a base move: never written back)
        except L.LayoutError:
            pass
        good = None
        if recent is not None:
            try:
                L.check_batch(recent, b, e)
                good = recent
            except L.LayoutError:
                pass
        path = self._cache_path(b, e)
        if good is None and path is not None:
            good = self._cached(path, b, e)  # checked whole (deleted when damaged)
        if good is None:
            return "no copy"
        self.objects.put(key, good)  # overwrite: the create-only name exists (damaged)
        log.warning("shared store %s: batch object %s was damaged on the store; put back from the writer's "
                    "checked copy (%d bytes)", self.stream, key, len(good))
        return "repaired"

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
                self.pack_inline()  # the channels' trim need not wait for the next writer
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
        self.discard()
        self.delete_objects()

    def discard(self) -> None:
        """Close without writing what is not written yet (the stream is deleted); on the event loop."""
        self._unreleased.clear()
        self._open = None
        self.docs.clear()
        self.closed = True
        if self._linger_handle is not None:
            self._linger_handle.cancel()
            self._linger_handle = None

    def delete_objects(self) -> None:
        """Delete the stream's objects and its cache directory. Blocks, seconds on a loaded machine: emptying
        the cache waits for every copy the process still has queued (`COPIES.empty`), so a server deleting a
        stream it leads runs this in a worker thread after `discard` (`clusterleaders._delete`)."""
        self.objects.delete_prefix(self.prefix)
        if self.cache_dir is not None:
            COPIES.empty(self.cache_dir, remove=True)
