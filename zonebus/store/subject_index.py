"""The in-memory index both stores keep: per-sequence metadata and per-subject sequence lists.

`MsgIndex` answers "next message at or after sequence S whose subject matches any of these filters" by
bisecting the sorted sequence list of each matching subject (so a sparse filter never scans the stream),
and keeps counts (messages, bytes, subjects) without touching message bodies. Per-sequence data lives in
parallel `array`s indexed by `seq - base`, about 28 bytes per message.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left
from collections.abc import Iterator

from zonebus.subjects.patterns import has_wildcards, matches

DELETED = -1
_SCAN_SUBJECT_LIMIT = 64  # above this many matching subjects, walk sequences instead of merging lists
_FILTER_CACHE_MAX = 512


class SeqList:
    """Sorted stream sequences of one subject; removals at the front are O(1)."""

    __slots__ = ("seqs", "head")

    def __init__(self) -> None:
        self.seqs = array("q")
        self.head = 0

    def __len__(self) -> int:
        return len(self.seqs) - self.head

    def append(self, seq: int) -> None:
        self.seqs.append(seq)

    def remove(self, seq: int) -> bool:
        seqs = self.seqs
        i = bisect_left(seqs, seq, self.head)
        if i >= len(seqs) or seqs[i] != seq:
            return False
        if i == self.head:
            self.head += 1
            if self.head > 1024 and self.head * 2 > len(seqs):
                del seqs[: self.head]
                self.head = 0
        else:
            del seqs[i]
        return True

    def first_at_or_after(self, seq: int) -> int:
        """The first sequence >= seq, or 0."""
        seqs = self.seqs
        i = bisect_left(seqs, seq, self.head)
        return seqs[i] if i < len(seqs) else 0

    def count_at_or_after(self, seq: int) -> int:
        return len(self.seqs) - bisect_left(self.seqs, seq, self.head)

    def last(self) -> int:
        return self.seqs[-1] if len(self.seqs) > self.head else 0

    def first(self) -> int:
        return self.seqs[self.head] if len(self.seqs) > self.head else 0

    def clear(self) -> None:
        self.seqs = array("q")
        self.head = 0


class MsgIndex:
    """Sequence -> (subject, size, timestamp, location) and subject -> sequences for one stream."""

    def __init__(self) -> None:
        self.base = 1  # sequence stored in slot 0
        self.sids = array("i")
        self.sizes = array("q")
        self.tss = array("q")
        self.locs = array("q")
        self.subjects: list[str] = []
        self.subject_ids: dict[str, int] = {}
        self.per_subject: list[SeqList] = []
        self.msgs = 0
        self.bytes = 0
        self.first_seq = 1  # first live sequence, or last_seq + 1 when empty
        self.last_seq = 0
        self.last_ts = 0
        self.num_subjects = 0
        self._filter_cache: dict[tuple[str, ...], list[int]] = {}

    # -- mutation ------------------------------------------------------------------------------------
    def add(self, seq: int, subject: str, size: int, ts: int, loc: int) -> None:
        """Record message `seq` (must be > last_seq; gaps become deleted slots)."""
        self._append_at(seq)
        sid = self.subject_ids.get(subject)
        if sid is None:
            sid = self._new_subject(subject)
        seqs = self.per_subject[sid]
        if not len(seqs):
            self.num_subjects += 1
        seqs.append(seq)
        self.sids.append(sid)
        self.sizes.append(size)
        self.tss.append(ts)
        self.locs.append(loc)
        if self.msgs == 0:
            self.first_seq = seq
        self.msgs += 1
        self.bytes += size
        self.last_seq = seq
        self.last_ts = ts

    def add_run(self, first: int, subjects: list[str], sizes: list[int], ts: int, locs: list[int]) -> None:
        """`add` for messages `first`, `first` + 1, ... stored at one time `ts` (the lists are theirs, in order)."""
        if not subjects:
            return
        self._append_at(first)
        ids, per, sids = self.subject_ids, self.per_subject, self.sids
        seq = first
        for subject in subjects:
            sid = ids.get(subject)
            if sid is None:
                sid = self._new_subject(subject)
            seqs = per[sid]
            if len(seqs.seqs) == seqs.head:
                self.num_subjects += 1
            seqs.seqs.append(seq)
            sids.append(sid)
            seq += 1
        self.sizes.extend(sizes)
        self.tss.extend(array("q", (ts,)) * len(subjects))
        self.locs.extend(locs)
        if self.msgs == 0:
            self.first_seq = first
        self.msgs += len(subjects)
        self.bytes += sum(sizes)
        self.last_seq = seq - 1
        self.last_ts = ts

    def _append_at(self, seq: int) -> None:
        """Make slot `seq` the next one: it must come after the last; sequences skipped become deleted slots."""
        if seq <= self.last_seq:
            raise ValueError(f"sequence {seq} not after last {self.last_seq}")
        if self.msgs == 0 and not self.sids:
            self.base = seq
            self.first_seq = seq
        gap = seq - (self.base + len(self.sids))
        if gap > 0:
            self._extend_deleted(gap)

    def add_bulk(self, base_seq: int, sids: array, sizes: array, tss: array, locs: array) -> int:
        """Record slots base_seq, base_seq + 1, ... at once (sid -1 = a removed message); returns live count.

        `sids` must already be ids of this index (see `subject_id`). Used by recovery from segment indexes.
        """
        n = len(sids)
        if not n:
            return 0
        self._append_at(base_seq)
        was_empty = self.msgs == 0
        per = self.per_subject
        live = 0
        nbytes = 0
        first_live = 0
        for i, sid in enumerate(sids):
            if sid < 0:
                continue
            seqs = per[sid]
            if not len(seqs):
                self.num_subjects += 1
            seq = base_seq + i
            seqs.seqs.append(seq)
            if not first_live:
                first_live = seq
            live += 1
            nbytes += sizes[i]
        self.sids.extend(sids)
        self.sizes.extend(sizes)
        self.tss.extend(tss)
        self.locs.extend(locs)
        self.msgs += live
        self.bytes += nbytes
        self.last_seq = base_seq + n - 1
        self.last_ts = max(self.last_ts, tss[-1])
        if was_empty:
            self.first_seq = first_live or self.last_seq + 1
        return live

    def subject_id(self, subject: str) -> int:
        sid = self.subject_ids.get(subject)
        return sid if sid is not None else self._new_subject(subject)

    def skip_to(self, seq: int, last: int = 0) -> None:
        """Every sequence below `seq` is gone and the last sequence is at least max(last, seq - 1)."""
        while self.msgs and self.first_seq < seq:
            self.remove(self.first_seq)
        self.last_seq = max(self.last_seq, last, seq - 1)
        if self.msgs == 0:
            self.sids = array("i")
            self.sizes = array("q")
            self.tss = array("q")
            self.locs = array("q")
            self.base = self.last_seq + 1
            self.first_seq = self.last_seq + 1

    def _extend_deleted(self, n: int) -> None:
        self.sids.extend(array("i", [DELETED]) * n)
        zeros = array("q", [0]) * n
        self.sizes.extend(zeros)
        self.tss.extend(array("q", [self.last_ts]) * n)  # keeps timestamps sorted for seq_at_time
        self.locs.extend(zeros)

    def _new_subject(self, subject: str) -> int:
        sid = len(self.subjects)
        self.subjects.append(subject)
        self.subject_ids[subject] = sid
        self.per_subject.append(SeqList())
        for filters, ids in self._filter_cache.items():
            if any(matches(f, subject) for f in filters):
                ids.append(sid)
        return sid

    def remove(self, seq: int) -> tuple[str, int, int] | None:
        """Forget `seq`; returns (subject, size, loc) or None when it was not there."""
        i = seq - self.base
        if i < 0 or i >= len(self.sids):
            return None
        sid = self.sids[i]
        if sid == DELETED:
            return None
        self.sids[i] = DELETED
        size = self.sizes[i]
        loc = self.locs[i]
        seqs = self.per_subject[sid]
        seqs.remove(seq)
        if not len(seqs):
            self.num_subjects -= 1
        self.msgs -= 1
        self.bytes -= size
        if seq == self.first_seq:
            self._advance_first()
        return self.subjects[sid], size, loc

    def _advance_first(self) -> None:
        if self.msgs == 0:
            self.first_seq = self.last_seq + 1
            self.sids = array("i")
            self.sizes = array("q")
            self.tss = array("q")
            self.locs = array("q")
            self.base = self.first_seq
            return
        sids = self.sids
        i = self.first_seq - self.base
        n = len(sids)
        while i < n and sids[i] == DELETED:
            i += 1
        self.first_seq = self.base + i
        if i > 4096 and i * 2 > n:
            del self.sids[:i]
            del self.sizes[:i]
            del self.tss[:i]
            del self.locs[:i]
            self.base += i

    # -- lookup --------------------------------------------------------------------------------------
    def has(self, seq: int) -> bool:
        i = seq - self.base
        return 0 <= i < len(self.sids) and self.sids[i] != DELETED

    def meta(self, seq: int) -> tuple[str, int, int, int] | None:
        """(subject, size, ts, loc) of a live sequence."""
        i = seq - self.base
        if i < 0 or i >= len(self.sids):
            return None
        sid = self.sids[i]
        if sid == DELETED:
            return None
        return self.subjects[sid], self.sizes[i], self.tss[i], self.locs[i]

    def subject_of(self, seq: int) -> str | None:
        i = seq - self.base
        if i < 0 or i >= len(self.sids) or self.sids[i] == DELETED:
            return None
        return self.subjects[self.sids[i]]

    def subjects_of(self, first: int, last: int) -> list[str | None]:
        """`subject_of` for each of `first`..`last`."""
        i0, i1 = first - self.base, last + 1 - self.base
        lo, hi = max(i0, 0), max(min(i1, len(self.sids)), 0)
        subjects = self.subjects
        out: list[str | None] = [None] * (min(lo, i1) - i0)
        out += [subjects[s] if s != DELETED else None for s in self.sids[lo:hi]]
        out += [None] * (i1 - max(hi, i0))
        return out

    def first_ts(self) -> int:
        return self.tss[self.first_seq - self.base] if self.msgs else 0

    def live_seqs(self, start: int = 0) -> Iterator[int]:
        sids = self.sids
        base = self.base
        for i in range(max(0, start - base), len(sids)):
            if sids[i] != DELETED:
                yield base + i

    def matching_ids(self, filters: tuple[str, ...]) -> list[int]:
        """Subject ids matching any filter (cached; kept current as new subjects appear)."""
        ids = self._filter_cache.get(filters)
        if ids is not None:
            return ids
        if not any(has_wildcards(f) for f in filters):
            ids = [self.subject_ids[f] for f in filters if f in self.subject_ids]
        else:
            ids = [sid for sid, subj in enumerate(self.subjects) if any(matches(f, subj) for f in filters)]
        if len(self._filter_cache) >= _FILTER_CACHE_MAX:
            self._filter_cache.clear()
        self._filter_cache[filters] = ids
        return ids

    def next_seq(self, start: int, filters: tuple[str, ...] | None) -> int:
        """The lowest live sequence >= start matching any filter (all when None), or 0."""
        start = max(start, self.first_seq)
        if start > self.last_seq:
            return 0
        if filters is None:
            return self._scan_live(start, None)
        ids = self.matching_ids(filters)
        if not ids:
            return 0
        if len(ids) > _SCAN_SUBJECT_LIMIT:
            return self._scan_live(start, set(ids))
        best = 0
        for sid in ids:
            seq = self.per_subject[sid].first_at_or_after(start)
            if seq and (best == 0 or seq < best):
                best = seq
                if best == start:
                    break
        return best

    def _scan_live(self, start: int, want: set[int] | None) -> int:
        sids = self.sids
        base = self.base
        n = len(sids)
        i = start - base
        if want is None:
            while i < n:
                if sids[i] != DELETED:
                    return base + i
                i += 1
            return 0
        while i < n:
            if sids[i] in want:
                return base + i
            i += 1
        return 0

    def count(self, start: int, filters: tuple[str, ...] | None) -> int:
        """Number of live messages with sequence >= start matching any filter."""
        start = max(start, self.first_seq)
        if start > self.last_seq:
            return 0
        if filters is None:
            if start == self.first_seq:
                return self.msgs
            i = start - self.base
            tail = self.sids[i:]
            return len(tail) - tail.count(DELETED)
        return sum(self.per_subject[sid].count_at_or_after(start) for sid in self.matching_ids(filters))

    def last_seq_for(self, filters: tuple[str, ...] | None) -> int:
        """The highest live sequence matching any filter, or 0."""
        if filters is None:
            return self.last_seq if self.msgs else 0
        return max((self.per_subject[sid].last() for sid in self.matching_ids(filters)), default=0)

    def last_per_subject(self, filters: tuple[str, ...] | None) -> list[int]:
        """Sorted last sequences of every subject matching the filters."""
        ids = range(len(self.subjects)) if filters is None else self.matching_ids(filters)
        return sorted(s for s in (self.per_subject[sid].last() for sid in ids) if s)

    def subject_seqs(self, subject: str) -> SeqList | None:
        sid = self.subject_ids.get(subject)
        return self.per_subject[sid] if sid is not None else None

    def seq_at_time(self, ts: int) -> int:
        """The first live sequence whose timestamp is >= ts (timestamps are non-decreasing), or 0."""
        lo = self.first_seq - self.base
        hi = len(self.tss)
        tss = self.tss
        while lo < hi:
            mid = (lo + hi) // 2
            if tss[mid] < ts:
                lo = mid + 1
            else:
                hi = mid
        seq = self.base + lo
        return self.next_seq(seq, None) if seq <= self.last_seq else 0

    def subject_counts(self, filt: str | None = None) -> dict[str, int]:
        out = {}
        for sid, subj in enumerate(self.subjects):
            n = len(self.per_subject[sid])
            if n and (filt is None or matches(filt, subj)):
                out[subj] = n
        return out
