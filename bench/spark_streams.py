"""Reading a whole stream: Spark in place on the shared store vs nats-py through the server, rows/s side by side.

One lone `zonebus server` with `jetstream { shared_store: "file://..." }` holds a stream of `--messages`
messages (`--payload` bytes, `--subjects` subjects). Then:

- nats-py: a pull consumer (`AckPolicy.NONE`, fetches of `--fetch` messages) reads every message through the
  server, counting messages and payload bytes;
- Spark (`local[2]` by default): `spark.read.format("zonebus")` over the same store, no server in the path,
  computing the same count and byte sum (and the number of distinct subjects), twice: the first read
  includes starting Spark's Python workers, the second is warm. The session's own start is not counted.

The stream is filled through the server with nats-py (`publish_async`, up to 256 acks outstanding), or, with
`--fill direct`, by the store's writer API before the server starts (faster for large counts; the server
takes the stream over at start, as after a restart). Both readers must see exactly `--messages` messages.

Run: `python bench/spark_streams.py [--messages 1000000] [--payload 128] [--subjects 16] [--master local[2]]
[--fill server|direct] [--skip-nats]`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import nats  # noqa: E402
from nats.js.api import AckPolicy, ConsumerConfig  # noqa: E402

from zonebus.testing.processes import ServerProcess  # noqa: E402

STREAM = "BENCH"
WINDOW = 256


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def server_config(root: Path) -> str:
    return (f'jetstream {{ store_dir: "{root}/local", shared_store: "file://{root}/shared", '
            f'shared_store_linger: "5ms" }}\nmax_payload: 1MB\n')


async def fill_server(url: str, args: argparse.Namespace) -> float:
    nc = await nats.connect(url)
    js = nc.jetstream(timeout=60)
    await js.add_stream(name=STREAM, subjects=["bench.>"])
    payload = os.urandom(args.payload)
    pending: set[asyncio.Future] = set()
    t0 = time.perf_counter()
    for i in range(args.messages):
        if len(pending) >= WINDOW:
            _done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        pending.add(await js.publish_async(f"bench.{i % args.subjects}.x", payload, wait_stall=60))
        if i and i % 100_000 == 0:
            log(f"  published {i:,}")
    if pending:
        await asyncio.wait(pending)
    dt = time.perf_counter() - t0
    await nc.close()
    return dt


def fill_direct(root: Path, args: argparse.Namespace) -> float:
    from zonebus.store.shared import CommitOptions, SharedStorage
    from zonebus.stream.stream_config import normalize

    t0 = time.perf_counter()
    storage = SharedStorage(f"file://{root}/shared", options=CommitOptions(batch_bytes=1 << 20))
    config = normalize({"name": STREAM, "subjects": ["bench.>"]}, STREAM, {})
    store = storage.create_stream(STREAM, config, time.time_ns())
    payload = os.urandom(args.payload)
    for i in range(args.messages):
        store.store(f"bench.{i % args.subjects}.x", None, payload)
    store.close()
    return time.perf_counter() - t0


async def consume_nats(url: str, args: argparse.Namespace) -> tuple[float, int, int]:
    nc = await nats.connect(url)
    js = nc.jetstream(timeout=60)
    await js.add_consumer(STREAM, ConsumerConfig(durable_name="bench", ack_policy=AckPolicy.NONE,
                                                 max_ack_pending=-1))
    sub = await js.pull_subscribe_bind(durable="bench", stream=STREAM)
    n = nbytes = 0
    t0 = time.perf_counter()
    while n < args.messages:
        msgs = await sub.fetch(args.fetch, timeout=30)
        n += len(msgs)
        nbytes += sum(len(m.data) for m in msgs)
    dt = time.perf_counter() - t0
    await nc.close()
    return dt, n, nbytes


def read_spark(root: Path, args: argparse.Namespace) -> list[tuple[float, int, int, int]]:
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from zonebus.pipeline.session import build_session
    from zonebus.pipeline.streams_source import register

    t0 = time.perf_counter()
    spark = build_session(args.master, "zonebus-bench-spark-streams", {"spark.sql.shuffle.partitions": "2"})
    register(spark)
    log(f"  spark session started in {time.perf_counter() - t0:.1f} s")
    out = []
    try:
        for _ in range(2):
            t = time.perf_counter()
            df = (spark.read.format("zonebus").option("store", f"file://{root}/shared").option("stream", STREAM)
                  .load())
            row = df.selectExpr("count(*) AS n", "sum(length(data)) AS b", "count(distinct subject) AS s").first()
            out.append((time.perf_counter() - t, int(row["n"]), int(row["b"] or 0), int(row["s"])))
    finally:
        spark.stop()
    return out


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=1_000_000, help="messages in the stream (default 1,000,000)")
    ap.add_argument("--payload", type=int, default=128, help="payload bytes per message (default 128)")
    ap.add_argument("--subjects", type=int, default=16, help="distinct subjects (default 16)")
    ap.add_argument("--fetch", type=int, default=1000, help="nats-py fetch batch (default 1000)")
    ap.add_argument("--master", default="local[2]", help="Spark master (default local[2])")
    ap.add_argument("--fill", choices=("server", "direct"), default="server",
                    help="publish through the server with nats-py (default) or write the store directly")
    ap.add_argument("--skip-nats", action="store_true", help="only the Spark read")
    ap.add_argument("--keep", action="store_true", help="keep the store directory")
    args = ap.parse_args()

    root = Path(tempfile.mkdtemp(prefix="zb-bench-spark-streams-"))
    fill_s = 0.0
    proc: ServerProcess | None = None
    try:
        if args.fill == "direct":
            log(f"writing {args.messages:,} messages to the shared store directly")
            fill_s = fill_direct(root, args)
        proc = ServerProcess(impl="zonebus", config=server_config(root)).start(timeout=120)
        if args.fill == "server":
            log(f"publishing {args.messages:,} messages through the server (nats-py)")
            fill_s = await fill_server(proc.url, args)
        log(f"  filled in {fill_s:.1f} s ({args.messages / fill_s:,.0f} msgs/s)")
        nats_res = None
        if not args.skip_nats:
            log("consuming with nats-py")
            nats_res = await consume_nats(proc.url, args)
        proc.stop()
        proc = None  # Spark reads the store with no server running
        log("reading with Spark")
        spark_res = read_spark(root, args)
    finally:
        if proc is not None:
            proc.stop()
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)

    want_bytes = args.messages * args.payload
    print(f"stream: {args.messages:,} messages x {args.payload} B, {args.subjects} subjects, "
          f"filled {args.fill} at {args.messages / fill_s:,.0f} msgs/s; {os.cpu_count()} cores")
    head = f"{'reader':36} {'seconds':>8} {'rows/s':>11} {'x nats-py':>10}"
    print(head)
    print("-" * len(head))
    base = None
    if nats_res is not None:
        dt, n, nbytes = nats_res
        assert (n, nbytes) == (args.messages, want_bytes), (n, nbytes)
        base = n / dt
        print(f"{'nats-py pull consumer (AckNone)':36} {dt:8.2f} {base:11,.0f} {1.0:10.2f}")
    for label, (dt, n, nbytes, subjects) in zip(("Spark (first read)", "Spark (second read)"), spark_res,
                                                strict=True):
        assert (n, nbytes, subjects) == (args.messages, want_bytes, args.subjects), (n, nbytes, subjects)
        ratio = f"{n / dt / base:10.2f}" if base else f"{'-':>10}"
        print(f"{label + ', ' + args.master:36} {dt:8.2f} {n / dt:11,.0f} {ratio}")


if __name__ == "__main__":
    asyncio.run(main())
