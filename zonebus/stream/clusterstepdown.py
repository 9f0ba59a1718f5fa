"""Leader stepdowns in a JetStream cluster (a mixin of `ClusteredJetStream`).

META.LEADER.STEPDOWN steps the meta group's leader down; STREAM.LEADER.STEPDOWN is proposed to the meta group.
CONSUMER.LEADER.STEPDOWN: a consumer lives beside its stream's writer (no Raft group of its own), so stepping it
down moves the stream, with its consumers, to a standby (`placement` picks, by nats-server's rules for a
preferred server, a cluster and tags). The stream's leader answers as nats-server does: `success` for an R1
stream or a `num_replicas: 1` consumer, else placement errors (10005, 10025). A leaf remote's
`jetstream_cluster_migrate` (zonebus.leaf.jsmigrate) makes this server an observer (`set_observer`): it hands
every replicated stream it leads, or gains, to a live standby (an epoch-guarded move). Runs on the event loop.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from zonebus.meta import MetaError, NoQuorum
from zonebus.meta.assign import matches
from zonebus.meta.state import StreamRecord
from zonebus.protocol.jserrors import JSError
from zonebus.stream.api import error_json, reply_json
from zonebus.stream.clusterlists import PROPOSE_TIMEOUT

if TYPE_CHECKING:
    from zonebus.stream.cluster import ClusteredJetStream

CONSUMER_STEPDOWN = ["CONSUMER", "LEADER", "STEPDOWN"]


def _stepdown_placement(payload: bytes) -> dict[str, Any] | None:
    """The `placement` of a leader stepdown request; a body that is not a JSON object or array is ignored (as
    nats-server does), a malformed one is 10025."""
    body = payload.strip()
    if not body or body[:1] not in (b"{", b"["):
        return None
    try:
        req = json.loads(body)
    except ValueError as exc:
        raise JSError("invalid_json", err=str(exc))
    if not isinstance(req, dict):
        raise JSError("invalid_json", err="cannot unmarshal array into a stepdown request")
    placement = req.get("placement")
    if placement is None:
        return None
    ok = isinstance(placement, dict) and all(isinstance(placement.get(k, ""), str) for k in ("cluster", "preferred"))
    tags = placement.get("tags") if isinstance(placement, dict) else None
    if not ok or not (tags is None or isinstance(tags, list) and all(isinstance(t, str) for t in tags)):
        raise JSError("invalid_json", err="placement: wrong types")
    return placement

class Stepdowns:
    """Stream, consumer and meta leader stepdowns, mixed into `ClusteredJetStream`."""

    async def _stream_stepdown(self: ClusteredJetStream, name: str, reply: str) -> None:
        kind = "stream_leader_stepdown_response"
        try:
            await self._propose({"op": "stream_stepdown", "name": name})
        except (JSError, MetaError) as err:
            self.svc.send(reply, error_json(kind, err))
            return
        self.svc.send(reply, reply_json(kind, {"success": True}))

    async def _consumer_stepdown(self: ClusteredJetStream, name: str, consumer: str, payload: bytes,
                                 reply: str) -> None:
        """On the stream's leader: step the consumer's leader (this server, the stream's writer) down."""
        kind = "consumer_leader_stepdown_response"
        try:
            stream = self.svc.streams.get(name)
            rec = self.meta.state.streams.get(name) if self.meta is not None else None
            if stream is None or rec is None:
                raise JSError("stream_not_found")
            cons = stream.consumers.get(consumer)
            if cons is None:
                raise JSError("consumer_not_found")
            if not rec.standbys or cons.cfg.get("num_replicas") == 1:
                self.svc.send(reply, reply_json(kind, {"success": True}))  # no group to hand over to: nothing moves
                return
            target = self._stepdown_target(rec, _stepdown_placement(payload))
            if target is not None:
                standbys = [s for s in rec.standbys if s != target] + [rec.leader]
                honoured = matches(self.meta.state.peers.get(target), rec.tags) if self.meta is not None else True
                await self._propose({"op": "stream_move", "name": name, "from_epoch": rec.epoch, "leader": target,
                                     "standbys": standbys, "honoured": honoured})
        except (JSError, MetaError) as err:
            self.svc.send(reply, error_json(kind, err))
            return
        self.svc.send(reply, reply_json(kind, {"success": True}))

    def _stepdown_target(self: ClusteredJetStream, rec: StreamRecord, placement: dict[str, Any] | None) -> str | None:
        """The standby a stepdown hands `rec` to (nats-server's rules for a preferred placement); None when no
        standby is live and nothing was asked for (nats-server's leader then just stays)."""
        assert self.meta is not None
        live = self.meta.live_view()
        preferred = placement.get("preferred") if placement else ""
        if preferred:
            if preferred == rec.leader:
                raise MetaError("cluster_no_peers", err=f'preferred server "{preferred}" is already leader')
            if preferred not in rec.standbys:
                raise MetaError("cluster_no_peers", err=f'preferred server "{preferred}" not known')
            if live.is_live(preferred):
                return preferred
            placement = None  # (nats-server then steps down to any current peer)
        candidates = [s for s in rec.standbys if live.is_live(s)]
        if placement is not None:
            if placement.get("cluster") and placement["cluster"] != self.cluster.opts.name:
                candidates = []
            tags = placement.get("tags") or ()
            candidates = [s for s in candidates if matches(self.meta.state.peers.get(s), tags)]
            if not candidates:
                raise MetaError("cluster_no_peers", err="no replacement peer connected")
        return candidates[0] if candidates else None

    # -- a leaf remote's jetstream_cluster_migrate (zonebus.leaf.jsmigrate) ----------------------------------
    def set_observer(self: ClusteredJetStream, on: bool) -> None:
        """While on, this server leads none of this account's replicated streams: each one it leads now, and
        each one it gains later (`_on_change`), moves to a live standby, as nats-server's stepdown and Raft
        observer state. A stream with no live standby stays (nats-server's would be left without a leader)."""
        if on != self.observer:
            what = "leads no replicated stream (a leafnode remote is down: jetstream_cluster_migrate)" if on \
                else "may lead replicated streams again (the leafnode remote is up)"
            self.server.log(f"JetStream{' account ' + self.account_name if self.account_name else ''}: {what}")
        self.observer = on
        if on and self.meta is not None:
            for name, rec in list(self.meta.state.streams.items()):
                self.observer_stepdown(name, rec)

    def observer_stepdown(self: ClusteredJetStream, name: str, rec: StreamRecord) -> None:
        if not self.observer or rec.leader != self.name or not rec.standbys or self.meta is None:
            return
        target = self._stepdown_target(rec, None)
        if target is None:
            return
        standbys = [s for s in rec.standbys if s != target] + [rec.leader]
        honoured = matches(self.meta.state.peers.get(target), rec.tags)
        self._spawn(self._propose_quietly({"op": "stream_move", "name": name, "from_epoch": rec.epoch,
                                           "leader": target, "standbys": standbys, "honoured": honoured}))

    async def _propose_quietly(self: ClusteredJetStream, request: dict[str, Any]) -> None:
        try:
            await self._propose(request)
        except (JSError, MetaError) as err:  # (an epoch that moved on meanwhile, no quorum: the next look retries)
            self.server.log(f"JetStream: stepping {request.get('name')} down failed: {err}", "WRN")

    async def _meta_stepdown(self: ClusteredJetStream, reply: str) -> None:
        kind = "meta_leader_stepdown_response"
        try:
            if self.meta is None:
                raise NoQuorum("meta group not formed")
            await self.meta.stepdown(PROPOSE_TIMEOUT)
        except (JSError, MetaError) as err:
            self.svc.send(reply, error_json(kind, err))
            return
        self.svc.send(reply, reply_json(kind, {"success": True}))
