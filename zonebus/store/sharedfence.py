"""Writer fencing of a stream on a shared store: takeover by epoch, and the create-only slot that stops the
writer before (a mixin of `SharedStore`; see docs/shared-store-layout.md, "Writers").

A writer takes a stream over with an epoch above every claim and seal: it writes its claim, lists the claims
and seals (a higher one: stop), loads the whole chain, writes an empty batch create-only into the slot after the
chain under the previous writer's epoch (so that writer can acknowledge nothing more: its own PUT of that slot
fails), writes its seal and lists the claims and seals again. A seal counts as its writer's claim: a claim object
can be lost (the campaigns' `damage` deletes the newest), and a takeover that had picked its epoch before a newer
writer claimed must then still stop, never fence that newer writer (a chain that reloads with a top epoch at or
above this writer's stops it too). Base moves list the claims once more before they delete anything
(`_check_fence`). Runs in worker threads (or inline without an event loop), but for `_fence`: the event loop's
side, once an upload or a base move found the store fenced (`Fenced`), which fails every waiting publisher.
"""

from __future__ import annotations

import json
import logging
import struct
from collections.abc import Callable
from typing import TYPE_CHECKING

from zonebus.storage.fs import ObjectExists
from zonebus.store import sharedlayout as L
from zonebus.store.msgstore import now_ns

if TYPE_CHECKING:
    from zonebus.store.sharedstore import SharedStore

log = logging.getLogger("zonebus.store.sharedstore")

# (stream, the fenced writer's epoch, its first batch not in the chain, the new epoch, the fenced writer's name)
# -> the records (no batch header) of that writer's batches from there on, as its replicas hold them (b"" when
# none); raises OSError while a replica that may hold some cannot be asked. A replica asked stops taking records
# of older epochs (`zonebus.store.sharedtier`).
TailSource = Callable[[str, int, int, int, str], bytes]
_TOTAL = struct.Struct("<I")


class Fenced(Exception):
    """A writer with a higher epoch took the stream over (or the epoch given was not above every claim)."""


class WriterFencing:
    """Takeover and fencing, mixed into `SharedStore`."""

    def _epochs_key(self: SharedStore, kind: str) -> str:
        return f"{self.prefix}/epochs/{L.num(self.epoch)}.{kind}"

    def _max_epoch(self: SharedStore) -> int:
        """The highest epoch of a claim or a seal on the store (a seal counts: a claim object can be lost)."""
        lst = L.Listing()
        self._list_epochs(lst)
        return lst.max_epoch()

    def _takeover(self: SharedStore) -> None:
        top = self._max_epoch()
        if top >= self.epoch:
            raise Fenced(f"stream {self.stream}: epoch {self.epoch} is not above the highest claim {top}")
        info = {"epoch": self.epoch, "writer": self.writer, "ts": now_ns()}
        self.objects.put(self._epochs_key("claim"), json.dumps(info).encode())
        self._check_fence()
        chain = self.reload(settled_only=False)
        for _ in range(self.FENCE_ATTEMPTS):
            if chain.top_epoch >= self.epoch:  # a newer writer sealed meanwhile (its claim may be gone): never
                raise Fenced(f"stream {self.stream}: epoch {chain.top_epoch} sealed during the takeover by "
                             f"epoch {self.epoch}")  # fence a newer writer
            if not chain.top_epoch or self._fence_previous(chain.top_epoch):
                break
            chain = self.reload(settled_only=False)  # the writer before us stored its next batch: take it in
        else:
            raise Fenced(f"stream {self.stream}: the writer of epoch {chain.top_epoch} kept writing; takeover "
                         f"by epoch {self.epoch} gave up")
        recovered = b""
        if chain.top_epoch and self.tail_source is not None:  # what the fenced writer acknowledged from replicas
            recovered = self._recover_tail(chain.top_epoch)
        seal = dict(info, prev=chain.top_epoch, start_batch=self.next_batch, next_seq=self.index.last_seq + 1)
        self.objects.put(self._epochs_key("seal"), json.dumps(seal).encode())
        self._check_fence()
        if recovered:
            self._store_recovered(recovered)
        self.top_epoch, self.pending_takeover = self.epoch, False
        self.durable_seq = self.index.last_seq
        self.durable_batch = self.next_batch - 1
        self._clear_leftovers(chain.start)
        self.prune_cache()

    FENCE_ATTEMPTS = 100

    def _recover_tail(self: SharedStore, epoch: int) -> bytes:
        """The replicated tail this takeover must store: writer `epoch`'s (the top seal's), or, when that writer
        stored nothing and its replicas hold nothing of it, its predecessor's, and so on. A takeover that wrote its
        seal and then failed (the PUT of the tail it had gathered gave up, or a newer claim fenced it) leaves
        its seal on top and the tail it gathered still only at the replicas; a retry that asked the failed
        writer alone started the stream below sequences already acknowledged."""
        end = self.next_batch
        for _ in range(self.FENCE_ATTEMPTS):
            start = self._tail_start(epoch, end)
            records = self.tail_source(self.stream, epoch, start, self.epoch, self._claim_writer(epoch))  # type: ignore[misc]
            if records or start > self.chain_start and self.batches.get(start - 1) == epoch:
                return records  # (a writer that stored a batch of records had stored any tail it took over)
            seal = self._seal_of(epoch)
            if seal is None or not seal.prev or seal.prev >= epoch:
                return b""
            if start != seal.start_batch:
                return b""  # (it stored a batch after all: its slots go past its seal's start)
            log.warning("shared store %s: writer of epoch %d stored nothing and its replicas hold nothing of it; "
                        "asking for the tail of epoch %d it took over", self.stream, epoch, seal.prev)
            epoch, end = seal.prev, seal.start_batch
        return b""

    def _seal_of(self: SharedStore, epoch: int) -> L.Seal | None:
        try:
            return L.Seal.from_json(self.objects.get(f"{self.prefix}/epochs/{L.num(epoch)}.seal"))
        except (FileNotFoundError, ValueError, KeyError):
            return None

    def _tail_start(self: SharedStore, epoch: int, end: int | None = None) -> int:
        """The first slot of writer `epoch`'s tail: `end` (default `next_batch`), or the first of the empty
        batches of that epoch right below it. A writer stores no empty batch; a takeover's fence is one, and a
        takeover that failed after fencing (a replica did not give the tail in time) left it in the chain, in
        the slot the writer's unstored records were for: its retry asks for them from there."""
        b = self.next_batch if end is None else end
        while b - 1 >= self.chain_start and self.batches.get(b - 1) == epoch:
            try:
                if L.read_header(self._fetch(b - 1, epoch)).nrec:
                    break
            except (FileNotFoundError, L.LayoutError):
                break
            b -= 1
        return b

    def _claim_writer(self: SharedStore, epoch: int) -> str:
        try:
            return str(json.loads(self.objects.get(f"{self.prefix}/epochs/{L.num(epoch)}.claim")).get("writer", ""))
        except (FileNotFoundError, ValueError):
            return ""

    def _store_recovered(self: SharedStore, records: bytes) -> None:
        """The fenced writer's replicated tail becomes this writer's first batch (one create-only PUT)."""
        n, last = self.next_batch, self.index.last_seq
        off = nrec = 0
        while off + 4 <= len(records):
            off += _TOTAL.unpack_from(records, off)[0]
            nrec += 1
        if off != len(records):
            raise L.LayoutError(f"stream {self.stream}: a replica's tail ends inside a record")
        probe = L.batch_header(self.epoch, n, last + 1, last, nrec) + records
        top = max((seq for _o, kind, seq, *_r in L.iter_records(probe) if kind == L.MSG), default=last)
        data = L.batch_header(self.epoch, n, last + 1, max(top, last), nrec) + records
        self.objects.put(self._key(n, self.epoch), data, if_absent=True)
        self._apply_batch(n, self.epoch, data)

    def _fence_previous(self: SharedStore, epoch: int) -> bool:
        """Write an empty batch of writer `epoch` into the slot after the chain, create-only, so that writer
        can store (and acknowledge) nothing from there on; False when it stored that slot first."""
        empty = L.batch_header(epoch, self.next_batch, self.index.last_seq + 1, self.index.last_seq, 0)
        try:
            self.objects.put(self._key(self.next_batch, epoch), empty, if_absent=True)
        except ObjectExists:
            return False
        return True

    def _check_fence(self: SharedStore) -> None:
        top = self._max_epoch()
        if top > self.epoch:
            raise Fenced(f"stream {self.stream}: taken over by epoch {top} (this writer has epoch {self.epoch})")

    def _clear_leftovers(self: SharedStore, start: int) -> None:
        """Batch and base objects below the chain start (an interrupted base move left them)."""
        for n in self.objects.list(f"{self.prefix}/log"):
            p = L.parse_pair(n, ".blk")
            if p is not None and p[0] < start:
                self.objects.delete(f"{self.prefix}/log/{n}")
        for n in self.objects.list(f"{self.prefix}/base"):
            p = L.parse_pair(n, ".json")
            if p is not None and p[0] < start:
                self.objects.delete(f"{self.prefix}/base/{n}")

    def _fence(self: SharedStore, reason: str) -> None:
        """On the loop: the store learnt it is fenced; every waiting publisher and the tail's waiters are told."""
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
