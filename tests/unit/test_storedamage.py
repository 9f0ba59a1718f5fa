"""The chaos campaigns' `damage` faults (`zonebus.testing.storedamage`) against moto's S3 server: a flipped bit
changes exactly one bit of a batch object, a torn object is a prefix of the original, a deleted claim is the
stream's newest, and nothing else in the bucket changes."""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest

from zonebus.testing.motos3 import MotoS3, moto_s3_server
from zonebus.testing.storedamage import StoreDamage

BATCHES = [f"zb/streams/S/log/{b:020d}.{1:020d}.blk" for b in range(1, 6)]
CLAIMS = [f"zb/streams/S/epochs/{e:020d}.claim" for e in (1, 2, 3)]
OTHER = ["zb/streams/S/stream.00000000000000000001.json", "zb/layout.json"]


@pytest.fixture(scope="module")
def s3() -> Iterator[MotoS3]:
    with moto_s3_server("zonebus-storedamage") as s3:
        yield s3


def _fill(s3: MotoS3) -> dict[str, bytes]:
    client = s3.client()
    stored = {key: bytes(random.Random(key).randbytes(200)) for key in BATCHES + CLAIMS + OTHER}
    for key, body in stored.items():
        client.put_object(Bucket=s3.bucket, Key=key, Body=body)
    return stored


def _now(s3: MotoS3) -> dict[str, bytes]:
    client = s3.client()
    return {k: client.get_object(Bucket=s3.bucket, Key=k)["Body"].read() for k in s3.keys("zb/")}


@pytest.mark.timeout(60)
def test_each_kind_damages_one_object_of_its_kind(s3: MotoS3) -> None:
    damage = StoreDamage(s3, "zb/")
    for seed in range(4):
        before = _fill(s3)
        what = damage.hit(random.Random(seed), ("flip",))
        after = _now(s3)
        changed = [k for k in before if after.get(k) != before[k]]
        assert len(changed) == 1 and changed[0] in BATCHES, (what, changed)
        diff = [a ^ b for a, b in zip(before[changed[0]], after[changed[0]], strict=True)]
        assert sorted(diff)[-1] in (1, 2, 4, 8, 16, 32, 64, 128) and sum(1 for d in diff if d) == 1, what

        before = _fill(s3)
        what = damage.hit(random.Random(seed), ("torn",))
        after = _now(s3)
        changed = [k for k in before if after.get(k) != before[k]]
        assert len(changed) == 1 and changed[0] in BATCHES, (what, changed)
        assert 0 < len(after[changed[0]]) < len(before[changed[0]]), what
        assert before[changed[0]].startswith(after[changed[0]]), what

        before = _fill(s3)
        what = damage.hit(random.Random(seed), ("claim",))
        after = _now(s3)
        assert set(before) - set(after) == {CLAIMS[-1]}, what
        assert all(after[k] == before[k] for k in after), what
    assert len(damage.hits) == 12


@pytest.mark.timeout(30)
def test_nothing_to_damage_is_said(s3: MotoS3) -> None:
    damage = StoreDamage(s3, "empty/")
    assert damage.hit(random.Random(1)).startswith("nothing to damage")


@pytest.mark.timeout(30)
def test_a_batch_deleted_after_the_listing_is_left_alone(s3: MotoS3, monkeypatch: pytest.MonkeyPatch) -> None:
    """A base move may delete the batch object the fault picked between its listing and its GET: the fault says
    so and writes nothing (a 30-minute KV campaign, seed 30, died of the NoSuchKey before)."""
    damage = StoreDamage(s3, "gone/")
    listed = "gone/streams/S/log/00000000000000000001.00000000000000000001.blk"  # (never stored)
    monkeypatch.setattr(damage, "_keys", lambda suffix, folder: [listed] if suffix == ".blk" else [])
    what = damage.hit(random.Random(1), ("flip",))
    assert what.startswith("nothing damaged") and s3.keys("gone/") == [], what
