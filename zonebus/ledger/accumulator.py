"""The in-server traffic ledger: aggregates per-interval counts and writes them as Parquet.

The server keeps hot-path counts in plain dicts (full subject -> [msgs, bytes]) and hands them over once
per interval per connection and direction (`record_traffic`), once per interval for queue routing
decisions (`record_decisions`), once for durable queue group hops (`record_durable`) and once for the
requests the process made to shared storage (`record_storage`, from `zonebus.storage.meter`). This object reduces
subjects to their first N tokens, merges rows with the same key, and `flush` writes everything recorded so
far as atomic Parquet files (see `writer`).

Memory is bounded: the subject -> prefix cache is cleared when it reaches `PREFIX_CACHE_MAX` entries, and
once `MAX_ROWS` distinct rows of one kind are held, new subject prefixes of that kind are folded into the
prefix `>` ("everything else") until the next flush. Reply subjects (`_INBOX.…`, `_R_.…`) are counted under
`_INBOX` / `_R_` so per-request inboxes don't make one row each.

`start(loop)` runs a background task that flushes shortly after every interval boundary (wall clock,
aligned to multiples of `interval`, see `window_start_for`) in a worker thread, so Parquet writing stays
off the event loop; `close()` stops it and writes what is left. A crash loses at most what was handed over
since the last flush: the open interval.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import math
import threading
import time
from typing import Any

import pyarrow as pa

from zonebus.ledger import schema as S
from zonebus.ledger.writer import LedgerWriter
from zonebus.options import LedgerOptions

log = logging.getLogger("zonebus.ledger")

PREFIX_CACHE_MAX = 65_536
MAX_ROWS = 200_000
OVERFLOW_PREFIX = ">"
REPLY_PREFIXES = ((b"_INBOX.", "_INBOX"), (b"_R_.", "_R_"))

TrafficBase = tuple[float, str, str, str, bool, str, str]  # window, link, peer, peer zone, known, dir, account
DecisionKey = tuple[float, str, str, str, str, int, int]  # window, prefix, queue, pub zone, chosen, w_in, w_out
DurableKey = tuple[float, str, str, str, str, str]  # window, prefix, queue, hop, src zone, dst zone
StorageKey = tuple[float, str, str, str]  # window, store, request kind, purpose


def window_start_for(now: float, interval: float) -> float:
    """Start of the counting window holding `now`: windows are aligned to multiples of `interval`."""
    return math.floor(now / interval) * interval


class LedgerAccumulator:
    """Per-server ledger: counts handed over per interval, flushed as Parquet."""

    def __init__(
        self, opts: LedgerOptions, server_name: str, server_zone: str, server_zone_known: bool
    ) -> None:
        if opts.interval <= 0:
            raise ValueError(f"ledger interval must be > 0, got {opts.interval}")
        if not opts.dir:
            raise ValueError("ledger dir is not set")
        self.opts = opts
        self.server_name = server_name
        self.server_zone = server_zone
        self.server_zone_known = server_zone_known
        self.tokens = max(1, int(opts.subject_tokens))
        self.writer = LedgerWriter(opts.dir, server_name)
        self._prefixes: dict[bytes, str] = {}
        self._traffic: dict[TrafficBase, dict[str, list[int]]] = {}
        self._traffic_rows = 0
        self._decisions: dict[DecisionKey, list[int]] = {}
        self._durable: dict[DurableKey, list[int]] = {}
        self._storage: dict[StorageKey, list[int]] = {}
        self._lock = threading.Lock()  # guards the pending dicts (event loop vs flush thread)
        self._flush_lock = threading.Lock()  # one flush at a time
        self._task: asyncio.Task[None] | None = None
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        # Counters, for monitoring and tests.
        self.files_written = 0
        self.rows_written = 0
        self.rows_folded = 0
        self.write_errors = 0

    # -- handing over counts (event loop) -------------------------------------------------------------

    def subject_prefix(self, subject: bytes) -> str:
        """The first `subject_tokens` tokens of `subject` (cached, bounded)."""
        prefix = self._prefixes.get(subject)
        if prefix is not None:
            return prefix
        for start, name in REPLY_PREFIXES:
            if subject.startswith(start):
                return name  # not cached: these subjects are mostly unique
        parts = subject.split(b".", self.tokens)
        if len(parts) > self.tokens:
            parts = parts[: self.tokens]
        prefix = b".".join(parts).decode("utf-8", "replace")
        if len(self._prefixes) >= PREFIX_CACHE_MAX:
            self._prefixes.clear()
        self._prefixes[subject] = prefix
        return prefix

    def record_traffic(
        self,
        window_start: float,
        link_kind: str,
        peer: str,
        peer_zone: str,
        peer_zone_known: bool,
        direction: str,
        account: str,
        counts: dict[bytes, list[int]],
    ) -> None:
        """Add one connection's counts for one window and direction: full subject -> [msgs, bytes]."""
        if not counts:
            return
        base: TrafficBase = (
            float(window_start), link_kind, peer, peer_zone, bool(peer_zone_known), direction, account
        )
        prefix_of = self.subject_prefix
        with self._lock:
            rows = self._traffic.get(base)
            if rows is None:
                rows = self._traffic[base] = {}
            for subject, (msgs, nbytes) in counts.items():
                prefix = prefix_of(subject)
                row = rows.get(prefix)
                if row is None:
                    if self._traffic_rows >= MAX_ROWS:
                        prefix = OVERFLOW_PREFIX
                        self.rows_folded += 1
                        row = rows.get(prefix)
                    if row is None:
                        row = rows[prefix] = [0, 0]
                        self._traffic_rows += 1
                row[0] += msgs
                row[1] += nbytes

    def record_decisions(
        self, window_start: float, counts: dict[tuple[bytes, bytes, str, str, int, int], list[int]]
    ) -> None:
        """Add one window's queue routing decisions.

        key: (subject, queue, publisher_zone, chosen_zone, weight_in_publisher_zone, weight_outside);
        value: [msgs, bytes].
        """
        if not counts:
            return
        window = float(window_start)
        prefix_of = self.subject_prefix
        with self._lock:
            pending = self._decisions
            for (subject, queue, pub_zone, chosen, w_in, w_out), (msgs, nbytes) in counts.items():
                prefix = prefix_of(subject)
                qname = queue.decode("utf-8", "replace") if isinstance(queue, bytes) else str(queue)
                rest = (qname, pub_zone, chosen, int(w_in), int(w_out))
                self._add_row(pending, (window, prefix, *rest), (window, OVERFLOW_PREFIX, *rest), msgs, nbytes)

    def record_durable(self, window_start: float, counts: dict[tuple[bytes, str, str, str, str], list[int]]) -> None:
        """Add one window's durable queue group hops: (subject, queue, hop, src zone, dst zone) -> [msgs, bytes]."""
        if not counts:
            return
        window = float(window_start)
        with self._lock:
            pending = self._durable
            for (subject, queue, hop, src, dst), (msgs, nbytes) in counts.items():
                prefix = self.subject_prefix(subject)
                self._add_row(pending, (window, prefix, queue, hop, src, dst),
                              (window, OVERFLOW_PREFIX, queue, hop, src, dst), msgs, nbytes)

    def record_storage(self, window_start: float, counts: dict[tuple[str, str, str], tuple[int, int]]) -> None:
        """Add one window's storage requests: (store, kind, purpose) -> (requests, bytes), as
        `RequestMeter.take` returns them. Never folded: the keys are few (stores x kinds x purposes)."""
        if not counts:
            return
        window = float(window_start)
        with self._lock:
            for (store, kind, purpose), (requests, nbytes) in counts.items():
                row = self._storage.setdefault((window, store, kind, purpose), [0, 0])
                row[0] += int(requests)
                row[1] += int(nbytes)

    def _add_row(self, pending: dict, key: tuple, folded: tuple, msgs: int, nbytes: int) -> None:
        """Add to the row `key` of a keyed table (decisions, durable queue); a new key past MAX_ROWS goes to
        the `folded` row (the overflow subject prefix) instead. The caller holds the lock."""
        row = pending.get(key)
        if row is None:
            if len(pending) >= MAX_ROWS:
                self.rows_folded += 1
                key = folded
                row = pending.get(key)
            if row is None:
                row = pending[key] = [0, 0]
        row[0] += msgs
        row[1] += nbytes

    # -- writing (worker thread) ----------------------------------------------------------------------

    def flush(self) -> None:
        """Write everything recorded so far as Parquet (atomically) and clear it from memory."""
        with self._flush_lock:
            with self._lock:
                traffic, self._traffic, self._traffic_rows = self._traffic, {}, 0
                decisions, self._decisions = self._decisions, {}
                durable, self._durable = self._durable, {}
                storage, self._storage = self._storage, {}
            for kind, table in ((S.TRAFFIC, self._traffic_table(traffic)),
                                (S.DECISIONS, self._keyed_table(decisions, S.DECISIONS_SCHEMA)),
                                (S.DURABLE_QUEUE, self._keyed_table(durable, S.DURABLE_QUEUE_SCHEMA)),
                                (S.STORAGE, self._keyed_table(storage, S.STORAGE_SCHEMA))):
                if table.num_rows == 0:
                    continue
                try:
                    files = self.writer.write(kind, table)
                except Exception:
                    # Bounded memory: the batch is dropped, not kept for a retry that may fail again.
                    self.write_errors += 1
                    log.exception("ledger: could not write %d %s rows", table.num_rows, kind)
                    continue
                self.files_written += len(files)
                self.rows_written += table.num_rows

    def _common(self, windows: list[float]) -> dict[str, Any]:
        n = len(windows)
        return {
            S.WINDOW_START: pa.array([round(w * 1_000_000) for w in windows], pa.int64()).cast(S.TIMESTAMP),
            S.INTERVAL_S: pa.array([float(self.opts.interval)] * n, pa.float64()),
            S.SERVER: pa.array([self.server_name] * n, pa.string()),
            S.SERVER_ZONE: pa.array([self.server_zone] * n, pa.string()),
            S.SERVER_ZONE_KNOWN: pa.array([bool(self.server_zone_known)] * n, pa.bool_()),
        }

    def _traffic_table(self, traffic: dict[TrafficBase, dict[str, list[int]]]) -> pa.Table:
        cols: list[list[Any]] = [[] for _ in range(10)]
        for base, rows in traffic.items():
            for prefix, (msgs, nbytes) in rows.items():
                for i, value in enumerate(base):
                    cols[i].append(value)
                cols[7].append(prefix)
                cols[8].append(msgs)
                cols[9].append(nbytes)
        data = self._common(cols[0])
        names = (S.LINK_KIND, S.PEER, S.PEER_ZONE, S.PEER_ZONE_KNOWN, S.DIRECTION, S.ACCOUNT,
                 S.SUBJECT_PREFIX, S.MSGS, S.BYTES)
        for name, values in zip(names, cols[1:], strict=True):
            data[name] = pa.array(values, S.TRAFFIC_SCHEMA.field(name).type)
        return pa.table(data, schema=S.TRAFFIC_SCHEMA)

    def _keyed_table(self, counts: dict[tuple, list[int]], schema: pa.Schema) -> pa.Table:
        """Rows keyed by (window, *fields): the schema's columns after WINDOW_AND_SERVER are the key's fields
        in order, then the two counts (msgs or requests, and bytes: decisions, durable-queue and storage tables)."""
        names = schema.names[len(S.WINDOW_AND_SERVER):]
        cols: list[list[Any]] = [[] for _ in range(len(names) + 1)]
        for key, (msgs, nbytes) in counts.items():
            for i, value in enumerate(key):
                cols[i].append(value)
            cols[-2].append(msgs)
            cols[-1].append(nbytes)
        data = self._common(cols[0])
        for name, values in zip(names, cols[1:], strict=True):
            data[name] = pa.array(values, schema.field(name).type)
        return pa.table(data, schema=schema)

    # -- background flushing --------------------------------------------------------------------------

    def next_flush_delay(self, now: float | None = None) -> float:
        """Seconds until shortly after the next interval boundary (a grace for the server's handover)."""
        now = time.time() if now is None else now
        interval = self.opts.interval
        grace = min(interval * 0.25, 2.5)
        boundary = window_start_for(now, interval) + interval
        return max(0.0, boundary + grace - now)

    def start(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        """Start flushing every interval in a worker thread (idempotent)."""
        if self._task is not None:
            return
        loop = loop or asyncio.get_running_loop()
        self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="zonebus-ledger")
        self._task = loop.create_task(self._run(loop), name="zonebus-ledger-flush")

    async def _run(self, loop: asyncio.AbstractEventLoop) -> None:
        while True:
            await asyncio.sleep(self.next_flush_delay())
            try:
                await loop.run_in_executor(self._executor, self.flush)
            except Exception:  # flush logs its own write errors; keep the loop alive regardless
                log.exception("ledger: flush failed")

    async def close(self) -> None:
        """Stop the background task and write what is left."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._executor, self.flush)
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
