"""Shared-store benchmark: publish-ack throughput and latency of one lone server, 1 KiB messages.

Rows: nats-server's file store (default sync, and `sync_interval: always`), zonebus's local file store, and
zonebus with `jetstream { shared_store: "file://..." }` at several `shared_store_linger` values. For each:

- async publish-ack msgs/s: nats-py `publish_async` with up to 256 acks outstanding, for `--seconds`
  (or `--msgs` messages, whichever comes first), and the p50/p99 of each publish's ack latency under that load;
- idle latency: p50/p99 of one `publish` at a time (`--idle` publishes).

The shared store fsyncs every batch (data and directory) before it acks; nats-server and zonebus's file store
by default only write to the kernel (fsync every 2 minutes), hence the `sync always` row for comparison.

Run: `python bench/shared_store.py [--seconds 6] [--msgs 30000] [--idle 300] [--lingers 0,1ms,5ms]`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import nats  # noqa: E402

from zonebus.testing.processes import ServerProcess  # noqa: E402

WINDOW = 256
SIZE = 1024


def pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(p * len(values)))]


async def measure(url: str, seconds: float, max_msgs: int, idle: int) -> dict[str, float]:
    nc = await nats.connect(url)
    js = nc.jetstream(timeout=30)
    await js.add_stream(name="BENCH", subjects=["bench.>"])
    payload = os.urandom(SIZE)
    lat: list[float] = []
    pending: set[asyncio.Future] = set()
    sent = 0
    t0 = time.perf_counter()
    end = t0 + seconds
    while sent < max_msgs and time.perf_counter() < end:
        if len(pending) >= WINDOW:
            _done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        start = time.perf_counter()
        fut = await js.publish_async(f"bench.{sent % 16}", payload, wait_stall=30)
        fut.add_done_callback(lambda f, s=start: lat.append(time.perf_counter() - s))
        pending.add(fut)
        sent += 1
    if pending:
        await asyncio.wait(pending)
    dt = time.perf_counter() - t0
    idle_lat = []
    for i in range(idle):
        s = time.perf_counter()
        await js.publish(f"bench.idle.{i % 4}", payload)
        idle_lat.append(time.perf_counter() - s)
    info = await js.stream_info("BENCH")
    assert info.state.messages == sent + idle, info.state
    await js.delete_stream("BENCH")
    await nc.close()
    return {"rate": sent / dt, "p50": pct(lat, 0.5) * 1e3, "p99": pct(lat, 0.99) * 1e3,
            "ip50": pct(idle_lat, 0.5) * 1e3, "ip99": pct(idle_lat, 0.99) * 1e3, "n": sent}


def config(impl: str, store: str, shared: str | None, linger: str, sync_always: bool) -> str:
    lines = [f'store_dir: "{store}"']
    if sync_always:
        lines.append("sync_interval: always")
    if shared is not None:
        lines += [f'shared_store: "file://{shared}"', f'shared_store_linger: "{linger}"']
    return "jetstream {\n  " + "\n  ".join(lines) + "\n}\n"


async def run_row(label: str, impl: str, args: argparse.Namespace, shared: bool = False, linger: str = "",
                  sync_always: bool = False) -> tuple[str, dict[str, float]]:
    root = tempfile.mkdtemp(prefix="zb-bench-shared-")
    conf = config(impl, f"{root}/local", f"{root}/shared" if shared else None, linger, sync_always)
    proc = ServerProcess(impl=impl, config=conf).start(timeout=60)
    try:
        res = await measure(proc.url, args.seconds, args.msgs, args.idle)
    finally:
        proc.stop()
    return label, res


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=6.0, help="time limit of each throughput run")
    ap.add_argument("--msgs", type=int, default=30000, help="message limit of each throughput run")
    ap.add_argument("--idle", type=int, default=300, help="one-at-a-time publishes for the idle latency")
    ap.add_argument("--lingers", default="0,1ms,5ms", help="shared_store_linger values (comma-separated)")
    args = ap.parse_args()
    rows = [await run_row("nats-server file store", "nats", args),
            await run_row("nats-server file store, sync always", "nats", args, sync_always=True),
            await run_row("zonebus file store (local)", "zonebus", args)]
    for linger in [x.strip() for x in args.lingers.split(",") if x.strip()]:
        rows.append(await run_row(f"zonebus shared file://, linger {linger}", "zonebus", args, True,
                                  linger if linger != "0" else "0s"))
    base = rows[0][1]["rate"]
    head = (f"{'1 KiB, lone server':40} {'msgs/s':>9} {'x nats':>7} {'p50 ms':>8} {'p99 ms':>8} "
            f"{'idle p50':>9} {'idle p99':>9}")
    print(head)
    print("-" * len(head))
    for label, r in rows:
        print(f"{label:40} {r['rate']:9.0f} {r['rate'] / base:7.2f} {r['p50']:8.2f} {r['p99']:8.2f} "
              f"{r['ip50']:9.2f} {r['ip99']:9.2f}")
    print(f"(async: up to {WINDOW} acks outstanding, {args.seconds:g} s or {args.msgs} msgs per row; "
          f"idle: {args.idle} publishes one at a time; medians of per-publish ack latency)")


if __name__ == "__main__":
    asyncio.run(main())
