"""nats-server R3's bill over its consumer-leader elections, for `bench/whole_bill.py`.

nats-server elects each R3 consumer's leader among the stream's three servers, and delivers from it: a reader
whose consumer is led outside its zone gets every message across a zone boundary. So one run's bill is one draw:
it moves by about a third between none and three of the bench's three consumers led outside their zone. With
`--nats-placements each` the bench runs nats-server once per count k = 0..3 of consumers led outside (consumers
z1..zk, placed by leader stepdowns with a preferred server, which nats-server 2.11+ honours), samples how often
nats-server elects a consumer's leader outside the zone of the server the consumer was created through (as the
bench's readers create theirs), and weighs the four bills by that binomial: nats-server's expected bill.
"""

from __future__ import annotations

import math
from typing import Any

import nats
from nats.js.api import AckPolicy, ConsumerConfig
from whole_bill_report import bill_per_gb

from zonebus.prices import StoragePrices, storage_prices
from zonebus.testing.zonecluster import step_leader_to

Results = list[tuple[Any, str, dict]]  # (the setup: `impl`, `outside`; the workload; the run's figures)
SAMPLE = 30  # consumers created per nats-server run to sample its elections


def wanted_leader(zone: int, outside: int, zones: int = 3) -> str:
    """The server to lead the consumer read in `zone` (1-based) when the first `outside` readers are led outside
    their zone: its own server, or the next zone's."""
    return f"s{zone % zones + 1}" if zone <= outside else f"s{zone}"


async def lead_consumer(url: str, stream: str, durable: str, server: str) -> str:
    """Step the consumer's leader down towards `server` until it leads it; the leader it ended with."""
    nc = await nats.connect(url)
    try:
        return await step_leader_to(nc, f"$JS.API.CONSUMER.INFO.{stream}.{durable}",
                                    f"$JS.API.CONSUMER.LEADER.STEPDOWN.{stream}.{durable}", server,
                                    {"placement": {"preferred": server}}, tries=30, pause=0.5)
    finally:
        await nc.close()


async def sample_elections(urls: list[str], stream: str, n: int = SAMPLE) -> tuple[int, int]:
    """(consumers nats-server elected a leader outside the zone of the server they were created through, of
    `n`): each created through server i % zones, as a reader in that zone creates its own, then deleted."""
    out = 0
    for i in range(n):
        z = i % len(urls)
        nc = await nats.connect(urls[z])
        try:
            js = nc.jetstream(timeout=10)
            name = f"sample{i}"
            info = await js.add_consumer(stream, ConsumerConfig(durable_name=name, ack_policy=AckPolicy.EXPLICIT))
            leader = (info.cluster.leader or "") if info.cluster else ""
            out += leader != f"s{z + 1}"
            await js.delete_consumer(stream, name)
        finally:
            await nc.close()
    return out, n


def weights(p_out: float, zones: int = 3) -> list[float]:
    """P(k of `zones` consumers led outside), k = 0..zones, each outside with probability `p_out`."""
    return [math.comb(zones, k) * p_out ** k * (1 - p_out) ** (zones - k) for k in range(zones + 1)]


def expected(bills: dict[int, float], p_out: float) -> float:
    """nats-server's expected bill over its elections, from the bill measured at each count outside."""
    return sum(w * bills[k] for k, w in enumerate(weights(p_out)))


def _nats_runs(results: Results, w: str) -> tuple[dict[int | None, list[dict]], int, int]:
    """nats-server's runs of workload `w` by count led outside (each placement's rounds), and its sampled
    elections over them: (consumers led outside, sampled); (0, 0) unless it ran at every placement."""
    runs: dict[int | None, list[dict]] = {}
    for b, ww, r in results:
        if b.impl == "nats" and ww == w:
            runs.setdefault(b.outside, []).append(r)
    if set(runs) != {0, 1, 2, 3}:
        return runs, 0, 0
    return (runs, sum(r["elected"][0] for rs in runs.values() for r in rs),
            sum(r["elected"][1] for rs in runs.values() for r in rs))


def placement_bill(runs: list[dict], prices: StoragePrices) -> float:
    """The mean bill of one placement's rounds."""
    return sum(bill_per_gb(r, prices) for r in runs) / len(runs)


def nats_bill(results: Results, w: str, prices: StoragePrices) -> tuple[float, str] | None:
    """nats-server's bill for workload `w` ($/GB) and what it is: its expected bill over its elections when it
    ran at every placement (`--nats-placements each`; each placement's bill the mean of its rounds), else its
    one run's (the mean of its rounds)."""
    runs, out, n = _nats_runs(results, w)
    if n:
        bills = {k: placement_bill(rs, prices) for k, rs in runs.items() if k is not None}
        rounds = min(len(rs) for rs in runs.values())
        return expected(bills, out / n), (f"expected over its elections, {out}/{n} led outside"
                                          + (f", {rounds} rounds" if rounds > 1 else ""))
    if runs:
        return placement_bill(next(iter(runs.values())), prices), "one placement, as elected"
    return None


def election_lines(results: Results) -> list[str]:
    """Per workload run at every placement: nats-server's bill at each, the weights its sampled elections give
    them, and the expected bill."""
    lines = []
    std = storage_prices("s3-standard")
    for w in dict.fromkeys(ww for _, ww, _ in results):
        runs, out, n = _nats_runs(results, w)
        if not n:
            continue
        ws = weights(out / n)
        ref = nats_bill(results, w, std)
        assert ref is not None
        lines.append(f"- {w}: nats-server at S3 Standard prices with 0/1/2/3 of the 3 readers' consumers led outside "
                     "their zone (mean of its rounds): "
                     + " / ".join(f"${placement_bill(runs[k], std):.4f}" for k in range(4))
                     + f" per GB; its elections led {out} of {n} sampled consumers outside the zone they were "
                     f"created in, so these placements weigh " + " / ".join(f"{x:.2f}" for x in ws)
                     + f": expected ${ref[0]:.4f}/GB")
    return lines
