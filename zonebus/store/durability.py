"""Making local writes durable: group commit of an append-only file, and fsynced directories and small files.

`GroupCommit` is what a file store's PubAcks wait on by default (`jetstream { sync_interval: always }`): an
append only marks the file as written; one fsync (fdatasync) per batch of appends runs in a thread, off the
event loop, and when it returns every waiter whose sequence it covered is called, in sequence order. While
one fsync runs, the appends that arrive wait for the next one, so concurrent publishes share an fsync
(group commit) and at most one fsync per file is in flight. A file created or renamed is durable only once
its directory is fsynced too: `make_dirs` and `replace_file` do that for new directories and small
documents (a stream's `meta.json`).
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

log = logging.getLogger(__name__)

Waiter = Callable[[str | None], None]  # called with None once durable, or with why not
_executor: ThreadPoolExecutor | None = None


def fsync_executor() -> ThreadPoolExecutor:
    """The threads that run group-commit fsyncs (one per file at a time; shared by the process's files)."""
    global _executor
    if _executor is None:
        _executor = ThreadPoolExecutor(max_workers=4, thread_name_prefix="zonebus-fsync")
    return _executor


def fsync_dir(path: str | Path) -> None:
    """fsync a directory (its entries); a file system that cannot (EINVAL, ENOTSUP) is let be."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP):
            raise
    finally:
        os.close(fd)


def make_dirs(path: str | Path) -> None:
    """`mkdir -p path`, each directory it created fsynced and so the directory holding the first of them."""
    path = Path(path)
    created: list[Path] = []
    probe = path
    while not probe.is_dir():
        created.append(probe)
        probe = probe.parent
    path.mkdir(parents=True, exist_ok=True)
    for d in created:  # deepest first: a directory's entries, then its own entry in its parent
        fsync_dir(d)
    if created:
        fsync_dir(probe)


def write_synced(fd: int, data: bytes) -> None:
    """Write all of `data` to the open file `fd`, then fsync it."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
    os.fsync(fd)


def replace_file(path: Path, data: bytes) -> None:
    """Write `path` whole and durably: a temporary file, fsynced, renamed over it, the directory fsynced."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        write_synced(fd, data)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(path.parent)


def _fdatasync_dup(fd: int) -> None:
    try:
        os.fdatasync(fd)
    finally:
        os.close(fd)


class GroupCommit:
    """The fsyncs of one append-only file (its current fd is `fd()`), shared by the appends that wait on them.

    `written(seq)` after each append (seq: the highest sequence written so far, 0 for records that carry
    none); `wait(seq, cb)` arranges `cb(None)` once an fsync that started after `seq` was written returned.
    `synced_seq` is the highest sequence known durable; `on_synced(first, last)` is told each advance.
    Without a running event loop (tools, unit tests) every `written` fsyncs at once.
    """

    def __init__(self, fd: Callable[[], int], synced_seq: int) -> None:
        self._fd = fd
        self.synced_seq = synced_seq
        self.on_synced: Callable[[int, int], None] | None = None
        self.before_sync: Callable[[], None] | None = None  # writes what the owner buffered (on the loop thread)
        self.fsyncs = 0  # fsyncs run (each covers every append before it)
        self.error: str | None = None  # an fsync failed: nothing written since is known durable
        self._written_seq = synced_seq
        self._writes = 0  # appends so far; a flush covers those before it started
        self._flushed_writes = 0
        self._waiters: deque[tuple[int, Waiter]] = deque()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._scheduled = False
        self._running = False
        self.closed = False

    def written(self, seq: int) -> None:
        self._writes += 1
        if seq > self._written_seq:
            self._written_seq = seq
        if self._scheduled or self._running:
            return
        try:
            self._loop = asyncio.get_running_loop()
        except RuntimeError:
            self.sync_now()
            return
        self._scheduled = True
        self._loop.call_soon(self._flush)

    def wait(self, seq: int, cb: Waiter) -> bool:
        """Arrange `cb` for once `seq` is durable; False (no call) when it is already."""
        if seq <= self.synced_seq:
            return False
        if self.error is not None:
            cb(self.error)
            return True
        self._waiters.append((seq, cb))
        return True

    @property
    def syncing(self) -> bool:
        """Whether an fsync runs (in its thread) now."""
        return self._running

    def start_now(self) -> None:
        """Start the fsync that `written` scheduled at once (the writer has nothing more for it in this turn of
        the loop: a stream that stored a publisher's whole burst), not after the loop's other ready callbacks."""
        if self._scheduled and not self._running:
            self._flush()

    def sync_now(self) -> None:
        """fsync here and now (a segment roll, a close, no event loop): everything written so far is durable."""
        if self._writes == self._flushed_writes:
            return
        target, writes = self._written_seq, self._writes
        if self.before_sync is not None:
            self.before_sync()
        os.fdatasync(self._fd())
        self.fsyncs += 1
        self._done(target, writes, None)

    def close(self) -> None:
        """The file is closed (after a last `sync_now`): no more fsyncs are started."""
        self.closed = True

    def _flush(self) -> None:
        self._scheduled = False
        if self._running or self.closed or self._writes == self._flushed_writes:
            return
        target, writes = self._written_seq, self._writes
        if self.before_sync is not None:
            try:
                self.before_sync()
            except OSError as exc:  # (a full disk, an I/O error): nothing written since is durable
                self._done(target, writes, f"write failed: {exc}")
                return
        fd = os.dup(self._fd())  # the file may be rolled (closed) while the thread syncs it
        self._running = True
        assert self._loop is not None
        fut = self._loop.run_in_executor(fsync_executor(), _fdatasync_dup, fd)
        fut.add_done_callback(lambda f: self._flushed(f, target, writes))

    def _flushed(self, fut: asyncio.Future, target: int, writes: int) -> None:
        self._running = False
        exc = fut.exception()
        self.fsyncs += 1
        self._done(target, writes, f"fsync failed: {exc}" if exc is not None else None)
        if self._writes != self._flushed_writes and self._loop is not None:
            self._flush()  # the appends made meanwhile: their fsync starts now, not a turn of the loop later

    def _done(self, target: int, writes: int, error: str | None) -> None:
        if error is not None:
            log.error("group commit: %s; refusing writes", error)
            self.error = error
            while self._waiters:
                self._waiters.popleft()[1](error)
            return
        self._flushed_writes = max(self._flushed_writes, writes)
        first = self.synced_seq + 1
        if target > self.synced_seq:
            self.synced_seq = target
        waiters = self._waiters
        while waiters and waiters[0][0] <= target:
            waiters.popleft()[1](None)
        if target >= first and self.on_synced is not None:
            self.on_synced(first, target)
