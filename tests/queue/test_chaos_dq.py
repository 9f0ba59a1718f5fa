"""A short fault campaign of the durable queue group workload (issue #27), as `bench/chaos.py --workloads dq`
runs it: three zonebus servers (one per zone, clustered JetStream, the group's log on a `file://` shared store)
with `queue_groups { chaos: { ack: explicit } }`, one writer per zone awaiting each PubAck, two members per zone
acking what they process; the nemesis kills servers (restart on the same directory), pauses them past the
failover timeout, cuts their power (kill -9, every unsynced write dropped), cuts a zone off and jumps a server's
wall clock, the group's primary its favourite target. After healing, every acknowledged message must be
processed by some member and nothing processed that was never sent (duplicates are allowed: at least once).
`--minutes` from `ZONEBUS_CHAOS_MINUTES` (1 by default: CI's time)."""

from __future__ import annotations

import pytest

from tests.zonerouter.kit_chaos import TIMEOUT, run_campaign


@pytest.mark.timeout(TIMEOUT)
def test_durable_queue_campaign_processes_every_acknowledged_message() -> None:
    c = run_campaign("dq", 5, "kill,pause,powerloss,isolate,clock", setup="zonebus-file")
    # setup | faults | acked | failed | processed (distinct) | lost | unexpected | duplicates | order | ...
    assert int(c.cells[2].replace(",", "")) > 500, f"too few writes acknowledged: {c.row}"
    assert c.cells[5] == "0", f"acknowledged messages never processed: {c.row}\n{c.progress[-4000:]}"
    assert c.cells[6] == "0", f"unexpected values processed: {c.row}"
    assert c.returncode == 0, c.progress[-4000:]
