"""The zone router's choice of path per batch (`zonebus.zonerouter.paths`): the link for a small batch,
storage for a large one, at S3 Standard and AWS transfer prices, counting the zones a replicated tail reaches;
when a batch may gather up to that size; a store that bills no requests always uses storage; the ratio is
measured on the batches and a forced mode is kept."""

from __future__ import annotations

import json
import random

import pytest
import zstandard

from zonebus.zonerouter.paths import GATHER_FROM, LINK, STORAGE, ZSTD_LEVEL, PathChooser, level_for


def payload(i: int) -> bytes:
    rng = random.Random(i)  # ids and a token that do not repeat, as real orders have
    return json.dumps({"order": i, "id": f"{rng.getrandbits(64):016x}", "customer": f"c-{rng.randrange(10**6)}",
                       "items": [{"sku": f"s{i % 13}", "qty": i % 5, "price": round(rng.uniform(1, 500), 2)}],
                       "token": f"{rng.getrandbits(128):032x}", "note": "deliver to the back door"}).encode()


@pytest.mark.timeout(10)
def test_link_for_small_batches_storage_for_large_ones() -> None:
    p = PathChooser("auto", billed=True, storage_linger=0.05)
    data = b"".join(payload(i) for i in range(200))
    p.compress("b1", data)
    ratio = p.flows["b1"].ratio
    assert 0 < ratio < 0.9
    # S3 Standard PUT $0.005 + GET $0.0004 per 1,000 against AWS $0.02/GB crossing: the break-even size
    alone = p.break_even("b1")
    assert alone == pytest.approx(5.4e-6 / (ratio * 0.02e-9), rel=0.01)
    assert p.gather_bytes("b1") == int(GATHER_FROM * alone) and GATHER_FROM >= 1
    assert p.choose("b1", alone // 2) == LINK
    assert p.choose("b1", alone * 2) == STORAGE
    why = p.info()["leaders"]["b1"]["why"]  # type: ignore[index]
    assert "through storage" in why and "crossing 1 zone boundary" in why
    # a replicated tail in a third zone: the link path crosses twice, storage adds one GET
    p.further_zones = 1
    assert p.break_even("b1") == pytest.approx(5.8e-6 / (ratio * 0.02e-9 * 2), rel=0.01)
    assert p.break_even("b1") < alone


@pytest.mark.timeout(10)
def test_quorum_spread_counts_the_zones_the_tail_reaches_from_here() -> None:
    """With `zone_router_spread: quorum` the tail reaches one replica: a proxy that is that replica (its own
    records come back by reference) pays one crossing for the link path, as the leader's own batches do (the
    tail's crossing, and the replica's GET through storage); any other proxy pays two, and a GET more."""
    p = PathChooser("auto", billed=True, storage_linger=0.05)
    p.here, p.spread_quorum, p.further_zones, p.tail_zones = "b2", True, 1, 1
    data = b"".join(payload(i) for i in range(200))
    for leader in ("b1", "b2"):
        p.compress(leader, data)
    ratio = p.flows["b1"].ratio
    further = p.break_even("b1")  # not the replica of b1's streams (no tail part from b1 yet)
    assert further == pytest.approx(5.8e-6 / (ratio * 0.02e-9 * 2), rel=0.01)
    p.tail_seen("b1")
    replica = p.break_even("b1")
    assert replica == pytest.approx(5.4e-6 / (ratio * 0.02e-9), rel=0.01)
    size = (further + replica) // 2  # storage as a further zone's proxy, the link as the replica
    assert p.choose("b1", size) == LINK
    assert "crossing 1 zone boundary" in p.info()["leaders"]["b1"]["why"]  # type: ignore[index]
    own = p.break_even("b2")  # this server leads: the tail's one crossing, or the PUT and the replica's GET
    assert own == pytest.approx(5.4e-6 / (p.flows["b2"].ratio * 0.02e-9), rel=0.01)
    p.tail_zones = None  # no tail (`zone_router_ack: storage`): as a proxy's batch to a leader elsewhere
    p.spread_quorum = False
    assert p.break_even("b2") == pytest.approx(5.8e-6 / (p.flows["b2"].ratio * 0.02e-9 * 2), rel=0.01)


@pytest.mark.timeout(10)
def test_a_batch_that_stays_here_is_measured_as_one_stream() -> None:
    """The leader's own batches are not sent: `measure` gives them the ratio of the tail's stream, which
    (compressing each batch against the ones before) beats compressing each small batch alone."""
    alone, streamed = PathChooser("auto", billed=True, storage_linger=0.05), PathChooser("auto", True, 0.05)
    for k in range(40):
        data = b"".join(payload(k * 10 + i) for i in range(10))
        alone.compress("me", data)
        streamed.measure("me", data)
    assert 0 < streamed.flows["me"].ratio < alone.flows["me"].ratio


@pytest.mark.timeout(10)
def test_unbilled_store_and_forced_modes() -> None:
    free = PathChooser("auto", billed=False, storage_linger=0.001)
    free.seen("b1", 10)
    assert free.choose("b1", 100) == STORAGE
    assert free.gather_bytes("b1") == 0  # no request price: batches never wait to grow
    forced = PathChooser("link", billed=True, storage_linger=0.05)
    forced.seen("b1", 10**9)
    assert forced.choose("b1", 10**7) == LINK
    assert forced.gather_bytes("b1") == 0
    data = payload(1) * 50
    assert forced.decompress(forced.compress("b1", data)) == data


@pytest.mark.timeout(10)
def test_inline_limit_is_where_a_get_costs_what_the_bytes_cost() -> None:
    # S3 Standard GET $0.0004 per 1,000; AWS cross-zone $0.02/GB: 20,000 bytes cost one GET
    assert PathChooser("auto", billed=True, storage_linger=0.05).inline_limit() == 20_000
    assert PathChooser("auto", billed=False, storage_linger=0.05).inline_limit() == 0
    assert PathChooser("storage", billed=True, storage_linger=0.05).inline_limit() == 0


@pytest.mark.timeout(10)
def test_storage_batches_are_measured_as_the_link_would_send_them() -> None:
    """Every storage-path batch is measured as the next block of one zstd stream (what the link path sends), and
    the first measurement replaces the initial guess (0.5): with the guess, or one batch in 16 compressed alone,
    the break-even size of JSON came out at about half the true one, and objects went to storage where the link
    was cheaper."""
    p = PathChooser("auto", billed=True, storage_linger=0.05)
    batches = [b"".join(payload(k * 40 + i) for i in range(40)) for k in range(8)]
    p.measure("b1", batches[0])
    first = p.flows["b1"].ratio
    assert first == pytest.approx(len(zstandard.ZstdCompressor(level=3).compress(batches[0])) / len(batches[0]),
                                  rel=0.05)
    for data in batches[1:]:
        p.measure("b1", data)
    f = p.flows["b1"]
    assert f.measured == len(batches)
    assert f.ratio < first  # later blocks compress against the earlier ones, as on the link


@pytest.mark.timeout(20)
def test_routes_compressed_at_their_best_lend_the_router_their_level() -> None:
    """`cluster { compression: s2_best }` (zstd 7 on zonebus's routes) sets the level of the router's link
    batches too: the same batches cost fewer bytes, the leader reads them back whole, and `/jsz` says the level.
    Routes that do not compress, or compress faster, leave the router's own level."""
    assert level_for("s2_best") == 7
    assert level_for("accept") == level_for("off") == level_for("s2_fast") == level_for("s2_auto") == ZSTD_LEVEL
    plain, best = PathChooser("auto", True, 0.05), PathChooser("auto", True, 0.05, level=level_for("s2_best"))
    leader = PathChooser("auto", True, 0.05)
    for k in range(40):
        data = b"".join(payload(k * 10 + i) for i in range(10))
        plain.compress_stream("ldr", data)
        gen, block = best.compress_stream("ldr", data)
        assert leader.decompress_stream("me", gen, block) == data
    assert 0 < best.flows["ldr"].ratio < plain.flows["ldr"].ratio
    assert best.info()["zstd_level"] == 7 and plain.info()["zstd_level"] == ZSTD_LEVEL
