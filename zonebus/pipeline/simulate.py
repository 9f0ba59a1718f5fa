"""The `cost simulate` job: sample routing decisions in Spark for a topology too big to run.

For each policy, `samples` messages are drawn as rows of `spark.range(samples)`, each with its own uniform
random numbers: the publishing server (by publish rate), the subject (by popularity; it fixes the queue
group), the message size, and the member server the policy's draw picks among the candidates (weighted by
member count). Every draw from a discrete distribution is an equi-join on a bucket index plus a range
check against small broadcast tables (`bucket_rows`), so the job is linear in the number of samples and
runs on a cluster as well as locally. The same seeds are used for every policy (common random numbers).

Results are scaled to `messages_per_month` and priced; each policy also gets the closed-form expectation
(`topology.closed_form`) and a standard error for the sampled figures, so the two can be compared.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from zonebus.pipeline.prices import Prices
from zonebus.pipeline.session import Progress
from zonebus.pipeline.topology import (
    POLICIES,
    Candidates,
    SizeDistribution,
    Topology,
    Workload,
    closed_form,
    monthly_messages,
    publisher_weights,
    subject_groups,
)

ROWS_PER_PARTITION = 2_000_000


@dataclass
class SimulateOptions:
    topology_path: str
    workload_path: str
    topology: Topology
    workload: Workload
    prices: Prices
    policies: list[str]
    samples: int
    seed: int


def bucket_rows(weights: list[float]) -> tuple[int, list[tuple[int, float, float, int]]]:
    """Bucket table of a discrete distribution: (k, [(bucket, lo, hi, category)]).

    Categories with weight > 0 get consecutive intervals [lo, hi) of [0, 1); bucket b of k covers
    [b/k, (b+1)/k) and lists every interval overlapping it (about 2k rows in all). A uniform u then picks
    category c where bucket == min(floor(u*k), k-1) and lo <= u < hi: exactly one row matches.
    """
    total = sum(weights)
    cats = [(c, w) for c, w in enumerate(weights) if w > 0]
    k = len(cats)
    intervals, acc = [], 0.0
    for n, (c, w) in enumerate(cats):
        hi = 1.0 if n == k - 1 else acc + w / total
        intervals.append((acc, hi, c))
        acc = hi
    rows, j = [], 0
    for b in range(k):
        b_lo, b_hi = b / k, (b + 1) / k
        while j < k and intervals[j][1] <= b_lo:
            j += 1
        m = j
        while m < k and intervals[m][0] < b_hi:
            if intervals[m][1] > intervals[m][0]:
                rows.append((b, intervals[m][0], intervals[m][1], intervals[m][2]))
            m += 1
    return k, rows


def _bucket(u: Column, k: Column) -> Column:
    return F.least(F.floor(u * k).cast("int"), (k - 1).cast("int"))


def size_column(size: SizeDistribution, seed: int) -> Column:
    p = size.params
    if size.kind == "fixed":
        return F.lit(float(p["bytes"]))
    if size.kind == "uniform":
        return F.lit(p["min"]) + F.rand(seed) * F.lit(p["max"] - p["min"])
    if size.kind == "exponential":
        return -F.lit(p["mean"]) * F.log(F.lit(1.0) - F.rand(seed))
    sigma = p["sigma"]
    mu = math.log(p["mean"]) - sigma * sigma / 2
    return F.exp(F.lit(mu) + F.lit(sigma) * F.randn(seed))


def _tables(spark: SparkSession, topo: Topology, wl: Workload, policy: str) -> dict[str, Any]:
    """The small broadcast tables of one policy."""
    zone_idx = {z: i for i, z in enumerate(topo.zones)}
    pubs = publisher_weights(topo)
    kp, prow = bucket_rows([w for _, w in pubs])
    pub_rows = [(b, lo, hi, pubs[c][0], zone_idx[topo.servers[pubs[c][0]].zone]) for b, lo, hi, c in prow]

    groups, probs = subject_groups(topo, wl)
    gnames = sorted(set(groups))
    gidx = {g: i for i, g in enumerate(gnames)}
    ks, srow = bucket_rows(probs)
    subj_rows = [(b, lo, hi, gidx[groups[c]]) for b, lo, hi, c in srow]

    rule = POLICIES[policy]
    set_ids: dict[Candidates, int] = {}
    pg_rows, cand_rows = [], []
    for pub, _ in pubs:
        for g in gnames:
            cands = rule(topo, pub, g)
            if not cands:
                continue  # no member: the message is not delivered
            sid = set_ids.get(cands)
            if sid is None:
                sid = set_ids[cands] = len(set_ids)
                k, crow = bucket_rows([float(w) for _, w in cands])
                cand_rows += [(sid, b, lo, hi, zone_idx[topo.servers[cands[c][0]].zone]) for b, lo, hi, c in crow]
            pg_rows.append((pub, gidx[g], sid, len(cands)))

    def df(rows: list[tuple], cols: str) -> DataFrame:
        return spark.createDataFrame(rows, cols)

    return {
        "kp": kp,
        "ks": ks,
        "pubs": df(pub_rows, "pb int, plo double, phi double, pub int, pub_zone int"),
        "subjects": df(subj_rows, "sb int, slo double, shi double, grp int"),
        "pg": df(pg_rows or [(-1, -1, -1, 1)], "pub int, grp int, set_id int, k int"),
        "cands": df(cand_rows or [(-1, 0, 0.0, 0.0, 0)], "set_id int, cb int, clo double, chi double, dst_zone int"),
    }


def sampled_pairs(spark: SparkSession, opts: SimulateOptions, policy: str) -> DataFrame:
    """Per (publisher zone, chosen member zone): sampled messages, sum of sizes and of squared sizes."""
    t = _tables(spark, opts.topology, opts.workload, policy)
    parts = max(spark.sparkContext.defaultParallelism, math.ceil(opts.samples / ROWS_PER_PARTITION))
    seed = opts.seed
    draws = spark.range(0, opts.samples, numPartitions=parts).select(
        F.rand(seed).alias("u_pub"),
        F.rand(seed + 1).alias("u_subj"),
        F.rand(seed + 2).alias("u_route"),
        size_column(opts.workload.size, seed + 3).alias("size"),
    )
    draws = draws.withColumn("pb", _bucket(F.col("u_pub"), F.lit(t["kp"])))
    draws = draws.withColumn("sb", _bucket(F.col("u_subj"), F.lit(t["ks"])))
    pubs, subj, pg, cands = (F.broadcast(t[k]) for k in ("pubs", "subjects", "pg", "cands"))
    d = draws.join(pubs, (draws.pb == pubs.pb) & (draws.u_pub >= pubs.plo) & (draws.u_pub < pubs.phi))
    d = d.join(subj, (d.sb == subj.sb) & (d.u_subj >= subj.slo) & (d.u_subj < subj.shi))
    d = d.join(pg, ["pub", "grp"])  # inner: messages to a group with no member are not delivered
    d = d.withColumn("cb", _bucket(F.col("u_route"), F.col("k")))
    d = d.join(cands, (d.set_id == cands.set_id) & (d.cb == cands.cb) & (d.u_route >= cands.clo)
               & (d.u_route < cands.chi))
    return d.groupBy("pub_zone", "dst_zone").agg(
        F.count(F.lit(1)).alias("msgs"),
        F.sum("size").alias("bytes"),
        F.sum(F.col("size") * F.col("size")).alias("bytes_sq"),
    )


def summarise_policy(opts: SimulateOptions, policy: str, pairs: list[dict[str, Any]]) -> dict[str, Any]:
    n = opts.samples
    zones = opts.topology.zones
    monthly = monthly_messages(opts.topology, opts.workload)
    delivered = sum(r["msgs"] for r in pairs)
    cross = [r for r in pairs if r["pub_zone"] != r["dst_zone"]]
    cross_msgs = sum(r["msgs"] for r in cross)
    cross_bytes = sum(r["bytes"] for r in cross)
    cross_sq = sum(r["bytes_sq"] for r in cross)
    p = cross_msgs / n
    mean_x = cross_bytes / n
    se_x = math.sqrt(max(0.0, cross_sq / n - mean_x * mean_x) / n)
    per_byte = opts.prices.per_byte_crossing
    cf = closed_form(opts.topology, opts.workload, policy)
    cf_bytes = cf["cross_zone_bytes_per_message"] * monthly
    return {
        "policy": policy,
        "sampled": {
            "delivered_fraction": delivered / n,
            "cross_zone_fraction": p,
            "cross_zone_fraction_stderr": math.sqrt(p * (1 - p) / n),
            "cross_zone_bytes_per_message": mean_x,
            "cross_zone_bytes_per_message_stderr": se_x,
            "cross_zone_gb_per_month": mean_x * monthly / 1e9,
            "cross_zone_gb_per_month_stderr": se_x * monthly / 1e9,
            "cost_usd_per_month": mean_x * monthly * per_byte,
            "cost_usd_per_month_stderr": se_x * monthly * per_byte,
        },
        "closed_form": {
            "delivered_fraction": cf["delivered_fraction"],
            "cross_zone_fraction": cf["cross_zone_fraction"],
            "cross_zone_bytes_per_message": cf["cross_zone_bytes_per_message"],
            "cross_zone_gb_per_month": cf_bytes / 1e9,
            "cost_usd_per_month": cf_bytes * per_byte,
        },
        "zone_pairs": [
            {
                "src_zone": zones[r["pub_zone"]],
                "dst_zone": zones[r["dst_zone"]],
                "fraction_of_msgs": r["msgs"] / n,
                "gb_per_month": r["bytes"] / n * monthly / 1e9,
            }
            for r in sorted(pairs, key=lambda r: (r["pub_zone"], r["dst_zone"]))
        ],
    }


def run_simulate(spark: SparkSession, opts: SimulateOptions, progress: Progress) -> dict[str, Any]:
    topo, wl = opts.topology, opts.workload
    results = []
    for policy in opts.policies:
        progress.phase(f"sampling {opts.samples:,} routing decisions under {policy}")
        pairs = [r.asDict() for r in sampled_pairs(spark, opts, policy).collect()]
        results.append(summarise_policy(opts, policy, pairs))
    return {
        "topology": opts.topology_path,
        "workload": opts.workload_path,
        "zones": topo.zones,
        "servers": len(topo.servers),
        "queue_groups": len(topo.groups),
        "subjects": wl.subjects,
        "messages_per_month": monthly_messages(topo, wl),
        "mean_message_bytes": wl.size.mean,
        "samples": opts.samples,
        "seed": opts.seed,
        "prices": {k: v for k, v in opts.prices.to_dict().items() if k != "description"},
        "policies": results,
    }


def format_simulation(summary: dict[str, Any]) -> str:
    cur = summary["prices"]["currency"]
    head = (f"{'policy':<22} {'cross-zone (sampled)':>22} {'closed form':>12} {'GB/month':>14} "
            f"{cur + '/month':>14} {'closed form ' + cur:>16}")
    lines = [
        f"{summary['servers']} servers in {len(summary['zones'])} zones, {summary['queue_groups']} queue "
        f"group(s), {summary['subjects']:,} subjects, {summary['messages_per_month']:,.0f} messages/month "
        f"of {summary['mean_message_bytes']:,.0f} bytes on average; {summary['samples']:,} samples",
        head,
        "-" * len(head),
    ]
    for r in summary["policies"]:
        s, c = r["sampled"], r["closed_form"]
        frac = f"{s['cross_zone_fraction']:.2%} ± {s['cross_zone_fraction_stderr']:.2%}"
        lines.append(
            f"{r['policy']:<22} {frac:>22} {c['cross_zone_fraction']:>12.2%} {s['cross_zone_gb_per_month']:>14,.1f} "
            f"{s['cost_usd_per_month']:>14,.2f} {c['cost_usd_per_month']:>16,.2f}"
        )
    return "\n".join(lines)
