"""The zone router's choice of path per leader (`zonebus.zonerouter.paths`): the link at a low rate, storage
at a high one, at S3 Standard and AWS transfer prices; a store that bills no requests always uses storage;
the ratio is measured on the batches and a forced mode is kept."""

from __future__ import annotations

import json

import pytest

from zonebus.zonerouter.paths import LINK, STORAGE, PathChooser


def payload(i: int) -> bytes:
    return json.dumps({"order": i, "customer": f"c-{i % 97}", "items": [{"sku": f"s{i % 13}", "qty": i % 5}],
                       "note": "deliver to the back door"}).encode()


@pytest.mark.timeout(10)
def test_link_at_low_rates_storage_at_high_rates() -> None:
    p = PathChooser("auto", billed=True, storage_linger=0.05)
    data = b"".join(payload(i) for i in range(200))
    p.compress("b1", data)
    assert 0 < p.flows["b1"].ratio < 0.9
    for _ in range(100):
        p.seen("b1", 1000)  # 100 kB arrive in one moment: 50 kB/s over the window
    assert p.choose("b1") == LINK
    p.flows["b1"].rate = 100e6  # 100 MB/s: storage's few requests a second are cheaper than the bytes
    assert p.choose("b1") == STORAGE
    why = p.info()["leaders"]["b1"]["why"]  # type: ignore[index]
    assert "through storage" in why and "over the link" in why


@pytest.mark.timeout(10)
def test_unbilled_store_and_forced_modes() -> None:
    free = PathChooser("auto", billed=False, storage_linger=0.001)
    free.seen("b1", 10)
    assert free.choose("b1") == STORAGE
    forced = PathChooser("link", billed=True, storage_linger=0.05)
    forced.seen("b1", 10**9)
    assert forced.choose("b1") == LINK
    data = payload(1) * 50
    assert forced.decompress(forced.compress("b1", data)) == data


@pytest.mark.timeout(10)
def test_inline_limit_is_where_a_get_costs_what_the_bytes_cost() -> None:
    # S3 Standard GET $0.0004 per 1,000; AWS cross-zone $0.02/GB: 20,000 bytes cost one GET
    assert PathChooser("auto", billed=True, storage_linger=0.05).inline_limit() == 20_000
    assert PathChooser("auto", billed=False, storage_linger=0.05).inline_limit() == 0
    assert PathChooser("storage", billed=True, storage_linger=0.05).inline_limit() == 0
