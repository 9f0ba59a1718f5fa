"""A read-only view of one stream on a shared store: the resolved log replayed into a `MsgStore` index.

`SharedView(objects, stream)` lists the stream's prefix, resolves the chain (`sharedlayout.resolve`), reads
every batch of it (from the local cache directory when one is given and holds it, else from the store, then
cached) and applies its records: MSG adds a message, DEL and MARK remove, exactly as the file store does on
recovery. `refresh()` applies batches written since (a standby or a tailing reader); when a takeover or a
base move makes the view stale it reloads from scratch. Only settled batches are applied: a view never shows
a message that a pending takeover could still cut. All the `MsgStore` queries (`load`, `next_msg`, `state`,
...) work on the view; writes raise. Every method blocks on storage I/O: use it from a worker thread (the
writer subclass, `SharedStore`, does its own I/O in threads).

Message locations are `(batch << 32) | offset in the batch object`. Batch bytes are kept in a small LRU in
memory; the cache directory holds copies of batch objects under their shared names (immutable, so a cached
copy is valid forever and needs no invalidation). A cached copy is checked whole (header and every record's
CRC) before it is used; a damaged one is deleted and the store's object read instead. A message's record is
checked again when it is served: a damaged object never yields a payload (`docs/shared-store-layout.md`,
"Damaged objects").
"""

from __future__ import annotations

import json
import logging
from collections import OrderedDict
from pathlib import Path

from zonebus.storage.fs import ObjectStore
from zonebus.store import sharedlayout as L
from zonebus.store.cachecopies import COPIES
from zonebus.store.durability import make_dirs, replace_file
from zonebus.store.filestore import FileStore
from zonebus.store.linklog import LinkResolver, link_epochs
from zonebus.store.msgstore import MsgStore

log = logging.getLogger(__name__)

LINKED = ".lnk"  # beside a cached batch: the store holds its linked form (version 2), maybe not packed yet


def mark_linked(path: Path) -> None:
    """Durably mark the cache file `path` as the full form of a linked batch."""
    replace_file(path.with_suffix(LINKED), b"")

MEM_CACHE_BYTES = 32 * 1024 * 1024
LOAD_ATTEMPTS = 5


class ReadOnlyError(Exception):
    pass


class SharedView(MsgStore):
    overhead = FileStore.overhead
    msg_size = FileStore.msg_size

    def __init__(self, objects: ObjectStore, stream: str, cache_dir: str | Path | None = None,
                 mem_cache_bytes: int = MEM_CACHE_BYTES, load: bool = True) -> None:
        super().__init__()
        self.objects = objects
        self.stream = stream
        self.prefix = L.stream_prefix(stream)
        self.cache_dir = Path(cache_dir) if cache_dir else None
        if self.cache_dir is not None:
            make_dirs(self.cache_dir)  # (fsynced up the path: a power loss must not drop the directory of copies)
        self.mem_cache_bytes = mem_cache_bytes
        self._mem: OrderedDict[int, bytes] = OrderedDict()  # batch -> object bytes (LRU)
        self._mem_bytes = 0
        self._seals: dict[int, L.Seal] = {}
        self.chain_start = 1  # first batch of the log
        self.batches: dict[int, int] = {}  # batch -> epoch, for every applied batch
        self.next_batch = 1  # the batch after the last applied one
        self.base_seq = 1  # every sequence below this is gone (from the base object)
        self.live: dict[int, int] = {}  # batch -> live messages in it
        self.batch_first: dict[int, int] = {}  # batch -> its header's first_seq
        self.top_epoch = 0
        self.pending_takeover = False
        # a replicated tail (`sharedtier`): the batch being received from the writer, not stored yet
        self._part: bytearray | None = None
        self.part_epoch = 0
        self._unstored: dict[int, tuple[int, bytes]] = {}  # batch -> (epoch, object) completed from parts
        self._held_tail: tuple[dict, bytearray | None, int, int] = ({}, None, 0, 0)
        self.links = LinkResolver(objects.get, objects.list, self.prefix)  # version-2 objects (`linklog`)
        self.linked_seen: dict[int, int] = {}  # batch -> lowest route epoch it links into (0: unknown), as read
        if load:
            self.reload()

    # -- listing and resolution ----------------------------------------------------------------------
    def list(self) -> L.Listing:
        """List log/, base/ and epochs/ (in that order: see the layout's settledness argument)."""
        lst = L.Listing()
        for n in self.objects.list(f"{self.prefix}/log"):
            p = L.parse_pair(n, ".blk")
            if p is not None:
                lst.batches[p] = n
        for n in self.objects.list(f"{self.prefix}/base"):
            p = L.parse_pair(n, ".json")
            if p is not None:
                lst.bases.append(p)
        self._list_epochs(lst)
        return lst

    def _list_epochs(self, lst: L.Listing) -> None:
        for n in self.objects.list(f"{self.prefix}/epochs"):
            p = L.parse_epoch_name(n)
            if p is None:
                continue
            (lst.claims if p[1] == "claim" else lst.seal_epochs).add(p[0])

    def seals(self, lst: L.Listing) -> dict[int, L.Seal]:
        for e in lst.seal_epochs:
            if e not in self._seals:
                self._seals[e] = L.Seal.from_json(self.objects.get(f"{self.prefix}/epochs/{L.num(e)}.seal"))
        return {e: self._seals[e] for e in lst.seal_epochs}

    def _base(self, lst: L.Listing) -> L.Base | None:
        if not lst.bases:
            return None
        b, e = max(lst.bases)
        d = json.loads(self.objects.get(f"{self.prefix}/base/{L.base_name(b, e)}"))
        return L.Base(int(d["batch"]), int(d["epoch"]), int(d["next_seq"]))

    def resolve(self) -> tuple[L.Listing, L.Chain, L.Base | None]:
        lst = self.list()
        base = self._base(lst)
        return lst, L.resolve(lst, self.seals(lst), base), base

    # -- loading -------------------------------------------------------------------------------------
    def reload(self, settled_only: bool = True) -> L.Chain:
        """Rebuild the index from the store (retrying when objects vanish under a concurrent writer)."""
        for attempt in range(LOAD_ATTEMPTS):
            try:
                lst, chain, base = self.resolve()
                self._reset(chain, base)
                self._apply_chain(chain, settled_only)
                self._reapply_tail()
                return chain
            except FileNotFoundError:
                if attempt == LOAD_ATTEMPTS - 1:
                    raise
                log.info("shared store %s: an object vanished while loading; listing again", self.stream)
        raise AssertionError("unreachable")

    def _reset(self, chain: L.Chain, base: L.Base | None) -> None:
        self._held_tail = (self._unstored, self._part, self.part_epoch, self.next_batch)  # see `_reapply_tail`
        MsgStore.__init__(self)
        self._mem.clear()
        self._mem_bytes = 0
        self.batches = {}
        self.live = {}
        self.batch_first = {}
        self.chain_start = self.next_batch = chain.start
        self.base_seq = base.next_seq if base else 1
        if self.base_seq > 1:
            self.index.skip_to(self.base_seq, self.base_seq - 1)
        self.top_epoch = chain.top_epoch
        self.pending_takeover = chain.pending
        self._part = None
        self._unstored = {}

    def _reapply_tail(self) -> None:
        """After a reload from the store: the replicated tail this view held (records its writer acknowledged
        because this view had them) is applied again where it continues the chain, and kept in any case."""
        unstored, part, part_epoch, part_batch = self._held_tail
        self._held_tail = ({}, None, 0, 0)
        for b, (e, data) in sorted(unstored.items()):
            stored = self.batches.get(b) == e  # the chain holds that very batch: it is stored, no tail any more
            if b == self.next_batch and (not self.batches or e >= self.top_epoch):
                self._apply_batch(b, e, data)
            if b >= self.next_batch - 1 and not stored:
                self._unstored[b] = (e, data)
        if part is not None and part_batch == self.next_batch and self._part is None:
            self.apply_part(part_batch, part_epoch, L.BATCH_HDR_LEN, b"", bytes(part[L.BATCH_HDR_LEN :]))

    def _apply_chain(self, chain: L.Chain, settled_only: bool) -> int:
        todo = chain.batches[: chain.settled] if settled_only else chain.batches
        n = 0
        for b, e in todo:
            if b < self.next_batch:
                continue
            if b != self.next_batch:
                break
            try:
                self._apply_batch(b, e, self._fetch(b, e))
            except L.LayoutError as exc:  # name the object: damaged data on the store is for an operator to see
                raise L.DamagedBatch(f"{self._key(b, e)}: {exc}", b, e, self.stream) from exc
            n += 1
        self.top_epoch = chain.top_epoch
        self.pending_takeover = chain.pending
        return n

    def refresh(self) -> int:
        """Apply settled batches written since the last look; returns how many. Reloads when stale."""
        for attempt in range(LOAD_ATTEMPTS):
            try:
                lst, chain, base = self.resolve()
                last = min(self._unstored, default=self.next_batch) - 1  # the last batch read from the store
                stale = (base is not None and base.batch > self.next_batch) or (
                    last >= chain.start and last in self.batches
                    and (last - chain.start >= len(chain.batches) or chain.batches[last - chain.start][1]
                         != self.batches[last]))
                if stale:
                    self._reset(chain, base)
                    n = self._apply_chain(chain, True)
                    self._reapply_tail()
                    return n
                return self._apply_chain(chain, True)
            except FileNotFoundError:
                if attempt == LOAD_ATTEMPTS - 1:
                    raise
        return 0

    def batch_key(self, b: int, e: int) -> str:
        """The object key of batch `b` written by epoch `e`."""
        return self._key(b, e)

    def apply_batch(self, b: int, e: int, data: bytes) -> None:
        """Apply the next batch of the chain (`b` must be `next_batch`), its bytes fetched by the caller."""
        part = self._part
        if part is not None:  # the replicated tail brought its first records: the object must continue them
            if e != self.part_epoch or data[L.BATCH_HDR_LEN : len(part)] != part[L.BATCH_HDR_LEN :]:
                raise L.LayoutError(f"{self.stream}: batch {b} does not continue the part held of it")
            if not self.apply_part(b, e, len(part), data[: L.BATCH_HDR_LEN], data[len(part) :]):
                raise L.LayoutError(f"{self.stream}: batch {b} could not complete its part")
            return
        self._apply_batch(b, e, data)

    # -- a replicated tail ---------------------------------------------------------------------------
    def part_position(self) -> tuple[int, int, int]:
        """(epoch, batch, bytes held): the part of `next_batch` received so far (0 bytes: none)."""
        if self._part is None:
            return self.top_epoch, self.next_batch, 0
        return self.part_epoch, self.next_batch, len(self._part)

    def apply_part(self, b: int, e: int, off: int, header: bytes, chunk: bytes) -> bool:
        """Records of batch `b` (writer epoch `e`) from offset `off`, as the writer's replicated tail sends them;
        `header` (once the writer sealed the batch) completes it, and the whole batch then goes to the cache
        directory, durably, as a fetched one does. False when they do not continue what is held."""
        if b != self.next_batch:
            return False
        if self._part is None:
            if off != L.BATCH_HDR_LEN:
                return False
            self._part, self.part_epoch = bytearray(L.BATCH_HDR_LEN), e
            self.live.setdefault(b, 0)
        part = self._part
        if e != self.part_epoch or off != len(part):
            return False
        part += chunk
        self._apply_records(b, part, off)
        if header:
            head = L.read_header(header)
            if head.batch != b or head.epoch != e:
                raise L.LayoutError(f"{self.stream}: a header of batch {head.batch} epoch {head.epoch} for {b}")
            part[: L.BATCH_HDR_LEN] = header
            data = bytes(part)
            self._part = None
            self.batches[b] = e
            self.batch_first[b] = head.first_seq
            self.next_batch = b + 1
            self._unstored[b] = (e, data)
            self._remember(b, data)
            path = self._cache_path(b, e)
            if path is not None:  # a copy on this disk too: the batch object may be damaged once stored
                self._cache_write(path, data)
        return True

    def tail_epochs(self) -> set[int]:
        """The writer epochs of the replicated tail this view applied beyond the stored log: its part, and the
        batches it completed from the tail (sealed by their writer, not yet reported stored)."""
        out = {e for b, (e, _data) in self._unstored.items() if self.batches.get(b) == e}
        if self._part is not None:
            out.add(self.part_epoch)
        return out

    def stored(self, upto: int) -> None:
        """The writer stored every batch up to `upto`: parts completed before are ordinary batches now."""
        for b in [x for x in self._unstored if x <= upto]:
            del self._unstored[b]

    def tail_records(self, epoch: int, batch: int) -> bytes:
        """The records of writer `epoch`'s batches from `batch` on that this view holds and the store may not
        (its replicated tail), in log order: what a new writer takes over."""
        out = [data[L.BATCH_HDR_LEN :] for b, (e, data) in sorted(self._unstored.items()) if b >= batch and e == epoch]
        if self._part is not None and self.part_epoch == epoch and self.next_batch >= batch:
            out.append(bytes(self._part[L.BATCH_HDR_LEN :]))
        return b"".join(out)

    def local_copy(self, b: int, e: int) -> bytes | None:
        """This view's own copy of batch `b` of epoch `e` (memory, the replicated tail, the cache directory),
        checked whole against the layout; None when it holds none that passes (`stream.batchcopies`)."""
        held = self._unstored.get(b)
        mem = self._mem.get(b) if self.batches.get(b) == e else None
        for data in (mem, held[1] if held and held[0] == e else None):
            if data is not None:
                try:
                    L.check_batch(data, b, e)
                    return data
                except L.LayoutError:
                    pass
        path = self._cache_path(b, e)
        return self._cached(path, b, e) if path is not None else None

    def recent_batch(self, b: int) -> bytes | None:
        """A batch's bytes if this view holds them in memory (a writer: its latest batches), else None."""
        return self._mem.get(b)

    def _apply_batch(self, b: int, e: int, data: bytes) -> None:
        head = L.read_header(data)
        if head.batch != b or head.epoch != e:
            raise L.LayoutError(f"{self.stream}: object {L.batch_name(b, e)} holds batch {head.batch} "
                                f"of epoch {head.epoch}")
        self.live.setdefault(b, 0)
        self._apply_records(b, data, -1)
        self.batches[b] = e
        self.batch_first[b] = head.first_seq
        self.next_batch = b + 1
        self._remember(b, data)

    def _apply_records(self, b: int, data: bytes | bytearray, start: int) -> None:
        """Index the records of batch `b`: all of an object (`start` -1), or a part's from offset `start`."""
        idx = self.index
        loc0 = b << L.LOC_SHIFT
        # (a whole object is checked to its end before any record is indexed: a damaged one leaves the view as it was)
        records = list(L.iter_records(data)) if start < 0 else L.iter_records_from(data, start, b)  # type: ignore[arg-type]
        for off, kind, seq, ts, slen, hlen, dlen in records:
            if kind == L.MSG:
                if seq <= idx.last_seq:
                    continue
                subject = L.record_subject(data, off, slen)
                size = slen + hlen + dlen + self.overhead + (4 if hlen else 0)
                idx.add(seq, subject, size, ts, loc0 | off)
                self.live[b] += 1
                self._last_ts = max(self._last_ts, ts)
            elif kind == L.DEL:
                self._index_remove(seq)
            elif kind != L.MARK:
                raise L.LayoutError(f"{self.stream}: batch {b}: a link record where full records belong")
            else:  # MARK: below `seq` nothing is live; the last sequence is at least `ts`
                while idx.msgs and idx.first_seq < seq:
                    self._index_remove(idx.first_seq)
                idx.skip_to(seq, ts)

    def _index_remove(self, seq: int) -> None:
        gone = self.index.remove(seq)
        if gone is not None:
            self._dec_live(gone[2] >> L.LOC_SHIFT)

    def _dec_live(self, b: int) -> None:
        if b in self.live:
            self.live[b] -= 1

    # -- batch bytes ---------------------------------------------------------------------------------
    def _key(self, b: int, e: int) -> str:
        return f"{self.prefix}/log/{L.batch_name(b, e)}"

    def _cache_path(self, b: int, e: int) -> Path | None:
        return self.cache_dir / L.batch_name(b, e) if self.cache_dir is not None else None

    def _fetch(self, b: int, e: int) -> bytes:
        """A batch object's bytes: memory, then the cache directory, then the store (and cache it)."""
        data = self._mem.get(b)
        if data is not None:
            self._mem.move_to_end(b)
            return data
        held = self._unstored.get(b)
        if held is not None and held[0] == e:
            return held[1]
        path = self._cache_path(b, e)
        if path is not None:
            data = self._cached(path, b, e)
            if data is not None:
                return data
        data = self.objects.get(self._key(b, e))
        if L.read_header(data).version != 1:  # link records: the full form from a pack or the channel objects
            low = link_epochs(data)
            data = self.links.resolve(b, e, data)
            self.linked_seen[b] = low or 0
            if path is not None:
                mark_linked(path)
        if path is not None:
            COPIES.put(path, data, (b, e))  # checked, durable, off this path (a takeover loads whole chains)
        return data

    def _cached(self, path: Path, b: int, e: int) -> bytes | None:
        """The cache directory's copy of batch `b` of epoch `e`, every record checked; None when there is none or
        it is damaged (then it is deleted: the caller reads the shared store's object instead)."""
        try:
            data = path.read_bytes()
        except OSError:
            return None
        try:
            L.check_batch(data, b, e)
        except L.LayoutError as exc:
            log.warning("shared store %s: cached copy %s is damaged (%s); reading the shared store's object",
                        self.stream, path, exc)
            path.unlink(missing_ok=True)
            return None
        if path.with_suffix(LINKED).exists():  # the store holds its linked form (`sharedpacks`)
            self.linked_seen.setdefault(b, 0)
        return data

    def _cache_write(self, path: Path, data: bytes, linked: bool = False) -> None:
        """Keep a checked batch in the cache directory, durably (fsynced, then renamed into place): it is another
        copy of the shared store's object, which a new writer can put back over a damaged one
        (`stream.batchcopies`), and a copy lost to a power cut is none."""
        try:
            if linked:
                mark_linked(path)
            replace_file(path, data)
        except OSError:
            log.warning("shared store %s: could not write cache file %s", self.stream, path)

    def _remember(self, b: int, data: bytes) -> None:
        if b in self._mem:
            self._mem.move_to_end(b)
            return
        self._mem[b] = data
        self._mem_bytes += len(data)
        while self._mem_bytes > self.mem_cache_bytes and len(self._mem) > 1:
            _b, old = self._mem.popitem(last=False)
            self._mem_bytes -= len(old)

    def _batch_bytes(self, b: int) -> bytes | None:
        e = self.batches.get(b)
        if e is None:
            return self._part if self._part is not None and b == self.next_batch else None  # type: ignore[return-value]
        data = self._fetch(b, e)
        self._remember(b, data)
        return data

    def prune_cache(self) -> None:
        """Delete cached batch files that are not (or no longer) in the applied chain."""
        if self.cache_dir is None:
            return
        keep = {L.batch_name(b, e) for b, e in self.batches.items()}
        keep |= {name[: -len(".blk")] + LINKED for name in keep}
        for p in self.cache_dir.iterdir():
            if p.name not in keep:
                try:
                    p.unlink()
                except OSError:
                    pass

    # -- MsgStore hooks ------------------------------------------------------------------------------
    def _read(self, seq: int, loc: int, size: int) -> tuple[bytes | None, bytes] | None:
        b, off = loc >> L.LOC_SHIFT, loc & L.LOC_MASK
        try:
            data = self._batch_bytes(b)
        except (OSError, L.LayoutError):
            log.exception("shared store %s: could not read batch %d", self.stream, b)
            return None
        if data is None:
            return None
        try:  # (a copy checked when it was read may have been evicted and read again from the store since)
            return L.record_body(data, off, check=True)
        except L.LayoutError as exc:
            log.error("shared store %s: message %d is damaged in %s (%s); not served", self.stream, seq,
                      self._key(b, self.batches.get(b, 0)), exc)
            return None

    def _write(self, seq: int, subject: str, hdrs: bytes | None, data: bytes, ts: int) -> int:
        raise ReadOnlyError(f"stream {self.stream}: a shared view is read-only")

    def _log_delete(self, seq: int) -> None:
        raise ReadOnlyError(f"stream {self.stream}: a shared view is read-only")

    def _log_watermark(self, first_seq: int) -> None:
        raise ReadOnlyError(f"stream {self.stream}: a shared view is read-only")

    # -- documents -----------------------------------------------------------------------------------
    def read_doc(self, sub: str, kind: str) -> dict | None:
        """The highest-epoch `<kind>.<epoch>.json` under the stream's `sub` folder ("" = the stream's own)."""
        folder = f"{self.prefix}/{sub}" if sub else self.prefix
        latest = L.latest_docs(self.objects.list(folder)).get(kind)
        if latest is None:
            return None
        key = f"{folder}/{latest[1]}"
        try:
            raw = self.objects.get(key)
        except FileNotFoundError:
            return None
        try:
            doc = json.loads(raw)
        except ValueError:
            doc = None
        if not isinstance(doc, dict):  # a torn or damaged document: refused, never read as something else
            raise L.LayoutError(f"{key}: not a JSON document (damaged)")
        return doc

    def config(self) -> dict | None:
        """{"config": ..., "created": ...} of the stream, or None."""
        return self.read_doc("", "stream")

    def consumers(self) -> dict[str, tuple[dict, dict | None]]:
        """consumer name -> (meta document, state document or None). The states are one document of the
        stream's (`consumers/states`); a consumer missing from it has its own (`consumers/<name>/state`, as
        written before the states were kept together)."""
        out = {}
        states = self.read_doc("consumers", "states") or {}
        for name in self.objects.list(f"{self.prefix}/consumers", dirs=True):
            meta = self.read_doc(f"consumers/{name}", "meta")
            if meta is not None:
                state = states.get(name)
                out[name] = (meta, state if isinstance(state, dict) else self.read_doc(f"consumers/{name}", "state"))
        return out
