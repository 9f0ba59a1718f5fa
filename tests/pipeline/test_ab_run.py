"""The report's predicted saving against a measured A/B run: the demo's workload on four real servers, once
with stock routing and once with `prefer_matching_tags`, each priced by `cost report`.

The prefer run's report estimates, from its own ledger, what stock NATS routing would have cost; the stock
run measures it. Their difference must match the prediction within 5%. In this workload the audit
subscriber (zone a) already receives every message published in zone b, so a queue choice of the zone-a
worker for those messages rides the same route copy: counting a copy per queue choice would predict twice
the saving. Sampling noise of the stock run: 8,000 messages per publisher, half of zone a's go across at
random, a standard deviation of about 1.1% of the saving.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from zonebus.cli.demo import run_workload

MESSAGES = 8000  # per publisher
SIZE = 512


@pytest.mark.timeout(400)
def test_predicted_saving_matches_the_measured_one(spark, run_cli, tmp_path: Path) -> None:
    summaries = {}
    for policy in ("stock", "prefer_matching_tags"):
        run = run_workload(policy, tmp_path / "runs", MESSAGES, SIZE)
        assert run.queue_delivered == run.published == 2 * MESSAGES
        assert run.audit_delivered == 2 * MESSAGES
        code, out, err = run_cli("report", "--ledger", str(run.ledger), "--json", "--quiet")
        assert code == 0, err
        summaries[policy] = json.loads(out)
    stock, prefer = summaries["stock"], summaries["prefer_matching_tags"]
    measured = stock["cost_usd"] - prefer["cost_usd"]
    predicted = prefer["saved_usd"]
    assert measured > 0
    assert predicted == pytest.approx(measured, rel=0.05), (predicted, measured)
    assert prefer["saving_is_significant"]
    # The stock run's own estimate is its measured bill, up to sampling noise. (Not `saving_is_significant`
    # == False: a saving of 0 still passes the report's 2-sigma bar in ~2% of runs, by chance alone.)
    assert abs(stock["saved_usd"]) <= 5 * stock["saved_noise_usd"]
    # Both runs carried the same traffic, counted the same way.
    for s in (stock, prefer):
        assert s["transfers"]["published"] == 2 * MESSAGES
        assert s["transfers"]["delivered"] == 4 * MESSAGES  # one queue delivery and one audit copy each
    assert stock["stock_routing_cost_usd"] == pytest.approx(prefer["stock_routing_cost_usd"], rel=0.05)
