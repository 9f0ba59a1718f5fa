"""The replicated state's apply functions, without Raft: results, changes, determinism, snapshots."""

from __future__ import annotations

import copy

import pytest

from zonebus.meta.state import (
    ConsumerRecord,
    MetaState,
    QueuePrimary,
    RouteEpochs,
    StreamRecord,
    apply_op,
    diff_states,
)

pytestmark = pytest.mark.timeout(10)

CFG = {"name": "ORDERS", "subjects": ["orders.>"], "num_replicas": 3}


def add_stream(state: MetaState, name: str = "ORDERS", leader: str = "a", standbys: tuple[str, ...] = ("b", "c"),
               config: dict | None = None) -> dict:
    return apply_op(state, {"op": "stream_add", "name": name, "config": config or {**CFG, "name": name},
                            "leader": leader, "standbys": list(standbys), "tags": ["az:z1"],
                            "created": "2026-01-01T00:00:00Z", "honoured": True}).result


def test_peer_set_records_tags_and_reports_a_change_only_when_different() -> None:
    state = MetaState()
    first = apply_op(state, {"op": "peer_set", "name": "a", "tags": ["az:z1"], "zone": "z1", "jetstream": True})
    again = apply_op(state, {"op": "peer_set", "name": "a", "tags": ["az:z1"], "zone": "z1", "jetstream": True})
    assert first.result["ok"] and [c.kind for c in first.changes] == ["peer"]
    assert again.changes == []
    assert state.peers["a"].tags == ("az:z1",) and state.peers["a"].zone == "z1"


def test_stream_add_then_same_config_is_idempotent_and_other_config_is_refused() -> None:
    state = MetaState()
    result = add_stream(state)
    assert result["stream"]["leader"] == "a" and result["stream"]["standbys"] == ["b", "c"]
    assert result["stream"]["epoch"] == 1
    assert add_stream(state)["existed"] is True
    clash = add_stream(state, config={**CFG, "subjects": ["other.>"]})
    assert clash == {"error": {"name": "stream_name_exist",
                               "description": "stream name already in use with a different configuration"}}
    assert state.streams["ORDERS"].config["subjects"] == ["orders.>"]


def test_stream_move_bumps_the_epoch_and_refuses_a_stale_epoch() -> None:
    state = MetaState()
    add_stream(state)
    moved = apply_op(state, {"op": "stream_move", "name": "ORDERS", "from_epoch": 1, "leader": "b",
                             "standbys": ["c", "a"], "honoured": True})
    assert moved.result["stream"]["leader"] == "b" and moved.result["stream"]["epoch"] == 2
    change = moved.changes[0]
    assert change.gained_leader("b") and change.lost_leader("a") and not change.gained_leader("c")
    stale = apply_op(state, {"op": "stream_move", "name": "ORDERS", "from_epoch": 1, "leader": "c",
                             "standbys": [], "honoured": True})
    assert stale.result["error"]["name"] == "stale_epoch" and stale.changes == []
    assert state.streams["ORDERS"] == StreamRecord("ORDERS", CFG, "b", ("c", "a"), 2, ("az:z1",),
                                                   "2026-01-01T00:00:00Z", True)


def test_consumers_follow_their_stream_leader_on_a_move() -> None:
    state = MetaState()
    add_stream(state)
    apply_op(state, {"op": "consumer_add", "stream": "ORDERS", "name": "C1", "config": {"durable_name": "C1"},
                     "owner": "a", "created": "t"})
    apply_op(state, {"op": "consumer_add", "stream": "ORDERS", "name": "C2", "config": {}, "owner": "c"})
    moved = apply_op(state, {"op": "stream_move", "name": "ORDERS", "from_epoch": 1, "leader": "b",
                             "standbys": ["c", "a"]})
    assert [(c.kind, c.key) for c in moved.changes] == [("stream", "ORDERS"), ("consumer", "ORDERS/C1")]
    assert state.consumers["ORDERS/C1"] == ConsumerRecord("ORDERS", "C1", {"durable_name": "C1"}, "b", 2, "t")
    assert state.consumers["ORDERS/C2"].owner == "c" and state.consumers["ORDERS/C2"].epoch == 1


def test_consumer_needs_its_stream_and_moves_by_epoch() -> None:
    state = MetaState()
    orphan = apply_op(state, {"op": "consumer_add", "stream": "NOPE", "name": "C", "config": {}, "owner": "a"})
    assert orphan.result["error"]["name"] == "stream_not_found"
    add_stream(state)
    apply_op(state, {"op": "consumer_add", "stream": "ORDERS", "name": "C", "config": {}, "owner": "a"})
    assert apply_op(state, {"op": "consumer_move", "stream": "ORDERS", "name": "C", "from_epoch": 1,
                            "owner": "b"}).result["consumer"]["epoch"] == 2
    assert apply_op(state, {"op": "consumer_move", "stream": "ORDERS", "name": "C", "from_epoch": 1,
                            "owner": "c"}).result["error"]["name"] == "stale_epoch"
    gone = apply_op(state, {"op": "consumer_delete", "stream": "ORDERS", "name": "C"})
    assert gone.result == {"ok": True, "deleted": "ORDERS/C"} and gone.changes[0].after is None


def test_stream_delete_removes_its_consumers_first() -> None:
    state = MetaState()
    add_stream(state)
    apply_op(state, {"op": "consumer_add", "stream": "ORDERS", "name": "C", "config": {}, "owner": "a"})
    deleted = apply_op(state, {"op": "stream_delete", "name": "ORDERS"})
    assert [(c.kind, c.key, c.after) for c in deleted.changes] == [("consumer", "ORDERS/C", None),
                                                                    ("stream", "ORDERS", None)]
    assert state.streams == {} and state.consumers == {}
    assert apply_op(state, {"op": "stream_delete", "name": "ORDERS"}).result["error"]["name"] == "stream_not_found"


def test_queue_primary_epochs_and_route_epochs_only_grow() -> None:
    state = MetaState()
    first = apply_op(state, {"op": "queue_set", "group": "orders.q", "server": "a", "candidates": ["a", "b"],
                             "zone": "z1", "from_epoch": 0})
    assert first.result["queue"]["epoch"] == 1
    moved = apply_op(state, {"op": "queue_set", "group": "orders.q", "server": "b", "candidates": ["a", "b"],
                             "zone": "z1", "from_epoch": 1})
    assert state.queue_primaries["orders.q"] == QueuePrimary("orders.q", "b", 2, ("a", "b"), "z1", True)
    assert moved.changes[0].gained_leader("b")
    assert apply_op(state, {"op": "queue_set", "group": "orders.q", "server": "a",
                            "from_epoch": 1}).result["error"]["name"] == "stale_epoch"

    assert apply_op(state, {"op": "route_epoch", "server": "a", "current": 3, "committed": 2}).result["ok"]
    assert apply_op(state, {"op": "route_epoch", "server": "a", "fenced": 2}).result["ok"]
    assert state.route_epochs["a"] == RouteEpochs("a", current=3, fenced=2, committed=2)
    assert apply_op(state, {"op": "route_epoch", "server": "a", "current": 2}).result["error"]["name"] == "stale_epoch"


def test_malformed_and_unknown_ops_are_refused_without_touching_state() -> None:
    state = MetaState()
    add_stream(state)
    before = state.to_dict()
    for op in [None, "x", {"op": "nope"}, {"op": "stream_move", "name": "ORDERS"},
               {"op": "stream_add", "name": "X", "config": {}, "leader": "a", "standbys": "b"}]:
        result = apply_op(state, op).result
        assert result["error"]["name"] == "bad_request", op
    assert state.to_dict() == before


def test_same_ops_give_the_same_state_and_a_dict_round_trip_keeps_it() -> None:
    ops = [
        {"op": "peer_set", "name": "a", "tags": ["az:z1"], "zone": "z1"},
        {"op": "stream_add", "name": "S", "config": {"num_replicas": 2}, "leader": "a", "standbys": ["b"],
         "tags": [], "created": "t"},
        {"op": "consumer_add", "stream": "S", "name": "C", "config": {"x": [1, 2]}, "owner": "a"},
        {"op": "stream_move", "name": "S", "from_epoch": 1, "leader": "b", "standbys": ["a"], "honoured": False},
        {"op": "queue_set", "group": "g", "server": None, "candidates": []},
        {"op": "route_epoch", "server": "b", "current": 1},
    ]
    one, two = MetaState(), MetaState()
    for op in ops:
        apply_op(one, copy.deepcopy(op))
        apply_op(two, copy.deepcopy(op))
    assert one.digest() == two.digest()
    restored = MetaState.from_dict(one.to_dict())
    assert restored == one and restored.digest() == one.digest()
    assert restored.streams["S"].honoured is False and restored.streams["S"].standbys == ("a",)


def test_diff_states_lists_what_a_snapshot_changed() -> None:
    old, new = MetaState(), MetaState()
    add_stream(old, "GONE")
    add_stream(new, "NEW", leader="c")
    apply_op(new, {"op": "peer_set", "name": "c"})
    changes = diff_states(old, new)
    assert [(c.kind, c.key, c.before is None, c.after is None) for c in changes] == [
        ("peer", "c", True, False), ("stream", "GONE", False, True), ("stream", "NEW", True, False)]
    assert changes[2].gained_leader("c")
