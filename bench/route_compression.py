"""Route compression: bytes between zones per payload byte, and the servers' CPU per message, for zonebus
(zstd) and nats-server (S2) at each `cluster { compression }` mode.

Three servers, one per zone, every route through a byte-counting proxy (`zonebus.testing.zonecluster`); a
publisher on s1 sends `--msgs` JSON order events of about `--size` bytes (`zonebus.testing.payloads`), plain
subscribers on s2 and s3 receive them all, so each payload crosses two zone boundaries. Measured over the
publish phase only (after the mesh, the interest and a probe message):

- `x-zone B / payload B`: bytes on the route sockets (both directions, everything: heartbeats too) per
  payload byte that had to cross (payload bytes x 2);
- `server CPU us/msg`: user + system CPU of the three server processes (from /proc) per published message;
- `routez ratio`: zonebus's own count, wire bytes per protocol byte on s1's routes.

    python bench/route_compression.py [--msgs 3000] [--size 750] [--only zonebus|nats]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sys
import tempfile
import time
from pathlib import Path

import nats

from zonebus.testing.payloads import json_event
from zonebus.testing.processes import ServerProcess, wait_for_mesh
from zonebus.testing.zonecluster import ZoneCluster

CONFIGS = [("nats", "off"), ("nats", "s2_fast"), ("nats", "s2_best"),
           ("zonebus", "off"), ("zonebus", "s2_fast"), ("zonebus", "s2_better"), ("zonebus", "s2_best")]
TICK = os.sysconf("SC_CLK_TCK")


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def cpu_seconds(servers: list[ServerProcess]) -> float:
    total = 0
    for s in servers:
        assert s.proc is not None
        for pid in [s.proc.pid, *s.worker_pids()]:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)
    return total / TICK


async def run(impl: str, mode: str, msgs: int, size: int, tmp: Path) -> dict[str, object]:
    def jetstream(i: int, t: Path) -> str:  # ZoneCluster starts nats-server with -js: give it its own store
        return f'jetstream {{ store_dir: "{t}/js{i}" }}' if impl == "nats" else ""

    zc = ZoneCluster(f"{impl} {mode}", impl, jetstream, zones=3, cluster_extra=f"compression: {mode}")
    zc.start(tmp)
    try:
        await asyncio.to_thread(wait_for_mesh, zc.servers, time.monotonic() + 30)
        pub, *subs = [await nats.connect(s.url) for s in zc.servers]
        counts = [0, 0]

        def counter(k: int):  # noqa: ANN202
            async def cb(msg) -> None:  # noqa: ANN001
                counts[k] += 1
            return cb

        for k, nc in enumerate(subs):
            await nc.subscribe("bench.json", cb=counter(k))
            await nc.flush()
        deadline = time.monotonic() + 20
        while min(counts) == 0:  # the probe: interest has reached s1
            if time.monotonic() > deadline:
                raise TimeoutError("no interest on s1")
            await pub.publish("bench.json", b"{}")
            await pub.flush()
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)
        rng = random.Random(42)
        payloads = [json_event(rng, i, size) for i in range(msgs)]
        start_counts = list(counts)
        zc.reset_bytes()
        cpu0, t0 = cpu_seconds(zc.servers), time.perf_counter()
        for i in range(0, msgs, 100):
            for p in payloads[i:i + 100]:
                await pub.publish("bench.json", p)
            await pub.flush()
        deadline = time.monotonic() + 120
        while any(c - s0 < msgs for c, s0 in zip(counts, start_counts, strict=True)):
            if time.monotonic() > deadline:
                raise TimeoutError(f"only {counts} of {msgs} received")
            await asyncio.sleep(0.01)
        wall = time.perf_counter() - t0
        cpu = cpu_seconds(zc.servers) - cpu0
        crossed = zc.cross_zone()
        for nc in (pub, *subs):
            await nc.close()
        ratio = "-"
        if impl == "zonebus":
            routes = zc.servers[0].http_get("/routez")["routes"]
            raw = sum(r["compression_bytes"]["raw_out"] + r["compression_bytes"]["raw_in"] for r in routes)
            wire = sum(r["compression_bytes"]["wire_out"] + r["compression_bytes"]["wire_in"] for r in routes)
            ratio = f"{wire / raw:.3f}" if raw else "1"
            mode_shown = routes[0].get("compression", "")
        else:
            mode_shown = zc.servers[0].http_get("/routez")["routes"][0].get("compression", "")
        payload_bytes = sum(map(len, payloads))
        return {"impl": impl, "mode": mode, "shown": mode_shown, "per_byte": crossed / (2 * payload_bytes),
                "cpu_us": cpu / msgs * 1e6, "rate": msgs / wall, "ratio": ratio, "avg": payload_bytes / msgs}
    finally:
        zc.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--msgs", type=int, default=3000)
    ap.add_argument("--size", type=int, default=750)
    ap.add_argument("--only", choices=("zonebus", "nats"), default=None)
    args = ap.parse_args()
    rows = []
    for impl, mode in CONFIGS:
        if args.only and impl != args.only:
            continue
        log(f"{impl} compression: {mode}")
        with tempfile.TemporaryDirectory(prefix="zb-rc-") as tmp:
            rows.append(asyncio.run(run(impl, mode, args.msgs, args.size, Path(tmp))))
    print(f"\n{args.msgs} JSON events of ~{rows[0]['avg']:.0f} B from s1 to subscribers on s2 and s3 "
          "(one server per zone)\n")
    print("| server | compression | route shows | x-zone B / payload B | server CPU us/msg | msgs/s | routez ratio |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        name = "nats-server" if r["impl"] == "nats" else "zonebus"
        print(f"| {name} | {r['mode']} | {r['shown']} | {r['per_byte']:.3f} | {r['cpu_us']:.1f} | "
              f"{r['rate']:,.0f} | {r['ratio']} |")


if __name__ == "__main__":
    main()
