"""`auto`'s join and leave rule (`zonebus.zonerouter.spread`) on a clock the test moves: a proxy whose
consumers fell behind in a burst leaves the tail and does not join again within `REJOIN_AFTER`, so a burst's
tail is not sent again to a reader that catches up on a stored object and falls behind once more; one whose
readers went away and came back joins at once. (The multi-server behaviour is `test_tail_spread.py`'s.)"""

from __future__ import annotations

import pytest

from zonebus.zonerouter import spread as sp


@pytest.mark.timeout(10)
def test_a_proxy_that_left_for_lag_rejoins_only_after_a_while(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [100.0]
    monkeypatch.setattr(sp.time, "monotonic", lambda: clock[0])
    seen: dict[str, tuple[int, bool] | None] = {"p": (0, False)}
    joined: list[str] = []
    spread = sp.TailSpread("auto", lambda name, peer: seen[peer], joined.append)

    def step(dt: float, lag: tuple[int, bool] | None) -> bool:
        clock[0] += dt
        seen["p"] = lag
        return spread.at_head("S", "p")

    assert step(0, (0, False)) and joined == ["S"]  # at the head: joins
    assert step(sp.JOIN_GRACE / 2, (sp.LEAVE_LAG, False))  # behind, but within the grace of its join
    assert not step(sp.JOIN_GRACE, (sp.LEAVE_LAG, False))  # behind after it: leaves
    assert not step(1.0, (0, True))  # caught up on a stored object: not yet
    assert not step(sp.REJOIN_AFTER - 1.5, (0, False))
    assert step(1.0, (0, False))  # REJOIN_AFTER after the leave: joins again
    assert spread.stats == {"joins": 2, "leaves": 1}
    assert not step(0, None)  # its readers went away: leaves
    assert step(0.1, (0, False))  # and joins as soon as they are back at the head
    assert spread.stats == {"joins": 3, "leaves": 2}
