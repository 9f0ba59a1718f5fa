"""`DocQueue`: a stream writer's JSON documents on the shared store, written one at a time, in order.

Documents are `<folder>/<kind>.<epoch>.json` (the stream's config, each consumer's meta and state): a writer
only ever writes its own epoch's name, so an older writer that still runs cannot overwrite a newer one's
documents; readers take the highest epoch of each kind. Writes of the same name that queue up are coalesced
(only the latest content is written). After the first write of a kind in a folder the lower-epoch versions are
deleted (a LIST of the folder; none for a folder this writer created). A delete of a folder (a consumer
removed) drops the writes queued for it and runs after the ones already running, so a late state write cannot
bring a deleted consumer back. A write that fails (S3 503s, timeouts) is queued again at the front, unless a
newer write of that name or a delete of its folder was queued meanwhile, and retried after a backoff (`later`;
without an event loop, on the next write or `flush`), so a consumer's meta or last state is not silently
dropped. Nothing is written once the writer is fenced.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import wait as wait_futures

from zonebus.storage.fs import ObjectStore
from zonebus.store import sharedlayout as L

log = logging.getLogger(__name__)

Runner = Callable[[Callable, object, Callable[[BaseException | None], None]], Future | None]
Later = Callable[[float, Callable[[], None]], bool]  # call fn after delay seconds (on the loop); False: no loop
RETRY_FIRST, RETRY_MAX = 0.1, 2.0  # backoff of a failed write's retries, seconds


class DocQueue:
    def __init__(self, objects: ObjectStore, prefix: str, epoch: int, run: Runner,
                 fenced: Callable[[], bool], later: Later | None = None) -> None:
        self.objects = objects
        self.prefix = prefix
        self.epoch = epoch
        self._run = run  # run(fn, arg, then): fn(arg) in a worker thread, then(error) on the loop
        self._fenced = fenced
        self._queue: dict[str, tuple[str, bytes | None]] = {}  # key -> (op, payload), in order
        self._busy = 0  # id of the job running (0: none)
        self._ids = 0
        self._future: Future | None = None
        self._cleaned: set[tuple[str, str]] = set()
        self._later = later
        self._current: tuple[str, tuple[str, bytes | None]] | None = None  # the job running
        self._backoff = False  # a retry is scheduled: no job starts before it
        self._streak = 0  # failures in a row
        self.failures = 0

    def _folder(self, sub: str) -> str:
        return f"{self.prefix}/{sub}" if sub else self.prefix

    def put(self, sub: str, kind: str, doc: dict, new: bool = False) -> None:
        folder = self._folder(sub)
        key = f"{folder}/{L.doc_name(kind, self.epoch)}"
        if new:  # created by this writer: no older epoch wrote it (a late one of a fenced writer is ignored by
            self._cleaned.add((folder, kind))  # readers, who take the highest epoch)
        self._queue[key] = ("put", json.dumps(doc, separators=(",", ":")).encode())
        self._kick()

    def delete(self, sub: str) -> None:
        folder = self._folder(sub) + "/"
        for k in [k for k in self._queue if k.startswith(folder)]:
            del self._queue[k]
        self._queue[folder] = ("delete", None)
        self._kick()

    def clear(self) -> None:
        self._queue.clear()

    def _kick(self) -> None:
        if self._busy or self._backoff or not self._queue or self._fenced():
            return
        key = next(iter(self._queue))
        op = self._queue.pop(key)
        self._ids += 1
        job = self._busy = self._ids
        self._current = (key, op)
        self._future = None
        fut = self._run(self._job, (key, op), lambda err: self._done(job, err))
        if self._busy == job:
            self._future = fut

    def _job(self, item: tuple[str, tuple[str, bytes | None]]) -> None:
        """Worker thread: one put or folder delete."""
        key, (op, data) = item
        if op == "delete":
            self.objects.delete_prefix(key.rstrip("/"))
            return
        assert data is not None
        self.objects.put(key, data)
        folder, name = key.rsplit("/", 1)
        parsed = L.parse_doc_name(name)
        if parsed is not None and (folder, parsed[0]) not in self._cleaned:
            self._cleaned.add((folder, parsed[0]))
            for n in self.objects.list(folder):
                p = L.parse_doc_name(n)
                if p is not None and p[0] == parsed[0] and p[1] < self.epoch:
                    self.objects.delete(f"{folder}/{n}")

    def _done(self, job: int, err: BaseException | None) -> None:
        if job != self._busy:
            return  # already handled by flush()
        self._busy = 0
        self._future = None
        item, self._current = self._current, None
        if err is None:
            self._streak = 0
            self._kick()
            return
        self.failures += 1
        self._streak += 1
        log.error("shared store %s: document write failed (retrying): %s", self.prefix, err)
        if item is not None:
            self._requeue(*item)
        delay = min(RETRY_FIRST * 2 ** (self._streak - 1), RETRY_MAX)
        if self._later is not None and self._later(delay, self._retry):
            self._backoff = True
        # else (no event loop): the next put or flush writes it

    def _retry(self) -> None:
        self._backoff = False
        self._kick()

    def _requeue(self, key: str, op: tuple[str, bytes | None]) -> None:
        """Put a failed job back at the front, unless something queued since supersedes it."""
        if key in self._queue or any(k.endswith("/") and key.startswith(k) for k in self._queue):
            return  # a newer write of that name, or a delete of its folder
        self._queue = {key: op, **self._queue}

    def flush(self, deadline: float) -> bool:
        """Blocking: finish the running job and write the queued ones inline; True when all are written."""
        while not self._fenced() and time.monotonic() < deadline:
            if self._busy:
                fut = self._future
                if fut is None:
                    return False
                wait_futures([fut], timeout=max(deadline - time.monotonic(), 0))
                if not fut.done():
                    return False
                self._busy = 0  # the loop callback for `job` will find another job id and do nothing
                self._future = None
                item, self._current = self._current, None
                if fut.exception() is not None:
                    self.failures += 1
                    log.error("shared store %s: document write failed: %s", self.prefix, fut.exception())
                    if item is not None:
                        self._requeue(*item)
                continue
            if not self._queue:
                return True
            key = next(iter(self._queue))
            op = self._queue.pop(key)
            try:
                self._job((key, op))
            except Exception as exc:
                self.failures += 1
                log.error("shared store %s: document write failed: %s", self.prefix, exc)
                self._requeue(key, op)
                time.sleep(min(RETRY_FIRST, max(deadline - time.monotonic(), 0)))
        return not self._queue and not self._busy
