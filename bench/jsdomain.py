"""JetStream domains: the cost of the `$JS.<domain>.API.` hop, zonebus against nats-server in one run.

For each implementation: a hub with `jetstream { domain: hub }` and a leaf of it with `domain: leaf` (the same
implementation), and a nats-py client on the hub timing sequential requests (p50 / p99, µs):
`$JS.API.INFO` (plain), `$JS.hub.API.INFO` (the domain, answered by the hub) and `$JS.leaf.API.INFO` (across
the leaf link, answered by the leaf). Prints one table with zonebus / nats-server ratios. The machine is
shared and noisy: compare within a run, repeat (`--rounds`) and look at the spread.

Run: `python bench/jsdomain.py [--requests 2000] [--rounds 3]`.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import nats  # noqa: E402

from zonebus.localservers import free_port  # noqa: E402
from zonebus.testing.processes import ServerProcess, start_parallel, stop_all  # noqa: E402

SUBJECTS = {"plain": "$JS.API.INFO", "domain": "$JS.hub.API.INFO", "leaf": "$JS.leaf.API.INFO"}


def _servers(impl: str, tmp: Path) -> list[ServerProcess]:
    port = free_port()
    hub = ServerProcess(impl, workers=1, config=(
        f'server_name: hub\njetstream {{ store_dir: "{tmp / "hub"}", domain: hub }}\n'
        f'leafnodes {{ listen: "127.0.0.1:{port}" }}\n'))
    leaf = ServerProcess(impl, workers=1, config=(
        f'server_name: leaf\njetstream {{ store_dir: "{tmp / "leaf"}", domain: leaf }}\n'
        f'leafnodes {{ remotes: [{{ url: "nats-leaf://127.0.0.1:{port}" }}] }}\n'))
    return [hub, leaf]


async def _time(nc: nats.NATS, subject: str, n: int) -> tuple[float, float]:
    for _ in range(100):  # (warm up; the leaf's interest may still be on its way)
        try:
            await nc.request(subject, b"", timeout=1)
        except (nats.errors.NoRespondersError, nats.errors.TimeoutError):
            await asyncio.sleep(0.05)
    took = []
    for _ in range(n):
        t0 = time.perf_counter()
        await nc.request(subject, b"", timeout=5)
        took.append((time.perf_counter() - t0) * 1e6)
    took.sort()
    return statistics.median(took), took[int(len(took) * 0.99) - 1]


async def _round(impl: str, n: int) -> dict[str, tuple[float, float]]:
    servers = start_parallel(_servers(impl, Path(tempfile.mkdtemp(prefix=f"jsdomain-{impl}-"))))
    try:
        nc = await nats.connect(servers[0].url)
        try:
            return {name: await _time(nc, subject, n) for name, subject in SUBJECTS.items()}
        finally:
            await nc.close()
    finally:
        stop_all(servers)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    runs: dict[str, list[dict[str, tuple[float, float]]]] = {"zonebus": [], "nats": []}
    for _ in range(args.rounds):
        for impl in runs:
            runs[impl].append(await _round(impl, args.requests))
    print(f"sequential requests from a hub client, {args.requests} per kind, {args.rounds} rounds "
          "(p50 median of rounds [min-max], p99 median), µs")
    print("| request | zonebus p50 | zonebus p99 | nats-server p50 | nats-server p99 | p50 ratio |")
    print("|---|---|---|---|---|---|")
    for name, subject in SUBJECTS.items():
        cells = []
        medians = {}
        for impl, rounds in runs.items():
            p50s = [r[name][0] for r in rounds]
            medians[impl] = statistics.median(p50s)
            cells += [f"{medians[impl]:.0f} [{min(p50s):.0f}-{max(p50s):.0f}]",
                      f"{statistics.median(r[name][1] for r in rounds):.0f}"]
        print(f"| `{subject}` | " + " | ".join(cells) + f" | {medians['zonebus'] / medians['nats']:.2f} |")


if __name__ == "__main__":
    asyncio.run(main())
