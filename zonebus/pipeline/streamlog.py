"""A stream read in place from a shared store: the plan (on Spark's driver) and the decoding (in the tasks).

No Spark here: `streams_source` wraps this in Spark's Python data source API. The layout (versions 1 and 2)
is `docs/shared-store-layout.md`; names, batch encoding and chain resolution come from
`zonebus.store.sharedlayout` and `SharedView` (listing, seals, base), so this module only decides which batch
objects a query needs and applies the log's rules to the records they hold.

Planning (`StreamLog.snapshot`): list and resolve the chain exactly as `SharedView` does, keep its *settled*
batches (a batch a pending takeover may still cut is never read), and summarise each batch object from its
first 79 bytes (the 48-byte batch header and the first record's header): `first_seq`, `last_seq`, record
count, and the time of its first message. Message sequences inside a batch are contiguous and end at
`last_seq`, so when the first record is the MSG `first_seq` and the record count is `last_seq - first_seq + 1`
the batch holds no DEL or MARK record (it is *clean*). Only the other batches are read whole on the driver,
to collect their removals. Summaries of immutable objects are kept for the next snapshot (streaming).

Applying the log without replaying it in one place: the MSG `s` at log position `p` (batch, record number) is
returned when `s` is above the last sequence seen before `p` (`last_before` of its batch, then tracked
through the batch's own records), when no MARK of the chain (nor the base) removes everything below a
sequence above `s` (`floor`: a MARK raises the last sequence to at least `seq - 1`, so a MARK can only
remove messages added before it), and when no DEL of `s` comes after `p`.

Pushdown: `seq` ranges skip batches by their header's sequence span; `time` ranges by the first message
times (timestamps are non-decreasing along the log: the store never writes one below the previous, which the
index's time lookups also rely on); subjects cannot skip objects in layout v1 (no per-object subject
summary) but are tested before a row is built. Every pushed predicate is applied exactly to each row.

Layout version 2: a batch object may hold link records (the zone router's leader stores where a message is
in a proxy's RouterChannel object instead of a second copy). A link record stands for its message in the
plan (same sequence and time); a task reads the batch's full form from the stream's packs or, before its
pack is written, from the channel objects (`zonebus.store.linklog.LinkResolver`), then decodes it as ever.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import pyarrow as pa

from zonebus.storage.fs import ObjectStore
from zonebus.store import sharedlayout as L
from zonebus.store.linklog import LinkResolver
from zonebus.store.shared import SharedStorage
from zonebus.store.sharedview import SharedView
from zonebus.subjects.patterns import matches

PREFIX_BYTES = L.BATCH_HDR_LEN + L.HDR_LEN  # a batch header and its first record's header
PARTITION_BYTES = 64 * 1024 * 1024  # at most this many object bytes per task (by default)
MIN_TASK_BYTES = 1024 * 1024  # a stream is not cut into tasks smaller than this to reach `min_tasks`
ROWS_PER_BATCH = 8192
SNAPSHOT_ATTEMPTS = 5
IO_THREADS = 8
NO_TS = -1
MAX_TS = math.inf

ARROW_SCHEMA = pa.schema([
    pa.field("stream", pa.string()),
    pa.field("seq", pa.int64()),
    pa.field("subject", pa.string()),
    pa.field("time", pa.timestamp("us", tz="UTC")),
    pa.field("headers", pa.map_(pa.string(), pa.list_(pa.string()))),
    pa.field("data", pa.binary()),
    pa.field("size", pa.int64()),
])
SPARK_SCHEMA = ("stream string, seq long, subject string, time timestamp, "
                "headers map<string,array<string>>, data binary, size long")


class StreamNotFound(L.LayoutError):
    """The store has no stream of that name."""


# -- what a query wants ------------------------------------------------------------------------------
@dataclass
class Predicate:
    """The AND of the filters a reader was given. Times are unix microseconds (Spark's precision)."""

    seq_lo: int = 0  # inclusive
    seq_hi: int = 2**63 - 1  # inclusive
    seqs: frozenset[int] | None = None
    ts_lo: int = -(2**63)  # inclusive, microseconds
    ts_hi: int = 2**63 - 1
    subjects: frozenset[str] | None = None  # exact subjects (EqualTo / In)
    prefixes: tuple[str, ...] = ()  # LIKE 'x%' (every one must hold)
    patterns: tuple[str, ...] = ()  # NATS filters from the `subjects` option (any one must match)

    def empty(self) -> bool:
        return (self.seq_lo > self.seq_hi or self.ts_lo > self.ts_hi or self.seqs == frozenset()
                or self.subjects == frozenset())

    def seq_span(self) -> tuple[int, int]:
        if self.seqs:
            return max(self.seq_lo, min(self.seqs)), min(self.seq_hi, max(self.seqs))
        return self.seq_lo, self.seq_hi

    def wants_subject(self, subject: str) -> bool:
        if self.subjects is not None and subject not in self.subjects:
            return False
        if self.prefixes and not all(subject.startswith(p) for p in self.prefixes):
            return False
        return not self.patterns or any(matches(p, subject) for p in self.patterns)

    def filters_subjects(self) -> bool:
        return self.subjects is not None or bool(self.prefixes) or bool(self.patterns)


# -- what the driver knows about one batch object ------------------------------------------------------
@dataclass(frozen=True, slots=True)
class BatchSummary:
    batch: int
    epoch: int
    size: int  # object bytes
    first_seq: int
    last_seq: int  # first_seq - 1: no message
    nrec: int
    first_ts: int  # time (ns) of the first message when the first record is one (the batch's earliest), else NO_TS
    removals: tuple[tuple[int, int, int, int], ...] | None  # (record number, kind, seq, aux) of DEL/MARK; None: clean
    max_ts: int = NO_TS  # exact latest message time, known only for batches read whole

    @property
    def clean(self) -> bool:
        return self.removals is None

    def raised_last(self) -> int:
        """The highest last-sequence this batch's records can set (MSG sequences, MARK `aux` and `seq - 1`)."""
        top = self.last_seq if self.last_seq >= self.first_seq else 0
        for _n, kind, seq, aux in self.removals or ():
            if kind == L.MARK:
                top = max(top, aux, seq - 1)
        return top


def _is_clean(head: L.BatchHeader, prefix: bytes) -> tuple[bool, int]:
    """(no DEL/MARK record in the batch, time of its first message or NO_TS) from its first PREFIX_BYTES."""
    if head.nrec == 0:
        return True, NO_TS
    if len(prefix) < PREFIX_BYTES:
        return False, NO_TS
    _total, kind, seq, ts, _s, _h, _d = L.record_header(prefix, L.BATCH_HDR_LEN)
    if kind not in (L.MSG, L.LINK):
        return False, NO_TS
    return seq == head.first_seq and head.nrec == head.last_seq - head.first_seq + 1, ts


def summarize_prefix(batch: int, epoch: int, size: int, prefix: bytes) -> BatchSummary | None:
    """The summary of a clean batch from its prefix; None when the batch must be read whole."""
    head = L.read_header(prefix)
    _check_names(head, batch, epoch)
    clean, first_ts = _is_clean(head, prefix)
    if not clean:
        return None
    return BatchSummary(batch, epoch, size, head.first_seq, head.last_seq, head.nrec, first_ts, None)


def summarize_whole(batch: int, epoch: int, data: bytes) -> BatchSummary:
    """The summary of a batch read whole: its removal records, exact first and last message times."""
    head = L.read_header(data)
    _check_names(head, batch, epoch)
    removals = []
    first_ts = max_ts = NO_TS
    for n, (_off, kind, seq, ts, _s, _h, _d) in enumerate(L.iter_records(data)):
        if kind in (L.MSG, L.LINK):  # (a link record stands for a message: layout version 2)
            if first_ts == NO_TS:
                first_ts = ts
            max_ts = max(max_ts, ts)
        else:
            removals.append((n, kind, seq, ts))
    return BatchSummary(batch, epoch, len(data), head.first_seq, head.last_seq, head.nrec, first_ts,
                        tuple(removals), max_ts)


def _check_names(head: L.BatchHeader, batch: int, epoch: int) -> None:
    if head.batch != batch or head.epoch != epoch:
        raise L.LayoutError(f"object {L.batch_name(batch, epoch)} holds batch {head.batch} of epoch {head.epoch}")


# -- the plan --------------------------------------------------------------------------------------------
@dataclass
class Task:
    """One Spark partition: consecutive batch objects and what is needed to apply the log to them alone."""

    url: str
    endpoint: str
    region: str
    stream: str
    batches: list[tuple[int, int, int, bool]]  # (batch, epoch, last sequence before it, clean)
    floor: int  # every message below this is removed (MARKs and the base)
    dels: dict[int, tuple[int, int]]  # seq -> (batch, record number) of its last DEL, for seqs in this task
    pred: Predicate
    size: int = 0


@dataclass
class Snapshot:
    """The settled chain at one moment, summarised."""

    batches: list[BatchSummary]
    last_before: list[int]  # the last sequence before each batch
    floor: int
    dels: dict[int, tuple[int, int]]
    next_seq: int  # the stream's next sequence (last sequence + 1) after the settled chain
    ts_lo: list[float] = field(default_factory=list)  # per batch: a lower bound of its message times (ns)
    ts_hi: list[float] = field(default_factory=list)  # ... and an upper bound

    def first_seq(self) -> int:
        """The lowest sequence that can still be live."""
        return max(self.floor, 1)

    def seq_at_time(self, ts_ns: int) -> int:
        """A sequence at or below the first message at or after `ts_ns` (for `startingTime`)."""
        for i, b in enumerate(self.batches):
            if self.ts_hi[i] >= ts_ns and b.last_seq >= b.first_seq:
                return max(b.first_seq, self.first_seq())
        return self.next_seq


def _bounds(batches: list[BatchSummary]) -> tuple[list[float], list[float]]:
    """Per batch, bounds of its message times from the first message times (non-decreasing along the log)."""
    lo: list[float] = []
    floor = -MAX_TS
    for b in batches:
        if b.first_ts != NO_TS:
            floor = max(floor, b.first_ts)
        lo.append(floor)
    hi: list[float] = [MAX_TS] * len(batches)
    ceiling = MAX_TS
    for i in range(len(batches) - 1, -1, -1):
        b = batches[i]
        hi[i] = b.max_ts if b.max_ts != NO_TS else ceiling
        if b.first_ts != NO_TS:
            ceiling = min(ceiling, b.first_ts)
    return lo, hi


class StreamLog:
    """One stream on a shared store, opened read-only. Blocking I/O; used on Spark's driver."""

    def __init__(self, url: str, stream: str, endpoint: str = "", region: str = "") -> None:
        self.url, self.stream, self.endpoint, self.region = url, stream, endpoint, region
        storage = SharedStorage(url, endpoint=endpoint, region=region, create=False)  # refuses unknown layouts
        self.objects: ObjectStore = storage.objects
        self.view = SharedView(self.objects, stream, load=False)
        self._summaries: dict[tuple[int, int], BatchSummary] = {}
        if self.view.config() is None and not self.objects.list(f"{self.view.prefix}/log"):
            names = ", ".join(storage.list_streams()) or "none"
            raise StreamNotFound(f"{url}: no stream {stream!r} on this shared store (streams: {names})")

    def _key(self, batch: int, epoch: int) -> str:
        return f"{self.view.prefix}/log/{L.batch_name(batch, epoch)}"

    def _summarize(self, be: tuple[int, int]) -> BatchSummary:
        batch, epoch = be
        prefix, size = self.objects.get_range(self._key(batch, epoch), 0, PREFIX_BYTES)
        summary = summarize_prefix(batch, epoch, size, prefix)
        if summary is None:
            summary = summarize_whole(batch, epoch, self.objects.get(self._key(batch, epoch)))
        return summary

    def snapshot(self) -> Snapshot:
        """Resolve the chain now and summarise its settled batches (listing again when objects vanish)."""
        for attempt in range(SNAPSHOT_ATTEMPTS):
            try:
                return self._snapshot()
            except FileNotFoundError:
                if attempt == SNAPSHOT_ATTEMPTS - 1:
                    raise
        raise AssertionError("unreachable")

    def _snapshot(self) -> Snapshot:
        _lst, chain, base = self.view.resolve()
        settled = chain.batches[: chain.settled]
        todo = [be for be in settled if be not in self._summaries]
        if todo:
            with ThreadPoolExecutor(min(IO_THREADS, len(todo)), thread_name_prefix="zb-spark-plan") as pool:
                for be, summary in zip(todo, pool.map(self._summarize, todo), strict=True):
                    self._summaries[be] = summary
        keep = set(settled)
        self._summaries = {be: s for be, s in self._summaries.items() if be in keep}
        batches = [self._summaries[be] for be in settled]
        last = base.next_seq - 1 if base else 0
        floor = base.next_seq if base else 0
        last_before: list[int] = []
        dels: dict[int, tuple[int, int]] = {}
        for b in batches:
            last_before.append(last)
            last = max(last, b.raised_last())
            for n, kind, seq, _aux in b.removals or ():
                if kind == L.MARK:
                    floor = max(floor, seq)
                else:
                    dels[seq] = (b.batch, n)
        lo, hi = _bounds(batches)
        return Snapshot(batches, last_before, floor, dels, last + 1, lo, hi)

    # -- planning ------------------------------------------------------------------------------------
    def plan(self, snap: Snapshot, pred: Predicate, partition_bytes: int = PARTITION_BYTES,
             min_tasks: int = 1) -> list[Task]:
        """Tasks over the runs of batches that may hold a message `pred` wants: at most about
        `partition_bytes` each, and a multiple of `min_tasks` of them (the cores) when the stream is large
        enough, so that every core gets about the same share."""
        if pred.empty():
            return []
        lo, hi = pred.seq_span()
        lo = max(lo, snap.floor)
        wanted = [i for i, b in enumerate(snap.batches)
                  if not (b.last_seq < b.first_seq or b.last_seq < lo or b.first_seq > hi
                          or snap.ts_hi[i] < pred.ts_lo * 1000 or snap.ts_lo[i] > pred.ts_hi * 1000 + 999)]
        total = sum(snap.batches[i].size for i in wanted)
        n = max(-(-total // max(partition_bytes, 1)), min(min_tasks, total // MIN_TASK_BYTES), 1)
        if min_tasks > 1 and n > min_tasks:
            n = -(-n // min_tasks) * min_tasks
        target = total / n
        tasks: list[Task] = []
        cur: Task | None = None
        prev = -1
        for i in wanted:
            b = snap.batches[i]
            if cur is None or prev != i - 1 or cur.size >= target:
                cur = Task(self.url, self.endpoint, self.region, self.stream, [], snap.floor, {}, pred)
                tasks.append(cur)
            cur.batches.append((b.batch, b.epoch, snap.last_before[i], b.clean))
            cur.size += b.size
            prev = i
        if snap.dels:
            by_num = {b.batch: b for b in snap.batches}
            for t in tasks:
                first, last = by_num[t.batches[0][0]].first_seq, by_num[t.batches[-1][0]].last_seq
                t.dels = {s: p for s, p in snap.dels.items() if first <= s <= last}
        return tasks


# -- reading (in the tasks) ----------------------------------------------------------------------------
def parse_headers(raw: bytes) -> list[tuple[str, list[str]]]:
    """A NATS header block (`NATS/1.0\\r\\nKey: value\\r\\n...\\r\\n\\r\\n`) as (key, values) pairs in order."""
    out: dict[str, list[str]] = {}
    for line in raw.decode("utf-8", "replace").split("\r\n")[1:]:
        key, sep, value = line.partition(":")
        if sep and key:
            out.setdefault(key.strip(), []).append(value.strip())
    return list(out.items())


def _fetch(objects: ObjectStore, prefix: str, batch: int, epoch: int, links: LinkResolver) -> bytes | None:
    """A batch object's version-1 bytes (link records resolved: layout version 2); None when a base move deleted
    it since the plan (then it held no live message)."""
    try:
        return links.resolve(batch, epoch, objects.get(f"{prefix}/log/{L.batch_name(batch, epoch)}"))
    except FileNotFoundError:
        for name in objects.list(f"{prefix}/base"):
            p = L.parse_pair(name, ".json")
            if p is not None and p[0] > batch:
                return None
        raise L.LayoutError(f"{prefix}: batch object {L.batch_name(batch, epoch)} is missing")


def read_task(task: Task, rows_per_batch: int = ROWS_PER_BATCH) -> Iterator[pa.RecordBatch]:
    """The live messages of the task's batches that its predicate wants, as Arrow record batches.

    A message is live when its sequence is above every sequence before it in the log (and above the floor of
    every MARK), is not deleted by a later DEL of this task's plan, and is not below the stream's floor. Each
    object is decoded as arrays (`batchdecode`)."""
    from zonebus.pipeline.batchdecode import decode

    objects = ObjectStore.from_url(task.url, task.endpoint, task.region)
    prefix = L.stream_prefix(task.stream)
    links = LinkResolver(objects.get, objects.list, prefix)
    pred = task.pred
    subject_ok: dict[str, bool] = {}

    def wants(subject: str) -> bool:
        ok = subject_ok.get(subject)
        if ok is None:
            ok = subject_ok[subject] = pred.wants_subject(subject)
        return ok

    for batch, epoch, last, clean in task.batches:
        data = _fetch(objects, prefix, batch, epoch, links)
        if data is None:
            continue
        _check_names(L.read_header(data), batch, epoch)
        rb = decode(data, batch, last, clean, task.stream, seq_lo=max(pred.seq_lo, task.floor), seq_hi=pred.seq_hi,
                    seqs=pred.seqs, ts_lo=pred.ts_lo, ts_hi=pred.ts_hi, dels=task.dels,
                    wants_subject=wants if pred.filters_subjects() else None, overhead=SharedView.overhead,
                    parse_headers=parse_headers, schema=ARROW_SCHEMA)
        if rb is None:
            continue
        for at in range(0, rb.num_rows, rows_per_batch):
            yield rb.slice(at, rows_per_batch)
