"""Placement, request resolution and the failover policy, as pure functions (no Raft, no clock)."""

from __future__ import annotations

import pytest

from zonebus.meta.assign import LiveView, PeerLiveness, place, plan_failover, resolve
from zonebus.meta.errors import NoSuitablePeers, Rejected
from zonebus.meta.state import MetaState, apply_op

pytestmark = pytest.mark.timeout(10)

TAGS = {"a": ["az:z1", "ssd"], "b": ["az:z2", "ssd"], "c": ["az:z3"], "d": ["az:z1"]}


def cluster(names: str = "abcd") -> MetaState:
    state = MetaState()
    for name in names:
        apply_op(state, {"op": "peer_set", "name": name, "tags": TAGS[name], "zone": TAGS[name][0][3:]})
    return state


def view(live: str, now: float = 100.0, dead_since: float = 90.0, live_since: float = 0.0,
         self_name: str = "a") -> LiveView:
    """Every server in `live` reachable since `live_since`; the others last seen at `dead_since`."""
    peers = {n: PeerLiveness(True, now, live_since) if n in live else PeerLiveness(False, dead_since, None)
             for n in "abcd" if n != self_name}
    return LiveView(now, self_name, peers, baseline=0.0)


def add(state: MetaState, name: str, leader: str, standbys: list[str], tags: list[str] = (),
        honoured: bool = True) -> None:
    apply_op(state, {"op": "stream_add", "name": name, "config": {"name": name}, "leader": leader,
                     "standbys": standbys, "tags": list(tags), "created": "t", "honoured": honoured})


def test_placement_takes_servers_carrying_every_tag() -> None:
    state = cluster()
    assert place(state, view("abcd"), 1, ["az:z2"]) == ["b"]
    assert place(state, view("abcd"), 2, ["ssd"]) == ["a", "b"]
    assert sorted(place(state, view("abcd"), 2, ["az:z1"])) == ["a", "d"]


def test_placement_error_has_nats_server_wording() -> None:
    state = cluster()
    with pytest.raises(NoSuitablePeers) as info:
        place(state, view("abcd"), 1, ["az:z9"])
    assert info.value.err_code == 10005 and info.value.code == 400
    assert info.value.description == "no suitable peers for placement, tags not matched ['az:z9']"
    with pytest.raises(NoSuitablePeers) as info:
        place(state, view("a"), 3, ["ssd"])
    assert info.value.description == "no suitable peers for placement, peer offline, tags not matched ['ssd']"
    with pytest.raises(NoSuitablePeers) as info:
        place(MetaState(), view("a"), 1, [])
    assert info.value.description == "no suitable peers for placement, jetstream not enabled in cluster"


def test_placement_spreads_leaders_over_the_least_loaded() -> None:
    state = cluster()
    add(state, "S1", "a", ["b"])
    add(state, "S2", "b", ["a"])
    assert place(state, view("abcd"), 1, []) == ["c"]
    add(state, "S3", "c", [])
    assert place(state, view("abcd"), 2, []) == ["d", "c"]


def test_stream_create_resolves_to_an_assignment_and_repeats_answer_the_same() -> None:
    state = cluster()
    cfg = {"name": "S", "num_replicas": 3, "placement": {"tags": ["az:z1"]}}
    with pytest.raises(NoSuitablePeers):
        resolve(state, view("abcd"), {"op": "stream_create", "name": "S", "config": cfg}, "t")
    cfg["num_replicas"] = 2
    op = resolve(state, view("abcd"), {"op": "stream_create", "name": "S", "config": cfg}, "2026-01-01T00:00:00Z")
    assert op == {"op": "stream_add", "name": "S", "config": cfg, "leader": "a", "standbys": ["d"],
                  "tags": ["az:z1"], "created": "2026-01-01T00:00:00Z", "honoured": True}
    apply_op(state, op)
    again = resolve(state, view("abcd"), {"op": "stream_create", "name": "S", "config": cfg}, "later")
    assert (again["leader"], again["standbys"]) == ("a", ["d"])
    with pytest.raises(Rejected) as info:
        resolve(state, view("abcd"), {"op": "stream_create", "name": "S", "config": {"num_replicas": 1}}, "t")
    assert info.value.err_code == 10058


def test_stepdown_moves_to_a_live_standby() -> None:
    state = cluster()
    add(state, "S", "a", ["b", "c"])
    op = resolve(state, view("ac"), {"op": "stream_stepdown", "name": "S"}, "t")
    assert op == {"op": "stream_move", "name": "S", "from_epoch": 1, "leader": "c", "standbys": ["b", "a"],
                  "honoured": True}


def test_consumer_create_is_owned_by_the_stream_leader() -> None:
    state = cluster()
    add(state, "S", "b", ["a"])
    op = resolve(state, view("abcd"), {"op": "consumer_create", "stream": "S", "name": "C", "config": {}}, "t")
    assert op["op"] == "consumer_add" and op["owner"] == "b"
    with pytest.raises(Rejected) as info:
        resolve(state, view("abcd"), {"op": "consumer_create", "stream": "X", "name": "C", "config": {}}, "t")
    assert info.value.err_code == 10059


def test_nothing_moves_before_the_failover_timeout() -> None:
    state = cluster()
    add(state, "S", "b", ["c"])
    assert plan_failover(state, view("acd", dead_since=97.0), timeout=5.0) == []
    assert plan_failover(state, view("abcd"), timeout=5.0) == []


def test_a_dead_leader_is_replaced_by_a_live_standby() -> None:
    state = cluster()
    add(state, "S", "b", ["c", "d"])
    ops = plan_failover(state, view("ad", dead_since=94.0), timeout=5.0)
    assert ops == [{"op": "stream_move", "name": "S", "from_epoch": 1, "leader": "d", "standbys": ["c", "b"],
                    "honoured": True}]


def test_without_a_live_standby_a_tag_matching_server_takes_over() -> None:
    state = cluster()
    add(state, "S", "a", ["c"], tags=["az:z1"])
    ops = plan_failover(state, view("bd", self_name="b"), timeout=5.0)
    assert ops == [{"op": "stream_move", "name": "S", "from_epoch": 1, "leader": "d", "standbys": ["c"],
                    "honoured": True}]


def test_else_any_live_server_takes_over_flagged_and_the_stream_goes_home_later() -> None:
    state = cluster()
    add(state, "S", "b", [], tags=["az:z2"])
    ops = plan_failover(state, view("acd"), timeout=5.0)
    assert ops == [{"op": "stream_move", "name": "S", "from_epoch": 1, "leader": "a", "standbys": [],
                    "honoured": False}]
    apply_op(state, ops[0])
    # b is back but only for 2 s: the stream stays; after 5 s it returns to b.
    assert plan_failover(state, view("abcd", live_since=98.0), timeout=5.0) == []
    home = plan_failover(state, view("abcd", live_since=90.0), timeout=5.0)
    assert home == [{"op": "stream_move", "name": "S", "from_epoch": 2, "leader": "b", "standbys": [],
                     "honoured": True}]


def test_no_live_server_means_no_move() -> None:
    state = cluster("ab")
    add(state, "S", "b", [])
    only_a = LiveView(100.0, "a", {"b": PeerLiveness(False, 10.0)}, baseline=0.0)
    state.peers.pop("a")
    assert plan_failover(state, only_a, timeout=5.0) == []


def test_a_peer_never_seen_counts_from_the_baseline() -> None:
    state = cluster()
    add(state, "S", "b", ["c"])
    fresh = LiveView(100.0, "a", {"b": PeerLiveness(False, None), "c": PeerLiveness(True, 100.0, 99.0)},
                     baseline=97.0)
    assert plan_failover(state, fresh, timeout=5.0) == []
    fresh.now = 102.5
    assert plan_failover(state, fresh, timeout=5.0)[0]["leader"] == "c"


def test_orphaned_consumers_and_queue_primaries_move() -> None:
    state = cluster()
    add(state, "S", "a", ["b"])
    apply_op(state, {"op": "consumer_add", "stream": "S", "name": "OWNED_BY_C", "config": {}, "owner": "c"})
    apply_op(state, {"op": "consumer_add", "stream": "S", "name": "WITH_LEADER", "config": {}, "owner": "a"})
    apply_op(state, {"op": "queue_set", "group": "q", "server": "c", "candidates": ["b", "c", "d"], "zone": "z1"})
    ops = plan_failover(state, view("abd"), timeout=5.0)
    assert ops == [
        {"op": "consumer_move", "stream": "S", "name": "OWNED_BY_C", "from_epoch": 1, "owner": "a"},
        {"op": "queue_set", "group": "q", "server": "d", "candidates": ["b", "c", "d"], "zone": "z1",
         "honoured": True, "from_epoch": 1},
    ]


def test_a_moving_stream_takes_its_consumers_along_in_one_op() -> None:
    state = cluster()
    add(state, "S", "b", ["c"])
    apply_op(state, {"op": "consumer_add", "stream": "S", "name": "C", "config": {}, "owner": "b"})
    ops = plan_failover(state, view("acd"), timeout=5.0)
    assert [op["op"] for op in ops] == ["stream_move"]
    apply_op(state, ops[0])
    assert state.consumers["S/C"].owner == "c" and state.consumers["S/C"].epoch == 2
