"""The proxy's snapshot of one stream led in another zone: its log, read from the shared store.

A `SharedView` of the stream (`zonebus.store.sharedview`), owned by one worker thread (every read and every
change of the view runs there, in order). A poll loop long-polls the leader (`readframes.Poll`: the next batch it
lacks, held up to 100 ms) and applies the batch objects each answer names, in order, fetched from the shared
store (or decompressed from the answer, where the leader sent a small one inline); when the answer shows the view
fell behind a base move, or the next batch is not the one named, the view is reloaded from a listing.
With a replicated tail (`zonebus.store.sharedtier`) the poll also says how much of the batches not stored yet
the view holds (the leader's acknowledgement that this replica has them), the answer brings the records since
(decompressed with one zstd stream per leader; the records this server published come back as references to
what its proxy sent, and those that came through another proxy's RouterChannel as link records to its objects,
read here once each: `tailrefs`), and the view keeps them until the leader stored them; `tail`
hands them to a new writer and from then on takes nothing from older writers. The records an answer brought are
appended to this server's files of the stream's tail (`heldtail`, `held`) and fsynced before the next poll
reports them held (the poll is the acknowledgement), and dropped from them once stored; a new snapshot replays
them into its view after its first load (a restarted replica holds what it acknowledged before).
A pinned snapshot (a replica, `pinned`) never stops for idleness. `read(seqs)` waits until the view holds the
sequences (or gives up after `WAIT`, reloading once) and returns the stored messages; `direct_get` answers a
direct get from the view; `caught_up(batch)` waits until the view applied a batch the leader named (a sync)
and `msg_get` answers a `STREAM.MSG.GET` from the view. The loop stops after `IDLE` seconds without use.
A batch object that fails its checks (`sharedlayout.DamagedBatch`: a GET'd object is checked whole before any
of it is applied; a reload names the object it stopped at) is repaired: the snapshot asks the leader, the
stream's writer, to put its checked copy back (`readframes.Repair`) and reads the object again once it did
(`repairs_asked`, `repaired` in its stats); an object the leader could not repair is asked for again after
`REPAIR_BACKOFF`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import zstandard

from zonebus.storage.fs import ObjectStore
from zonebus.store import sharedlayout as L
from zonebus.store.msgstore import StoredMsg
from zonebus.store.sharedview import SharedView
from zonebus.stream import direct
from zonebus.stream.api import JSApi
from zonebus.zonerouter import readframes as rf
from zonebus.zonerouter import tailrefs
from zonebus.zonerouter.channel import object_key
from zonebus.zonerouter.heldtail import HeldTail

log = logging.getLogger(__name__)

HOLD_MS = 100
ANSWER_TIMEOUT = 1.0  # an answer later than hold + this: poll again
REPAIR_TIMEOUT = 10.0  # seconds to wait for the leader's answer to a repair request (a GET and a PUT)
REPAIR_BACKOFF = 2.0  # seconds before asking again for an object the leader could not repair
WAIT = 2.0  # seconds a read waits for its sequences to reach the view
IDLE = 30.0
REFS_OFF = 30.0  # seconds of whole records after a reference this proxy could not rebuild


class Snapshot:
    def __init__(self, objects: ObjectStore, stream: str, leader: Callable[[], str | None],
                 send: Callable[[str, bytes], bool], cache_dir: Path | None = None) -> None:
        self.stream = stream
        self.leader = leader  # the stream's current leader in another zone, or None
        self.send = send
        # with `cache_dir` the view keeps a durable, checked copy of every batch it fetched or completed from the
        # replicated tail: the copies a new writer puts back over a damaged object
        # (`zonebus.stream.batchcopies`) survive a restart or a power loss of this server (in memory only, a torn
        # object of a recent batch had no copy left after every server lost power: a 30-minute campaign, seed 22)
        self.view = SharedView(objects, stream, cache_dir, load=False)
        self.exec = ThreadPoolExecutor(1, thread_name_prefix=f"zr-snap-{stream}")
        self.last_seq = 0  # the view's last sequence (as of the last change)
        self.next_batch = 1
        self.used = time.monotonic()
        self.loaded = asyncio.Event()
        self._answer: asyncio.Future | None = None
        self._changed = asyncio.Event()
        self._task: asyncio.Task | None = None
        self.stats = {"polls": 0, "batches": 0, "reloads": 0, "gets": 0, "get_bytes": 0, "inline": 0,
                      "tail_parts": 0, "tail_bytes": 0, "tail_resets": 0, "tail_ref_misses": 0,
                      "repairs_asked": 0, "repaired": 0}
        self._resume = False  # a load stopped at a damaged object: continue from it (`_refresh`), not from scratch
        self._progress = 0.0  # when the last repair this snapshot asked for was done
        self._repaired: asyncio.Future | None = None  # the leader's answer to a repair request
        self._repair_after: dict[tuple[int, int], float] = {}  # (batch, epoch) -> no new request before
        self._dctx = zstandard.ZstdDecompressor()  # used on the worker thread only
        self.pinned = False  # a replica of the stream's tail: runs while the stream is led in another zone
        self.writer_epoch = 0  # the epoch of the writer whose answers this view follows
        self.min_epoch = 0  # a new writer took this view's tail: answers of older writers are ignored
        self.part = (0, 0)  # (epoch, bytes held of `next_batch`) of the replicated tail
        self.gen = 0  # the compression context of the tail's parts (0: none, the leader starts one)
        self._dobj: Any = None
        self.own: tuple[bytes, tailrefs.SentBatches] | None = None  # this server's channel and what it sent
        self.linked = tailrefs.ChannelBatches(self._channel_object)  # channel objects the tail links to
        self.refs_off_until = 0.0  # a reference could not be rebuilt: whole records until then
        self.held: HeldTail | None = None  # this server's files of the tail: fsynced before a poll reports it

    # -- lifecycle -----------------------------------------------------------------------------------
    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self.exec.shutdown(wait=False, cancel_futures=True)

    @property
    def idle(self) -> bool:
        return not self.pinned and time.monotonic() - self.used > IDLE

    async def _in_thread(self, fn: Callable, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self.exec, fn, *args)

    # -- the poll loop -------------------------------------------------------------------------------
    async def _run(self) -> None:
        while True:
            try:
                await self._in_thread(self._refresh if self._resume else self._reload)
                await self._in_thread(self._replay_held)
                break
            except Exception as exc:  # the store may be briefly unreachable: try again
                log.warning("zone router: loading the snapshot of %s failed: %r", self.stream, exc)
                if isinstance(exc, L.DamagedBatch) and await self._repair(exc):
                    continue  # (the view continues from the repaired object: `_resume`)
                self._resume = False
                await asyncio.sleep(0.5)
        self.loaded.set()
        while not self.idle:
            leader = self.leader()
            if leader is None:
                await asyncio.sleep(0.05)
                continue
            loop = asyncio.get_running_loop()
            self._answer = loop.create_future()
            self.stats["polls"] += 1
            epoch, held = self.part if self.part[1] else (self.writer_epoch, 0)
            source = self.own[0] if self.own is not None and time.monotonic() >= self.refs_off_until else b""
            poll = rf.Poll(self.stream, self.next_batch, HOLD_MS, epoch if epoch >= self.min_epoch else 0, held,
                           self.gen, source)
            if not self.send(leader, poll.encode()):
                await asyncio.sleep(0.05)
                continue
            try:
                snap: rf.Snap = await asyncio.wait_for(self._answer, HOLD_MS / 1000 + ANSWER_TIMEOUT)
            except TimeoutError:
                self.gen = 0  # an answer may be lost: the leader starts a new compression stream
                continue
            if snap.status != rf.SNAP_OK:
                await asyncio.sleep(0.05)
                continue
            try:
                await self._in_thread(self._apply, snap)
            except Exception as exc:
                log.warning("zone router: applying the snapshot of %s failed: %r", self.stream, exc)
                if not (isinstance(exc, L.DamagedBatch) and await self._repair(exc)):
                    await asyncio.sleep(0.05)
            self._changed.set()

    def on_snap(self, snap: rf.Snap) -> None:
        if self._answer is not None and not self._answer.done():
            self._answer.set_result(snap)

    async def _repair(self, exc: L.DamagedBatch) -> bool:
        """A batch object failed its checks: ask the leader (the writer, which keeps a checked copy) to put it
        back (`readframes.Repair`); True when it did (or found it whole): read it again at once. Otherwise the
        caller backs off, and the next failure asks again (after `REPAIR_BACKOFF`)."""
        leader = self.leader()
        key = (exc.batch, exc.epoch)
        if leader is None or time.monotonic() < self._repair_after.get(key, 0.0):
            return False
        self.stats["repairs_asked"] += 1
        self._repaired = asyncio.get_running_loop().create_future()
        status = -1
        if self.send(leader, rf.Repair(self.stream, exc.batch, exc.epoch).encode()):
            with contextlib.suppress(TimeoutError):
                status = (await asyncio.wait_for(self._repaired, REPAIR_TIMEOUT)).status
        self._repaired = None
        if status in (rf.REPAIR_DONE, rf.REPAIR_WHOLE):
            self.stats["repaired"] += 1
            self._progress = time.monotonic()
            self._repair_after.pop(key, None)
            return True
        self._repair_after[key] = time.monotonic() + REPAIR_BACKOFF
        return False

    async def _wait_loaded(self) -> None:
        """Until the first load completed; TimeoutError after `WAIT` * 5 seconds without progress (a batch
        applied or an object repaired: a long log read object by object, or repaired one object after the
        other, is not stuck)."""
        last, seen = time.monotonic(), self.view.next_batch
        while not self.loaded.is_set():
            if self.view.next_batch != seen:  # (an int the worker thread moves on: read as it is)
                last, seen = time.monotonic(), self.view.next_batch
            left = max(last, self._progress) + WAIT * 5 - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"the snapshot of {self.stream} is not loaded")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.loaded.wait(), min(left, 1.0))

    def on_repaired(self, answer: rf.Repair) -> None:
        if self._repaired is not None and not self._repaired.done():
            self._repaired.set_result(answer)

    # -- worker thread -------------------------------------------------------------------------------
    def _reload(self) -> None:
        try:
            self.view.reload()
        except L.DamagedBatch:
            self._resume = True  # the view holds the chain up to that object: continue from it once repaired
            raise
        self._resume = False
        self.stats["reloads"] += 1
        self.view.prune_cache()  # (copies of batches a base move or a new writer dropped from the chain)
        self._note()

    def _replay_held(self) -> None:
        """After the first load: the tail this server held on disk (it acknowledged it, maybe before a restart)
        continues the view where it is of the writer the view follows, not of one a newer writer fenced."""
        if self.held is None or not self.held.top_epoch():
            return
        view = self.view
        claimed = view.list().max_epoch()
        if self.held.top_epoch() > claimed:  # epochs start again at 1 for a stream created anew under the name
            log.warning("zone router: the held tail of %s names epoch %d, above every claim and seal of the "
                        "stream (%d): it is of a deleted stream of that name; dropped", self.stream,
                        self.held.top_epoch(), claimed)
            self.held.clear()
            self.min_epoch = min(self.min_epoch, claimed)
            return
        for b, e, header, data in self.held.entries():
            if e < max(self.min_epoch, view.top_epoch) or b != view.next_batch:
                continue
            try:
                view.apply_part(b, e, L.BATCH_HDR_LEN, header, data)
            except L.LayoutError as exc:
                log.warning("zone router: the held tail of %s does not fit its view: %s", self.stream, exc)
                break
        self._note()

    def _note(self) -> None:
        self.last_seq = self.view.index.last_seq
        self.next_batch = self.view.next_batch
        epoch, _b, held = self.view.part_position()
        self.part = (epoch, held)

    def _apply(self, snap: rf.Snap) -> None:
        view = self.view
        if self._resume:
            self._refresh()
        if snap.epoch < self.min_epoch:
            return  # a writer that a newer one fenced (it took this view's tail)
        if view.tail_epochs() - {snap.epoch}:
            # a new writer: the old one's unstored part, and the batches it sealed but never stored, come back in
            # its first batch. Kept, batches completed from the old writer's tail had left this view ahead in
            # batch numbers and behind in content: its polls claimed the new writer's records (which the leader
            # then acknowledged) and its message gets answered from the old log (a KV campaign read a value
            # 250 revisions old through a proxy)
            self._reload()
        self.writer_epoch = snap.epoch
        if view.next_batch < snap.chain_start:
            self._reload()  # a base move dropped batches the view never applied
            return
        for i, (b, e) in enumerate(snap.batches):
            if b < view.next_batch:
                if view.batches.get(b, e) != e:
                    self._reload()  # the chain changed under a batch we applied
                    return
                continue
            if b != view.next_batch:
                self._reload()
                return
            packed = snap.inline[i] if i < len(snap.inline) else b""
            if packed:  # it came with the answer: cheaper than a GET
                data = self._dctx.decompress(packed)
                self.stats["inline"] += 1
            else:
                data = view.objects.get(view.batch_key(b, e))
                self.stats["gets"] += 1
                self.stats["get_bytes"] += len(data)
                try:  # checked whole before any of it is applied: a damaged object leaves the view as it was
                    L.check_batch(data, b, e)
                except L.LayoutError as exc:
                    raise L.DamagedBatch(f"{view.batch_key(b, e)}: {exc}", b, e) from exc
                data = view.links.resolve(b, e, data)  # (link records: from a pack or the channel objects)
            try:
                view.apply_batch(b, e, data)
            except L.LayoutError:  # it does not continue the part the tail brought (a new writer's batch)
                self._reload()
                return
            self.stats["batches"] += 1
        stored = max(snap.batches[-1][0] if snap.batches else 0, snap.stored)
        if stored:
            view.stored(stored)
            if self.held is not None:
                self.held.drop(stored)
        if snap.parts:
            self._apply_parts(snap)
        if self.held is not None:
            self.held.sync()  # durable before the next poll says the view holds it
        self._note()

    def _channel_object(self, channel: bytes, epoch: int, offset: int) -> bytes:
        return self.view.objects.get(object_key(channel, epoch, offset))

    def _apply_parts(self, snap: rf.Snap) -> None:
        view = self.view
        if snap.gen != self.gen or self._dobj is None:
            self.gen = snap.gen
            self._dobj = zstandard.ZstdDecompressor().decompressobj()  # its own context (inline objects use _dctx)
            self.stats["tail_resets"] += 1
        for b, e, off, header, packed in snap.parts:
            try:
                chunk = tailrefs.rebuild(self._dobj.decompress(packed), self.own[1] if self.own else None,
                                         self.linked)
            except zstandard.ZstdError:
                self.gen, self._dobj = 0, None
                return
            except tailrefs.RefError as exc:  # start over from the view's position, with every record in full
                log.info("zone router: tail of %s: %s; asking for whole records for a while", self.stream, exc)
                self.gen, self._dobj = 0, None
                self.refs_off_until = time.monotonic() + REFS_OFF
                self.stats["tail_ref_misses"] += 1
                return
            self.stats["tail_parts"] += 1
            self.stats["tail_bytes"] += len(chunk)
            if b < view.next_batch:
                continue  # applied already (the stored batch came first)
            if not view.apply_part(b, e, off, header, chunk):
                self.gen = 0  # the leader's idea of this view is off: it starts over from the view's position
                return
            if self.held is not None:
                self.held.add(b, e, off, header, chunk)

    async def tail(self, epoch: int, batch: int, new_epoch: int) -> bytes:
        """A new writer (`new_epoch`) takes the stream over: the records of writer `epoch`'s batches from `batch`
        on that this view holds; from now on answers of writers before `new_epoch` are ignored."""
        self.min_epoch = max(self.min_epoch, new_epoch)
        self.used = time.monotonic()
        if not self.loaded.is_set():
            return b""
        return await self._in_thread(self.view.tail_records, epoch, batch)

    def _read(self, seqs: list[int]) -> list[StoredMsg | None]:
        if seqs and max(seqs) > self.view.index.last_seq:
            self.view.refresh()  # the poll has not brought them yet: list the log
            self.stats["reloads"] += 1
            self._note()
        return [self.view.load(s) for s in seqs]

    # -- reads ---------------------------------------------------------------------------------------
    async def read(self, seqs: list[int]) -> list[StoredMsg | None]:
        """The stored messages `seqs` (None for one that is gone), once the view holds them."""
        self.used = time.monotonic()
        await self._wait_loaded()
        want = max(seqs) if seqs else 0
        deadline = time.monotonic() + WAIT
        while self.last_seq < want and time.monotonic() < deadline:
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), max(deadline - time.monotonic(), 0.001))
        return await self._in_thread(self._read, seqs)

    def has(self, batch: int, offset: int = 0, epoch: int = 0) -> bool:
        """The view holds every batch before `batch` and all of it (`offset` 0), or that many bytes of its
        replicated tail as written by the writer of `epoch` (0: any writer; a new writer's tail after a
        failover has other bytes at the same offsets: an older writer's part does not count)."""
        if self.next_batch > batch:
            return True
        return (offset > 0 and self.next_batch == batch and self.part[1] >= offset
                and (not epoch or self.part[0] == epoch))

    async def caught_up(self, batch: int, offset: int = 0, epoch: int = 0) -> bool:
        """Wait until the view `has` that position (the poll brings it; after `WAIT`, a listing); False when it
        still has not."""
        self.used = time.monotonic()
        await self._wait_loaded()
        deadline = time.monotonic() + WAIT
        while not self.has(batch, offset, epoch) and time.monotonic() < deadline:
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), max(deadline - time.monotonic(), 0.001))
        if not self.has(batch, offset, epoch):
            await self._in_thread(self._refresh)
        return self.has(batch, offset, epoch)

    def _refresh(self) -> None:
        try:
            self.view.refresh()
        except L.DamagedBatch:
            self._resume = True
            raise
        self._resume = False
        self.stats["reloads"] += 1
        self._note()

    async def msg_get(self, subject: str, payload: bytes) -> dict[str, Any] | None:
        """The `$JS.API.STREAM.MSG.GET.<stream>` answer (JSON document) from the view, as the leader's API
        builds it (`zonebus.stream.api`)."""
        self.used = time.monotonic()
        api = JSApi(SimpleNamespace(streams={self.stream: SimpleNamespace(store=self.view)}))  # type: ignore[arg-type]
        return await self._in_thread(api.handle, subject, payload)

    async def direct_get(self, key: str, payload: bytes) -> list[tuple[bytes, bytes]]:
        """The frames of a direct get, answered from the view (`zonebus.stream.direct`)."""
        self.used = time.monotonic()
        await self._wait_loaded()
        return await self._in_thread(direct.answer, SimpleNamespace(name=self.stream, store=self.view), key,
                                     payload)

    def info(self) -> dict[str, Any]:
        return {"last_seq": self.last_seq, "next_batch": self.next_batch, "pinned": self.pinned,
                "tail_held": self.part[1], "link_gets": self.linked.gets, "link_get_bytes": self.linked.get_bytes,
                **self.stats}
