"""Shared-storage requests in `/jsz` (`storage_requests`) and `/metrics` (`zonebus_storage_*_total`), and the
reconciliation of the counts with what the S3 server itself received.

`test_jsz_and_metrics_show_the_meters_counts` runs a server core in this process (a real Node with JetStream and
its HTTP monitor), counts into the process's meter directly and reads both pages over HTTP (the /metrics text
through prometheus_client's parser). Each run uses a store label of its own, so counts other tests made in this
process do not matter.

`test_counts_agree_with_moto`: `zonebus/storage/fs.py` counts every request into `zonebus.storage.meter.METER`;
a real `zonebus server` process with a stream on `s3://` on
moto's S3 server, publishes and consumes; the ledger's storage rows, `/jsz` and `/metrics` must agree within 2%
with the requests moto's server recorded (its request recorder, `/moto-api/recorder/`), counted by HTTP method
and URL.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import urllib.request
import uuid
from collections import Counter
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import nats
import pyarrow.parquet as pq
import pytest
from nats.js.api import AckPolicy, ConsumerConfig

from tests.monitoring.kit import prometheus_client_families
from zonebus.testing.processes import ServerProcess, free_port

PUT_PER_REQ = 0.005 / 1000  # S3 Standard, per request
GET_PER_REQ = 0.0004 / 1000


def _get(port: int, path: str) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
        return resp.read().decode()


def _samples(text: str, name: str, store: str) -> dict[tuple[str, str], float]:
    """(kind, purpose) -> value of the samples `name` of `store`."""
    out = {}
    for fam in {id(f): f for f in prometheus_client_families(text).values()}.values():
        for s in fam.samples:
            if s.name == name and s.labels.get("store") == store:
                out[(s.labels["kind"], s.labels["purpose"])] = s.value
    return out


@pytest.mark.timeout(60)
async def test_jsz_and_metrics_show_the_meters_counts(tmp_path: Path) -> None:
    from zonebus.config import parse_config_text
    from zonebus.node import Node
    from zonebus.storage.meter import METER

    http = free_port()
    opts = parse_config_text(f'listen: 127.0.0.1:{free_port()}\nhttp: 127.0.0.1:{http}\n'
                             f'jetstream {{ store_dir: "{tmp_path}" }}\n')
    node = Node(opts)
    assert node.server.storage_meter is METER
    await node.start()
    store = f"s3://jsz-{uuid.uuid4().hex[:8]}/zb"
    try:
        for size in (1000, 2000, 3000):
            METER.count(store, "PUT", "stream_log", size)
        METER.count(store, "GET", "stream_log", 2500, n=2)
        METER.count(store, "DELETE", "router_channel")
        jsz = json.loads(await asyncio.to_thread(_get, http, "/jsz"))
        block = jsz["storage_requests"]
        assert block["price_list"] == "s3-standard"
        rows = {(r["kind"], r["purpose"]): r for r in block["rows"] if r["store"] == store}
        assert {k: (r["requests"], r["bytes"]) for k, r in rows.items()} == {
            ("PUT", "stream_log"): (3, 6000), ("GET", "stream_log"): (2, 2500), ("DELETE", "router_channel"): (1, 0)}
        assert rows[("PUT", "stream_log")]["cost_usd"] == pytest.approx(3 * PUT_PER_REQ)
        assert rows[("GET", "stream_log")]["cost_usd"] == pytest.approx(2 * GET_PER_REQ)
        assert rows[("DELETE", "router_channel")]["cost_usd"] == 0.0
        assert block["by_kind"]["PUT"]["requests"] >= 3
        text = await asyncio.to_thread(_get, http, "/metrics")
        assert _samples(text, "zonebus_storage_requests_total", store) == {
            ("PUT", "stream_log"): 3, ("GET", "stream_log"): 2, ("DELETE", "router_channel"): 1}
        assert _samples(text, "zonebus_storage_bytes_total", store) == {
            ("PUT", "stream_log"): 6000, ("GET", "stream_log"): 2500, ("DELETE", "router_channel"): 0}
        cost = _samples(text, "zonebus_storage_cost_dollars_total", store)
        assert cost[("PUT", "stream_log")] == pytest.approx(3 * PUT_PER_REQ)
        METER.count(store, "PUT", "stream_log", 10)  # counters move with the meter
        text = await asyncio.to_thread(_get, http, "/metrics")
        assert _samples(text, "zonebus_storage_requests_total", store)[("PUT", "stream_log")] == 4
    finally:
        await node.server.shutdown()


# -- reconciliation with moto's own request log ------------------------------------------------------------
def moto_kind(entry: dict[str, Any], bucket: str) -> str | None:
    """The S3 request kind of one recorded request (None: not a request to the bucket)."""
    url = urlparse(entry["url"])
    parts = url.path.lstrip("/").split("/", 1)
    if parts[0] != bucket and not url.netloc.startswith(bucket + "."):
        return None
    key = parts[1] if len(parts) > 1 else ""
    query = parse_qs(url.query, keep_blank_values=True)
    method = entry["method"]
    headers = {k.lower(): v for k, v in entry["headers"].items()}
    if method == "PUT":
        return "COPY" if "x-amz-copy-source" in headers else "PUT"
    if method == "GET":
        return "LIST" if not key or "list-type" in query or "prefix" in query else "GET"
    if method == "HEAD":
        return "HEAD"
    if method == "DELETE":
        return "DELETE"
    if method == "POST" and "delete" in query:
        return "DELETE"
    return method  # multipart POSTs: counted as their own kind


def _ledger_rows(data_dir: Path, prefix: str) -> Counter[str]:
    out: Counter[str] = Counter()
    for f in (data_dir / "ledger" / "storage").rglob("*.parquet"):
        for r in pq.read_table(f).to_pylist():
            if prefix in r["store"]:
                out[r["kind"]] += r["requests"]
    return out


def _post(endpoint: str, path: str) -> None:
    urllib.request.urlopen(urllib.request.Request(endpoint + path, method="POST"), timeout=10).read()


@pytest.mark.timeout(180)
@pytest.mark.parametrize("workers", [1, 2])
async def test_counts_agree_with_moto(tmp_path: Path, workers: int) -> None:
    """With 2 worker processes only worker 0 touches storage: every request must be in the ledger once (none lost
    in a worker's last handover, none counted by two workers); clients connect to both workers."""
    from moto.moto_api import recorder

    from zonebus.testing.motos3 import moto_s3_server

    with moto_s3_server("zonebus-bill") as s3:
        recorder._location = str(tmp_path / "moto_recording")  # in this process: moto's server is a thread here
        _post(s3.endpoint, "/moto-api/recorder/reset-recording")
        _post(s3.endpoint, "/moto-api/recorder/start-recording")
        prefix = f"zb-{uuid.uuid4().hex[:8]}"  # moto's buckets outlive its server in this process
        url = f"s3://{s3.bucket}/{prefix}"
        data = tmp_path / "data"
        conf = (f'server_tags: ["az:z1"]\nledger {{ dir: "{data}", interval: "1s" }}\n'
                f'jetstream {{ store_dir: "{tempfile.mkdtemp(dir=tmp_path)}", shared_store: "{url}" }}\n')
        proc = ServerProcess(impl="zonebus", config=conf, http_port=free_port(), env=s3.env(),
                             workers=workers).start()
        try:
            extra = [await nats.connect(proc.url) for _ in range(3)]  # the kernel spreads these over the workers
            nc = await nats.connect(proc.url)
            js = nc.jetstream(timeout=10)
            await js.add_stream(name="BILL", subjects=["bill.>"])
            seqs = []
            for _round in range(30):  # 30 rounds of 10: a few batch objects each
                futs = [await js.publish_async(f"bill.{i % 4}", b"x" * 512) for i in range(10)]
                seqs += [(await f).seq for f in futs]
                other = extra[_round % 3].jetstream(timeout=10)
                seqs.append((await other.publish("bill.w", b"y" * 256)).seq)
            assert sorted(seqs) == list(range(1, 331))
            await js.add_consumer("BILL", ConsumerConfig(durable_name="c", ack_policy=AckPolicy.EXPLICIT))
            sub = await js.pull_subscribe_bind(durable="c", stream="BILL")
            got = 0
            while got < 150:
                for m in await sub.fetch(10, timeout=5):
                    await m.ack_sync()
                    got += 1
            await nc.close()
            for c in extra:
                await c.close()
            jsz = json.loads(await asyncio.to_thread(_get, proc.http_port, "/jsz"))["storage_requests"]
            metrics = await asyncio.to_thread(_get, proc.http_port, "/metrics")
        finally:
            proc.stop()  # SIGTERM: the last handover writes the remaining storage rows
        _post(s3.endpoint, "/moto-api/recorder/stop-recording")
        recorded = [json.loads(line) for line in Path(recorder._location).read_text().splitlines() if line]
    moto = Counter(k for k in (moto_kind(e, "zonebus-bill") for e in recorded) if k)
    ledger = _ledger_rows(data, prefix)
    total_moto, total_ledger = sum(moto.values()), sum(ledger.values())
    assert total_moto >= 60 and moto["PUT"] >= 30, moto
    assert abs(total_ledger - total_moto) <= 0.02 * total_moto, (ledger, moto)
    assert abs(ledger["PUT"] - moto["PUT"]) <= 0.02 * moto["PUT"], (ledger, moto)
    assert abs(ledger["GET"] - moto["GET"]) <= 0.02 * max(moto["GET"], 1), (ledger, moto)
    # the pages were read before the last requests (shutdown), so they are at most the ledger's totals
    jsz_total = sum(r["requests"] for r in jsz["rows"] if prefix in r["store"])
    prom_total = sum(v for (_k, _p), v in _samples_any_store(metrics, "zonebus_storage_requests_total",
                                                             prefix).items())
    assert jsz_total == pytest.approx(prom_total, rel=0.02)
    assert 0.9 * total_moto <= jsz_total <= total_ledger


def _samples_any_store(text: str, name: str, part: str) -> dict[tuple[str, str], float]:
    out: dict[tuple[str, str], float] = {}
    for fam in {id(f): f for f in prometheus_client_families(text).values()}.values():
        for s in fam.samples:
            if s.name == name and part in s.labels.get("store", ""):
                key = (s.labels["kind"], s.labels["purpose"])
                out[key] = out.get(key, 0) + s.value
    return out
