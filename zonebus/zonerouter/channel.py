"""RouterChannel: one proxy's append-only log of batches on the shared store.

Objects: `zonerouter/channels/<channel id>/<epoch, 10 digits>/<offset, 20 digits>.zrb`, written whole through
`zonebus.storage.fs.ObjectStore` (one PUT on S3; fsync + rename on a file system). The channel id is 8 random
bytes chosen when the proxy starts (a restarted server gets a new channel, so offsets never collide), shown
as 16 hex digits; `owner.json` beside it names the server. A batch is deleted once its leader answered it
(the leader appended the messages to the stream's own log) or the proxy gave up on it; a restarted server
deletes the channels of its earlier runs. Any server opens a read-only view of another's
channel by id (`get`); the writer never reads its own batches back. Blocking methods run in worker
threads; `next_offset` is taken on the event loop.
"""

from __future__ import annotations

import json
import os
import threading
import time

from zonebus.storage.fs import ObjectStore
from zonebus.store.routerbatch import PREFIX, object_key

__all__ = ["PREFIX", "RouterChannel", "object_key"]


class RouterChannel:
    def __init__(self, store: ObjectStore, server: str, channel_id: bytes | None = None) -> None:
        self.store = store
        self.server = server
        self.id = channel_id or os.urandom(8)
        self.epoch = 0
        self._next = 0
        self.puts = self.gets = self.put_bytes = self.get_bytes = self.deletes = 0
        self._written: dict[int, set[int]] = {}  # epoch -> offsets this run wrote and did not delete yet
        self._lock = threading.Lock()  # (writers and trims run in worker threads)

    # -- writer --------------------------------------------------------------------------------------
    def open(self) -> None:
        """Worker thread: announce the channel (its owner) on the store."""
        self.store.put(f"{PREFIX}/{self.id.hex()}/owner.json",
                       json.dumps({"server": self.server, "started": time.time()}).encode())

    def next_offset(self) -> tuple[int, int]:
        """Event loop: reserve (epoch, offset) for the next batch."""
        offset = self._next
        self._next += 1
        return self.epoch, offset

    def next_epoch(self, epoch: int) -> None:
        if epoch > self.epoch:
            self.epoch = epoch

    def append(self, epoch: int, offset: int, data: bytes) -> None:
        """Worker thread: write one batch; durable when this returns."""
        key = object_key(self.id, epoch, offset)
        with self._lock:  # (before the PUT: one that lands but whose answer is lost is deleted all the same)
            self._written.setdefault(epoch, set()).add(offset)
        try:
            self.store.put(key, data)
        except FileNotFoundError:  # the epoch folder was trimmed under us (only on a file system): once more
            self.store.forget_dirs()
            self.store.put(key, data)
        self.puts += 1
        self.put_bytes += len(data)

    def trimmed(self, epoch: int) -> None:
        """Every folder of this channel up to `epoch` was deleted."""
        with self._lock:
            self._written = {e: offs for e, offs in self._written.items() if e > epoch}

    def delete_up_to(self, epoch: int) -> int:
        """Worker thread: delete this run's objects of epochs <= `epoch` by key (on S3 without a LIST: this run
        knows what it wrote; a DELETE costs nothing), on a file system their folders; returns the folders."""
        with self._lock:
            gone = {e: offs for e, offs in self._written.items() if e <= epoch}
        for e, offsets in sorted(gone.items()):
            if self.store.local:
                self.store.delete_prefix(f"{PREFIX}/{self.id.hex()}/{e:010d}")
            else:
                for offset in sorted(offsets):
                    self.store.delete(object_key(self.id, e, offset))
                    self.deletes += 1
        self.trimmed(epoch)
        return len(gone)

    def trim(self, batches: list[tuple[int, int]]) -> None:
        """Worker thread: delete batches the leaders are done with (answered, or given up on)."""
        for epoch, offset in batches:
            self.store.delete(object_key(self.id, epoch, offset))
            self.deletes += 1
            with self._lock:
                offsets = self._written.get(epoch)
                if offsets is not None:
                    offsets.discard(offset)

    def remove_stale(self) -> int:
        """Worker thread: delete the channels an earlier run of this server left (their batches were answered
        or their publishers were told to retry); returns how many."""
        removed = 0
        for cid in self.store.list(PREFIX, dirs=True):
            if cid == self.id.hex():
                continue
            try:
                owner = json.loads(self.store.get(f"{PREFIX}/{cid}/owner.json"))
            except (FileNotFoundError, ValueError):
                continue
            if owner.get("server") == self.server:
                self.store.delete_prefix(f"{PREFIX}/{cid}")
                removed += 1
        return removed

    # -- readers -------------------------------------------------------------------------------------
    def get(self, channel: bytes, epoch: int, offset: int) -> bytes:
        """Worker thread: one batch of any channel, from the store."""
        data = self.store.get(object_key(channel, epoch, offset))
        self.gets += 1
        self.get_bytes += len(data)
        return data

    def stats(self) -> dict[str, int]:
        return {"puts": self.puts, "put_bytes": self.put_bytes, "gets": self.gets, "get_bytes": self.get_bytes,
                "deletes": self.deletes}
