"""A durable queue group's log: a file store (zonebus.store.filestore) under `<base>/queues/<group>/`.

The base is the shared store's directory when JetStream has a `file://` shared store (a new primary opens the
same log after a failover), else the server's JetStream store_dir (or a temporary directory). Only the
primary writes; on a shared store each record is written at once (`FileStore(shared=True)`), so a primary
back from a pause never writes a buffer into a log its successor leads. A message leaves the log once
delivered (ack none) or acked: the log's first sequence is the group's committed offset. With `sync_always`
(`jetstream { sync_interval: always }`, the default) a publish is confirmed only once its record is fsynced
(`when_durable`: the file store's group commit), so a power loss loses nothing confirmed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from zonebus.queue.model import Record, decode_origin, encode_origin
from zonebus.store.atrest import AtRest, store_keys
from zonebus.store.filestore import FileStore

log = logging.getLogger(__name__)


class GroupLog:
    def __init__(self, base: str, group: str, sync_always: bool = True, atrest: AtRest | None = None,
                 shared: bool = False) -> None:
        self.dir = Path(base) / "queues" / group
        # with encryption at rest, sealed as a stream's store is (AtRestKeyError, an OSError, for a wrong key)
        keys = store_keys(atrest, self.dir)
        self.store = FileStore(self.dir, sync_always=sync_always, keys=keys, shared=shared)
        if keys is not None and keys.converting:
            keys.finish_conversion()

    def append(self, subject: str, hdrs: bytes | None, payload: bytes, origin: str, zone: str) -> int:
        seq, _ts = self.store.store(subject, encode_origin(origin, zone, hdrs), payload)
        return seq

    def when_durable(self, seq: int, confirm: Callable[[], None]) -> None:
        """Call `confirm()` once `seq` is durable (at once when it is, or when the log is lazy). When the fsync
        fails it is never called: the publisher gets no PubAck and sends again."""
        def synced(err: str | None) -> None:
            if err is None:
                confirm()
            else:
                log.error("queue group log %s: message %d not confirmed: %s", self.dir, seq, err)

        if not self.store.ack_when_durable(seq, synced):
            confirm()

    def sync(self) -> None:
        self.store.sync()

    def read(self, seq: int) -> Record | None:
        m = self.store.load(seq)
        if m is None:
            return None
        origin, zone, hdrs = decode_origin(m.hdrs)
        return Record(m.seq, m.subject, hdrs, m.data, m.ts, origin, zone)

    def holds(self, seq: int) -> bool:
        """Whether `seq` is in the log (read() may still fail: a record where the index says none is)."""
        return self.store.index.meta(seq) is not None

    def next_seq(self, start: int) -> int:
        """The first stored sequence at or after `start`, 0 when none."""
        return self.store.index.next_seq(max(start, self.store.index.first_seq), None) or 0

    def appended_elsewhere(self) -> bool:
        """Whether another process appended to this log since this one opened it (a former primary that wrote
        past the meta group's fence): this view of it is stale and must be opened again."""
        return self.store.appended_elsewhere() != 0

    def remove(self, seq: int) -> bool:
        return self.store.remove(seq) is not None

    @property
    def msgs(self) -> int:
        return self.store.index.msgs

    @property
    def first_seq(self) -> int:
        return self.store.index.first_seq

    @property
    def last_seq(self) -> int:
        return self.store.index.last_seq

    def close(self) -> None:
        self.store.close()
