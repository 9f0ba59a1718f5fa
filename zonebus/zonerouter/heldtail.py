"""A replica's replicated tail of one stream on its own disk: what it acknowledged survives a power loss.

With `zone_router_ack: replicas` a leader acknowledges a publish once a proxy in another zone holds the record
(`zonebus.store.sharedtier`); the batch object is stored up to `zone_router_tier` seconds later. Held in memory
only, those seconds are lost when every server loses power at once. So a replica's snapshot
(`zonebus.zonerouter.snapshot`) appends the records each poll answer brings to this file and fsyncs it (the
directory too when the file is new) before its next poll reports that it holds them: one fsync per answer.
Batches the leader reports stored are dropped by a compacting rewrite (a temporary file, fsynced, renamed, the
directory fsynced), so the file holds a few seconds of records. A new writer's tail query
(`zonebus.zonerouter.tailrecovery`) raises the stream's epoch fence (`min_epoch`: answers of older writers are
ignored from then on); that is written and fsynced before the answer leaves, so a restarted replica does not
acknowledge a fenced writer's records either.

One file per stream, `<store_dir>/jetstream/zone-router-tail/<stream name in hex>.tail`: frames of
`u32 body length, u32 crc32(body), body`; a body is `b"P"` + epoch u64, batch u64, offset u32, header length u16,
the batch header (once the writer sealed the batch) and the record bytes from `offset`, or `b"F"` + the fence
epoch u64. A torn or damaged frame ends the file (it was never fsynced, so never reported). All methods may be
called from any thread (a lock guards the state); the ones that write block on the disk.
"""

from __future__ import annotations

import logging
import os
import struct
import threading
import zlib
from pathlib import Path

from zonebus.store import sharedlayout as L
from zonebus.store.durability import fsync_dir, make_dirs, replace_file

log = logging.getLogger(__name__)

SUFFIX = ".tail"
_FRAME = struct.Struct("<II")
_PART = struct.Struct("<QQIH")
_FENCE = struct.Struct("<Q")
Held = tuple[bytes, bytearray]  # (the batch header once sealed else b"", the records from BATCH_HDR_LEN on)


def _frame(body: bytes) -> bytes:
    return _FRAME.pack(len(body), zlib.crc32(body)) + body


def _part_frame(epoch: int, batch: int, offset: int, header: bytes, chunk: bytes | bytearray) -> bytes:
    return _frame(b"P" + _PART.pack(epoch, batch, offset, len(header)) + header + bytes(chunk))


class HeldTail:
    """The records of one stream's replicated tail this server holds, kept in a file (`path`)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.held: dict[tuple[int, int], Held] = {}  # (batch, epoch) -> what is held of it
        self.min_epoch = 0  # a new writer took this tail: older writers' answers are ignored
        self._lock = threading.Lock()
        self._pending: list[bytes] = []  # frames not written yet
        self._rewrite = False  # batches were dropped: the next sync rewrites the file
        self._exists = path.exists()
        self.stats = {"syncs": 0, "rewrites": 0, "bytes": 0}

    @classmethod
    def for_stream(cls, directory: Path, stream: str) -> HeldTail:
        return cls(directory / (stream.encode().hex() + SUFFIX))

    @staticmethod
    def stream_of(path: Path) -> str | None:
        """The stream a file in the directory holds the tail of (None: not such a file)."""
        if not path.name.endswith(SUFFIX):
            return None
        try:
            return bytes.fromhex(path.name[: -len(SUFFIX)]).decode()
        except (ValueError, UnicodeDecodeError):
            return None

    # -- what is held ----------------------------------------------------------------------------------
    def add(self, batch: int, epoch: int, offset: int, header: bytes, chunk: bytes | bytearray) -> None:
        """Records of batch `batch` (writer `epoch`) from byte `offset` of the batch object, as the snapshot
        applied them; written by the next `sync`. Bytes held already are skipped; a gap is refused."""
        with self._lock:
            self._add(batch, epoch, offset, header, chunk, log_it=True)

    def _add(self, batch: int, epoch: int, offset: int, header: bytes, chunk: bytes | bytearray,
             log_it: bool) -> bool:
        cur = self.held.get((batch, epoch))
        have = L.BATCH_HDR_LEN + (len(cur[1]) if cur is not None else 0)
        if offset > have or offset < L.BATCH_HDR_LEN:
            return False
        new = chunk[have - offset :]
        if cur is None:
            cur = self.held[(batch, epoch)] = (b"", bytearray())
        if header and not cur[0]:
            cur = self.held[(batch, epoch)] = (bytes(header), cur[1])
        elif not new:
            return True
        cur[1].extend(new)
        if log_it:
            self._pending.append(_part_frame(epoch, batch, have, header, new))
        return True

    def fence(self, epoch: int) -> None:
        """A writer of `epoch` took the tail: durable before the caller answers it."""
        with self._lock:
            if epoch <= self.min_epoch:
                return
            self.min_epoch = epoch
            self._pending.append(_frame(b"F" + _FENCE.pack(epoch)))
            self._sync()

    def clear(self) -> None:
        """Forget the stream's tail and its fence, and delete the file (the stream was deleted, or the file is of
        an earlier stream of that name)."""
        with self._lock:
            self.held, self.min_epoch, self._pending, self._rewrite = {}, 0, [], False
            if self._exists:
                self.path.unlink(missing_ok=True)
                fsync_dir(self.path.parent)
                self._exists = False

    def top_epoch(self) -> int:
        """The highest writer epoch the file names (its fence, or the writer of a batch held)."""
        with self._lock:
            return max([self.min_epoch, *(e for _b, e in self.held)])

    def drop(self, upto: int) -> None:
        """The leader stored every batch up to `upto`: what is held of them goes at the next `sync`."""
        with self._lock:
            gone = [k for k in self.held if k[0] <= upto]
            for k in gone:
                del self.held[k]
            self._rewrite = self._rewrite or bool(gone)

    def records(self, epoch: int, batch: int) -> bytes:
        """The records of writer `epoch`'s batches from `batch` on, in log order (up to a batch not held)."""
        with self._lock:
            out: list[bytes] = []
            prev = -1
            for b, e in sorted(k for k in self.held if k[1] == epoch and k[0] >= batch):
                if out and b != prev + 1:
                    break
                out.append(bytes(self.held[(b, e)][1]))
                prev = b
            return b"".join(out)

    def entries(self) -> list[tuple[int, int, bytes, bytes]]:
        """(batch, epoch, header, records) of every batch held, in batch order (a snapshot's reload replays them)."""
        with self._lock:
            return [(b, e, h, bytes(data)) for (b, e), (h, data) in sorted(self.held.items())]

    def __len__(self) -> int:
        return sum(len(d) for _h, d in self.held.values())

    # -- the file --------------------------------------------------------------------------------------
    def sync(self) -> None:
        """Make what was added (and dropped) durable: append and fsync, or rewrite when batches were dropped."""
        with self._lock:
            self._sync()

    def _sync(self) -> None:
        if self._rewrite:
            self._rewrite, self._pending = False, []
            self._write_whole()
            return
        if not self._pending:
            return
        data = b"".join(self._pending)
        self._pending = []
        created = not self._exists
        if created:
            make_dirs(self.path.parent)
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        if created:
            fsync_dir(self.path.parent)
            self._exists = True
        self.stats["syncs"] += 1
        self.stats["bytes"] += len(data)

    def _write_whole(self) -> None:
        frames = [_frame(b"F" + _FENCE.pack(self.min_epoch))] if self.min_epoch else []
        frames += [_part_frame(e, b, L.BATCH_HDR_LEN, h, data) for (b, e), (h, data) in sorted(self.held.items())]
        make_dirs(self.path.parent)
        replace_file(self.path, b"".join(frames))
        self._exists = True
        self.stats["rewrites"] += 1

    def load(self) -> None:
        """Read the file (at start): what was fsynced before a crash or a power loss. A torn end is cut off."""
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return
        with self._lock:
            pos = 0
            while pos + _FRAME.size <= len(raw):
                n, crc = _FRAME.unpack_from(raw, pos)
                body = raw[pos + _FRAME.size : pos + _FRAME.size + n]
                if len(body) != n or zlib.crc32(body) != crc or not self._replay(body):
                    break
                pos += _FRAME.size + n
            if pos != len(raw):
                log.warning("zone router: %s ends in %d bytes that were never synced; cut off", self.path,
                            len(raw) - pos)
                self._write_whole()

    def _replay(self, body: bytes) -> bool:
        try:
            if body[:1] == b"F":
                self.min_epoch = max(self.min_epoch, _FENCE.unpack_from(body, 1)[0])
                return True
            if body[:1] != b"P":
                return False
            epoch, batch, offset, hlen = _PART.unpack_from(body, 1)
        except struct.error:
            return False
        start = 1 + _PART.size
        return self._add(batch, epoch, offset, body[start : start + hlen], body[start + hlen :], log_it=False)


def load_all(directory: Path) -> dict[str, HeldTail]:
    """Every stream's held tail in `directory` (at start; blocking)."""
    out: dict[str, HeldTail] = {}
    if not directory.is_dir():
        return out
    for path in sorted(directory.iterdir()):
        stream = HeldTail.stream_of(path)
        if stream is None:
            continue
        held = HeldTail(path)
        held.load()
        out[stream] = held
    return out
