"""`zonebus cost simulate`: topology parsing, policies, the closed form, and Spark sampling against it.

The seed's scenario (examples/seed4-topology.json): s1, s2 in az1; s3, s4 in az2; one `workers` member on
s2 and one on s3; the publisher on s1. Random routing picks s2 or s3 with probability 1/2 each, so half the
messages cross zones; prefer_matching_tags always picks s2 (same zone as s1), so none do.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from zonebus.pipeline import topology as topo_mod
from zonebus.pipeline.errors import PipelineInputError
from zonebus.pipeline.prices import load_prices, parse_prices
from zonebus.pipeline.simulate import bucket_rows
from zonebus.pipeline.topology import closed_form, parse_topology, parse_workload

EXAMPLES = Path(topo_mod.__file__).parent / "examples"
SEED_TOPOLOGY = EXAMPLES / "seed4-topology.json"
SEED_WORKLOAD = EXAMPLES / "seed4-workload.json"

# Three zones, unequal member weights, a server with local members, two groups with different shares.
#   workers: s1 (za) 1, s3 (zb) 2, s5 (zc) 1; audit: s4 (zb) 3. One subject of 4 -> audit, 3 -> workers.
#   Publishers: s1 rate 1 (za, has a local member), s2 rate 3 (za, no local member), s4 rate 1 (zb).
THREE_ZONES = {
    "servers": [
        {"name": "s1", "zone": "za", "queue_members": {"workers": 1}, "publish_rate": 1},
        {"name": "s2", "zone": "za", "publish_rate": 3},
        {"name": "s3", "zone": "zb", "queue_members": {"workers": 2}},
        {"name": "s4", "zone": "zb", "queue_members": {"audit": 3}, "publish_rate": 1},
        {"name": "s5", "zone": "zc", "queue_members": {"workers": 1}},
    ],
    "queue_groups": [{"name": "workers", "share": 3}, {"name": "audit", "share": 1}],
}
# Hand computation, subjects uniform: P(workers) = 3/4, P(audit) = 1/4; publishers 1/5, 3/5, 1/5.
#   random, workers: za publishers cross w.p. 3/4 (s3 + s5 of 4); s4 (zb) w.p. 2/4.
#   random, audit: za publishers cross w.p. 1; s4 w.p. 0.
#   P(cross) = 3/4 * (4/5 * 3/4 + 1/5 * 1/2) + 1/4 * (4/5 * 1) = 3/4 * 0.7 + 0.2 = 0.725
#   prefer_matching_tags, workers: s1 local -> 0; s2 -> s1 (same zone) -> 0; s4 -> s3 (same zone) -> 0.
#   audit: s1, s2 -> s4 only (other zone) -> 1; s4 local -> 0.   P(cross) = 1/4 * 4/5 = 0.2
THREE_ZONES_EXPECTED = {"random": 0.725, "prefer_matching_tags": 0.2}


def test_closed_form_seed_scenario() -> None:
    topo = parse_topology(json.loads(SEED_TOPOLOGY.read_text()), "seed")
    wl = parse_workload(json.loads(SEED_WORKLOAD.read_text()), "seed")
    assert closed_form(topo, wl, "random")["cross_zone_fraction"] == pytest.approx(0.5)
    assert closed_form(topo, wl, "prefer_matching_tags")["cross_zone_fraction"] == 0.0


def test_closed_form_three_zones_by_hand() -> None:
    topo = parse_topology(THREE_ZONES)
    wl = parse_workload({"subjects": {"count": 4}, "message_size": {"distribution": "uniform", "min": 100,
                                                                     "max": 300}})
    for policy, expected in THREE_ZONES_EXPECTED.items():
        cf = closed_form(topo, wl, policy)
        assert cf["cross_zone_fraction"] == pytest.approx(expected)
        assert cf["cross_zone_bytes_per_message"] == pytest.approx(expected * 200)
        assert cf["delivered_fraction"] == pytest.approx(1.0)


def test_bucket_rows_pick_each_category_with_its_weight() -> None:
    weights = [0.5, 0.0, 2.0, 1.0, 0.25]
    k, rows = bucket_rows(weights)
    assert k == 4 and len(rows) <= 2 * k
    n = 40_000
    picks = [0] * len(weights)
    for j in range(n):  # a fine grid of u values, as rand() would give
        u = (j + 0.5) / n
        b = min(int(u * k), k - 1)
        matches = [c for bb, lo, hi, c in rows if bb == b and lo <= u < hi]
        assert len(matches) == 1
        picks[matches[0]] += 1
    total = sum(weights)
    for c, w in enumerate(weights):
        assert picks[c] / n == pytest.approx(w / total, abs=2 / n)


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        ({"servers": [{"name": "a", "zone": "z", "zonee": 1}]}, "unknown key 'zonee'"),
        ({"servers": [{"name": "a", "zone": "z", "publish_rate": 1}]}, "no queue groups"),
        ({"servers": [{"name": "a", "zone": "z", "queue_members": {"q": 1}}]}, "no publishers"),
        ({"servers": [{"name": "a", "zone": "z", "publish_rate": 1}],
          "queue_groups": [{"name": "q", "members": {"b": 1}}]}, "server 'b' is not defined"),
        ({"servers": [{"name": "a", "zone": "z", "count": 2, "publish_rate": -1}]}, "publish_rate"),
    ],
)
def test_bad_topology_names_the_key(data: dict, needle: str) -> None:
    with pytest.raises(PipelineInputError, match=needle):
        parse_topology(data, "t.json")


def test_topology_count_expansion() -> None:
    topo = parse_topology({"servers": [{"name": "a{i}", "zone": "z1", "count": 3, "publish_rate": 2,
                                        "queue_members": {"q": 1}}, {"name": "b", "zone": "z2"}]})
    assert [s.name for s in topo.servers] == ["a1", "a2", "a3", "b"]
    assert topo.zones == ["z1", "z2"] and topo.groups == {"q": 1.0}


def test_prices() -> None:
    aws = load_prices("aws")
    assert aws.per_byte_crossing == pytest.approx(0.02 / 1e9)
    with pytest.raises(PipelineInputError, match="unknown key 'egress'"):
        parse_prices({"cross_zone_per_gb_each_side": 0.01, "egress": 1}, "p.json")
    with pytest.raises(PipelineInputError, match="missing key 'cross_zone_per_gb_each_side'"):
        parse_prices({"sides_charged": 2}, "p.json")
    with pytest.raises(PipelineInputError, match="must be a number"):
        parse_prices({"cross_zone_per_gb_each_side": "cheap"}, "p.json")


def _within(sampled: dict, expected: float, n: int, sigmas: float = 5.0) -> bool:
    return abs(sampled["cross_zone_fraction"] - expected) <= sigmas * math.sqrt(expected * (1 - expected) / n) + 1e-12


@pytest.mark.timeout(180)
def test_spark_sampling_agrees_with_closed_form(spark, tmp_path: Path, run_cli) -> None:
    # The seed scenario, through the command line.
    n = 20_000
    code, out, err = run_cli("simulate", "--topology", str(SEED_TOPOLOGY), "--workload", str(SEED_WORKLOAD),
                             "--samples", str(n), "--json", "--quiet")
    assert code == 0, err
    result = {p["policy"]: p for p in json.loads(out)["policies"]}
    # 5 standard errors of a binomial proportion at p = 0.5, n = 20,000: 5 * 0.0035 = 0.018.
    assert _within(result["random"]["sampled"], 0.5, n)
    assert result["prefer_matching_tags"]["sampled"]["cross_zone_fraction"] == 0.0
    assert result["random"]["sampled"]["delivered_fraction"] == 1.0
    # 1,000 msg/s * 30 days * 512 B * 1/2 crossing = 663.552 GB/month, $0.02/GB -> $13.27
    assert result["random"]["closed_form"]["cross_zone_gb_per_month"] == pytest.approx(663.552)
    assert result["random"]["closed_form"]["cost_usd_per_month"] == pytest.approx(13.27104)
    pairs = {(p["src_zone"], p["dst_zone"]) for p in result["random"]["zone_pairs"]}
    assert pairs == {("az1", "az1"), ("az1", "az2")}

    # Three zones with unequal weights and sizes, written to --out as well.
    (tmp_path / "t.json").write_text(json.dumps(THREE_ZONES))
    (tmp_path / "w.json").write_text(json.dumps({
        "messages_per_month": 1e9, "subjects": {"count": 4},
        "message_size": {"distribution": "uniform", "min": 100, "max": 300}, "seed": 3}))
    code, out, err = run_cli("simulate", "--topology", str(tmp_path / "t.json"), "--workload",
                             str(tmp_path / "w.json"), "--samples", str(n), "--out", str(tmp_path / "o"),
                             "--quiet")
    assert code == 0, err
    assert "random" in out and "prefer_matching_tags" in out
    saved = json.loads((tmp_path / "o" / "simulation.json").read_text())
    for policy in saved["policies"]:
        expected = THREE_ZONES_EXPECTED[policy["policy"]]
        assert _within(policy["sampled"], expected, n), (policy["policy"], policy["sampled"])
        gb, se = policy["sampled"]["cross_zone_gb_per_month"], policy["sampled"]["cross_zone_gb_per_month_stderr"]
        assert abs(gb - expected * 200 * 1e9 / 1e9) <= 5 * se  # mean size 200 B, 1e9 messages


def test_simulate_bad_policy_option(run_cli) -> None:
    code, _, err = run_cli("simulate", "--topology", str(SEED_TOPOLOGY), "--workload", str(SEED_WORKLOAD),
                           "--policies", "random,zone_router_v9")
    assert code == 2 and "--policies" in err and "zone_router_v9" in err
