"""Gateway compression between zonebus clusters (nats-server has none on gateways): `gateway { compression:
s2_best }` on both sides negotiates zstd at level 7 on the outbound and the inbound connection, messages and
interest still cross, /gatewayz shows the mode and a ratio well under 1 for JSON payloads, and the traffic
ledger counts the gateway's bytes as they are on the wire (compressed)."""

from __future__ import annotations

import json
import random
import tempfile
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.gateway.kit import connect, gatewayz, in_thread, start_supercluster, wait_for_full_mesh, wait_remote_interest
from zonebus.testing.polling import until, wait_until

pytestmark = pytest.mark.timeout(90)


def ledger_out(ledger_dir: Path, prefix: str) -> tuple[int, int]:
    """(msgs, bytes) of the `gateway` rows out with this subject prefix in a server's ledger."""
    msgs = nbytes = 0
    for path in sorted((ledger_dir / "ledger" / "traffic").rglob("*.parquet")):
        if not path.name.startswith("."):
            for row in pq.read_table(path).to_pylist():
                if row["link_kind"] == "gateway" and row["direction"] == "out" and row["subject_prefix"] == prefix:
                    msgs += row["msgs"]
                    nbytes += row["bytes"]
    return msgs, nbytes


async def test_gateways_compress_between_zonebus_clusters() -> None:
    ledger = Path(tempfile.mkdtemp(prefix="zb-gw-compression-"))
    sc = start_supercluster("zonebus", names=("A", "B"), per_cluster=1, gateway_extra="compression: s2_best",
                            extra={"A": f"ledger {{ dir: {json.dumps(str(ledger))}, interval: 1s }}"})
    try:
        await in_thread(wait_for_full_mesh, sc)
        a1, b1 = sc.server("A1"), sc.server("B1")
        sub_nc, pub_nc = await connect(b1), await connect(a1)
        got: list[bytes] = []

        async def on_msg(msg) -> None:  # noqa: ANN001
            got.append(msg.data)

        try:
            await sub_nc.subscribe("gw.json", cb=on_msg)
            await sub_nc.flush()
            await in_thread(wait_remote_interest, a1, "B", "gw.json")
            rng = random.Random(5)
            sent = [json.dumps({"seq": i, "customer": rng.randrange(10**6), "items": [
                {"sku": f"SKU-{rng.randrange(10**5):05d}", "qty": rng.randint(1, 9)} for _ in range(4)],
                "note": "leave at the door, ring twice " * 15}).encode() for i in range(200)]
            for p in sent:
                await pub_nc.publish("gw.json", p)
            await pub_nc.flush()
            await until(lambda: len(got) == len(sent), "every message in B", show=lambda: len(got))
            assert got == sent
        finally:
            await sub_nc.close()
            await pub_nc.close()
        out = (await in_thread(gatewayz, a1, False))["outbound_gateways"]["B"]["connection"]
        assert out["compression"] == "zstd_best" and out["compression_peer"] == "s2_best"
        assert out["compression_bytes"]["raw_out"] > 200 * 400 and out["compression_ratio"] < 0.5, out
        inbound = (await in_thread(gatewayz, b1, False))["inbound_gateways"]["A"][0]["connection"]
        assert inbound["compression"] == "zstd_best"
        assert inbound["compression_bytes"]["raw_in"] > 200 * 400
        # (a publisher that moved to the worker holding the gateways was not counted there: 106 of 200 once,
        # tests/workers/test_workers_migrate.py)
        msgs, nbytes = await in_thread(wait_until, lambda: (r := ledger_out(ledger, "gw.json"))[0] == 200 and r,
                                       "200 gateway messages in A's ledger", 30,
                                       show=lambda: ledger_out(ledger, "gw.json"))
        assert nbytes < 0.5 * sum(map(len, sent)), (nbytes, sum(map(len, sent)))
    finally:
        sc.stop()


async def test_s2_auto_follows_the_rtt() -> None:
    """`s2_auto` on both sides, A's writes to B delayed 150 ms (the zonebus test hook): B sees A's INFO late
    and picks the best level at once; A's first view of the RTT is short, and its level moves to best once its
    PINGs measure the RTT (a new zstd frame mid-stream); messages cross before and after the change."""
    sc = start_supercluster("zonebus", names=("A", "B"), per_cluster=1, gateway_extra="compression: s2_auto",
                            env={"A": {"ZONEBUS_GATEWAY_DELAY_MS": "B:150"}})
    try:
        await in_thread(wait_for_full_mesh, sc)
        a1, b1 = sc.server("A1"), sc.server("B1")
        sub_nc, pub_nc = await connect(b1), await connect(a1)
        got: list[bytes] = []

        async def on_msg(msg) -> None:  # noqa: ANN001
            got.append(msg.data)

        try:
            await sub_nc.subscribe("gw.auto", cb=on_msg)
            await sub_nc.flush()
            await in_thread(wait_remote_interest, a1, "B", "gw.auto")
            for i in range(20):
                await pub_nc.publish("gw.auto", b"before %d" % i)
            await pub_nc.flush()

            def out_mode() -> str:
                return gatewayz(a1, False)["outbound_gateways"]["B"]["connection"]["compression"]
            await in_thread(wait_until, lambda: out_mode() == "zstd_best", "A's outbound level follows the RTT",
                            15, show=out_mode)
            for i in range(20):
                await pub_nc.publish("gw.auto", b"after %d" % i)
            await pub_nc.flush()
            await until(lambda: len(got) == 40, "40 messages in B", show=lambda: len(got))
            assert got == [b"before %d" % i for i in range(20)] + [b"after %d" % i for i in range(20)]
        finally:
            await sub_nc.close()
            await pub_nc.close()
        inbound = (await in_thread(gatewayz, b1, False))["inbound_gateways"]["A"][0]["connection"]
        assert inbound["compression"] == "zstd_best"
    finally:
        sc.stop()
