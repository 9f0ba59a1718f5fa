"""A short fault campaign of the KV compare-and-set workload (issue #27), as `bench/chaos.py` runs it: three zones,
the zone router on the S3 stand-in (S3-like latency), the bucket R1 in z2, one client per zone; the nemesis kills
servers, pauses them, breaks storage, cuts a zone off, deletes a claim object and jumps a server's wall clock, one
fault at a time. Every key's history must be linearizable
(`zonebus.testing.linearizable`). The campaign is the bench's own
script in its own process, `--minutes` from `ZONEBUS_CHAOS_MINUTES` (1 by default: CI's time;
`bench/chaos.py --minutes 30` is the long run)."""

from __future__ import annotations

import re

import pytest

from tests.zonerouter.kit_chaos import TIMEOUT, run_campaign


@pytest.mark.timeout(TIMEOUT)
def test_kv_campaign_is_linearizable() -> None:
    c = run_campaign("kv", 3, "kill,pause,powerloss,s3-503,s3-reset,s3-timeout,s3-slow,isolate,damage,clock")
    ok_writes = [int(n) for n in re.findall(r"(\d+), \d+, \d+", c.cells[2])]
    assert sum(ok_writes[1:]) > 100, f"too few writes answered: {c.row}"
    assert c.cells[3].count(" yes") == 3, f"a key is not linearizable:\n{c.row}\n{c.progress[-4000:]}"
    assert c.returncode == 0, c.progress[-4000:]
