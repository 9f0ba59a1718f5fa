"""The file store: append-only segment files with CRC-checked records, rebuilt into an index on open.

Layout: `<dir>/<n>.blk`, n = 1, 2, ... Every record is

    total_len u32 | kind u8 | seq u64 | ts i64 | subj_len u16 | hdr_len u32 | data_len u32
    | subject | headers | data | crc32 u32 (over everything before it)

kinds: MSG; SMSG (a MSG sealed, with encryption at rest: `nonce | AEAD(subject | headers | data)` in place of
the three, the header as associated data; the lengths stay those of the plaintext); DEL (one sequence
removed); MARK (every sequence below `seq` is gone, and the last sequence is at least `ts`). Removals are
appended to the active segment, so a segment is only deleted when it and every older segment hold no live
message: a tombstone never outlives its target's segment. Each new segment starts with a MARK so the last
sequence survives even when every message is gone.

Recovery reads segments in order and stops a segment at the first short or corrupt record, truncating the
file there (a torn tail after a crash). With `sync_always` (zonebus's default) a record is durable before it is
acknowledged or shown to consumers: `visible_seq` is the last fsynced sequence and `ack_when_durable` waits for
the group commit (`zonebus.store.durability`: one fsync in a thread per batch of appends); the records of a
batch are buffered and written with one `os.write` just before its fsync (a SIGKILL can take only records not
yet acknowledged; a read of one still buffered writes the buffer first), except in a `shared` store (a durable
queue group's log on a shared store, which a successor may open while this process is paused): there each
record is written at once. Without it (an explicit lazy
`sync_interval`) each record is written with its own `os.write` (to the kernel: it survives a SIGKILL), and a
power loss can take what the OS had not written back. New directories and segment files are
fsynced into their directory in both modes.

With `keys` (zonebus.store.atrest) every message is written as SMSG, sealed with its segment's key, and the
`.idx` files are sealed whole; a store that may still hold plaintext (`keys.converting`: a `key` added to an
existing store, or such a conversion cut short by a crash) is converted first: each segment re-written sealed
(to a temporary file, renamed over it), the indexes dropped; the keys' owner ends the conversion
(`finish_conversion`) once its own documents are sealed too. Without keys nothing of this runs.
"""

from __future__ import annotations

import logging
import os
import zlib
from array import array
from pathlib import Path
from time import time_ns
from typing import TYPE_CHECKING

from zonebus.store import segindex
from zonebus.store.atrest import NONCE, OVERHEAD, AtRestKeyError, StoreKeys
from zonebus.store.durability import GroupCommit, Waiter, fsync_dir, make_dirs
from zonebus.store.msgstore import MsgStore
from zonebus.store.records import (
    CRC,
    DEL,
    HDR_LEN,
    HEADER,
    MARK,
    MSG,
    OFF_MASK,
    SEG_SHIFT,
    SMSG,
    encode,
    encode_run,
    encode_sealed,
    whole_record,
)
from zonebus.store.segindex import SegIndex

if TYPE_CHECKING:
    from zonebus.store.atrest import AEAD

log = logging.getLogger(__name__)

DEFAULT_SEGMENT_BYTES = 64 * 1024 * 1024
READ_AHEAD = 64 * 1024  # bytes read at once for a message: a consumer's next ones come from the same read


class FileStore(MsgStore):
    overhead = 30  # nats-server fileStoreMsgSize: subject + headers + data + 22 record + 8 hash

    def msg_size(self, subject: str, hdrs: bytes | None, data: bytes) -> int:
        # nats-server adds 4 bytes (the header length) when there are headers
        return MsgStore.msg_size(self, subject, hdrs, data) + (4 if hdrs else 0)  # (SharedView borrows it)

    def __init__(self, directory: str | Path, sync_always: bool = False,
                 segment_bytes: int = DEFAULT_SEGMENT_BYTES, keys: StoreKeys | None = None,
                 shared: bool = False) -> None:
        super().__init__()
        # `shared`: another process may write this directory after this one (a queue group's log on a shared
        # store, led by a successor while this one was paused): each record is written at once, never from a
        # buffer after a pause, when the successor may have appended its own (two writers: a corrupt log)
        self.buffered = False  # (set with the group commit, below)
        self.dir = Path(directory)
        self.keys = keys  # encryption at rest (zonebus.store.atrest); None: plaintext, as fast as ever
        self._aeads: dict[int, AEAD] = {}  # segment number -> its records' AEAD (with keys)
        if keys is not None:  # the sealed write and read in place of the plaintext ones
            self._write = self._write_sealed  # type: ignore[method-assign]
            self._read = self._read_sealed  # type: ignore[method-assign]
        self.sync_always = sync_always
        make_dirs(self.dir)  # (fsynced in either mode: a new stream or segment must not vanish whole)
        self.commit: GroupCommit | None = None
        self.segment_bytes = segment_bytes
        self._fds: dict[int, int] = {}  # segment number -> fd
        self._live: dict[int, int] = {}  # segment number -> live messages
        self._active = 0
        self._offset = 0  # write offset in the active segment
        self._dirty = False
        self._seg_base: dict[int, int] = {}  # segment number -> first sequence written into it
        self._removals: list[tuple[int, int, int]] = []  # DEL/MARK records of the active segment
        self._buf = bytearray()  # with sync_always: records of the active segment not written yet (`_write_out`)
        self._ahead: tuple[int, int, bytes] = (-1, 0, b"")  # (segment, offset, bytes) of the last read from disk
        self._ahead_next = -1  # where the record after the last one read starts (its loc)
        self.recovered_truncations = 0
        self.indexed_segments = 0  # segments recovered from their .idx file
        if keys is not None:
            self._encrypt_plaintext()
        self._recover()
        if sync_always:
            self.commit = GroupCommit(lambda: self._fds[self._active], self.index.last_seq)
            self.commit.on_synced = self._synced
            self.commit.before_sync = self._write_out
            self.buffered = not shared

    # -- recovery ------------------------------------------------------------------------------------
    def _segments(self) -> list[int]:
        nums = []
        for p in self.dir.glob("*.blk"):
            try:
                nums.append(int(p.stem))
            except ValueError:
                continue
        return sorted(nums)

    def _path(self, n: int) -> Path:
        return self.dir / f"{n}.blk"

    def _idx_path(self, n: int) -> Path:
        return self.dir / f"{n}.idx"

    def _aead(self, n: int) -> AEAD:
        aead = self._aeads.get(n)
        if aead is None:
            aead = self._aeads[n] = self.keys.segment_aead(n)  # type: ignore[union-attr]  # (only with keys)
        return aead

    def _encrypt_plaintext(self) -> None:
        """The store may hold plaintext (a key was just made for it, or a conversion was cut short): re-write
        every segment sealed, and drop the (plaintext) indexes; recovery then scans the sealed segments."""
        segs = self._segments()
        if not segs or not self.keys.converting:  # type: ignore[union-attr]
            return
        log.warning("filestore %s: encrypting %d segment(s) written before the key was configured", self.dir,
                    len(segs))
        for n in segs:
            out = bytearray()
            data = self._path(n).read_bytes()
            off = 0
            while (head := whole_record(data, off, len(data))) is not None:  # (a torn tail: recovery truncates it)
                total, kind, seq, ts, slen, hlen, dlen = head
                end = off + total - 4
                if kind == MSG:
                    p = off + HDR_LEN
                    out += encode_sealed(self._aead(n), seq, ts, data[p:p + slen], data[p + slen:p + slen + hlen],
                                         data[p + slen + hlen:end])
                else:
                    out += data[off:off + total]
                off += total
            tmp = self.dir / f"{n}.blk.tmp"
            with open(tmp, "wb") as f:
                f.write(out)
                f.flush()
                os.fsync(f.fileno())
            self._idx_path(n).unlink(missing_ok=True)
            tmp.replace(self._path(n))
        fsync_dir(self.dir)

    def _recover(self) -> None:
        segs = self._segments()
        for n in segs:
            self._live[n] = 0
            self._fds[n] = os.open(self._path(n), os.O_RDWR | os.O_APPEND)
            self._removals = []
            start = self._load_index(n)
            self._scan_segment(n, start)
        if segs:
            self._active = segs[-1]
            self._offset = os.fstat(self._fds[self._active]).st_size
            if self._offset >= self.segment_bytes:
                self._roll()
        else:
            self._open_segment(1)
        self._drop_empty_front()

    def _load_index(self, n: int) -> int:
        """Load segment n from its index file when that is valid; returns the offset to scan from."""
        seg = segindex.read(self._idx_path(n), self.keys)
        idx = self.index
        size = os.fstat(self._fds[n]).st_size
        if seg is None or seg.covered > size or (len(seg.sids) and seg.base_seq <= idx.last_seq):
            return 0
        table = {gid: idx.subject_id(subj) for gid, subj in seg.subjects.items()}
        table[-1] = -1
        sids = seg.sids
        if any(table[g] != g for g in table):
            sids = array("i", [table[g] for g in seg.sids])
        self._live[n] += idx.add_bulk(seg.base_seq, sids, seg.sizes, seg.tss, seg.locs)
        if len(seg.tss):
            self._last_ts = max(self._last_ts, seg.tss[-1])
        self._seg_base[n] = seg.base_seq
        for kind, seq, aux in seg.removals:
            self._apply_removal(kind, seq, aux)
        self.indexed_segments += 1
        return seg.covered

    def _apply_removal(self, kind: int, seq: int, aux: int) -> None:
        self._removals.append((kind, seq, aux))
        if kind == DEL:
            self._index_remove(seq)
            return
        idx = self.index  # MARK: below `seq` nothing is live; the last sequence is at least `aux`
        while idx.msgs and idx.first_seq < seq:
            self._index_remove(idx.first_seq)
        idx.skip_to(seq, aux)

    def _scan_segment(self, n: int, start: int = 0) -> None:
        fd = self._fds[n]
        size = os.fstat(fd).st_size
        data = os.pread(fd, size - start, start) if size > start else b""
        idx = self.index
        off = 0
        size -= start
        base = start
        while off < size:
            head = whole_record(data, off, size)
            if head is None:
                break
            total, kind, seq, ts, slen, hlen, dlen = head
            if kind in (MSG, SMSG):
                if seq > idx.last_seq:
                    p = off + HDR_LEN
                    if kind == SMSG:
                        plain = self._open(n, data, off, total)
                        if plain is None:  # (never truncated: an intact record that does not open is no torn tail)
                            raise AtRestKeyError(f"filestore {self.dir}: segment {n} holds a sealed record at "
                                                 f"{base + off} that does not decrypt")
                        subject = plain[:slen].decode()
                    else:
                        subject = data[p : p + slen].decode()
                    msize = slen + hlen + dlen + self.overhead + (4 if hlen else 0)
                    idx.add(seq, subject, msize, ts, (n << SEG_SHIFT) | (base + off))
                    self._seg_base.setdefault(n, seq)
                    self._live[n] += 1
                    self._last_ts = max(self._last_ts, ts)
            else:
                self._apply_removal(kind, seq, ts)
            off += total
        if off < size:
            log.warning("filestore %s: truncating segment %d at %d (torn or corrupt record)", self.dir, n,
                        base + off)
            os.ftruncate(fd, base + off)
            self.recovered_truncations += 1

    def _open(self, n: int, rec: bytes, off: int, total: int) -> bytes | None:
        """An SMSG record's subject, headers and data; None (logged) when it does not decrypt."""
        if self.keys is None:
            raise AtRestKeyError(f"filestore {self.dir}: the store holds encrypted records and no key is configured")
        p = off + HDR_LEN
        try:
            return self._aead(n).decrypt(rec[p:p + NONCE], rec[p + NONCE:off + total - 4], rec[off:p])
        except Exception:
            log.error("filestore %s: record at %d of segment %d does not decrypt", self.dir, off, n)
            return None

    def _index_remove(self, seq: int) -> None:
        gone = self.index.remove(seq)
        if gone is not None:
            self._live[gone[2] >> SEG_SHIFT] -= 1

    # -- segments ------------------------------------------------------------------------------------
    def _open_segment(self, n: int) -> None:
        fd = os.open(self._path(n), os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        fsync_dir(self.dir)  # the new file's entry
        self._fds[n] = fd
        self._live[n] = 0
        self._active = n
        self._offset = os.fstat(fd).st_size
        self._seg_base[n] = self.index.last_seq + 1
        self._removals = []
        self._log_watermark(self.index.first_seq)

    def _roll(self) -> None:
        if self.commit is not None:
            self.commit.sync_now()
        elif self._dirty:
            os.fsync(self._fds[self._active])
            self._dirty = False
        self._write_index(self._active)
        self._open_segment(self._active + 1)
        self._drop_empty_front()

    def _write_index(self, n: int) -> None:
        """Write `<n>.idx` for the segment's current contents (it must be the active segment)."""
        idx = self.index
        base = max(self._seg_base.get(n, idx.last_seq + 1), idx.base)
        i0, i1 = base - idx.base, idx.last_seq + 1 - idx.base
        if i1 <= i0:
            seg = SegIndex(self._offset, idx.last_seq + 1)
        else:
            sids = idx.sids[i0:i1]
            seg = SegIndex(self._offset, base, sids, idx.sizes[i0:i1], idx.tss[i0:i1], idx.locs[i0:i1],
                           {g: idx.subjects[g] for g in set(sids) if g >= 0})
        seg.removals = list(self._removals)
        try:
            segindex.write(self._idx_path(n), seg, self.keys)
        except OSError:
            log.exception("filestore %s: could not write index of segment %d", self.dir, n)

    def _drop_empty_front(self) -> None:
        for n in sorted(self._fds):
            if n == self._active or self._live.get(n, 0) > 0:
                break
            os.close(self._fds.pop(n))
            self._live.pop(n, None)
            self._seg_base.pop(n, None)
            self._aeads.pop(n, None)
            for path in (self._idx_path(n), self._path(n)):  # the index first: never an index without data
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    pass

    def _append(self, rec: bytes, seq: int = 0) -> int:
        """Write one record at the end of the active segment; `seq`: the message it stores (0: a removal)."""
        off = self._offset
        self._offset += len(rec)
        if self.buffered:  # written with the others of its batch, before their fsync
            self._buf += rec
            assert self.commit is not None
            self.commit.written(seq or self.index.last_seq)
            return off
        fd = self._fds[self._active]
        view = memoryview(rec)
        while view:
            written = os.write(fd, view)
            view = view[written:]
        if self.commit is not None:
            self.commit.written(seq or self.index.last_seq)
        else:
            self._dirty = True
        return off

    def _write_out(self) -> None:
        """Write the buffered records to the active segment (before an fsync, a roll, a close or a read of one)."""
        if not self._buf:
            return
        buf, self._buf = self._buf, bytearray()
        fd = self._fds[self._active]
        view = memoryview(buf)
        try:
            while view:
                written = os.write(fd, view)
                view = view[written:]
        except OSError:
            self._buf = bytearray(view)  # (what was not written stays for the next attempt)
            raise
        finally:
            view.release()

    # -- MsgStore hooks ------------------------------------------------------------------------------
    def _write(self, seq: int, subject: str, hdrs: bytes | None, data: bytes, ts: int) -> int:
        if self._offset >= self.segment_bytes:
            self._roll()
        off = self._append(encode(MSG, seq, ts, subject.encode(), hdrs or b"", data), seq)
        self._live[self._active] += 1
        return (self._active << SEG_SHIFT) | off

    def store_run(self, subjects: list[str], datas: list[bytes]) -> int:
        """`MsgStore.store_run` in one pass in plaintext: the records are encoded together
        (`records.encode_run`, all with one timestamp) and the index takes them together. With the group commit
        they go into its buffer and it hears of them once (per segment); without it (a lazy `sync_interval`)
        they are written with one `os.write` per segment before this returns, so before any PubAck."""
        commit = self.commit
        if self.keys is not None or (commit is not None and not self.buffered):
            return super().store_run(subjects, datas)
        idx = self.index
        ts = time_ns()
        if ts < self._last_ts:
            ts = self._last_ts
        self._last_ts = ts
        i, n = 0, len(subjects)
        while i < n:
            if self._offset >= self.segment_bytes:  # a roll, as `store` does it (what was written before is written())
                self.store(subjects[i], None, datas[i], ts)
                i += 1
                continue
            first = idx.last_seq + 1
            start = self._offset
            buf = self._buf if commit is not None else bytearray()
            done, self._offset, sizes, locs = encode_run(buf, subjects, datas, i, first, ts,
                                                         self._active << SEG_SHIFT, self._offset, self.segment_bytes,
                                                         self.overhead)
            if commit is None:
                self._write_now(buf, start)
            self._live[self._active] += done - i
            idx.add_run(first, subjects[i:done], sizes, ts, locs)
            if commit is not None:
                commit.written(idx.last_seq)
            i = done
        if commit is not None:
            commit.start_now()
        return idx.last_seq

    def _write_now(self, buf: bytearray, start: int) -> None:
        """Write a lazy store's encoded run at `start` of the active segment, its end `_offset`; when the write
        fails (a full disk) the segment is cut back to `start` and nothing of the run is stored."""
        fd = self._fds[self._active]
        view = memoryview(buf)
        try:
            while view:
                view = view[os.write(fd, view):]
        except OSError:
            os.ftruncate(fd, start)
            self._offset = start
            raise
        finally:
            view.release()
        self._dirty = True

    def _write_sealed(self, seq: int, subject: str, hdrs: bytes | None, data: bytes, ts: int) -> int:
        """`_write` with keys (set in its place, so that the plaintext path tests nothing)."""
        if self._offset >= self.segment_bytes:
            self._roll()
        rec = encode_sealed(self._aead(self._active), seq, ts, subject.encode(), hdrs or b"", data)
        off = self._append(rec, seq)
        self._live[self._active] += 1
        return (self._active << SEG_SHIFT) | off

    def _read(self, seq: int, loc: int, size: int) -> tuple[bytes | None, bytes] | None:
        n, off = loc >> SEG_SHIFT, loc & OFF_MASK
        fd = self._fds.get(n)
        if fd is None:
            return None
        if self._buf and n == self._active and off >= self._offset - len(self._buf):
            self._write_out()
        want = size - self.overhead + HDR_LEN + 4  # the record (with headers: 4 bytes more)
        seg, start, chunk = self._ahead
        at = off - start
        if seg != n or at < 0 or at + want > len(chunk):  # (a segment's bytes never change once written)
            sequential = self._ahead_next == loc  # (a consumer's: read ahead; a random get reads one record)
            chunk = os.pread(fd, max(want, READ_AHEAD) if sequential else want, off)
            self._ahead = (n, off, chunk)
            at = 0
        if len(chunk) < at + HDR_LEN:
            return None
        total, _k, rseq, _ts, slen, hlen, dlen = HEADER.unpack_from(chunk, at)
        end = at + total
        if len(chunk) < end:
            return None
        if rseq != seq or zlib.crc32(memoryview(chunk)[at : end - 4]) != CRC.unpack_from(chunk, end - 4)[0]:
            log.error("filestore %s: record for seq %d is corrupt", self.dir, seq)
            return None
        self._ahead_next = loc + total
        p = at + HDR_LEN + slen
        return (chunk[p : p + hlen] if hlen else None), chunk[p + hlen : p + hlen + dlen]

    def _read_sealed(self, seq: int, loc: int, size: int) -> tuple[bytes | None, bytes] | None:
        """`_read` with keys (set in its place): an SMSG record is opened (a MSG one read as it is)."""
        n, off = loc >> SEG_SHIFT, loc & OFF_MASK
        fd = self._fds.get(n)
        if fd is None:
            return None
        if self._buf and n == self._active and off >= self._offset - len(self._buf):
            self._write_out()
        rec = os.pread(fd, size - self.overhead + HDR_LEN + 4 + OVERHEAD, off)
        if len(rec) < HDR_LEN:
            return None
        total, kind, rseq, _ts, slen, hlen, _dlen = HEADER.unpack_from(rec, 0)
        if len(rec) < total:
            return None
        if kind != SMSG or rseq != seq or zlib.crc32(memoryview(rec)[: total - 4]) != CRC.unpack_from(
                rec, total - 4)[0]:
            return FileStore._read(self, seq, loc, size)  # (a plaintext record; or corrupt, which it reports)
        plain = self._open(n, rec, 0, total)
        if plain is None:
            return None
        return (plain[slen:slen + hlen] if hlen else None), plain[slen + hlen:]

    def _forget(self, seq: int, loc: int) -> None:
        n = loc >> SEG_SHIFT
        if n in self._live:
            self._live[n] -= 1
            if self._live[n] <= 0 and n != self._active:
                self._drop_empty_front()

    def _log_delete(self, seq: int) -> None:
        self._append(encode(DEL, seq, 0))
        self._removals.append((DEL, seq, 0))

    def _log_watermark(self, first_seq: int) -> None:
        last = self.index.last_seq
        self._append(encode(MARK, first_seq, last))
        self._removals.append((MARK, first_seq, last))

    def _purge_all(self) -> None:
        super()._purge_all()
        self._roll()  # the new segment starts with a MARK at last_seq + 1; the older ones are all empty

    # -- durability ----------------------------------------------------------------------------------
    def write_error(self) -> str | None:
        return self.commit.error if self.commit is not None else None

    def visible_seq(self) -> int:
        return self.commit.synced_seq if self.commit is not None else self.index.last_seq

    durable_in_order = True  # (one fsync covers every write before it; after a failed one, every wait fails)

    def ack_when_durable(self, seq: int, cb: Waiter) -> bool:
        return self.commit is not None and self.commit.wait(seq, cb)

    def _synced(self, first: int, last: int) -> None:
        first = max(first, self.index.first_seq)  # (a `first_seq` or purge skips sequences never stored)
        if self.on_visible is not None and first <= last:
            self.on_visible(first, last)

    def sync(self) -> None:
        if self.commit is not None:
            self._write_out()
            if self._fds:
                self.commit.sync_now()
            return
        if self._dirty and self._active in self._fds:
            os.fsync(self._fds[self._active])
            self._dirty = False

    def close(self) -> None:
        if not self._fds:
            return
        self.sync()
        if self.commit is not None:
            self.commit.close()
        if self._active in self._fds:
            self._write_index(self._active)
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def destroy(self) -> None:
        self.close()
        for pattern in ("*.idx", "*.blk", "*.tmp"):
            for p in self.dir.glob(pattern):
                p.unlink()
        try:
            self.dir.rmdir()
        except OSError:
            pass

    def disk_bytes(self) -> int:
        return sum(os.fstat(fd).st_size for fd in self._fds.values())

    def appended_elsewhere(self) -> int:
        """Bytes at the end of the active segment that this store did not write (0: none): another process
        appended to the same directory (a second writer of a shared log, which this store's index knows
        nothing of; its own next records would be indexed at offsets where they are not)."""
        fd = self._fds.get(self._active)
        return os.fstat(fd).st_size - (self._offset - len(self._buf)) if fd is not None else 0
