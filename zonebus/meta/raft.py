"""The pysyncobj side: the replicated object, its configuration, and snapshots written as JSON.

`MetaSyncObj` is a `SyncObj` with one replicated method, `apply_meta_op(op_json)`, which runs
`state.apply_op` on every server in log order. pysyncobj is driven by `doTick(0)` from the event loop
(`autoTick=False`), so every callback here runs on the loop thread.

Persistence, under `<store_dir>/meta/`: `raft.journal` (pysyncobj's mmap'ed log, plus `raft.journal.meta`
with term/vote/commit index), and `raft.snapshot`, written by `_write_snapshot` as JSON (state + the two log
entries pysyncobj needs to resume) instead of pysyncobj's default gzip+pickle, also when a leader sends it
to a lagging follower. pysyncobj writes the journal through mmap and fsyncs nothing; `barrier`
(`zonebus.meta.durability.JournalBarrier`) fsyncs what changed before the group's Raft frames leave, so the
log and the vote survive a power loss, as Raft requires.
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pysyncobj import SyncObj, SyncObjConf, replicated
from pysyncobj.node import Node

from zonebus.meta.durability import JournalBarrier
from zonebus.meta.state import Applied, MetaState, apply_op
from zonebus.meta.transport import LinkTransport
from zonebus.store.durability import make_dirs

SNAPSHOT_VERSION = 1
JOURNAL_FILE = "raft.journal"
SNAPSHOT_FILE = "raft.snapshot"
# An operation is at most MAX_OP_BYTES, far below BATCH_BYTES, so pysyncobj never splits an entry into pickled
# "transmission" chunks; a frame carries at most BATCH_BYTES + one entry (~430 KB once base64'd in JSON).
BATCH_BYTES = 256 * 1024
MAX_OP_BYTES = 64 * 1024


@dataclass(frozen=True)
class MetaTiming:
    """Timers of the meta group, in seconds.

    A dead meta leader is replaced after `election_min`..`election_max` without heartbeats (elections need
    a majority, so a minority never elects); a leader that hears from no majority for `leader_fallback`
    steps down. A server unreachable for `failover` loses its streams, consumers and queue primaries.
    `tick` drives pysyncobj's timers (messages are handled as they arrive, not on the tick)."""

    tick: float = 0.1
    heartbeat: float = 0.2
    election_min: float = 1.0
    election_max: float = 2.0
    leader_fallback: float = 3.0
    ping: float = 0.5
    silence: float = 2.0
    failover: float = 5.0
    check: float = 0.5
    propose: float = 5.0
    compaction_entries: int = 5000
    compaction_seconds: float = 300.0


def _entry_to_json(entry: Any) -> list[Any]:
    command, idx, term = entry
    return [base64.b64encode(bytes(command)).decode("ascii"), int(idx), int(term)]


def _entry_from_json(row: list[Any]) -> tuple[bytes, int, int]:
    return base64.b64decode(row[0], validate=True), int(row[1]), int(row[2])


class MetaSyncObj(SyncObj):
    """The replicated meta state. `on_applied(op, applied)` runs after every applied operation;
    `on_replaced(old, new)` after a snapshot replaced the whole state."""

    def __init__(self, self_name: str, transport: LinkTransport, store_dir: str | os.PathLike[str],
                 timing: MetaTiming, on_applied: Callable[[Any, Applied], None],
                 on_replaced: Callable[[MetaState, MetaState], None]) -> None:
        self.meta_state = MetaState()
        self._on_applied = on_applied
        self._on_replaced = on_replaced
        directory = Path(store_dir) / "meta"
        make_dirs(directory)  # (fsynced up to the directory holding the first it made: `barrier` relies on it)
        self.snapshot_path = directory / SNAPSHOT_FILE
        self.barrier = JournalBarrier(directory, JOURNAL_FILE, SNAPSHOT_FILE)
        conf = SyncObjConf(
            autoTick=False,
            appendEntriesUseBatch=False,  # send a proposal at once instead of on the next heartbeat
            appendEntriesPeriod=timing.heartbeat,
            raftMinTimeout=timing.election_min,
            raftMaxTimeout=timing.election_max,
            leaderFallbackTimeout=timing.leader_fallback,
            connectionTimeout=max(timing.election_max, timing.silence),
            appendEntriesBatchSizeBytes=BATCH_BYTES,
            logCompactionMinEntries=timing.compaction_entries,
            logCompactionMinTime=timing.compaction_seconds,
            journalFile=str(directory / JOURNAL_FILE),
            fullDumpFile=str(self.snapshot_path),
            serializer=self._write_snapshot,
            deserializer=self._read_snapshot,
            useFork=False,
            dynamicMembershipChange=False,
        )
        others = [transport.nodes[name] for name in sorted(transport.nodes)]
        super().__init__(Node(self_name), others, conf, transport=transport)
        transport.func_ids = frozenset(self._idToMethod)

    @replicated
    def apply_meta_op(self, op_json: str) -> dict[str, Any]:
        try:
            op = json.loads(op_json)
        except ValueError:
            op = None
        applied = apply_op(self.meta_state, op)
        self._on_applied(op, applied)
        return applied.result

    # ---- snapshots ---------------------------------------------------------------------------------------

    def _write_snapshot(self, path: str, data: tuple[Any, Any, Any]) -> None:
        last, prev, cluster = data
        body = {
            "version": SNAPSHOT_VERSION,
            "state": self.meta_state.to_dict(),
            "last": _entry_to_json(last),
            "prev": _entry_to_json(prev),
            "cluster": sorted(node.id for node in cluster),
        }
        with open(path, "w") as f:
            json.dump(body, f, separators=(",", ":"))
            f.flush()
            os.fsync(f.fileno())

    def _read_snapshot(self, path: str) -> tuple[Any, Any, Any]:
        with open(path) as f:
            body = json.load(f)
        if body.get("version") != SNAPSHOT_VERSION:
            raise ValueError(f"unknown meta snapshot version {body.get('version')!r}")
        new = MetaState.from_dict(body["state"])
        old, self.meta_state = self.meta_state, new
        self._on_replaced(old, new)
        return _entry_from_json(body["last"]), _entry_from_json(body["prev"]), {Node(n) for n in body["cluster"]}

    # ---- read-only views of pysyncobj's state ------------------------------------------------------------

    def leader_name(self) -> str | None:
        leader = self._getLeader()
        return None if leader is None else str(leader.id)

    def is_leader(self) -> bool:
        return self._isLeader()
