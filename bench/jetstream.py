"""JetStream benchmark: zonebus -js against nats-server -js, with the same nats-py load generator.

1. publish-with-ack throughput to a file-store stream (publish_async, a window of in-flight acks);
2. pull-consume throughput (fetch batches from a durable pull consumer, ack policy none);
3. fetch time from a consumer with two filters that together match 1% of a stream of 50k / 200k / 1M
   messages (zonebus only): it must not grow with the stream. The big streams are written straight into
   the store directory with zonebus's FileStore, then the server recovers them on start (time shown).

Run: `python bench/jetstream.py [--msgs 20000] [--size 128] [--big 1000000]`. Prints one table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import nats  # noqa: E402
from nats.js.api import AckPolicy, ConsumerConfig  # noqa: E402

from zonebus.stream.filestore import FileStore  # noqa: E402
from zonebus.stream.stream_config import normalize  # noqa: E402
from zonebus.testing.processes import ServerProcess  # noqa: E402

WINDOW = 256


def start(impl: str, store: str) -> ServerProcess:
    return ServerProcess(impl=impl, config=f'jetstream {{ store_dir: "{store}" }}\n').start(timeout=120)


async def publish_rate(url: str, n: int, size: int) -> float:
    nc = await nats.connect(url)
    js = nc.jetstream(timeout=30)
    await js.add_stream(name="BENCH", subjects=["bench.>"])
    payload = os.urandom(size)
    t0 = time.perf_counter()
    pending: list[asyncio.Future] = []
    for i in range(n):
        pending.append(await js.publish_async(f"bench.{i % 16}", payload, wait_stall=30))
        if len(pending) >= WINDOW:
            await asyncio.gather(*pending)
            pending.clear()
    await asyncio.gather(*pending)
    dt = time.perf_counter() - t0
    info = await js.stream_info("BENCH")
    assert info.state.messages == n, info.state
    await nc.close()
    return n / dt


async def consume_rate(url: str, n: int) -> float:
    nc = await nats.connect(url)
    js = nc.jetstream(timeout=30)
    await js.add_consumer("BENCH", ConsumerConfig(durable_name="reader", ack_policy=AckPolicy.NONE))
    sub = await js.pull_subscribe_bind(durable="reader", stream="BENCH")
    got = 0
    t0 = time.perf_counter()
    while got < n:
        got += len(await sub.fetch(min(1000, n - got), timeout=10))
    dt = time.perf_counter() - t0
    await js.delete_stream("BENCH")
    await nc.close()
    return n / dt


def write_big_stream(store: str, n: int) -> None:
    """A stream of n messages over 200 subjects (each filter subject matches 1 in 200) written offline."""
    cfg = normalize({"name": "BIG", "subjects": ["big.>"]}, "BIG", {})
    d = Path(store) / "jetstream" / "streams" / "BIG"
    d.mkdir(parents=True)
    (d / "meta.json").write_text(json.dumps({"config": cfg, "created": time.time_ns()}))
    fs = FileStore(d / "msgs")
    payload = b"p" * 32
    for i in range(n):
        fs.store(f"big.k{i % 200}.v", None, payload)
    fs.close()


async def filtered_fetch_ms(url: str, rounds: int = 9, batch: int = 50) -> float:
    """Median time of one fetch of `batch` messages from a consumer whose 2 filters match 1% of the stream."""
    nc = await nats.connect(url)
    js = nc.jetstream(timeout=60)
    cfg = ConsumerConfig(durable_name="sparse", ack_policy=AckPolicy.NONE,
                         filter_subjects=["big.k7.*", "big.k42.>"])
    await js.add_consumer("BIG", cfg)
    sub = await js.pull_subscribe_bind(durable="sparse", stream="BIG")
    await sub.fetch(1, timeout=10)  # warm up: connection, consumer, first lookup
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        got = await sub.fetch(batch, timeout=10)
        times.append(time.perf_counter() - t0)
        assert len(got) == batch
    await nc.close()
    return statistics.median(times) * 1000


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--msgs", type=int, default=20000)
    ap.add_argument("--size", type=int, default=128)
    ap.add_argument("--big", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=3, help="runs per server; the best is reported")
    args = ap.parse_args()
    rows = []
    rates: dict[str, tuple[float, float]] = {}
    for _ in range(args.repeat):
        for impl in ("nats", "zonebus"):  # interleaved, so that machine noise hits both alike
            store = tempfile.mkdtemp(prefix=f"zb-bench-{impl}-")
            proc = start(impl, store)
            try:
                pub = await publish_rate(proc.url, args.msgs, args.size)
                con = await consume_rate(proc.url, args.msgs)
            finally:
                proc.stop()
            best = rates.get(impl, (0.0, 0.0))
            rates[impl] = (max(best[0], pub), max(best[1], con))
    for i, what in enumerate(("publish with ack (file store), msgs/s", "pull consume (fetch 1000), msgs/s")):
        ref, ours = rates["nats"][i], rates["zonebus"][i]
        rows.append((what, f"{ref:,.0f}", f"{ours:,.0f}", f"{ours / ref:.3f}"))
    print(f"\nJetStream, {args.msgs} messages of {args.size} bytes, ack window {WINDOW}, best of {args.repeat};"
          " load generator: nats-py")
    print(f"{'':42} {'nats-server':>12} {'zonebus':>12} {'zonebus/nats':>13}")
    for what, a, b, r in rows:
        print(f"{what:42} {a:>12} {b:>12} {r:>13}")
    sizes = sorted({50_000, 200_000, args.big})
    print("\nfetch 50 messages from a 2-filter consumer matching 1% of the stream (zonebus, median of 9)")
    print(f"{'stream size':>12} {'recovery s':>11} {'fetch ms':>9}")
    for n in sizes:
        store = tempfile.mkdtemp(prefix="zb-bench-big-")
        write_big_stream(store, n)
        t0 = time.perf_counter()
        proc = start("zonebus", store)
        recovery = time.perf_counter() - t0
        try:
            ms = await filtered_fetch_ms(proc.url)
        finally:
            proc.stop()
        print(f"{n:>12,} {recovery:>11.1f} {ms:>9.1f}")


if __name__ == "__main__":
    asyncio.run(main())
