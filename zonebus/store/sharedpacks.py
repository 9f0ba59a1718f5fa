"""Link records in the writer's log, and their late bulk commit (a mixin of `SharedStore`; seed 002).

With the zone router on and a replicated tail, most messages a leader appends came from a proxy's RouterChannel
object, which is already on the shared store. The router tells the store which (`link_refs`, asked when a batch
is sealed: sequence -> where the message is and what it was), and the upload writes the batch's version-2 form
(`linklog.link_batch`): those MSG records become link records, so the log object holds no second copy. The
version-1 bytes stay with the writer (memory, and its cache directory, beside a `.lnk` marker).

Channel objects go a few route epochs later, so the writer commits the full form late and in bulk: every
`pack_interval` seconds, one create-only PUT of a pack (`linklog`) holding the version-1 objects of every linked
batch stored since the last pack. Until a batch is in a pack, its lowest route epoch holds the channels' trim back
(`link_floor`, which the router reports; and the stream's pin in the meta group, which outlives this writer).
Batches whose messages were all removed before their pack (the base moved past them) are never packed. A clean
close packs at once; a new writer adopts the linked batches after the last pack (`_adopt_links`) and packs them.
Base moves delete the packs below the new base.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from zonebus.storage.fs import ObjectExists
from zonebus.store import linklog
from zonebus.store import sharedlayout as L
from zonebus.store.linklog import LinkRef
from zonebus.store.routerbatch import Message

if TYPE_CHECKING:
    from zonebus.store.sharedcommit import PendingBatch
    from zonebus.store.sharedstore import SharedStore

log = logging.getLogger("zonebus.store.sharedstore")

LinkRefs = Callable[[int, int], Mapping[int, tuple[LinkRef, Message]]]
Pack = tuple[int, int, int]  # (first batch, last batch, writer epoch)


class LatePacks:
    """Linked batches and their packs, mixed into `SharedStore`."""

    def _packs_init(self: SharedStore) -> None:
        # set by the zone router: (first_seq, last_seq) of a sealed batch -> the messages to link
        self.link_refs: LinkRefs | None = None
        self.unpacked: dict[int, tuple[int, int]] = {}  # stored linked batch -> (epoch, lowest route epoch)
        self._linking: dict[int, int] = {}  # sealed batch with links, not stored yet -> lowest route epoch
        self.packs: list[Pack] = []
        self._pack_due = False
        self._pack_busy = False
        self.pack_stats = {"linked_batches": 0, "linked_bytes_saved": 0, "packs": 0, "packed_batches": 0,
                           "pack_bytes": 0, "never_packed": 0}

    # -- linking -------------------------------------------------------------------------------------
    def _link_at_seal(self: SharedStore, b: PendingBatch) -> None:
        if self.link_refs is None or not b.msgs:
            return
        try:
            refs = self.link_refs(b.first_seq, b.last_seq)
        except Exception:
            log.exception("shared store %s: link references failed", self.stream)
            return
        if refs:
            b.refs = refs
            self._linking[b.num] = min(ref.epoch for ref, _m in refs.values())

    def _stored_form(self: SharedStore, b: PendingBatch) -> bytes:
        """Worker thread: the bytes the store gets for `b`: its version-2 form when messages are linked."""
        assert b.data is not None
        if b.stored is None:
            got = linklog.link_batch(b.data, b.refs) if b.refs else None
            b.stored = got[0] if got is not None else b.data
        return b.stored

    def _link_released(self: SharedStore, b: PendingBatch) -> None:
        """Loop: `b` was stored; a linked one waits for its pack."""
        low = self._linking.pop(b.num, None)
        linked = b.stored is not None and b.stored is not b.data
        if low is not None and linked:
            self.unpacked[b.num] = (self.epoch, low)
            self.pack_stats["linked_batches"] += 1
            self.pack_stats["linked_bytes_saved"] += len(b.data or b"") - len(b.stored or b"")
            self._pack_later()
        b.refs = None
        b.stored = None

    def unstored_batches(self: SharedStore) -> int:
        """Batches with records that are not stored yet (the open one included)."""
        return len(self._unreleased) + (1 if self._open is not None and self._open.nrec else 0)

    def link_floor(self: SharedStore) -> int | None:
        """The lowest route epoch that a batch of this stream links into and no pack holds yet (None: none)."""
        lows = [low for _e, low in self.unpacked.values()]
        lows += self._linking.values()
        return min(lows) if lows else None

    # -- packs ---------------------------------------------------------------------------------------
    def _pack_later(self: SharedStore, delay: float | None = None) -> None:
        if self._pack_due or self.loop is None:
            return
        self._pack_due = True
        self._later(self.opts.pack_interval if delay is None else delay, self._pack_now)

    def _pack_due_now(self: SharedStore) -> list[int]:
        for n in [n for n in self.unpacked if n < self.chain_start]:  # its messages are gone: never copied
            del self.unpacked[n]
            self.pack_stats["never_packed"] += 1
        return sorted(self.unpacked)

    def _pack_now(self: SharedStore) -> None:
        self._pack_due = False
        if self._pack_busy or self.fenced:
            return
        nums = self._pack_due_now()
        if not nums:
            return
        self._pack_busy = True
        self._run_job(self._put_pack, self._pack_items(nums), lambda err: self._packed(nums, err))

    def _pack_items(self: SharedStore, nums: list[int]) -> list[tuple[int, int, bytes | None]]:
        """Loop: (batch, epoch, the bytes held in memory or None) of each batch to pack."""
        return [(n, self.unpacked[n][0], self._mem.get(n)) for n in nums]

    def _put_pack(self: SharedStore, items: list[tuple[int, int, bytes | None]]) -> Pack:
        """Worker thread: one create-only PUT of the version-1 objects of `items` ((batch, epoch, bytes or None))."""
        parts = []
        for n, e, data in items:
            if data is None or L.read_header(data).version != 1:
                path = self._cache_path(n, e)
                data = self._cached(path, n, e) if path is not None else None
                if data is None:
                    data = self.links.resolve(n, e, self.objects.get(self._key(n, e)))
            L.check_batch(data, n, e)
            parts.append(data)
        pack = (items[0][0], items[-1][0], self.epoch)
        body = b"".join(parts)
        key = f"{self.prefix}/packs/{linklog.pack_name(*pack)}"
        try:
            self.objects.put(key, body, if_absent=True)
        except ObjectExists:
            if self.objects.get(key) != body:
                raise OSError(f"{key} exists with other bytes") from None
        self.pack_stats["pack_bytes"] += len(body)
        return pack

    def _packed(self: SharedStore, nums: list[int], err: BaseException | None) -> None:
        self._pack_busy = False
        if err is not None:
            log.warning("shared store %s: writing a pack of batches %d-%d failed (%s); retrying", self.stream,
                        nums[0], nums[-1], err)
            self._pack_later(1.0)
            return
        for n in nums:
            self.unpacked.pop(n, None)
        self.packs.append((nums[0], nums[-1], self.epoch))
        self.pack_stats["packs"] += 1
        self.pack_stats["packed_batches"] += len(nums)
        if self.unpacked:
            self._pack_later()

    def pack_inline(self: SharedStore) -> None:
        """Blocking (a clean close): pack every linked batch now."""
        nums = self._pack_due_now()
        if not nums or self.fenced:
            return
        try:
            self._put_pack(self._pack_items(nums))
        except Exception as exc:  # noqa: BLE001 - the next writer adopts them
            log.warning("shared store %s: packing at close failed: %r", self.stream, exc)
            return
        self._packed(nums, None)

    def _adopt_links(self: SharedStore) -> None:
        """Takeover (blocking): the packs on the store, and the linked batches of the chain after the last one,
        which this writer packs (their channel objects are kept for them meanwhile)."""
        self.packs = self.links.list_packs()
        packed_upto = max((p[1] for p in self.packs), default=0)  # every linked batch up to here is in a pack
        for b, e in self.batches.items():
            low = self.linked_seen.get(b)
            if low is not None and b > packed_upto:
                self.unpacked[b] = (e, low)
        if self.unpacked:
            log.info("shared store %s: %d linked batches of earlier writers to pack", self.stream, len(self.unpacked))

    def packs_below(self: SharedStore, b: int) -> list[Pack]:
        """Packs whose batches are all below `b` (a base move deletes them)."""
        return [p for p in self.packs if p[1] < b]
