"""Differential suite: the same scripts against nats-server -js and zonebus -js, results compared.

Each scenario records API replies (normalised: times and metadata dropped), PubAcks, delivered messages
(subject, payload, stream/consumer sequence, delivery count, pending) and status replies; the two lists
must be equal.
"""

from __future__ import annotations

import itertools

import pytest

from tests.stream import kit_scenarios
from tests.stream.kit_scenarios import first_difference, run_scenarios

_counter = itertools.count()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("scenario", kit_scenarios.ALL, ids=lambda f: f.__name__)
async def test_same_results_as_nats_server(js_servers, scenario) -> None:
    tag = f"{scenario.__name__[:6]}{next(_counter)}".replace("_", "")
    ref = await run_scenarios(js_servers["nats"].url, tag, scenario)
    got = await run_scenarios(js_servers["zonebus"].url, tag, scenario)
    assert got == ref, first_difference(ref, got)
