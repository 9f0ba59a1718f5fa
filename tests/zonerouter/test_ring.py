"""The main/proxy mapping's math (ring, bounded loads, view) and the router's record codecs: pure unit tests."""

from __future__ import annotations

import math

import pytest

from zonebus.store import routerbatch as batch
from zonebus.zonerouter.records import (
    BatchAnswer,
    Handoff,
    LinkRecord,
    RecordError,
    answer_entries,
    kind_of,
)
from zonebus.zonerouter.ring import MIN_VNODES, Ring, assign, mapping
from zonebus.zonerouter.view import derive


def test_ring_needs_enough_virtual_nodes() -> None:
    with pytest.raises(ValueError, match="at least 8"):
        Ring(["a"], vnodes=MIN_VNODES - 1)
    ring = Ring(["a", "b"], vnodes=MIN_VNODES)
    assert len(ring._keys) == 2 * MIN_VNODES


@pytest.mark.parametrize("n_zone,n_foreign", [(1, 5), (2, 3), (3, 7), (4, 4), (5, 23), (3, 0)])
def test_assign_bounds_loads_to_ceil_average(n_zone: int, n_foreign: int) -> None:
    ring = Ring([f"z{i}" for i in range(n_zone)])
    foreign = [f"f{i}" for i in range(n_foreign)]
    out = assign(ring, foreign)
    assert set(out) == set(foreign)
    assert set(out.values()) <= set(ring.servers)
    if foreign:
        cap = math.ceil(n_foreign / n_zone)
        loads = [list(out.values()).count(s) for s in ring.servers]
        assert max(loads) <= cap


def test_assign_is_deterministic_and_stable_when_a_server_leaves() -> None:
    zone = [f"a{i}" for i in range(4)]
    foreign = [f"b{i}" for i in range(40)]
    first = assign(Ring(zone), foreign)
    assert first == assign(Ring(list(reversed(zone))), list(reversed(foreign)))
    after = assign(Ring(zone[:3]), foreign)
    assert all(p != "a3" for p in after.values())
    kept = sum(1 for f in foreign if first[f] != "a3" and after[f] == first[f])
    assert kept >= len([f for f in foreign if first[f] != "a3"]) // 2  # consistent hashing: most stay


def test_mapping_covers_every_other_zone() -> None:
    m = mapping({"z1": ["a1", "a2"], "z2": ["b1"], "z3": ["c1"]})
    assert set(m) == {"z1", "z2", "z3"}
    assert set(m["z1"]) == {"b1", "c1"} and sorted(m["z1"].values()) == ["a1", "a2"]  # cap 1 each
    assert m["z2"] == {"a1": "b1", "a2": "b1", "c1": "b1"}


def test_view_leaves_out_fenced_leaving_and_unzoned() -> None:
    zones = {"a1": "z1", "a2": "z1", "b1": "z2", "b2": "z2", "c1": "z3"}
    view = derive([*zones, "x"], zones, lambda n: n != "b2", leaving={"a2"})
    assert view.left_out == {"a2": "shutting down", "b2": "fenced", "x": "no zone"}
    assert view.zones == {"z1": ("a1",), "z2": ("b1",), "z3": ("c1",)}
    assert view.proxy("z1", "b1") == "a1" and view.proxy("z2", "c1") == "b1"
    assert view.proxy("z1", "b2") is None and view.zone_of("c1") == "z3"
    assert view.to_dict()["proxies"]["z3"] == {"a1": "c1", "b1": "c1"}


def test_records_round_trip_and_stay_small() -> None:
    rec = LinkRecord(b"12345678", 7, 3, 123456789, 100)
    frame = rec.encode()
    assert len(frame) == 36 and kind_of(frame) == 1
    assert LinkRecord.decode(frame) == rec
    outcomes = [("ok", 10 + i) for i in range(100)] + [("dup", 5), ("err", b'{"error":{}}'), ("ok", 111)]
    ans = BatchAnswer(b"12345678", 7, answer_entries(outcomes))
    assert len(ans.entries) == 4
    back = BatchAnswer.decode(ans.encode())
    assert back.outcomes() == outcomes
    assert len(BatchAnswer(b"12345678", 7, answer_entries(outcomes[:100])).encode()) < 40
    h = Handoff("b1", "S", "orders.1", "_INBOX.x", b"NATS/1.0\r\n\r\n", b"payload")
    assert Handoff.decode(h.encode()) == h
    with pytest.raises(RecordError):
        kind_of(b"XX\x01\x01")
    with pytest.raises(RecordError):
        Handoff.decode(h.encode()[:-1])


def test_batch_objects_round_trip() -> None:
    msgs = [batch.Message("S", f"s.{i}", b"" if i % 2 else b"NATS/1.0\r\nA: b\r\n\r\n", bytes([i]) * i)
            for i in range(20)]
    assert batch.decode(batch.encode(msgs)) == msgs
    with pytest.raises(batch.BatchFormatError):
        batch.decode(batch.encode(msgs)[:-3])
    with pytest.raises(batch.BatchFormatError):
        batch.decode(b"nope" + bytes(8))
