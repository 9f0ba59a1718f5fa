"""A replica's replicated tail of one stream on its own disk: what it acknowledged survives a power loss.

With `zone_router_ack: replicas` a leader acknowledges a publish once a proxy in another zone holds the record
(`zonebus.store.sharedtier`); the batch object is stored up to `zone_router_tier` seconds later. Held in memory
only, those seconds are lost when every server loses power at once. So a replica's snapshot
(`zonebus.zonerouter.snapshot`) appends the records each poll answer brings to its files of the stream's tail
and fsyncs them (the directory too when a file is new) before its next poll reports that it holds them: one
fsync per answer (two when the answer crosses into a new batch). A batch the leader reports stored is dropped by
deleting its file, so the directory holds a few seconds of records and nothing is ever rewritten. A new writer's
tail query (`zonebus.zonerouter.tailrecovery`) raises the stream's epoch fence (`min_epoch`: answers of older
writers are ignored from then on); it is written (temporary file, fsync, rename, directory fsync) before the
answer leaves, so a restarted replica does not acknowledge a fenced writer's records either.

Layout, one directory per stream, `<store_dir>/jetstream/zone-router-tail/<stream name in hex>/`:
`<batch>-<epoch>.part` per batch held (frames of `u32 body length, u32 crc32(body), body`, a body being the
offset in the batch object u32, the header's length u16, the batch header once the writer sealed the batch,
then the record bytes from that offset), and `fence` (the fence epoch, in decimal). A torn or damaged frame
ends its file (it was never fsynced, so never reported) and is cut off. A deletion lost to a power loss brings
back the file of a stored batch: it is dropped again (a tail query asks from the first batch not stored). All
methods may be called from any thread (a lock guards the state); the ones that write block on the disk.
"""

from __future__ import annotations

import logging
import os
import shutil
import struct
import threading
import time
import zlib
from pathlib import Path

from zonebus.store import sharedlayout as L
from zonebus.store.durability import fsync_dir, make_dirs, replace_file, write_synced

log = logging.getLogger(__name__)

PART_SUFFIX = ".part"
FENCE = "fence"
_FRAME = struct.Struct("<II")
_PART = struct.Struct("<IH")
Held = tuple[bytes, bytearray]  # (the batch header once sealed else b"", the records from BATCH_HDR_LEN on)
Key = tuple[int, int]  # (batch, writer epoch)


def _frame(offset: int, header: bytes, chunk: bytes | bytearray) -> bytes:
    body = _PART.pack(offset, len(header)) + header + bytes(chunk)
    return _FRAME.pack(len(body), zlib.crc32(body)) + body


class HeldTail:
    """The records of one stream's replicated tail this server holds, kept in a directory (`path`)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.held: dict[Key, Held] = {}  # (batch, epoch) -> what is held of it
        self.min_epoch = 0  # a new writer took this tail: older writers' answers are ignored
        self._lock = threading.Lock()
        self._pending: dict[Key, list[bytes]] = {}  # frames not written yet, per file
        self._files: set[Key] = set()  # the part files that exist
        self._gone: set[Key] = set()  # part files to delete
        self.stats = {"syncs": 0, "bytes": 0, "deleted": 0, "sync_ms": 0.0, "sync_ms_max": 0.0}

    @classmethod
    def for_stream(cls, directory: Path, stream: str) -> HeldTail:
        return cls(directory / stream.encode().hex())

    @staticmethod
    def stream_of(path: Path) -> str | None:
        """The stream a directory holds the tail of (None: not such a directory)."""
        try:
            return bytes.fromhex(path.name).decode() if path.is_dir() else None
        except (ValueError, UnicodeDecodeError):
            return None

    def _file(self, key: Key) -> Path:
        return self.path / f"{L.num(key[0])}-{L.num(key[1])}{PART_SUFFIX}"

    # -- what is held ----------------------------------------------------------------------------------
    def add(self, batch: int, epoch: int, offset: int, header: bytes, chunk: bytes | bytearray) -> None:
        """Records of batch `batch` (writer `epoch`) from byte `offset` of the batch object, as the snapshot
        applied them; written by the next `sync`. Bytes held already are skipped; a gap is refused."""
        with self._lock:
            self._add((batch, epoch), offset, header, chunk, log_it=True)

    def _add(self, key: Key, offset: int, header: bytes, chunk: bytes | bytearray, log_it: bool) -> bool:
        cur = self.held.get(key)
        have = L.BATCH_HDR_LEN + (len(cur[1]) if cur is not None else 0)
        if offset > have or offset < L.BATCH_HDR_LEN:
            return False
        new = chunk[have - offset :]
        if cur is None:
            cur = self.held[key] = (b"", bytearray())
            self._gone.discard(key)
        if header and not cur[0]:
            cur = self.held[key] = (bytes(header), cur[1])
        elif not new:
            return True
        cur[1].extend(new)
        if log_it:
            self._pending.setdefault(key, []).append(_frame(have, header, new))
        return True

    def fence(self, epoch: int) -> None:
        """A writer of `epoch` took the tail: durable before the caller answers it."""
        with self._lock:
            if epoch <= self.min_epoch:
                return
            self.min_epoch = epoch
            make_dirs(self.path)
            replace_file(self.path / FENCE, str(epoch).encode())

    def drop(self, upto: int) -> None:
        """The leader stored every batch up to `upto`: their files go at the next `sync`."""
        with self._lock:
            for key in [k for k in self.held if k[0] <= upto]:
                del self.held[key]
                self._pending.pop(key, None)
                if key in self._files:
                    self._gone.add(key)

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

    def top_epoch(self) -> int:
        """The highest writer epoch the directory names (its fence, or the writer of a batch held)."""
        with self._lock:
            return max([self.min_epoch, *(e for _b, e in self.held)])

    def __len__(self) -> int:
        return sum(len(d) for _h, d in self.held.values())

    # -- the files -------------------------------------------------------------------------------------
    def sync(self) -> None:
        """Make what was added durable (append, fsync; the directory when a file is new); delete dropped files."""
        with self._lock:
            if not self._pending and not self._gone:
                return
            start = time.perf_counter()
            try:
                self._write()
            finally:
                ms = (time.perf_counter() - start) * 1000
                self.stats["sync_ms"] += ms
                self.stats["sync_ms_max"] = max(self.stats["sync_ms_max"], ms)

    def _write(self) -> None:
        for key in sorted(self._gone):  # (no directory fsync: a file that comes back is dropped again)
            self._file(key).unlink(missing_ok=True)
            self._files.discard(key)
            self.stats["deleted"] += 1
        self._gone.clear()
        if not self._pending:
            return
        make_dirs(self.path)
        created = False
        for key, frames in sorted(self._pending.items()):
            data = b"".join(frames)
            fd = os.open(self._file(key), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            try:
                write_synced(fd, data)
            finally:
                os.close(fd)
            created = created or key not in self._files
            self._files.add(key)
            del self._pending[key]  # (what failed stays pending: the next sync writes it)
            self.stats["bytes"] += len(data)
        if created:
            fsync_dir(self.path)
        self.stats["syncs"] += 1

    def load(self) -> None:
        """Read the directory (at start): what was fsynced before a crash or a power loss. A torn end is cut off."""
        with self._lock:
            try:
                self.min_epoch = int((self.path / FENCE).read_bytes() or b"0")
            except (FileNotFoundError, ValueError):
                pass
            for path in sorted(self.path.glob(f"*{PART_SUFFIX}")):
                try:
                    b, e = (int(x) for x in path.name[: -len(PART_SUFFIX)].split("-"))
                except ValueError:
                    continue
                self._load_part((b, e), path)

    def _load_part(self, key: Key, path: Path) -> None:
        raw = path.read_bytes()
        self._files.add(key)
        pos = 0
        while pos + _FRAME.size <= len(raw):
            n, crc = _FRAME.unpack_from(raw, pos)
            body = raw[pos + _FRAME.size : pos + _FRAME.size + n]
            if len(body) != n or zlib.crc32(body) != crc or len(body) < _PART.size:
                break
            offset, hlen = _PART.unpack_from(body)
            start = _PART.size
            if not self._add(key, offset, body[start : start + hlen], body[start + hlen :], log_it=False):
                break
            pos += _FRAME.size + n
        if pos != len(raw):
            log.warning("zone router: %s ends in %d bytes that were never synced; cut off", path, len(raw) - pos)
            with path.open("r+b") as f:
                f.truncate(pos)
                os.fsync(f.fileno())

    def clear(self) -> None:
        """Forget the stream's tail and its fence, and delete the directory (the stream was deleted, or the
        directory is of an earlier stream of that name)."""
        with self._lock:
            self.held, self.min_epoch, self._pending, self._files, self._gone = {}, 0, {}, set(), set()
            if self.path.exists():
                shutil.rmtree(self.path, ignore_errors=True)
                fsync_dir(self.path.parent)


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
