"""Encryption at rest, its cost: publish-ack rate and latency on one file stream, with and without a key.

For each server (zonebus, and nats-server for reference) and each setting (no key; `key` with `cipher:
chachapoly`; `key` with `cipher: aes`), runs interleaved `--repeat` times on a fresh store: `--msgs` async
publishes with a window of acks in flight (msgs/s), then `--latency-msgs` sequential publishes (each waits
for its PubAck: p50 / p99 ms). Reports the best rate and the median latencies over the runs. Each server
runs with its own default `sync_interval` (zonebus: `always`, nats-server: `2m`) unless `--sync` is given.

Run: `python bench/atrest.py [--msgs 20000] [--size 128] [--latency-msgs 1000] [--repeat 3] [--impl zonebus]`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import nats

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from jetstream import WINDOW, publish_window  # noqa: E402

from zonebus.testing.processes import ServerProcess  # noqa: E402

SETTINGS = {"no key": "", "chachapoly": 'key: "bench-key", cipher: chachapoly',
            "aes": 'key: "bench-key", cipher: aes'}


def config(store: str, setting: str, sync: str) -> str:
    extra = [SETTINGS[setting]] if SETTINGS[setting] else []
    if sync:
        extra.append(f"sync_interval: {json.dumps(sync)}")
    return "jetstream { " + ", ".join([f'store_dir: "{store}"', *extra]) + " }\n"


async def run(url: str, n: int, size: int, latency_msgs: int) -> tuple[float, float, float]:
    nc = await nats.connect(url)
    try:
        js = nc.jetstream(timeout=30)
        await js.add_stream(name="BENCH", subjects=["bench.>"])
        payload = b"x" * size
        rate = n / await publish_window(js, n, payload)
        lat = []
        for i in range(latency_msgs):
            t = time.perf_counter()
            await js.publish(f"bench.{i % 16}", payload)
            lat.append(time.perf_counter() - t)
        lat.sort()
        return rate, lat[len(lat) // 2] * 1000, lat[int(len(lat) * 0.99)] * 1000
    finally:
        await nc.close()


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--msgs", type=int, default=20000)
    ap.add_argument("--size", type=int, default=128)
    ap.add_argument("--latency-msgs", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--sync", default="", help="sync_interval for every run (default: each server's own)")
    ap.add_argument("--impl", action="append", choices=("zonebus", "nats"), help="default: both")
    args = ap.parse_args()
    impls = args.impl or ["nats", "zonebus"]
    results: dict[tuple[str, str], list[tuple[float, float, float]]] = {}
    for r in range(args.repeat):
        for impl in impls:
            for setting in SETTINGS:  # interleaved, so that machine noise hits every setting alike
                store = tempfile.mkdtemp(prefix=f"zb-bench-atrest-{impl}-")
                with ServerProcess(impl=impl, config=config(store, setting, args.sync)) as proc:
                    out = await run(proc.url, args.msgs, args.size, args.latency_msgs)
                results.setdefault((impl, setting), []).append(out)
                print(f"run {r + 1}: {impl} {setting}: {out[0]:,.0f} msgs/s, p50 {out[1]:.2f} ms, "
                      f"p99 {out[2]:.2f} ms", flush=True)
    print(f"\n{args.msgs} async publishes of {args.size} B (window {WINDOW}), then {args.latency_msgs} sequential; "
          f"best rate, median latencies of {args.repeat} runs")
    print(f"{'server':10} {'setting':12} {'msgs/s':>10} {'p50 ms':>8} {'p99 ms':>8} {'rate vs no key':>15}")
    for impl in impls:
        base = max(o[0] for o in results[(impl, "no key")])
        for setting in SETTINGS:
            runs = results[(impl, setting)]
            rate = max(o[0] for o in runs)
            print(f"{impl:10} {setting:12} {rate:>10,.0f} {statistics.median(o[1] for o in runs):>8.2f} "
                  f"{statistics.median(o[2] for o in runs):>8.2f} {rate / base:>15.3f}")


if __name__ == "__main__":
    asyncio.run(main())
