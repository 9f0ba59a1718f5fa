"""`zonebus cost report --streams`: a real 3-server zonebus cluster (zones z1, z2, z3; a ledger; clustered
JetStream on one shared file store), clients in known zones publish to a stream, the servers stop (flushing
their ledgers), then the report joins the ledger with the stream's contents read in place by Spark.

orders.eu.* is published from z1 only, orders.us.* from z2 only, orders.mix.* from z1 and z3 alike (same
subject and size, alternating), so the zone shares are exact: 100%, 100%, 50/50.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import nats
import pytest
from nats.js.api import StreamInfo

from zonebus.store.sharedview import SharedView
from zonebus.testing.polling import until
from zonebus.testing.processes import ServerProcess, cluster_config, free_port, start_parallel, stop_all

ZONES = ("z1", "z2", "z3")
# (publishing zone, subject, messages, payload bytes)
WORKLOAD = [("z1", "orders.eu.new", 30, 100), ("z2", "orders.us.new", 20, 300),
            ("z1", "orders.mix.new", 12, 50), ("z3", "orders.mix.new", 12, 50)]


async def _create_stream(url: str, deadline_s: float = 30) -> None:
    """Add the stream once the meta group has a leader (polled)."""
    nc = await nats.connect(url)
    refused: list[Exception] = []
    try:
        js = nc.jetstream(timeout=2)

        async def added() -> bool:
            try:
                await js.add_stream(name="ORDERS", subjects=["orders.>"])
                return True
            except Exception as exc:
                refused[:] = [exc]
                return False

        await until(added, "the ORDERS stream to be added", timeout=deadline_s, interval=0.2, show=lambda: refused)
    finally:
        await nc.close()


async def _publish(servers: list[ServerProcess]) -> int:
    """Plain PUBs (no reply subject, so every ledger row counts the same bytes per message); returns the stream's
    byte count as the server reports it."""
    await _create_stream(servers[0].url)
    conns = {z: await nats.connect(servers[i].url, name=f"orders-api?az={z}") for i, z in enumerate(ZONES)}
    mix = [w for w in WORKLOAD if w[1] == "orders.mix.new"]
    for zone, subject, n, size in WORKLOAD:
        if subject != "orders.mix.new":
            for _ in range(n):
                await conns[zone].publish(subject, b"x" * size)
    for _ in range(mix[0][2]):  # alternate the two zones
        for zone, subject, _n, size in mix:
            await conns[zone].publish(subject, b"x" * size)
    for nc in conns.values():
        await nc.flush()
    total = sum(w[2] for w in WORKLOAD)
    js = conns["z1"].jetstream(timeout=5)

    async def full() -> StreamInfo | None:
        info = await js.stream_info("ORDERS")
        return info if info.state.messages >= total else None

    info = await until(full, f"the stream to hold {total} messages", timeout=15)
    for nc in conns.values():
        await nc.close()
    return int(info.state.bytes)


@pytest.fixture(scope="module")
def cluster_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, int]:
    """(ledger data dir, shared store URL, the stream's bytes per the server); the servers are stopped."""
    tmp = tmp_path_factory.mktemp("cost-streams")
    shared = f"file://{tmp}/shared"
    ports = [free_port() for _ in ZONES]
    servers = []
    for i, zone in enumerate(ZONES):
        extra = (f'ledger {{ dir: "{tmp}/data", interval: "1s", subject_tokens: 2 }}\n'
                 f'jetstream {{ store_dir: "{tmp}/local{i}", shared_store: "{shared}" }}')
        servers.append(ServerProcess("zonebus", cluster_config(f"s{i + 1}", ports[i], ports, [f"az:{zone}"],
                                                               extra=extra), http_port=free_port()))
    start_parallel(servers)
    try:
        stream_bytes = asyncio.run(_publish(servers))
    finally:
        stop_all(servers)  # SIGTERM: each server writes its open ledger window
    return tmp / "data", shared, stream_bytes


@pytest.mark.timeout(240)  # the cluster's start, and the report's whole bill (and ratio sample) besides the section
def test_report_gives_bytes_per_subject_and_zone_of_origin(cluster_run, spark, run_cli, tmp_path: Path) -> None:
    data, shared, stream_bytes = cluster_run
    out = tmp_path / "report"
    code, stdout, err = run_cli("report", "--ledger", str(data), "--streams", shared, "--stream", "ORDERS",
                                "--out", str(out), "--quiet")
    assert code == 0, err
    section = json.loads((out / "summary.json").read_text())["stream_contents"]
    [stream] = section["streams"]
    assert stream["stream"] == "ORDERS"
    assert stream["msgs"] == sum(w[2] for w in WORKLOAD)
    assert stream["bytes"] == stream_bytes  # what the server says the stream holds
    subjects = {s["subject_prefix"]: s for s in stream["subjects"]}
    assert set(subjects) == {"orders.eu", "orders.us", "orders.mix"}
    for prefix, subject, zones in (("orders.eu", "orders.eu.new", {"z1": 1.0}),
                                   ("orders.us", "orders.us.new", {"z2": 1.0}),
                                   ("orders.mix", "orders.mix.new", {"z1": 0.5, "z3": 0.5})):
        rows = [w for w in WORKLOAD if w[1] == subject]
        n = sum(w[2] for w in rows)
        nbytes = sum(w[2] * (len(subject) + w[3] + SharedView.overhead) for w in rows)
        sub = subjects[prefix]
        assert (sub["msgs"], sub["bytes"], sub["in_ledger"]) == (n, nbytes, True), sub
        assert sub["ledger_publishes"] == n
        assert {z["zone"]: z["share"] for z in sub["zones"]} == pytest.approx(zones), sub
        assert sum(z["bytes"] for z in sub["zones"]) == pytest.approx(nbytes)
        assert all(z["zone_known"] for z in sub["zones"])
    assert stream["origin_bytes_by_zone"] == pytest.approx({
        "z1": subjects["orders.eu"]["bytes"] + subjects["orders.mix"]["bytes"] / 2,
        "z2": subjects["orders.us"]["bytes"],
        "z3": subjects["orders.mix"]["bytes"] / 2,
    })
    assert stream["unattributed_bytes"] == 0
    assert stream["replicated_r3"]["cross_zone_bytes"] == 2 * stream_bytes
    assert stream["replicated_r3"]["cost_usd"] == pytest.approx(2 * stream_bytes * 0.02 / 1e9)
    shared_cost = stream["shared_storage"]
    assert shared_cost["cross_zone_bytes"] == 0 and shared_cost["price_list"] == "s3-standard"
    assert shared_cost["storage_monthly_cost_usd"] == pytest.approx(stream_bytes / 1e9 * 0.023)  # kept a month
    assert shared_cost["cost_usd"] > 0  # shared storage is not free any more
    assert stream["replicated_r3"]["monthly_cost_usd"] is None  # written over less than a minute
    bill = json.loads((out / "summary.json").read_text())["whole_bill"]
    if bill["stores"]:  # the servers counted their requests to the store (ObjectStore into the meter)
        assert shared in bill["stores"], bill["stores"]
        assert shared_cost["requests_cost_usd"] > 0 and bill["storage_requests"]["by_purpose"]["stream_log"]
    r3 = bill["nats_r3"]
    assert r3["zones"] == 3 and r3["compression_ratio_basis"].startswith("measured")
    assert 0 < r3["compression_ratio"] < 0.5  # runs of "x" compress well
    assert 0 < r3["delivery_compression_ratio"] <= r3["write_compression_ratio"]  # deliveries leave in blocks
    assert "stream ORDERS: 74 messages" in stdout
    assert "orders.mix" in stdout and "from z1 50%, z3 50%" in stdout
    page = (out / "report.html").read_text()
    assert "<h2>Stream contents</h2>" in page and "z1 50%, z3 50%" in page
    assert page.rstrip().endswith("</html>")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("extra, needle", [
    (["--streams", "ftp://host/x"], "--streams: "),
    (["--streams", "file:///nonexistent/zonebus-store"], "--streams: "),
    (["--streams", ""], "--streams: empty URL"),
    (["--streams", "{shared}", "--stream", "NOPE"], "--stream: "),
    (["--stream", "ORDERS"], "--stream needs --streams"),
])
def test_bad_streams_options_are_one_line_exit_2(extra: list[str], needle: str, cluster_run, hand_ledger: Path,
                                                 run_cli, tmp_path: Path) -> None:
    _data, shared, _ = cluster_run
    args = [a.format(shared=shared) for a in extra]
    code, _out, err = run_cli("report", "--ledger", str(hand_ledger), "--out", str(tmp_path / "o"), *args)
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith("zonebus cost report: ") and needle in err, err
    assert not (tmp_path / "o").exists()  # refused before anything was written


def test_subjects_without_publishes_in_the_ledger_have_no_zone() -> None:
    from zonebus.pipeline.prices import load_prices
    from zonebus.pipeline.stream_contents import build_section, format_section

    hour_us = 3_600_000_000
    rows = [{"stream": "S", "subject_prefix": "mirror.x", "in_ledger": False, "msgs": 3, "bytes": 300,
             "first_us": 0, "last_us": hour_us},
            {"stream": "S", "subject_prefix": "a.b", "in_ledger": True, "msgs": 4, "bytes": 1000,
             "first_us": 0, "last_us": hour_us}]
    zones = [{"stream": "S", "subject_prefix": "a.b", "zone": "z1", "zone_known": False, "ledger_msgs": 1,
              "ledger_bytes": 10},
             {"stream": "S", "subject_prefix": "a.b", "zone": "z2", "zone_known": True, "ledger_msgs": 3,
              "ledger_bytes": 30}]
    section = build_section("file:///x", ["S"], rows, zones, load_prices("aws"))
    [s] = section["streams"]
    assert (s["msgs"], s["bytes"], s["unattributed_bytes"]) == (7, 1300, 300)
    assert s["origin_bytes_by_zone"] == {"z1": 250.0, "z2": 750.0}
    assert s["replicated_r3"]["monthly_cost_usd"] == pytest.approx(2 * 1300 * 0.02 / 1e9 * 24 * 30)
    text = format_section(section, "USD")
    assert "zone unknown: no client publishes in the ledger" in text
    assert "from z2 75%, z1 (server zone) 25%" in text
