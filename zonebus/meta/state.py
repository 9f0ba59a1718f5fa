"""The replicated cluster metadata and its apply functions (pure: no I/O, no clock, no randomness).

`apply_op(state, op)` is the only writer of a `MetaState`. Every server applies the same operations in the
same order (the Raft log), so every server holds the same state; anything that depends on time or on who is
alive (placement, failover) is decided on the meta leader *before* proposing (see `assign.py`) and arrives
here as plain data. An operation that cannot apply (unknown stream, stale epoch...) leaves the state
unchanged and returns an error result, identically on every server.

Operations (JSON objects, key "op"):
    peer_set        name, tags, zone, jetstream
    stream_add      name, config, leader, standbys, tags, created, honoured
    stream_update   name, config, [leader, standbys, honoured, tags, from_epoch]
    stream_move     name, from_epoch, leader, standbys, honoured      (writer epoch + 1; the consumers the
                    old leader owned follow the new leader, epoch + 1 each)
    stream_delete   name                                              (and its consumers)
    consumer_add    stream, name, config, owner, created
    consumer_move   stream, name, from_epoch, owner
    consumer_delete stream, name
    queue_set       group, server, candidates, zone, honoured, [from_epoch]
    queue_delete    group
    route_epoch     server, [current, fenced, committed]              (each only grows)

Ownership: the Raft apply callback (`raft.MetaSyncObj`) on the event-loop thread is the only caller of
`apply_op`; everything else reads.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from zonebus.meta.errors import error_result

Record = Any  # one of the record dataclasses below


@dataclass(frozen=True)
class PeerRecord:
    name: str
    tags: tuple[str, ...] = ()
    zone: str = ""
    jetstream: bool = True


@dataclass(frozen=True)
class StreamRecord:
    name: str
    config: dict[str, Any]
    leader: str
    standbys: tuple[str, ...] = ()
    epoch: int = 1  # the writer epoch: + 1 on every leader change
    tags: tuple[str, ...] = ()  # placement tags
    created: str = ""
    honoured: bool = True  # False: the leader does not carry the placement tags (shown by /jsz)

    @property
    def replicas(self) -> tuple[str, ...]:
        return (self.leader, *self.standbys)


@dataclass(frozen=True)
class ConsumerRecord:
    stream: str
    name: str
    config: dict[str, Any]
    owner: str
    epoch: int = 1
    created: str = ""

    @property
    def key(self) -> str:
        return consumer_key(self.stream, self.name)


@dataclass(frozen=True)
class QueuePrimary:
    """The server that holds a durable queue group's primary (for the zone router)."""

    group: str
    server: str | None
    epoch: int = 1
    candidates: tuple[str, ...] = ()
    zone: str = ""
    honoured: bool = True


@dataclass(frozen=True)
class RouteEpochs:
    """A server's zone-router route epochs; each only grows."""

    server: str
    current: int = 0
    fenced: int = 0
    committed: int = 0


@dataclass(frozen=True)
class Change:
    """One record that an applied operation added (before None), changed, or removed (after None)."""

    kind: str  # "peer" | "stream" | "consumer" | "queue" | "route_epoch"
    key: str
    before: Record | None
    after: Record | None

    def gained_leader(self, server: str) -> bool:
        """For streams: `server` became this stream's leader (or owner, for consumers and queue groups)."""
        return _holder(self.after) == server and _holder(self.before) != server

    def lost_leader(self, server: str) -> bool:
        return _holder(self.before) == server and _holder(self.after) != server


def _holder(record: Record | None) -> str | None:
    if isinstance(record, StreamRecord):
        return record.leader
    if isinstance(record, ConsumerRecord):
        return record.owner
    if isinstance(record, QueuePrimary):
        return record.server
    return None


def consumer_key(stream: str, name: str) -> str:
    return f"{stream}/{name}"


def record_dict(record: Record) -> dict[str, Any]:
    """A record as plain JSON data (tuples become lists)."""
    return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(record).items()}


@dataclass
class MetaState:
    peers: dict[str, PeerRecord] = field(default_factory=dict)
    streams: dict[str, StreamRecord] = field(default_factory=dict)
    consumers: dict[str, ConsumerRecord] = field(default_factory=dict)
    queue_primaries: dict[str, QueuePrimary] = field(default_factory=dict)
    route_epochs: dict[str, RouteEpochs] = field(default_factory=dict)

    def consumers_of(self, stream: str) -> list[ConsumerRecord]:
        return [c for c in self.consumers.values() if c.stream == stream]

    def to_dict(self) -> dict[str, Any]:
        return {
            "peers": {k: record_dict(v) for k, v in sorted(self.peers.items())},
            "streams": {k: record_dict(v) for k, v in sorted(self.streams.items())},
            "consumers": {k: record_dict(v) for k, v in sorted(self.consumers.items())},
            "queue_primaries": {k: record_dict(v) for k, v in sorted(self.queue_primaries.items())},
            "route_epochs": {k: record_dict(v) for k, v in sorted(self.route_epochs.items())},
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MetaState:
        def load(kind: type, rows: dict[str, Any], tuples: tuple[str, ...]) -> dict[str, Any]:
            out = {}
            for key, row in rows.items():
                row = dict(row)
                for name in tuples:
                    row[name] = tuple(row.get(name) or ())
                out[key] = kind(**row)
            return out

        return cls(
            peers=load(PeerRecord, data.get("peers", {}), ("tags",)),
            streams=load(StreamRecord, data.get("streams", {}), ("standbys", "tags")),
            consumers=load(ConsumerRecord, data.get("consumers", {}), ()),
            queue_primaries=load(QueuePrimary, data.get("queue_primaries", {}), ("candidates",)),
            route_epochs=load(RouteEpochs, data.get("route_epochs", {}), ()),
        )

    def digest(self) -> str:
        """A hash of the whole state: equal on every server that applied the same operations."""
        text = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass
class Applied:
    result: dict[str, Any]
    changes: list[Change] = field(default_factory=list)


def _ok(**payload: Any) -> dict[str, Any]:
    return {"ok": True, **payload}


def _strs(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str) or not all(isinstance(v, str) for v in value):
        raise TypeError(f"expected a list of strings, got {value!r}")
    return tuple(value)


def _epoch_guard(op: dict[str, Any], current: int) -> bool:
    """True when the op carries no `from_epoch` or carries the current one."""
    return op.get("from_epoch") is None or int(op["from_epoch"]) == current


# ---- peers -------------------------------------------------------------------------------------------------

def _peer_set(state: MetaState, op: dict[str, Any]) -> Applied:
    name = str(op["name"])
    rec = PeerRecord(name, _strs(op.get("tags")), str(op.get("zone", "")), bool(op.get("jetstream", True)))
    before = state.peers.get(name)
    if before == rec:
        return Applied(_ok(peer=record_dict(rec)))
    state.peers[name] = rec
    return Applied(_ok(peer=record_dict(rec)), [Change("peer", name, before, rec)])


# ---- streams -----------------------------------------------------------------------------------------------

def _stream_add(state: MetaState, op: dict[str, Any]) -> Applied:
    name = str(op["name"])
    config = copy.deepcopy(dict(op["config"]))
    existing = state.streams.get(name)
    if existing is not None:
        if existing.config == config:  # the same create again (a retried request): answer as before
            return Applied(_ok(stream=record_dict(existing), existed=True))
        return Applied(error_result("stream_name_exist"))
    rec = StreamRecord(
        name=name, config=config, leader=str(op["leader"]), standbys=_strs(op.get("standbys")), epoch=1,
        tags=_strs(op.get("tags")), created=str(op.get("created", "")), honoured=bool(op.get("honoured", True)),
    )
    state.streams[name] = rec
    return Applied(_ok(stream=record_dict(rec)), [Change("stream", name, None, rec)])


def _stream_update(state: MetaState, op: dict[str, Any]) -> Applied:
    name = str(op["name"])
    before = state.streams.get(name)
    if before is None:
        return Applied(error_result("stream_not_found"))
    if not _epoch_guard(op, before.epoch):
        return Applied(error_result("stale_epoch"))
    leader = str(op.get("leader", before.leader))
    rec = replace(
        before, config=copy.deepcopy(dict(op["config"])), leader=leader,
        standbys=_strs(op["standbys"]) if "standbys" in op else before.standbys,
        tags=_strs(op["tags"]) if "tags" in op else before.tags,
        honoured=bool(op.get("honoured", before.honoured)),
        epoch=before.epoch + (1 if leader != before.leader else 0),
    )
    if rec == before:
        return Applied(_ok(stream=record_dict(rec)))
    state.streams[name] = rec
    changes = [Change("stream", name, before, rec)]
    if leader != before.leader:
        changes += _consumers_follow(state, name, before.leader, leader)
    return Applied(_ok(stream=record_dict(rec)), changes)


def _stream_move(state: MetaState, op: dict[str, Any]) -> Applied:
    name = str(op["name"])
    before = state.streams.get(name)
    if before is None:
        return Applied(error_result("stream_not_found"))
    if int(op["from_epoch"]) != before.epoch:
        return Applied(error_result("stale_epoch"))
    leader = str(op["leader"])
    rec = replace(
        before, leader=leader, standbys=_strs(op.get("standbys")), epoch=before.epoch + 1,
        honoured=bool(op.get("honoured", True)),
    )
    state.streams[name] = rec
    changes = [Change("stream", name, before, rec)]
    changes += _consumers_follow(state, name, before.leader, leader)
    return Applied(_ok(stream=record_dict(rec)), changes)


def _consumers_follow(state: MetaState, stream: str, old: str, new: str) -> list[Change]:
    """Consumers live beside their stream's writer: the ones `old` owned move to `new`."""
    changes = []
    for cons in sorted(state.consumers_of(stream), key=lambda c: c.name):
        if cons.owner == old and old != new:
            moved = replace(cons, owner=new, epoch=cons.epoch + 1)
            state.consumers[cons.key] = moved
            changes.append(Change("consumer", cons.key, cons, moved))
    return changes


def _stream_delete(state: MetaState, op: dict[str, Any]) -> Applied:
    name = str(op["name"])
    before = state.streams.pop(name, None)
    if before is None:
        return Applied(error_result("stream_not_found"))
    changes = []
    for cons in sorted(state.consumers_of(name), key=lambda c: c.name):
        del state.consumers[cons.key]
        changes.append(Change("consumer", cons.key, cons, None))
    changes.append(Change("stream", name, before, None))
    return Applied(_ok(deleted=name), changes)


# ---- consumers ---------------------------------------------------------------------------------------------

def _consumer_add(state: MetaState, op: dict[str, Any]) -> Applied:
    stream, name = str(op["stream"]), str(op["name"])
    if stream not in state.streams:
        return Applied(error_result("stream_not_found"))
    key = consumer_key(stream, name)
    config = copy.deepcopy(dict(op["config"]))
    existing = state.consumers.get(key)
    if existing is not None:
        if existing.config == config:
            return Applied(_ok(consumer=record_dict(existing), existed=True))
        return Applied(error_result("consumer_exists"))
    rec = ConsumerRecord(stream, name, config, str(op["owner"]), 1, str(op.get("created", "")))
    state.consumers[key] = rec
    return Applied(_ok(consumer=record_dict(rec)), [Change("consumer", key, None, rec)])


def _consumer_move(state: MetaState, op: dict[str, Any]) -> Applied:
    key = consumer_key(str(op["stream"]), str(op["name"]))
    before = state.consumers.get(key)
    if before is None:
        return Applied(error_result("consumer_not_found"))
    if int(op["from_epoch"]) != before.epoch:
        return Applied(error_result("stale_epoch"))
    rec = replace(before, owner=str(op["owner"]), epoch=before.epoch + 1)
    state.consumers[key] = rec
    return Applied(_ok(consumer=record_dict(rec)), [Change("consumer", key, before, rec)])


def _consumer_delete(state: MetaState, op: dict[str, Any]) -> Applied:
    key = consumer_key(str(op["stream"]), str(op["name"]))
    before = state.consumers.pop(key, None)
    if before is None:
        return Applied(error_result("consumer_not_found"))
    return Applied(_ok(deleted=key), [Change("consumer", key, before, None)])


# ---- queue-group primaries and zone-router epochs ----------------------------------------------------------

def _queue_set(state: MetaState, op: dict[str, Any]) -> Applied:
    group = str(op["group"])
    before = state.queue_primaries.get(group)
    if before is not None and not _epoch_guard(op, before.epoch):
        return Applied(error_result("stale_epoch"))
    if before is None and op.get("from_epoch") not in (None, 0):
        return Applied(error_result("stale_epoch"))
    server = op.get("server")
    rec = QueuePrimary(
        group=group, server=None if server is None else str(server),
        epoch=1 if before is None else before.epoch + (1 if server != before.server else 0),
        candidates=_strs(op.get("candidates")), zone=str(op.get("zone", "")),
        honoured=bool(op.get("honoured", True)),
    )
    if rec == before:
        return Applied(_ok(queue=record_dict(rec)))
    state.queue_primaries[group] = rec
    return Applied(_ok(queue=record_dict(rec)), [Change("queue", group, before, rec)])


def _queue_delete(state: MetaState, op: dict[str, Any]) -> Applied:
    group = str(op["group"])
    before = state.queue_primaries.pop(group, None)
    if before is None:
        return Applied(error_result("bad_request", f"queue group {group} has no primary"))
    return Applied(_ok(deleted=group), [Change("queue", group, before, None)])


def _route_epoch(state: MetaState, op: dict[str, Any]) -> Applied:
    server = str(op["server"])
    existing = state.route_epochs.get(server)
    before = existing or RouteEpochs(server)
    values = {}
    for name in ("current", "fenced", "committed"):
        if op.get(name) is None:
            continue
        value = int(op[name])
        if value < getattr(before, name):
            return Applied(error_result("stale_epoch"))
        values[name] = value
    rec = replace(before, **values)
    if existing == rec:
        return Applied(_ok(route_epochs=record_dict(rec)))
    state.route_epochs[server] = rec
    return Applied(_ok(route_epochs=record_dict(rec)), [Change("route_epoch", server, existing, rec)])


APPLY: dict[str, Callable[[MetaState, dict[str, Any]], Applied]] = {
    "peer_set": _peer_set,
    "stream_add": _stream_add,
    "stream_update": _stream_update,
    "stream_move": _stream_move,
    "stream_delete": _stream_delete,
    "consumer_add": _consumer_add,
    "consumer_move": _consumer_move,
    "consumer_delete": _consumer_delete,
    "queue_set": _queue_set,
    "queue_delete": _queue_delete,
    "route_epoch": _route_epoch,
}


def apply_op(state: MetaState, op: Any) -> Applied:
    """Apply one operation. Never raises: a malformed or refused op returns an error result and leaves the
    state as it was (the same on every server, since every server sees the same bytes)."""
    if not isinstance(op, dict) or op.get("op") not in APPLY:
        kind = op.get("op") if isinstance(op, dict) else type(op).__name__
        return Applied(error_result("bad_request", f"unknown meta operation {kind!r}"))
    try:
        return APPLY[op["op"]](state, op)
    except (KeyError, TypeError, ValueError) as exc:
        return Applied(error_result("bad_request", f"malformed {op['op']} operation: {exc!r}"))


def diff_states(old: MetaState, new: MetaState) -> list[Change]:
    """The changes that turn `old` into `new` (after a snapshot replaced the state wholesale)."""
    changes: list[Change] = []
    for kind, attr in (("peer", "peers"), ("stream", "streams"), ("consumer", "consumers"),
                       ("queue", "queue_primaries"), ("route_epoch", "route_epochs")):
        before, after = getattr(old, attr), getattr(new, attr)
        for key in sorted(set(before) | set(after)):
            if before.get(key) != after.get(key):
                changes.append(Change(kind, key, before.get(key), after.get(key)))
    return changes
