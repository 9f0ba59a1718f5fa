"""Cluster metadata on Raft (pysyncobj), carried over the server's own cluster links.

Modules: `state` (replicated records and their pure apply functions), `assign` (placement, request
resolution and failover decisions on the meta leader), `errors` (JetStream-shaped errors), `codec` (the
meta channel's wire format), `transport` (a pysyncobj Transport over link-layer callbacks), `membership`
(who is in the group), `raft` (the SyncObj, its timers and JSON snapshots) and `group` (`MetaGroup`, the
asyncio facade the server wires in).
"""

from zonebus.meta.assign import LiveView, PeerLiveness, place, plan_failover, resolve
from zonebus.meta.errors import MetaError, NoQuorum, NoSuitablePeers, NotLeader, Rejected
from zonebus.meta.group import MembershipError, MetaGroup
from zonebus.meta.membership import Membership, MembershipDecision, RoutePeer, decide_members, server_hash
from zonebus.meta.raft import MetaTiming
from zonebus.meta.state import (
    Change,
    ConsumerRecord,
    MetaState,
    PeerRecord,
    QueuePrimary,
    RouteEpochs,
    StreamRecord,
    apply_op,
)

__all__ = [
    "Change", "ConsumerRecord", "LiveView", "Membership", "MembershipDecision", "MembershipError", "MetaError",
    "MetaGroup", "MetaState", "MetaTiming", "NoQuorum", "NoSuitablePeers", "NotLeader", "PeerLiveness",
    "PeerRecord", "QueuePrimary", "Rejected", "RouteEpochs", "RoutePeer", "StreamRecord", "apply_op",
    "decide_members", "place", "plan_failover", "resolve", "server_hash",
]
