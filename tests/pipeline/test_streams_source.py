"""The `zonebus` Spark data source: streams published with nats-py to a real `zonebus server` whose streams live
on a shared store, read in place by a real local SparkSession (batch and structured streaming), file:// and
s3:// (moto's S3 server on loopback), with the server stopped for the batch reads.

Small group-commit batches (`shared_store_batch: 1KB`) make each stream span many batch objects, so that
partitions and pushdown have something to cut.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import nats
import pytest

from zonebus.testing.motos3 import MotoS3, moto_s3_server
from zonebus.testing.polling import until
from zonebus.testing.processes import ServerProcess

# Spark's Python workers inherit the environment of the JVM, which starts with the first Spark test: the
# in-process S3 clients of the workers need moto's (fake) credentials before that.
for _k, _v in (("AWS_ACCESS_KEY_ID", "test"), ("AWS_SECRET_ACCESS_KEY", "test"), ("AWS_EC2_METADATA_DISABLED", "true")):
    os.environ.setdefault(_k, _v)

Expected = dict[int, tuple[str, bytes, dict[str, list[str]] | None]]  # seq -> (subject, data, headers)


def server_config(root: Path, shared_url: str) -> str:
    return (f'jetstream {{ store_dir: "{root}/local", shared_store: "{shared_url}", '
            f'shared_store_linger: "1ms", shared_store_batch: 1KB }}\n')


def start_server(root: Path, shared_url: str, env: dict[str, str] | None = None) -> ServerProcess:
    root.mkdir(parents=True, exist_ok=True)
    return ServerProcess(impl="zonebus", config=server_config(root, shared_url), env=env).start()


async def publish(js, model: Expected, subject: str, n: int, *, headers_every: int = 3, window: int = 25,
                  tag: str = "") -> None:
    """`n` messages to `subject` (a `{i}` in it is replaced), acks awaited in windows (several per batch)."""
    futs = []
    for i in range(n):
        subj = subject.format(i=i % 4)
        data = f"{tag}{i}:".encode() + secrets.token_bytes(i % 40)
        hdrs = {"Order-Id": f"{tag}{i}", "Region": subj.split(".")[-1]} if i % headers_every == 0 else None
        futs.append((subj, data, hdrs, await js.publish_async(subj, data, headers=hdrs)))
        if len(futs) >= window or i == n - 1:
            for s, d, h, fut in futs:
                ack = await fut
                model[ack.seq] = (s, d, {k: [v] for k, v in h.items()} if h else None)
            futs = []


async def raw_hpub(url: str, subject: str, header_block: bytes, data: bytes) -> None:
    """One HPUB over a raw socket: a header with two values for one key, which nats-py cannot send."""
    host, port = url.removeprefix("nats://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    await reader.readline()  # INFO
    writer.write(b'CONNECT {"verbose":false,"headers":true}\r\n')
    writer.write(f"HPUB {subject} {len(header_block)} {len(header_block) + len(data)}\r\n".encode()
                 + header_block + data + b"\r\nPING\r\n")
    await writer.drain()
    assert (await reader.readline()).startswith(b"PONG")
    writer.close()


async def wait_messages(js, stream: str, n: int, deadline_s: float = 10) -> None:

    async def reached() -> bool:
        return (await js.stream_info(stream)).state.messages >= n

    await until(reached, f"stream {stream} to reach {n} messages", timeout=deadline_s, interval=0.02)


@dataclass
class Published:
    url: str
    orders: Expected = field(default_factory=dict)
    edits: Expected = field(default_factory=dict)
    gone: Expected = field(default_factory=dict)
    server_counts: dict[str, int] = field(default_factory=dict)


async def _fill(url: str, out: Published) -> None:
    nc = await nats.connect(url)
    js = nc.jetstream(timeout=5)
    await js.add_stream(name="ORDERS", subjects=["orders.>"])
    await publish(js, out.orders, "orders.{i}.eu", 150, tag="a")
    await publish(js, out.orders, "orders.{i}.us", 150, tag="b")
    block = b"NATS/1.0\r\nTag: one\r\nTag: two\r\nEmpty:\r\n\r\n"
    await raw_hpub(url, "orders.9.eu", block, b"raw")
    await wait_messages(js, "ORDERS", 301)
    out.orders[301] = ("orders.9.eu", b"raw", {"Tag": ["one", "two"], "Empty": [""]})

    await js.add_stream(name="EDITS", subjects=["edits.>"])
    await publish(js, out.edits, "edits.{i}", 200, tag="e")
    for seq in (2, 50, 51, 120, 200):
        await js.delete_msg("EDITS", seq)
        del out.edits[seq]
    await js.purge_stream("EDITS", subject="edits.1")
    out.edits = {s: m for s, m in out.edits.items() if m[0] != "edits.1"}
    await js.purge_stream("EDITS", seq=60)  # everything below 60
    out.edits = {s: m for s, m in out.edits.items() if s >= 60}
    await js.purge_stream("EDITS", subject="edits.2", keep=3)
    twos = sorted(s for s, m in out.edits.items() if m[0] == "edits.2")
    for s in twos[:-3]:
        del out.edits[s]
    await publish(js, out.edits, "edits.{i}", 60, tag="f")
    await js.delete_msg("EDITS", max(out.edits))
    del out.edits[max(out.edits)]

    await js.add_stream(name="GONE", subjects=["gone.>"])
    await publish(js, {}, "gone.{i}", 40, tag="g")
    await js.purge_stream("GONE")
    await publish(js, out.gone, "gone.{i}", 10, tag="h")
    for name in ("ORDERS", "EDITS", "GONE"):
        out.server_counts[name] = (await js.stream_info(name)).state.messages
    await nc.close()


@pytest.fixture(scope="module")
def published(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Published]:
    """Three streams published through a server that is stopped before anything is read."""
    root = tmp_path_factory.mktemp("streams-src")
    out = Published(f"file://{root}/shared")
    proc = start_server(root / "server", out.url)
    try:
        asyncio.run(_fill(proc.url, out))
    finally:
        proc.stop()
    yield out


def read(spark, url: str, stream: str, **options: object):
    r = spark.read.format("zonebus").option("store", url).option("stream", stream)
    for k, v in options.items():
        r = r.option(k, str(v))
    return r.load()


def as_model(rows) -> Expected:
    return {r["seq"]: (r["subject"], bytes(r["data"]), {k: list(v) for k, v in r["headers"].items()}
                       if r["headers"] is not None else None) for r in rows}


@pytest.mark.timeout(120)
def test_batch_read_equals_what_was_published(spark, published: Published) -> None:
    objects = list((Path(published.url.removeprefix("file://")) / "streams" / "ORDERS" / "log").glob("*.blk"))
    assert len(objects) >= 10, "the stream should span many batch objects"
    df = read(spark, published.url, "ORDERS", partitionBytes=4096)
    assert df.rdd.getNumPartitions() >= 4  # partitions follow the batch objects
    rows = df.collect()
    assert len(rows) == len(published.orders) == published.server_counts["ORDERS"] == 301
    assert as_model(rows) == published.orders
    assert {r["stream"] for r in rows} == {"ORDERS"}
    # size is the stream's byte count (nats-server's file store formula)
    r = next(r for r in rows if r["seq"] == 301)
    block = b"NATS/1.0\r\nTag: one\r\nTag: two\r\nEmpty:\r\n\r\n"
    assert r["size"] == len("orders.9.eu") + len(block) + 4 + len(b"raw") + 30
    times = [r["time"] for r in sorted(rows, key=lambda r: r["seq"])]
    assert times == sorted(times) and times[0].year >= 2024


@pytest.mark.timeout(120)
def test_deletes_and_purges_are_not_returned(spark, published: Published) -> None:
    got = as_model(read(spark, published.url, "EDITS").collect())
    assert len(got) == published.server_counts["EDITS"]
    assert got == published.edits
    gone = as_model(read(spark, published.url, "GONE").collect())
    assert gone == published.gone and sorted(gone) == list(range(41, 51))


@pytest.mark.timeout(120)
def test_pushdown_reads_fewer_partitions(spark, published: Published) -> None:
    url = published.url
    full = read(spark, url, "ORDERS", partitionBytes=2048)
    n_full = full.rdd.getNumPartitions()
    rows = {r["seq"]: r for r in full.collect()}
    # ranges given as options
    some = read(spark, url, "ORDERS", partitionBytes=2048, startingSeq=200, endingSeq=211)
    assert some.rdd.getNumPartitions() < n_full / 4
    assert sorted(r["seq"] for r in some.collect()) == list(range(200, 211))
    # Spark filters on seq and time (pushFilters: one DataFrame per filtered query on this Spark)
    by_seq = read(spark, url, "ORDERS", partitionBytes=2048, pushFilters="true").filter("seq >= 290 AND seq < 300")
    assert by_seq.rdd.getNumPartitions() < n_full / 4
    assert sorted(r["seq"] for r in by_seq.collect()) == list(range(290, 300))
    t = rows[280]["time"]
    by_time = read(spark, url, "ORDERS", partitionBytes=2048, pushFilters="true").where(
        __import__("pyspark.sql.functions", fromlist=["col"]).col("time") >= t)
    assert by_time.rdd.getNumPartitions() < n_full / 4
    assert {r["seq"] for r in by_time.collect()} == {s for s, r in rows.items() if r["time"] >= t}
    # subjects: NATS wildcards as an option, exact ones as a filter; applied exactly
    us = read(spark, url, "ORDERS", subjects="orders.*.us")
    assert {r["seq"] for r in us.collect()} == {s for s, m in published.orders.items() if m[0].endswith(".us")}
    exact = read(spark, url, "ORDERS", pushFilters="true").filter("subject = 'orders.2.eu'")
    assert {r["seq"] for r in exact.collect()} == {s for s, m in published.orders.items() if m[0] == "orders.2.eu"}
    nothing = read(spark, url, "ORDERS", startingSeq=10_000)
    assert nothing.count() == 0


@pytest.mark.timeout(120)
def test_unknown_layout_and_stream_are_refused(spark, published: Published, tmp_path: Path) -> None:
    store = tmp_path / "future"
    store.mkdir()
    (store / "layout.json").write_text(json.dumps({"format": "zonebus-shared-store", "version": 99}))
    with pytest.raises(Exception, match="layout version 99 is not supported"):
        read(spark, f"file://{store}", "ORDERS").collect()
    with pytest.raises(Exception, match=r"no stream 'NOPE' on this shared store \(streams: EDITS, GONE, ORDERS\)"):
        read(spark, published.url, "NOPE").collect()
    with pytest.raises(Exception, match="needs the 'stream' option"):
        spark.read.format("zonebus").option("store", published.url).load().collect()


@pytest.mark.timeout(150)
def test_streaming_picks_up_new_messages_and_resumes_from_its_checkpoint(spark, tmp_path: Path) -> None:
    url = f"file://{tmp_path}/shared"
    proc = start_server(tmp_path / "server", url)
    loop = asyncio.new_event_loop()
    model: Expected = {}
    seen: list[int] = []

    def sink(df, batch_id: int) -> None:
        seen.extend(r["seq"] for r in df.select("seq").collect())

    def run_query():
        return (spark.readStream.format("zonebus").option("store", url).option("stream", "LIVE").load()
                .writeStream.foreachBatch(sink).option("checkpointLocation", str(tmp_path / "ckpt"))
                .trigger(processingTime="200 milliseconds").start())

    try:
        nc = loop.run_until_complete(nats.connect(proc.url))
        js = nc.jetstream(timeout=5)
        loop.run_until_complete(js.add_stream(name="LIVE", subjects=["live.>"]))
        loop.run_until_complete(publish(js, model, "live.{i}", 60, tag="s"))
        query = run_query()
        try:
            query.processAllAvailable()
            assert sorted(seen) == list(range(1, 61))
            loop.run_until_complete(publish(js, model, "live.{i}", 40, tag="t"))  # after the query started
            query.processAllAvailable()
            assert sorted(seen) == list(range(1, 101))
        finally:
            query.stop()
        loop.run_until_complete(publish(js, model, "live.{i}", 50, tag="u"))  # while the query is down
        query = run_query()
        try:
            query.processAllAvailable()
            loop.run_until_complete(publish(js, model, "live.{i}", 20, tag="v"))
            query.processAllAvailable()
        finally:
            query.stop()
        assert seen == sorted(seen), "micro-batches go forward in sequence order"
        assert seen == list(range(1, 171)), "no gap and no repeat across the restart"
        # startingOffsets=latest: only what comes after the query started
        latest: list[int] = []
        q = (spark.readStream.format("zonebus").option("store", url).option("stream", "LIVE")
             .option("startingOffsets", "latest").load().writeStream
             .foreachBatch(lambda df, _i: latest.extend(r["seq"] for r in df.select("seq").collect()))
             .trigger(processingTime="200 milliseconds").start())
        try:
            q.processAllAvailable()
            loop.run_until_complete(publish(js, model, "live.{i}", 5, tag="w"))
            q.processAllAvailable()
        finally:
            q.stop()
        assert latest == list(range(171, 176))
        loop.run_until_complete(nc.close())
    finally:
        proc.stop()
        loop.close()


@pytest.fixture(scope="module")
def moto_s3() -> Iterator[MotoS3]:
    with moto_s3_server("streams") as s3:
        yield s3


@pytest.mark.timeout(120)
def test_s3_store_through_moto(spark, moto_s3: MotoS3, tmp_path: Path) -> None:
    url = "s3://streams/prod"
    env = moto_s3.env()
    moto_endpoint = moto_s3.endpoint
    proc = start_server(tmp_path / "server", url, env=env)
    model: Expected = {}

    async def fill() -> None:
        nc = await nats.connect(proc.url)
        js = nc.jetstream(timeout=5)
        await js.add_stream(name="S3", subjects=["s3.>"])
        await publish(js, model, "s3.{i}.eu", 120, tag="s")
        await js.delete_msg("S3", 7)
        del model[7]
        await nc.close()

    try:
        asyncio.run(fill())
    finally:
        proc.stop()
    df = read(spark, url, "S3", endpoint=moto_endpoint, region="us-east-1", partitionBytes=2048)
    assert df.rdd.getNumPartitions() > 1
    assert as_model(df.collect()) == model
    assert read(spark, url, "S3", endpoint=moto_endpoint, region="us-east-1", startingSeq=100).count() == 21


@pytest.mark.timeout(120)
def test_cli_export_writes_partitioned_parquet(spark, published: Published, tmp_path: Path, capsys) -> None:
    from zonebus.cli.main import main

    out = tmp_path / "edits"
    code = main(["streams", "export", "--stream", "EDITS", "--store", published.url, "--to", str(out)])
    stdout = capsys.readouterr().out
    assert code == 0, stdout
    n = len(published.edits)
    assert f"wrote {n} messages of stream EDITS (seq {min(published.edits)}..{max(published.edits)})" in stdout
    assert any(p.name.startswith("date=") for p in out.iterdir())
    back = spark.read.parquet(str(out))
    assert as_model(back.collect()) == published.edits
    code = main(["streams", "export", "--stream", "ORDERS", "--store", published.url, "--to", str(out),
                 "--overwrite", "--subjects", "orders.*.us", "--partition-by", "subject"])
    assert code == 0
    assert {p.name for p in out.iterdir() if p.is_dir()} == {f"subject=orders.{i}.us" for i in range(4)}
    assert spark.read.parquet(str(out)).count() == 150


@pytest.mark.timeout(60)
@pytest.mark.parametrize("argv, needle", [
    (["export", "--store", "file:///x", "--to", "/tmp/x"], "the following arguments are required: --stream"),
    (["export", "--stream", "S", "--store", "ftp://host/x", "--to", "{tmp}/o"], "--store: ftp://host/x: unsupported"),
    (["export", "--stream", "S", "--store", "file://{tmp}/none", "--to", "{tmp}/o"], "--store: file://"),
    (["export", "--stream", "NOPE", "--store", "{url}", "--to", "{tmp}/o"], "--stream: "),
    (["export", "--stream", "ORDERS", "--store", "{url}", "--to", "{tmp}/o", "--subjects", "a.>.b"],
     "--subjects: 'a.>.b' is not a NATS subject filter"),
    (["export", "--stream", "ORDERS", "--store", "{url}", "--to", "{tmp}/file"], "--to: "),
    (["export", "--stream", "ORDERS", "--store", "{url}", "--to", "{tmp}/full"], "is not empty (use --overwrite"),
    (["export", "--stream", "ORDERS", "--store", "{url}", "--to", "{tmp}/o", "--partition-by", "x"],
     "--partition-by: invalid choice: 'x'"),
    ([], "a command is needed"),
])
def test_cli_bad_options_are_one_line_exit_2(argv: list[str], needle: str, published: Published, tmp_path: Path,
                                            capsys) -> None:
    from zonebus.cli.main import main

    (tmp_path / "file").write_text("x")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "part").write_text("x")
    args = [a.format(tmp=tmp_path, url=published.url) for a in argv]
    capsys.readouterr()
    assert main(["streams", *args]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert needle in err and err.startswith("zonebus streams"), err
