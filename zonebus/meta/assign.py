"""Decisions the meta leader takes before proposing: placement, request resolution, failover (pure functions).

Nothing here touches Raft or the network. Inputs are the replicated `MetaState` and a `LiveView` (which
servers the meta leader can reach now, and since when); outputs are concrete operations for `state.apply_op`
or a `MetaError`.

Placement follows nats-server: a stream with `num_replicas: R` and `placement {tags}` goes to R live
JetStream servers whose tags include *every* placement tag; too few gives 10005 "no suitable peers for
placement" with nats-server's reasons (", peer offline", ", tags not matched ['az:z9']"). The least-loaded
candidate leads, the next ones are standbys.

Failover: a server unreachable for `failover_timeout` loses what it led. A stream goes to its first live
standby (writer epoch + 1), else to a live server carrying the placement tags, else to any live server with
`honoured: False` (shown by /jsz); once a tag-matching server has been live for `failover_timeout`, such a
stream moves back to it. Consumers follow their stream's leader; queue-group primaries go to a live candidate
in the same zone, else any live candidate, else any live server (`honoured: False`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from zonebus.meta.errors import NoSuitablePeers, Rejected
from zonebus.meta.state import MetaState, PeerRecord, StreamRecord


@dataclass(frozen=True)
class PeerLiveness:
    live: bool
    last_seen: float | None = None  # monotonic time of the last frame (None: never heard from)
    live_since: float | None = None  # monotonic time the current live period began


@dataclass
class LiveView:
    """Who the deciding server can reach. `baseline`: when it started watching; a peer never heard from
    counts as last seen then, so a freshly started leader does not move streams of servers still dialling."""

    now: float
    self_name: str
    peers: dict[str, PeerLiveness] = field(default_factory=dict)
    baseline: float = 0.0

    def is_live(self, name: str) -> bool:
        if name == self.self_name:
            return True
        info = self.peers.get(name)
        return bool(info and info.live)

    def dead_for(self, name: str) -> float:
        """Seconds since `name` was last reachable (0 while it is)."""
        if self.is_live(name):
            return 0.0
        info = self.peers.get(name)
        seen = info.last_seen if info and info.last_seen is not None else self.baseline
        return max(0.0, self.now - max(seen, self.baseline))

    def live_for(self, name: str) -> float:
        if name == self.self_name:
            return self.now - self.baseline
        info = self.peers.get(name)
        if not info or not info.live:
            return 0.0
        since = info.live_since if info.live_since is not None else self.now
        return max(0.0, self.now - since)


def stream_replicas(config: dict[str, Any]) -> int:
    return max(1, int(config.get("num_replicas") or 1))


def placement_tags(config: dict[str, Any]) -> tuple[str, ...]:
    placement = config.get("placement") or {}
    return tuple(str(t) for t in (placement.get("tags") or ()))


def matches(peer: PeerRecord | None, tags: Iterable[str]) -> bool:
    return peer is not None and peer.jetstream and set(tags) <= set(peer.tags)


def _loads(state: MetaState) -> tuple[Counter[str], Counter[str]]:
    led: Counter[str] = Counter(s.leader for s in state.streams.values())
    held: Counter[str] = Counter(r for s in state.streams.values() for r in s.replicas)
    return led, held


def place(state: MetaState, view: LiveView, replicas: int, tags: Sequence[str],
          exclude: Iterable[str] = ()) -> list[str]:
    """`replicas` live servers carrying every tag, least loaded first; NoSuitablePeers when too few."""
    excluded = set(exclude)
    js_peers = [p for p in state.peers.values() if p.jetstream and p.name not in excluded]
    matching = [p for p in js_peers if matches(p, tags)]
    live = [p for p in matching if view.is_live(p.name)]
    if len(live) < replicas:
        reasons = []
        if len(matching) > len(live):
            reasons.append("peer offline")
        missing = sorted({t for p in js_peers for t in tags if t not in p.tags})
        if missing:
            reasons.append("tags not matched [" + ", ".join(f"'{t}'" for t in missing) + "]")
        if not js_peers:
            reasons.append("jetstream not enabled in cluster")
        raise NoSuitablePeers(reasons)
    led, held = _loads(state)
    first = min(live, key=lambda p: (led[p.name], held[p.name], p.name))
    rest = sorted((p for p in live if p is not first), key=lambda p: (held[p.name], p.name))
    return [first.name] + [p.name for p in rest[: replicas - 1]]


# ---- requests resolved on the meta leader ------------------------------------------------------------------

PASSTHROUGH = {
    "peer_set", "stream_add", "stream_move", "stream_delete", "consumer_add",
    "consumer_move", "consumer_delete", "queue_set", "queue_delete", "route_epoch",
}


def resolve(state: MetaState, view: LiveView, request: dict[str, Any], created: str) -> dict[str, Any]:
    """Turn a request into the concrete operation to propose. `created` stamps new records (the leader's
    wall clock, so that the replicated value is the same everywhere)."""
    kind = request.get("op")
    if kind == "stream_create":
        return _stream_create(state, view, request, created)
    if kind == "stream_update":
        return _stream_update(state, view, request)
    if kind == "stream_stepdown":
        return _stream_stepdown(state, view, str(request["name"]))
    if kind == "consumer_create":
        return _consumer_create(state, request, created)
    if kind == "queue_primary":
        return _queue_primary(state, view, request)
    if kind in PASSTHROUGH:
        return dict(request)
    raise Rejected("bad_request", f"unknown meta request {kind!r}")


def _stream_create(state: MetaState, view: LiveView, req: dict[str, Any], created: str) -> dict[str, Any]:
    name, config = str(req["name"]), dict(req["config"])
    existing = state.streams.get(name)
    if existing is not None:
        if existing.config != config:
            raise Rejected("stream_name_exist")
        chosen, tags = list(existing.replicas), existing.tags
    else:
        tags = placement_tags(config)
        chosen = place(state, view, stream_replicas(config), tags)
    return {"op": "stream_add", "name": name, "config": config, "leader": chosen[0], "standbys": chosen[1:],
            "tags": list(tags), "created": created, "honoured": True}


def _stream_update(state: MetaState, view: LiveView, req: dict[str, Any]) -> dict[str, Any]:
    name, config = str(req["name"]), dict(req["config"])
    rec = state.streams.get(name)
    if rec is None:
        raise Rejected("stream_not_found")
    replicas, tags = stream_replicas(config), placement_tags(config)
    op: dict[str, Any] = {"op": "stream_update", "name": name, "config": config}
    if replicas == len(rec.replicas) and tags == rec.tags:
        return op
    keep = [s for s in rec.replicas if view.is_live(s) and matches(state.peers.get(s), tags)][:replicas]
    if len(keep) < replicas:
        keep += place(state, view, replicas - len(keep), tags, exclude=keep)
    op.update(leader=keep[0], standbys=keep[1:], tags=list(tags), honoured=True, from_epoch=rec.epoch)
    return op


def _stream_stepdown(state: MetaState, view: LiveView, name: str) -> dict[str, Any]:
    rec = state.streams.get(name)
    if rec is None:
        raise Rejected("stream_not_found")
    target = _takeover(state, view, rec, allow_unhonoured=False)
    if target is None:
        raise NoSuitablePeers(["peer offline"])
    leader, standbys, honoured = target
    return {"op": "stream_move", "name": name, "from_epoch": rec.epoch, "leader": leader,
            "standbys": standbys, "honoured": honoured}


def _consumer_create(state: MetaState, req: dict[str, Any], created: str) -> dict[str, Any]:
    stream = state.streams.get(str(req["stream"]))
    if stream is None:
        raise Rejected("stream_not_found")
    return {"op": "consumer_add", "stream": stream.name, "name": str(req["name"]), "config": dict(req["config"]),
            "owner": stream.leader, "created": created}


def _queue_primary(state: MetaState, view: LiveView, req: dict[str, Any]) -> dict[str, Any]:
    group = str(req["group"])
    candidates = [str(c) for c in req.get("candidates") or ()]
    zone = str(req.get("zone", ""))
    server = req.get("server")
    honoured = True
    before = state.queue_primaries.get(group)
    if server is None and before is not None and before.server is not None and view.is_live(before.server):
        # an election that finds a live primary (several servers ask at once at start) keeps it
        return {"op": "queue_set", "group": group, "server": before.server, "candidates": list(before.candidates),
                "zone": before.zone, "honoured": before.honoured, "from_epoch": before.epoch}
    if server is None:
        picked = _pick_queue_server(state, view, candidates, zone)
        if picked is None:
            raise NoSuitablePeers(["peer offline"])
        server, honoured = picked
    return {"op": "queue_set", "group": group, "server": server, "candidates": candidates, "zone": zone,
            "honoured": honoured, "from_epoch": before.epoch if before else 0}


# ---- failover ----------------------------------------------------------------------------------------------

def _takeover(state: MetaState, view: LiveView, rec: StreamRecord,
              allow_unhonoured: bool = True) -> tuple[str, list[str], bool] | None:
    """Who takes `rec` over from its leader: (leader, standbys, honoured), or None when nobody can."""
    for s in rec.standbys:
        if view.is_live(s) and s != rec.leader:
            standbys = [x for x in rec.standbys if x != s] + [rec.leader]
            return s, standbys, matches(state.peers.get(s), rec.tags)
    led, held = _loads(state)
    outsiders = [p for p in state.peers.values()
                 if p.jetstream and p.name not in rec.replicas and view.is_live(p.name)]
    outsiders.sort(key=lambda p: (led[p.name], held[p.name], p.name))
    for p in outsiders:
        if matches(p, rec.tags):
            return p.name, list(rec.standbys), True
    if allow_unhonoured and outsiders:
        return outsiders[0].name, list(rec.standbys), False
    return None


def _restore(state: MetaState, view: LiveView, rec: StreamRecord, timeout: float) -> str | None:
    """A tag-matching server, live for `timeout`, to take back a stream whose placement is not honoured."""
    candidates = [p for p in state.peers.values()
                  if matches(p, rec.tags) and view.is_live(p.name) and view.live_for(p.name) >= timeout]
    if not candidates:
        return None
    led, held = _loads(state)
    candidates.sort(key=lambda p: (p.name not in rec.standbys, led[p.name], p.name))
    return candidates[0].name


def _pick_queue_server(state: MetaState, view: LiveView, candidates: Sequence[str],
                       zone: str) -> tuple[str, bool] | None:
    live = [c for c in candidates if view.is_live(c)]
    in_zone = [c for c in live if zone and (p := state.peers.get(c)) is not None and p.zone == zone]
    if in_zone:
        return sorted(in_zone)[0], True
    if live:
        return sorted(live)[0], True
    others = sorted(p.name for p in state.peers.values() if p.jetstream and view.is_live(p.name))
    return (others[0], False) if others else None


def plan_failover(state: MetaState, view: LiveView, timeout: float) -> list[dict[str, Any]]:
    """The epoch-guarded moves the meta leader should propose now (empty when nothing is due)."""

    def dead(name: str | None) -> bool:
        return name is not None and not view.is_live(name) and view.dead_for(name) >= timeout

    ops: list[dict[str, Any]] = []
    new_leader: dict[str, str] = {}
    for name in sorted(state.streams):
        rec = state.streams[name]
        move: tuple[str, list[str], bool] | None = None
        if dead(rec.leader):
            move = _takeover(state, view, rec)
        elif not rec.honoured and view.is_live(rec.leader):
            target = _restore(state, view, rec, timeout)
            if target is not None and target != rec.leader:
                standbys = [s for s in rec.standbys if s != target]
                if len(standbys) + 1 < len(rec.replicas):
                    standbys.append(rec.leader)
                move = (target, standbys, True)
        if move is not None:
            leader, standbys, honoured = move
            new_leader[name] = leader
            ops.append({"op": "stream_move", "name": name, "from_epoch": rec.epoch, "leader": leader,
                        "standbys": standbys, "honoured": honoured})
    for key in sorted(state.consumers):
        cons = state.consumers[key]
        stream = state.streams.get(cons.stream)
        if stream is None or not dead(cons.owner):
            continue
        if cons.stream in new_leader and cons.owner == stream.leader:
            continue  # the stream's move takes its consumers along
        target = new_leader.get(cons.stream, stream.leader)
        if target != cons.owner and view.is_live(target):
            ops.append({"op": "consumer_move", "stream": cons.stream, "name": cons.name,
                        "from_epoch": cons.epoch, "owner": target})
    for group in sorted(state.queue_primaries):
        q = state.queue_primaries[group]
        if not dead(q.server):
            continue
        picked = _pick_queue_server(state, view, [c for c in q.candidates if c != q.server], q.zone)
        if picked is not None:
            ops.append({"op": "queue_set", "group": group, "server": picked[0], "candidates": list(q.candidates),
                        "zone": q.zone, "honoured": picked[1], "from_epoch": q.epoch})
    return ops
