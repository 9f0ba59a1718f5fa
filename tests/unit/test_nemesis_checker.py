"""The campaign checker (`zonebus.testing.nemesis`): Jepsen's queue checker over publisher histories, lost values
split into prefix, middle and postfix per writer, zones that read different logs, and unavailability windows."""

from __future__ import annotations

import pytest

from zonebus.testing.faultload import FaultPublisher
from zonebus.testing.nemesis import queue_check, unavailable

pytestmark = pytest.mark.timeout(10)


def _writer(who: str, acked: list[int], seq0: int) -> FaultPublisher:
    p = FaultPublisher("nats://127.0.0.1:1", who, f"t.{who}")
    p.acked = {i: seq0 + i for i in acked}
    return p


def _log(values: list[tuple[str, int]]) -> list[tuple[int, bytes]]:
    return [(seq, f"{who}:{i}".encode()) for seq, (who, i) in enumerate(values, 1)]


def test_everything_read_is_clean() -> None:
    a = _writer("a", [0, 1, 2], 1)
    stored = _log([("a", 0), ("a", 1), ("a", 2)])
    q = queue_check([a], {"z1": stored, "z2": list(stored)})
    assert q.ok and q.zones_agree and q.attempted == 3
    assert (q.lost_prefix, q.lost_middle, q.lost_postfix) == (0, 0, 0)


def test_lost_values_split_by_where_they_fall() -> None:
    a = _writer("a", list(range(6)), 1)  # acked 0..5 at sequences 1..6
    stored = _log([("a", 1), ("a", 2), ("a", 4)])  # 0 lost before, 3 in the middle, 5 after
    q = queue_check([a], {"z1": stored})
    assert (q.lost_prefix, q.lost_middle, q.lost_postfix) == (1, 1, 1)
    assert not q.ok and len(q.report.lost) == 6  # (none of them at its acknowledged sequence either)
    b = _writer("b", [0, 1], 10)  # nothing of b read at all: every acked value is postfix
    q = queue_check([b], {"z1": []})
    assert (q.lost_prefix, q.lost_middle, q.lost_postfix) == (0, 0, 2)


def test_unexpected_values_and_zones_that_disagree() -> None:
    a = _writer("a", [0], 1)
    stored = _log([("a", 0), ("ghost", 7)])
    q = queue_check([a], {"z1": stored, "z2": stored[:1]})
    assert len(q.report.unknown) == 1 and not q.zones_agree and not q.ok
    assert q.zone_reads == {"z1": 2, "z2": 1}


def test_unavailability_is_the_longest_stretch_without_an_ack() -> None:
    a, b = _writer("a", [], 0), _writer("b", [], 0)
    a.ack_times = [10.0, 10.5, 14.0]
    b.ack_times = [11.0, 16.5]
    assert unavailable([a, b], 9.0, 17.0) == pytest.approx(3.0)  # 11.0 -> 14.0
    assert unavailable([a, b], 15.0, 15.5) == pytest.approx(0.5)  # nothing inside: the whole window
