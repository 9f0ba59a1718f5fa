"""Base moves of a stream on a shared store: drop front batches whose messages are all gone (a mixin of
`SharedStore`).

When the front batches of the chain hold no live message any more (deleted, purged, acked in a work queue),
the writer writes `base/<b>.<epoch>.json` (the log now starts at batch `b`), checks that nobody took the stream
over, and deletes the batch objects below `b` (and their cache files) and older base objects. At most one move
runs at a time, at least `BASE_MIN_BATCHES` batches or `BASE_INTERVAL` seconds apart unless forced (a clean
close). The upload runs in a worker thread; the bookkeeping on the event loop.
"""

from __future__ import annotations

import json
import logging
import time
from typing import TYPE_CHECKING

from zonebus.store import sharedlayout as L
from zonebus.store.linklog import pack_name
from zonebus.store.msgstore import now_ns
from zonebus.store.sharedfence import Fenced
from zonebus.store.sharedview import LINKED

if TYPE_CHECKING:
    from zonebus.store.sharedstore import SharedStore

log = logging.getLogger("zonebus.store.sharedstore")


class BaseMoves:
    """Base moves, mixed into `SharedStore`."""

    BASE_MIN_BATCHES = 16
    BASE_INTERVAL = 1.0

    def _maybe_move_base(self: SharedStore, force: bool = False) -> None:
        if self._base_busy or self.fenced or self.closed:
            return
        b = self.chain_start
        while b <= self.durable_batch and self.live.get(b, 0) <= 0:
            b += 1
        if b == self.chain_start:
            return
        if not force and b - self.chain_start < self.BASE_MIN_BATCHES and (
                time.monotonic() - self._last_base_move < self.BASE_INTERVAL):
            return
        first = self.batch_first.get(b)
        next_seq = first if first else self.index.last_seq + 1
        old = [(n, e) for n, e in self.batches.items() if n < b]
        self._base_busy = True
        self._last_base_move = time.monotonic()
        self._run_job(self._put_base, (b, next_seq, old, self.packs_below(b)), lambda err: self._base_moved(b, err))

    def _put_base(self: SharedStore, args: tuple[int, int, list[tuple[int, int]], list[tuple[int, int, int]]]) -> None:
        b, next_seq, old, packs = args
        doc = {"batch": b, "epoch": self.epoch, "next_seq": next_seq, "writer": self.writer, "ts": now_ns()}
        self.objects.put(f"{self.prefix}/base/{L.base_name(b, self.epoch)}", json.dumps(doc).encode())
        self._check_fence()  # never delete anything once another writer owns the stream
        for n, e in old:
            self.objects.delete(self._key(n, e))
            path = self._cache_path(n, e)
            if path is not None:
                path.unlink(missing_ok=True)
                path.with_suffix(LINKED).unlink(missing_ok=True)
        for first, last, e in packs:
            self.objects.delete(f"{self.prefix}/packs/{pack_name(first, last, e)}")
        for name in self.objects.list(f"{self.prefix}/base"):
            p = L.parse_pair(name, ".json")
            if p is not None and p[0] < b:
                self.objects.delete(f"{self.prefix}/base/{name}")

    def _base_moved(self: SharedStore, b: int, err: BaseException | None) -> None:
        self._base_busy = False
        if isinstance(err, Fenced):
            self._fence(str(err))
            return
        if err is not None:
            log.warning("shared store %s: could not move the base to batch %d: %s", self.stream, b, err)
            return
        for n in [n for n in self.batches if n < b]:
            self.batches.pop(n, None)
            self.live.pop(n, None)
            self.batch_first.pop(n, None)
            data = self._mem.pop(n, None)
            if data is not None:
                self._mem_bytes -= len(data)
        self.chain_start = max(self.chain_start, b)
        self.packs = [p for p in self.packs if p[1] >= b]

