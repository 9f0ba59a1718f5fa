"""The traffic ledger counts gateway links with the zone of the server at the other end (zonebus).

Clusters A and B of one server each (tags az:a-1, az:b-1), both writing a ledger every second. 50 messages
published in A to a subscriber in B are counted on A1 as `gateway` traffic out to peer B1 in zone b-1, and
on B1 as `gateway` traffic in from peer A1 in zone a-1.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.gateway.kit import (
    connect,
    in_thread,
    start_supercluster,
    wait_for_full_mesh,
    wait_remote_interest,
    wait_until,
)

pytestmark = pytest.mark.timeout(60)


def gateway_rows(ledger_dir: Path, subject_prefix: str) -> list[dict]:
    rows = []
    for path in sorted((ledger_dir / "ledger" / "traffic").rglob("*.parquet")):
        if path.name.startswith("."):
            continue
        for row in pq.read_table(path).to_pylist():
            if row["link_kind"] == "gateway" and row["subject_prefix"] == subject_prefix:
                rows.append(row)
    return rows


def totals(rows: list[dict], direction: str) -> dict[tuple[str, str, bool], int]:
    out: dict[tuple[str, str, bool], int] = {}
    for r in rows:
        if r["direction"] == direction:
            key = (r["peer"], r["peer_zone"], r["peer_zone_known"])
            out[key] = out.get(key, 0) + r["msgs"]
    return out


async def test_gateway_traffic_in_the_ledger():
    dirs = {n: Path(tempfile.mkdtemp(prefix=f"zb-gw-ledger-{n}-")) for n in "AB"}
    extra = {n: f"ledger {{ dir: {json.dumps(str(d))}, interval: 1s }}" for n, d in dirs.items()}
    sc = await in_thread(start_supercluster, "zonebus", names=("A", "B"), per_cluster=1, extra=extra)
    try:
        await in_thread(wait_for_full_mesh, sc)
        pub, sub = await connect(sc.server("A1")), await connect(sc.server("B1"))
        got: list = []

        async def on_msg(msg) -> None:
            got.append(msg)

        await sub.subscribe("ledger.gw", cb=on_msg)
        await sub.flush()
        await in_thread(wait_remote_interest, sc.server("A1"), "B", "ledger.gw")
        for i in range(50):
            await pub.publish("ledger.gw", b"%d" % i)
        await pub.flush()
        await in_thread(wait_until, lambda: len(got) == 50, "50 messages in B")
        out_a = await in_thread(wait_until, lambda: totals(gateway_rows(dirs["A"], "ledger.gw"), "out").get(
            ("B1", "b-1", True)) == 50 and totals(gateway_rows(dirs["A"], "ledger.gw"), "out"),
            "A1's ledger to count 50 gateway messages out to B1")
        assert out_a == {("B1", "b-1", True): 50}
        in_b = await in_thread(wait_until, lambda: totals(gateway_rows(dirs["B"], "ledger.gw"), "in").get(
            ("A1", "a-1", True)) == 50 and totals(gateway_rows(dirs["B"], "ledger.gw"), "in"),
            "B1's ledger to count 50 gateway messages in from A1")
        assert in_b == {("A1", "a-1", True): 50}
        await pub.close()
        await sub.close()
    finally:
        sc.stop()
