"""Differential suite: the same scripts against nats-server -js and zonebus -js, results compared.

Each scenario records API replies (normalised: times and metadata dropped), PubAcks, delivered messages
(subject, payload, stream/consumer sequence, delivery count, pending) and status replies; the two lists
must be equal.
"""

from __future__ import annotations

import itertools

import nats
import pytest

from tests.stream import kit_scenarios
from tests.stream.kit_scenarios import Probe, strip_replies

_counter = itertools.count()


async def run(url: str, scenario, tag: str) -> list:
    nc = await nats.connect(url, allow_reconnect=False)
    try:
        p = Probe(nc, tag)
        await scenario(p)
        return strip_replies(p.notes)
    finally:
        await nc.close()


def first_difference(a: list, b: list) -> str:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return f"step {i}:\n  nats-server: {x}\n  zonebus:     {y}"
    return f"lengths differ: {len(a)} vs {len(b)}"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("scenario", kit_scenarios.ALL, ids=lambda f: f.__name__)
async def test_same_results_as_nats_server(js_servers, scenario) -> None:
    tag = f"{scenario.__name__[:6]}{next(_counter)}".replace("_", "")
    ref = await run(js_servers["nats"].url, scenario, tag)
    got = await run(js_servers["zonebus"].url, scenario, tag)
    assert got == ref, first_difference(ref, got)
