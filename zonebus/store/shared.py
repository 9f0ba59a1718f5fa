"""`SharedStorage`: one shared store root (`file://` or `s3://` URL) and the calls made on it.

This is the API the JetStream service (a lone server) and the clustered layer use:

- `takeover(stream, epoch, writer)` -> `SharedStore`: become the stream's only writer with `epoch`, which must
  be above every epoch that ever claimed the stream (the clustered layer hands out epochs from its meta
  group; a lone server uses `next_epoch`). An older writer that still runs is fenced: its later writes are
  never acknowledged and never become part of the stream.
- `create_stream(stream, config, created, epoch, writer)`: a new stream (leftovers of an old one deleted).
- `open_view(stream)` -> `SharedView`: a read-only view (standbys, tools, a Spark reader); `refresh()` tails.
- `list_streams()`, `next_epoch(stream)`, `delete_stream(stream)`.

Every call blocks on storage I/O: call them from a worker thread (`asyncio.to_thread`). Writers attach to the
event loop afterwards (`store.attach(loop, storage.executor)`). The root holds `layout.json`; opening a root
whose layout version this code does not know fails with `LayoutError`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from zonebus.storage.fs import ObjectStore
from zonebus.store import sharedlayout as L
from zonebus.store.cachecopies import COPIES
from zonebus.store.sharedcommit import CommitOptions
from zonebus.store.sharedfence import Fenced, TailSource
from zonebus.store.sharedstore import SharedStore
from zonebus.store.sharedview import SharedView

log = logging.getLogger(__name__)

__all__ = ["CommitOptions", "Fenced", "SharedStorage", "SharedStore", "SharedView"]


class SharedStorage:
    def __init__(self, url: str, *, endpoint: str = "", region: str = "", cache_root: str | Path | None = None,
                 options: CommitOptions | None = None, create: bool = True) -> None:
        self.url = url
        self.objects = ObjectStore.from_url(url, endpoint, region)
        self.cache_root = Path(cache_root) if cache_root else None
        self.options = options or CommitOptions()
        # set by the zone router: a new writer recovers the replicated tail of the one it fences from there
        self.tail_source: TailSource | None = None
        # set by JetStream when streams keep a replicated tail and the zone router runs (it sets `tail_source` once
        # started): until then no stream is taken over (its last writer's tail would be left behind, `takeover`)
        self.tail_expected = False
        # set by clustered JetStream (`zonebus.stream.batchcopies`): a checked copy of a damaged batch object from
        # this server or a live member (or None)
        self.copy_source: Callable[[str, int, int], bytes | None] | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._check_layout(create)

    def _check_layout(self, create: bool) -> None:
        try:
            raw = self.objects.get(L.LAYOUT_KEY)
        except FileNotFoundError:
            if not create:
                raise L.LayoutError(f"{self.url}: no zonebus shared store here ({L.LAYOUT_KEY} missing)")
            self.objects.put(L.LAYOUT_KEY, L.layout_doc())
            return
        if L.check_layout(raw, self.url) < L.VERSION and create:  # a writer may write link records from now on
            self.objects.put(L.LAYOUT_KEY, L.layout_doc())

    @property
    def executor(self) -> ThreadPoolExecutor:
        """The worker threads that run uploads and document writes for every stream of this root."""
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=max(4, self.options.inflight * 2),
                                                thread_name_prefix="zb-shared")
        return self._executor

    def shutdown(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None

    def cache_dir(self, stream: str) -> Path | None:
        return self.cache_root / stream if self.cache_root is not None else None

    # -- streams -------------------------------------------------------------------------------------
    def list_streams(self, headless: list[str] | None = None) -> list[str]:
        """Names of the streams on the store (those with a config document); streams whose log has batch
        objects but whose config document is missing are added to `headless` when given."""
        out = []
        for name in self.objects.list(L.STREAMS, dirs=True):
            names = self.objects.list(L.stream_prefix(name))
            if "stream" in L.latest_docs(names):
                out.append(name)
            elif headless is not None and self.has_log(name):
                headless.append(name)
        return out

    def has_log(self, stream: str) -> bool:
        """The stream's log holds batch objects (whatever its documents say)."""
        return any(L.parse_pair(n, ".blk") is not None for n in self.objects.list(f"{L.stream_prefix(stream)}/log"))

    def max_epoch(self, stream: str) -> int:
        """The highest epoch that ever claimed `stream` (0: none)."""
        best = 0
        for n in self.objects.list(f"{L.stream_prefix(stream)}/epochs"):
            p = L.parse_epoch_name(n)
            if p is not None:
                best = max(best, p[0])
        return best

    def next_epoch(self, stream: str) -> int:
        return self.max_epoch(stream) + 1

    def takeover(self, stream: str, epoch: int | None = None, writer: str = "") -> SharedStore:
        """Open `stream` as its writer with `epoch` (default: the next one). Raises `Fenced` when `epoch` is
        not above every earlier claim or a higher one appears during the takeover, OSError when the store
        failed or the replicated tail cannot be gathered yet (`tail_expected`)."""
        if self.tail_expected and self.tail_source is None:
            # the zone router is still starting (after every server lost power at once, a restarted leader was
            # seen taking its stream over before that, and storing it without the 310 acknowledged messages its
            # replicas held): OSError, retried by the caller
            raise OSError(f"stream {stream}: the zone router has not started, so the replicated tail of its last "
                          f"writer cannot be gathered yet")
        if epoch is None:
            epoch = self.next_epoch(stream)
        return SharedStore(self.objects, stream, epoch, writer, self.cache_dir(stream), self.options,
                           self.tail_source)

    def create_stream(self, stream: str, config: dict, created: int, epoch: int | None = None,
                      writer: str = "") -> SharedStore:
        """A new, empty stream; whatever was left under its name is deleted first."""
        if epoch is None:
            epoch = self.next_epoch(stream)
        self.objects.delete_prefix(L.stream_prefix(stream))
        cache = self.cache_dir(stream)
        if cache is not None:
            COPIES.empty(cache)
        store = SharedStore(self.objects, stream, epoch, writer, cache, self.options, self.tail_source)
        self.write_config(stream, epoch, config, created)
        return store

    def repair_from_copy(self, exc: L.DamagedBatch) -> bool:
        """A takeover found batch object `exc.batch` of epoch `exc.epoch` damaged: put back a checked copy from
        another server (`copy_source`) over it (an unconditional PUT: the create-only name exists). Blocking; True
        when the object was put back."""
        stream = exc.stream
        if self.copy_source is None or not stream:
            return False
        data = self.copy_source(stream, exc.batch, exc.epoch)
        if data is None:
            return False
        L.check_batch(data, exc.batch, exc.epoch)
        key = f"{L.stream_prefix(stream)}/log/{L.batch_name(exc.batch, exc.epoch)}"
        self.objects.put(key, data)
        log.warning("shared store %s: batch object %s was damaged on the store; put back from another server's "
                    "checked copy (%d bytes)", stream, key, len(data))
        return True

    def write_config(self, stream: str, epoch: int, config: dict, created: int) -> None:
        """The stream's config document of writer `epoch`, written now (one PUT)."""
        self.objects.put(f"{L.stream_prefix(stream)}/{L.doc_name('stream', epoch)}",
                         json.dumps({"config": config, "created": created}).encode())

    def open_view(self, stream: str, cache_dir: str | Path | None = None) -> SharedView:
        return SharedView(self.objects, stream, cache_dir)

    def delete_stream(self, stream: str) -> None:
        self.objects.delete_prefix(L.stream_prefix(stream))
