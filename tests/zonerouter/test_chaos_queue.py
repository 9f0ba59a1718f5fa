"""A short fault campaign of the queue workload (issue #27), as `bench/chaos.py` runs it: three zones, the zone
router on the S3 stand-in (S3-like latency), the stream R1 in z2, one writer per zone awaiting each PubAck; the
nemesis kills and pauses servers, breaks storage, cuts a zone off, deletes a claim object and jumps a server's
wall clock (the default mix), one fault at a time. Jepsen's queue checker: nothing
acknowledged lost, nothing unexpected, each writer's order kept, every zone reads the same log. `--minutes` from
`ZONEBUS_CHAOS_MINUTES` (1 by default: CI's time; `bench/chaos.py --minutes 30` is the long run)."""

from __future__ import annotations

import pytest

from tests.zonerouter.kit_chaos import TIMEOUT, assert_queue_campaign_passed, run_campaign


@pytest.mark.timeout(TIMEOUT)
def test_queue_campaign_loses_nothing_acknowledged() -> None:
    c = run_campaign("queue", 5)
    assert_queue_campaign_passed(c, 500)
