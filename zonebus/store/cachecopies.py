"""Durable cache copies of fetched batch objects, written off the reader's path (one writer thread per process).

A view keeps a checked copy of every batch object it fetches in its cache directory: another copy that a new
writer can put back over a damaged object (`zonebus.stream.batchcopies`). A copy is written durably (a
temporary file, fsynced, renamed, the directory fsynced: `durability.replace_file`), and those two fsyncs per
batch had made a takeover that loads a long chain on a cold cache take minutes (a 30-minute `zonebus-file`
campaign: 39,471 batch objects, the stream without a leader until the campaign's read-back gave up). So the
copies go to this writer, which writes them in order behind the reader; the takeover waits for none of them.

    COPIES.put(path, data, (b, e))  # queued, or dropped (a warning) while more than BUDGET bytes wait
    COPIES.drain(timeout)           # True once every queued copy is on disk (tests, shutdown)
    COPIES.empty(directory)         # a deleted stream's copies gone, after the queued ones landed
    read_copy(directory, b, e)      # a kept copy's bytes (unchecked), or None

A copy dropped or not yet written when the power goes is a copy fewer, never a wrong one: a cached file is
checked whole before it is used. With `(batch, epoch)` the writer checks the bytes before it keeps them, and a
damaged object is not kept: the store's object was fetched unchecked (the reader checks it as it applies it), and
a cache that had kept a torn object's bytes held one damaged copy more and no good one (a 30-minute campaign,
seed 17: batch 1165 torn, the cache of the server that had read it after the damage held the same torn bytes).
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from pathlib import Path

from zonebus.store import sharedlayout as L
from zonebus.store.durability import replace_file

log = logging.getLogger(__name__)

BUDGET = 64 << 20  # bytes of copies waiting to be written, at most


def read_copy(directory: Path | None, batch: int, epoch: int) -> bytes | None:
    """The bytes of the copy of batch `batch` of epoch `epoch` kept in `directory` (unchecked: the caller checks
    them against the layout), or None when there is no such directory or file."""
    if directory is None:
        return None
    try:
        return (directory / L.batch_name(batch, epoch)).read_bytes()
    except OSError:
        return None


class CacheCopies:
    def __init__(self, budget: int = BUDGET) -> None:
        self.budget = budget
        self._queue: deque[tuple[Path, bytes, tuple[int, int] | None]] = deque()
        self._bytes = 0
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._busy = False
        self.written = self.dropped = self.damaged = 0

    def put(self, path: Path, data: bytes, batch: tuple[int, int] | None = None) -> None:
        """Queue a copy of `data` for `path`; `batch` = (batch, epoch) to check it as that batch object first."""
        with self._cond:
            if self._bytes + len(data) > self.budget:
                self.dropped += 1
                if self.dropped == 1 or self.dropped % 1000 == 0:
                    log.warning("cache copies: %d bytes wait to be written; %s not kept (%d dropped so far)",
                                self._bytes, path.name, self.dropped)
                return
            self._queue.append((path, data, batch))
            self._bytes += len(data)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="cache-copies", daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def empty(self, directory: Path, remove: bool = False) -> None:
        """Delete the copies in `directory` (and with `remove` the directory) once every queued copy is written:
        none of a deleted stream lands there after it was emptied (a stream created anew under the name would
        find the old one's batches under the same names)."""
        if not directory.is_dir():
            return
        self.drain()
        for p in directory.glob("*"):
            p.unlink(missing_ok=True)
        if remove:
            try:
                directory.rmdir()
            except OSError:
                pass

    def drain(self, timeout: float = 30.0) -> bool:
        """Wait until every queued copy is written (or failed); False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._queue and not self._busy, timeout)

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: bool(self._queue))
                path, data, batch = self._queue.popleft()
                self._busy = True
            try:
                if batch is not None:
                    L.check_batch(data, *batch)
                replace_file(path, data)
                self.written += 1
            except L.LayoutError as exc:
                self.damaged += 1
                log.warning("cache copies: %s not kept: the store's object is damaged (%s)", path.name, exc)
            except OSError as exc:  # (a directory removed meanwhile: the stream was deleted or moved)
                log.debug("cache copies: could not write %s: %r", path, exc)
            finally:
                with self._cond:
                    self._bytes -= len(data)
                    self._busy = False
                    self._cond.notify_all()


COPIES = CacheCopies()
