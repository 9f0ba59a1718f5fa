"""The message store contract shared by the file store and the memory store.

`MsgStore` owns a `MsgIndex` and implements everything that only needs the index (counts, filtered
lookups, purge planning); a subclass stores and reads message bodies (`_write`, `_read`, `_forget`) and
makes removals durable (`_log_delete`, `_log_watermark`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from zonebus.store.subject_index import MsgIndex
from zonebus.subjects.patterns import matches

if TYPE_CHECKING:
    from zonebus.store.atrest import StoreKeys


def now_ns() -> int:
    return time.time_ns()


@dataclass(slots=True)
class StoredMsg:
    seq: int
    subject: str
    hdrs: bytes | None
    data: bytes
    ts: int  # unix nanoseconds


@dataclass(slots=True)
class StoreState:
    msgs: int
    bytes: int
    first_seq: int
    first_ts: int
    last_seq: int
    last_ts: int
    num_subjects: int
    num_deleted: int


class MsgStore:
    """Base store: sequence numbering, index upkeep and queries. Subclasses keep the bodies."""

    overhead = 16  # bytes counted per message besides subject, headers and payload
    # told (first, last) when stored messages become durable after `store` returned (a store whose
    # `visible_seq` lags behind its last sequence); the stream announces them to its consumers then
    on_visible: Callable[[int, int], None] | None = None
    keys: StoreKeys | None = None  # encryption at rest (a file store's; zonebus.store.atrest): None = plaintext

    def __init__(self) -> None:
        self.index = MsgIndex()
        self._last_ts = 0

    # -- subclass hooks ------------------------------------------------------------------------------
    def _write(self, seq: int, subject: str, hdrs: bytes | None, data: bytes, ts: int) -> int:
        raise NotImplementedError

    def _read(self, seq: int, loc: int, size: int) -> tuple[bytes | None, bytes] | None:
        raise NotImplementedError

    def _forget(self, seq: int, loc: int) -> None:
        """Drop a removed message's body (called after the index forgot it)."""

    def _log_delete(self, seq: int) -> None:
        """Make the removal of one message durable."""

    def _log_watermark(self, first_seq: int) -> None:
        """Make 'every sequence below first_seq is gone' durable."""

    def sync(self) -> None:
        pass

    # -- durability (a shared store acknowledges later; these stores are durable at once) -------------
    def write_error(self) -> str | None:
        """Why writes are refused right now (fenced, closed, backlog full), or None."""
        return None

    def visible_seq(self) -> int:
        """Every message up to this sequence is durable: consumers may see it."""
        return self.index.last_seq

    # whether a message durable means every one before it is durable too, and a failed one fails every later
    # one: a run of publishes may then wait once, for its last (zonebus.stream.stream)
    durable_in_order = False

    def ack_when_durable(self, seq: int, cb: Callable[[str | None], None]) -> bool:
        """Arrange `cb(None)` (or `cb(error text)`) once `seq` is durable; False (and no call) when it is already."""
        return False

    def close(self) -> None:
        pass

    def destroy(self) -> None:
        """Close and delete everything on disk."""
        self.close()

    # -- writes --------------------------------------------------------------------------------------
    def msg_size(self, subject: str, hdrs: bytes | None, data: bytes) -> int:
        # (the subject's length in bytes, as nats-server counts it and as a file store reads its record back)
        slen = len(subject) if subject.isascii() else len(subject.encode())
        return slen + (len(hdrs) if hdrs else 0) + len(data) + self.overhead

    def store(self, subject: str, hdrs: bytes | None, data: bytes, ts: int = 0, seq: int = 0) -> tuple[int, int]:
        """Append a message; returns (seq, ts). `seq`: its sequence when it must be a given one (a mirror's),
        after the last: the ones skipped become deleted slots."""
        if not ts:
            ts = now_ns()
        if ts < self._last_ts:
            ts = self._last_ts  # keep timestamps non-decreasing (wall clock steps back)
        self._last_ts = ts
        if seq <= self.index.last_seq:
            seq = self.index.last_seq + 1
        loc = self._write(seq, subject, hdrs, data, ts)
        self.index.add(seq, subject, self.msg_size(subject, hdrs, data), ts, loc)
        return seq, ts

    def store_run(self, subjects: list[str], datas: list[bytes]) -> int:
        """Append header-less messages (`subjects[i]`, `datas[i]`) in order, as `store` each; the last one's
        sequence (they have the sequences up to it)."""
        for subject, data in zip(subjects, datas, strict=True):
            self.store(subject, None, data)
        return self.index.last_seq

    def start_at(self, seq: int) -> None:
        """An empty, new store starts numbering at `seq` (a stream's `first_seq`)."""
        self._log_watermark(seq)
        self.index.skip_to(seq)

    def remove(self, seq: int) -> str | None:
        """Remove one message; returns its subject, or None when it was not stored."""
        was_first = seq == self.index.first_seq
        gone = self.index.remove(seq)
        if gone is None:
            return None
        subject, _size, loc = gone
        if was_first:
            self._log_watermark(self.index.first_seq)
        else:
            self._log_delete(seq)
        self._forget(seq, loc)
        return subject

    def purge(self, subject: str | None = None, seq: int = 0, keep: int = 0) -> list[tuple[int, str]]:
        """Remove messages (all, or matching `subject`), below `seq` when set, keeping the last `keep`.

        Returns the removed (seq, subject) pairs in sequence order.
        """
        idx = self.index
        filters = (subject,) if subject and subject != ">" else None
        if filters is None and not seq and not keep:
            removed = [(s, idx.subject_of(s) or "") for s in idx.live_seqs(idx.first_seq)]
            self._purge_all()
            return removed
        upper = seq if seq else idx.last_seq + 1
        if keep:
            total = idx.count(0, filters)
            if total <= keep:
                return []
            # the keep-th newest matching message bounds the purge from above
            cut = self._nth_newest(filters, keep)
            upper = min(upper, cut) if seq else cut
        removed = []
        s = idx.next_seq(idx.first_seq, filters)
        while s and s < upper:
            nxt = idx.next_seq(s + 1, filters)
            subj = self.remove(s)
            if subj is not None:
                removed.append((s, subj))
            s = nxt
        return removed

    def _nth_newest(self, filters: tuple[str, ...] | None, n: int) -> int:
        idx = self.index
        if filters is None:
            seqs = list(idx.live_seqs(idx.first_seq))
            return seqs[-n]
        seqs = sorted(
            s for sid in idx.matching_ids(filters) for s in idx.per_subject[sid].seqs[idx.per_subject[sid].head :]
        )
        return seqs[-n]

    def _purge_all(self) -> None:
        idx = self.index
        first = idx.last_seq + 1
        self._log_watermark(first)  # durable first, then forget the bodies
        for s in list(idx.live_seqs(idx.first_seq)):
            gone = idx.remove(s)
            if gone:
                self._forget(s, gone[2])
        idx.skip_to(first)

    # -- reads ---------------------------------------------------------------------------------------
    def load(self, seq: int) -> StoredMsg | None:
        meta = self.index.meta(seq)
        if meta is None:
            return None
        subject, size, ts, loc = meta
        body = self._read(seq, loc, size)
        if body is None:
            return None
        return StoredMsg(seq, subject, body[0], body[1], ts)

    def next_msg(self, start: int, filters: tuple[str, ...] | None) -> StoredMsg | None:
        seq = self.index.next_seq(start, filters)
        return self.load(seq) if seq else None

    def last_msg(self, filt: str) -> StoredMsg | None:
        filters = None if filt == ">" else (filt,)
        seq = self.index.last_seq_for(filters)
        return self.load(seq) if seq else None

    def next_matching(self, start: int, filt: str) -> StoredMsg | None:
        return self.next_msg(start, None if filt == ">" else (filt,))

    def count(self, start: int, filters: tuple[str, ...] | None) -> int:
        return self.index.count(start, filters)

    def subject_matches(self, seq: int, filters: tuple[str, ...] | None) -> bool:
        subj = self.index.subject_of(seq)
        if subj is None:
            return False
        return filters is None or any(matches(f, subj) for f in filters)

    def state(self) -> StoreState:
        idx = self.index
        span = idx.last_seq - idx.first_seq + 1 if idx.msgs else 0
        return StoreState(
            msgs=idx.msgs,
            bytes=idx.bytes,
            first_seq=idx.first_seq,
            first_ts=idx.first_ts(),
            last_seq=idx.last_seq,
            last_ts=idx.last_ts,
            num_subjects=idx.num_subjects,
            num_deleted=span - idx.msgs,
        )
