"""What nats-server would bill for the same stream traffic: streams replicated R3, routes compressed.

The model (cross-zone bytes of one stream message of B bytes, in a cluster of Z zones):

    publish      the publisher's server forwards it to the stream leader: it crosses when the leader is in
                 another zone. Leaders are placed evenly over the zones (nothing in the ledger says where a
                 nats-server would put them), so a publish crosses with probability (Z - 1) / Z.
    replication  the leader sends it to its two followers, one in each other zone: min(2, Z - 1) crossings.
    delivery     nats-server delivers a consumer's messages from the leader; each delivery to a client in
                 another zone than the leader's crosses: probability (Z - 1) / Z.

    cross-zone bytes = write ratio x [ P x (Z - 1) / Z  +  P x min(2, Z - 1) ]  +  delivery ratio x D x (Z - 1) / Z

where P are the bytes clients published to streams and D the bytes delivered to consuming clients, both from
the ledger's client rows (protocol bytes, as the client link carries them: the route's framing is close to
the client's), and the ratios are the route compression's (compressed / raw bytes, `compression: s2_*`
applies to every route crossing above). Cost = cross-zone bytes x the transfer price per byte crossing.
No storage is charged (nats-server keeps streams on local disks, whose cost is the same either way and is
left out). Client-to-server hops stay in the client's zone in both systems and cost nothing.

Which ledger traffic is stream traffic: client publishes (`in`) and deliveries (`out`) whose subject prefix
matches one of `subjects` (NATS wildcards, matched token by token against the ledger's subject prefix), by
default every client subject except the JetStream API, acks, system and reply subjects (`$JS.`, `$SYS.`,
`_INBOX`, `_R_`): on a ledger that also carries core NATS traffic, name the streams' subjects. The report makes
the comparison only when the ledger has storage rows (streams on a shared store), `--r3-subjects` is given or
`--streams` is (`zonebus.pipeline.bill.compute`).

The ratio is one per kind of hop (`Compression`), because S2 compresses each route write as one block and the
hops write differently:
- publish and replication: the messages one route write carries at the stream rate of each ledger window
  (`write_msgs`, weighed by the window's bytes: `write_mix`). Clients that await each PubAck at a few hundred
  messages per second get one message a write, which compresses poorly; a burst queues many behind each write.
- delivery: a consumer's leader sends what a pull request asks for in blocks (`DELIVERY_BLOCK_BYTES`), which
  compress about as well as a burst's writes, whatever the publish rate.
The default ratio, 0.4 for every hop, is an assumption, not a measurement (what S2 achieves depends on the
payloads); `zonebus cost report --streams URL` measures both on the streams' own messages, route-framed
(`measure_ratio`), and `--r3-compression-ratio` sets one for every hop. PyPI has no S2 codec; the measure uses
zstd's fast mode at `STANDIN_LEVEL` as S2 best's stand-in (`standin_size`): like S2 it gains little on a message
or two and much on large blocks. Snappy, S2's subset, cannot stand in for `s2_best`: on large blocks it
compresses about a fifth worse (the cost report was 14-17% over nats-server's bursts with it).

The constants were fitted to nats-server 2.15 in `bench/whole_bill.py` (R3, `s2_best`, 1 KiB JSON, 2-core
machine), hop by hop from its runs at each placement of its consumers' leaders:
- steady (awaited publishes, 480-580 acked msgs/s): 0.67-0.77 cross-zone bytes per payload byte per crossing of
  publish and replication (one message a write: 0.70), 0.22-0.33 per consumer led outside the reader's zone;
- burst (3,000-4,000 msgs/s): 0.33 per crossing of publish and replication (14-17 messages a write), 0.30 per
  consumer led outside (blocks of 20 messages or more: 0.30-0.32).
One ratio for every hop (the model before 2026-12-01's second change) was 9-12% under nats-server's steady bill:
too good for its publishes, too poor for its deliveries.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import zstandard
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from zonebus.ledger import schema as S
from zonebus.pipeline.prices import Prices

DEFAULT_RATIO = 0.4
EXCLUDED_PREFIXES = ("$JS.", "$SYS.", "_INBOX", "_R_", "$JSC.", "$JSD")
REPLICAS = 3
SAMPLE_FRAMES = 4096  # messages compressed to measure the ratio
BATCH_BYTES = 64 * 1024  # a route write carries at most about this much
DELIVERY_BLOCK_BYTES = BATCH_BYTES  # a consumer's deliveries leave its leader in blocks of about this much
SINGLE_RATE = 600.0  # stream msgs/s up to which a route write carries one message (`write_msgs`)
COALESCE_S = 0.005  # above it, the messages arriving within this long share a write (`write_msgs`)
STANDIN_LEVEL = -3  # zstd's fast mode: the stand-in for nats-server's `s2_best` (`standin_size`)


def matches(prefix: str, pattern: str) -> bool:
    """Does the subject prefix `prefix` fall under the NATS pattern `pattern` (`*` one token, `>` the rest)?
    A pattern longer than the prefix matches when the prefix is a match of its first tokens (the ledger
    keeps only the first tokens of each subject)."""
    toks, pats = prefix.split("."), pattern.split(".")
    for i, p in enumerate(pats):
        if i >= len(toks):
            return True  # the prefix stopped at the ledger's subject_tokens: its subjects may go on
        if p == ">":
            return True
        if p != "*" and p != toks[i]:
            return False
    return len(toks) == len(pats)


def is_stream_prefix(prefix: str, subjects: Sequence[str]) -> bool:
    if subjects:
        return any(matches(prefix, p) for p in subjects)
    return not prefix.startswith(EXCLUDED_PREFIXES) and prefix not in ("_INBOX", "_R_")


def client_flows(traffic: DataFrame) -> list[dict[str, Any]]:
    """Client bytes and messages per (subject prefix, direction), and the zones, collected for `stream_traffic`."""
    rows = (traffic.where(F.col(S.LINK_KIND) == "client")
            .groupBy(S.SUBJECT_PREFIX, S.DIRECTION)
            .agg(F.sum(S.MSGS).alias(S.MSGS), F.sum(S.BYTES).alias(S.BYTES)).collect())
    return [r.asDict() for r in rows]


def ledger_zones(traffic: DataFrame) -> list[str]:
    return sorted(r[0] for r in traffic.select(S.SERVER_ZONE).distinct().collect() if r[0])


def stream_traffic(flows: list[dict[str, Any]], subjects: Sequence[str]) -> dict[str, int]:
    """Published and delivered stream bytes and messages."""
    out = {"published_msgs": 0, "published_bytes": 0, "delivered_msgs": 0, "delivered_bytes": 0}
    for r in flows:
        if not is_stream_prefix(r[S.SUBJECT_PREFIX] or "", subjects):
            continue
        side = "published" if r[S.DIRECTION] == "in" else "delivered"
        out[f"{side}_msgs"] += int(r[S.MSGS] or 0)
        out[f"{side}_bytes"] += int(r[S.BYTES] or 0)
    return out


@dataclass(frozen=True)
class Compression:
    """nats-server's route compression ratios, by kind of hop (module doc), and where they come from."""

    write: float  # publish to the leader and replication: as many messages a write as the stream rate brings
    delivery: float  # deliveries from a consumer's leader: blocks of DELIVERY_BLOCK_BYTES
    basis: str

    @classmethod
    def every_hop(cls, ratio: float, basis: str) -> Compression:
        return cls(ratio, ratio, basis)


def r3_bill(traffic: dict[str, int], zones: int, compression: Compression, prices: Prices,
            subjects: Sequence[str]) -> dict[str, Any]:
    """The R3 counterfactual: cross-zone bytes by hop, compressed, and their cost (see the module's model)."""
    z = max(1, zones)
    away = (z - 1) / z
    followers = min(REPLICAS - 1, z - 1)
    raw = {
        "publish_to_leader": (traffic["published_bytes"] * away, compression.write),
        "replication": (traffic["published_bytes"] * followers, compression.write),
        "delivery_from_leader": (traffic["delivered_bytes"] * away, compression.delivery),
    }
    hops = {k: {"raw_cross_zone_bytes": v, "compression_ratio": r, "cross_zone_bytes": v * r,
                "cost_usd": prices.cost(v * r)} for k, (v, r) in raw.items()}
    cross = sum(h["cross_zone_bytes"] for h in hops.values())
    raw_total = sum(v for v, _ in raw.values())
    return {
        **traffic,
        "zones": zones,
        "compression_ratio": cross / raw_total if raw_total else compression.write,
        "write_compression_ratio": compression.write,
        "delivery_compression_ratio": compression.delivery,
        "compression_ratio_basis": compression.basis,
        "subjects": list(subjects) or "every client subject but $JS., $SYS., _INBOX and _R_",
        "hops": hops,
        "raw_cross_zone_bytes": raw_total,
        "cross_zone_bytes": cross,
        "cost_usd": prices.cost(cross),
        "model": (f"nats-server R3 across {zones} zone(s): a publish crosses to the leader with probability "
                  f"(Z-1)/Z = {away:.3g} (leaders spread evenly over zones), the leader replicates it to "
                  f"{followers} follower(s) in other zones, a delivery crosses from the leader with probability "
                  f"{away:.3g}; route compression takes publishes and replication to {compression.write:.3g} of "
                  f"their bytes and deliveries to {compression.delivery:.3g}"),
    }


def write_msgs(rate: float) -> float:
    """Messages per route write of publishes and replication at `rate` stream messages per second: one up to
    `SINGLE_RATE` (nats-server writes each as it comes), then one more per `COALESCE_S` of arrivals (a fraction
    between two counts is measured at both and interpolated, `mixed_ratio`). S2 compresses each write as one
    block, so a slow stream's writes compress far worse than a burst's (fitted: module doc)."""
    return max(1.0, 1.0 + (rate - SINGLE_RATE) * COALESCE_S)


def write_mix(traffic: DataFrame, subjects: Sequence[str]) -> dict[float, int]:
    """Messages per route write (`write_msgs` of each ledger window's stream publish rate) -> the stream bytes
    published in windows of that rate: a burst and the quiet after it are weighed each at its own rate."""
    rows = (traffic.where((F.col(S.LINK_KIND) == "client") & (F.col(S.DIRECTION) == "in"))
            .groupBy(S.WINDOW_START, S.SUBJECT_PREFIX)
            .agg(F.sum(S.MSGS).alias(S.MSGS), F.sum(S.BYTES).alias(S.BYTES), F.max(S.INTERVAL_S).alias("iv"))
            .collect())
    windows: dict[Any, list[float]] = {}
    for r in rows:
        if is_stream_prefix(r[S.SUBJECT_PREFIX] or "", subjects):
            w = windows.setdefault(r[S.WINDOW_START], [0, 0, 0.0])
            w[0] += int(r[S.MSGS] or 0)
            w[1] += int(r[S.BYTES] or 0)
            w[2] = max(w[2], float(r["iv"] or 0))
    mix: dict[float, int] = {}
    for msgs, nbytes, interval in windows.values():
        if nbytes:
            k = round(write_msgs(msgs / interval if interval > 0 else 0.0), 1)
            mix[k] = mix.get(k, 0) + int(nbytes)
    return mix


def mixed_ratio(payloads: Sequence[tuple[str, bytes]], mix: dict[float, int]) -> float | None:
    """`measure_ratio` at each messages-per-write of `mix` (a fraction: interpolated between the whole counts
    around it), weighed by its bytes (None without messages)."""
    total = sum(mix.values())
    if not total:
        return measure_ratio(payloads)
    measured: dict[int, float | None] = {}

    def at(k: int) -> float | None:
        if k not in measured:
            measured[k] = measure_ratio(payloads, k)
        return measured[k]

    out = 0.0
    for k, n in mix.items():
        lo = max(1, int(k))
        hi, f = (lo + 1, k - lo) if k > lo else (lo, 0.0)
        r_lo, r_hi = at(lo), at(hi)
        if r_lo is None or r_hi is None:
            return None
        out += ((1 - f) * r_lo + f * r_hi) * n
    return out / total


def standin_size(block: bytes) -> int:
    """The compressed size of one route write's block, by nats-server's `s2_best`'s stand-in (module doc)."""
    return len(_STANDIN.compress(block))


_STANDIN = zstandard.ZstdCompressor(level=STANDIN_LEVEL)


def measure_ratio(payloads: Sequence[tuple[str, bytes]], per_write: int | None = None,
                  block_bytes: int = BATCH_BYTES) -> float | None:
    """Compressed / raw bytes of route-framed messages (`RMSG $G <subject> <size>\\r\\n<data>\\r\\n`), by S2
    best's stand-in (`standin_size`), `per_write` messages a block (None: blocks of about `block_bytes`); None
    without messages."""
    raw = done = 0
    batch: list[bytes] = []
    size = 0
    for subject, data in payloads[:SAMPLE_FRAMES]:
        frame = b"RMSG $G %s %d\r\n%s\r\n" % (subject.encode(), len(data), data)
        batch.append(frame)
        size += len(frame)
        if size >= block_bytes or (per_write is not None and len(batch) >= per_write):
            raw, done = raw + size, done + standin_size(b"".join(batch))
            batch, size = [], 0
    if batch:
        raw, done = raw + size, done + standin_size(b"".join(batch))
    return done / raw if raw else None


def measure(payloads: Sequence[tuple[str, bytes]], mix: dict[float, int]) -> Compression | None:
    """Both ratios measured on the streams' messages (`payloads`), publishes and replication at the write mix
    of the ledger (`write_mix`), deliveries in blocks of DELIVERY_BLOCK_BYTES; None without messages."""
    write = mixed_ratio(payloads, mix)
    delivery = measure_ratio(payloads, block_bytes=DELIVERY_BLOCK_BYTES)
    if write is None or delivery is None:
        return None
    total = sum(mix.values())
    writes = ", ".join(f"{k:g} ({n / max(total, 1):.0%} of the bytes)" for k, n in sorted(mix.items()))
    return Compression(write, delivery, (
        f"measured: zstd level {STANDIN_LEVEL} (S2 best's stand-in) on up to {SAMPLE_FRAMES:,} of the streams' "
        f"messages, route-framed; publishes and replication at the messages a route write carries at each ledger "
        f"window's stream rate (one up to {SINGLE_RATE:g} msgs/s, then one more per {COALESCE_S * 1e3:g} ms): "
        f"{writes or 'no stream publishes'}; deliveries in blocks of {DELIVERY_BLOCK_BYTES // 1024} KiB"))
