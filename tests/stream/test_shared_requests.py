"""What a stream writer asks of a shared store, counted by `zonebus.storage.meter`: one create-only PUT per
batch and no LIST or HEAD per upload; a newer writer fences the old one through the slot it would write next
(on a file system and on moto's S3 server); a latency budget makes a busy stream write a few objects a second
while every ack still comes within it."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from zonebus.storage.meter import RequestMeter
from zonebus.store.shared import CommitOptions, SharedStorage
from zonebus.testing.polling import until


def counting(url: str, meter: RequestMeter, **opts) -> SharedStorage:
    st = SharedStorage(url, options=CommitOptions(**opts))
    st.objects.meter = meter
    return st


def kinds(meter: RequestMeter, purpose: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for (_store, kind, p), (n, _b) in meter.totals().items():
        if p == purpose:
            out[kind] = out.get(kind, 0) + n
    return out


@pytest.mark.timeout(60)
async def test_one_put_per_batch_and_no_list(tmp_path: Path) -> None:
    meter = RequestMeter()
    st = counting(f"file://{tmp_path}/shared", meter)
    s = st.create_stream("S", {"name": "S"}, 0)
    s.attach(asyncio.get_running_loop(), st.executor)
    before = kinds(meter, "stream_log")
    acked: list[str | None] = []
    for i in range(50):  # one at a time: each message its own batch
        seq = s.store("t", None, f"m{i}".encode())[0]
        assert s.ack_when_durable(seq, acked.append)
        await until(lambda n=i + 1: len(acked) == n, f"the ack of message {i + 1}", timeout=10)
    after = kinds(meter, "stream_log")
    assert acked == [None] * 50
    assert after.get("PUT", 0) - before.get("PUT", 0) == s.uploads == 50
    assert after.get("LIST", 0) == before.get("LIST", 0)  # no fencing LIST per upload
    assert not any(k in after for k in ("HEAD", "GET"))
    s.close()
    st.shutdown()


@pytest.mark.timeout(60)
def test_a_newer_writer_fences_the_old_one_on_s3(moto_s3) -> None:
    url = f"s3://{moto_s3.bucket}/fence-{time.monotonic_ns()}"
    meter = RequestMeter()
    st = SharedStorage(url, endpoint=moto_s3.endpoint, region=moto_s3.region,
                       options=CommitOptions(batch_bytes=10**9))
    w1 = st.create_stream("S", {"name": "S"}, 0, epoch=1, writer="one")
    w1.objects.meter = meter
    for i in range(10):
        w1.store("t", None, f"a{i}".encode())
    w1.sync()
    assert kinds(meter, "stream_log") == {"PUT": 1}  # one create-only PUT, no LIST, no HEAD
    w2 = SharedStorage(url, endpoint=moto_s3.endpoint, region=moto_s3.region).takeover("S", epoch=2, writer="two")
    assert w2.state().last_seq == 10
    for i in range(5):  # the old writer goes on: its PUT finds the slot fenced, nothing is acknowledged
        w1.store("t", None, f"b{i}".encode())
    with pytest.raises(OSError):
        w1.sync()
    assert "taken over by epoch 2" in w1.fenced and w1.durable_seq == 10
    w2.store("t", None, b"c")
    w2.sync()
    view = st.open_view("S")
    assert [view.load(q).data for q in view.index.live_seqs()] == [f"a{i}".encode() for i in range(10)] + [b"c"]
    w2.close()


@pytest.mark.timeout(60)
async def test_a_retried_put_that_had_landed_counts_as_done(tmp_path: Path) -> None:
    st = SharedStorage(f"file://{tmp_path}/shared", options=CommitOptions(batch_bytes=10**9))
    s = st.create_stream("S", {"name": "S"}, 0)
    s.store("t", None, b"x")
    s._seal()
    b = s._unreleased[0]
    s.objects.put(s._key(b.num, s.epoch), b.data)  # the first attempt landed, but its answer was lost
    s.sync()  # the retry finds its own bytes there: done, not fenced
    assert s.durable_seq == 1 and not s.fenced
    s.close()


@pytest.mark.timeout(60)
async def test_latency_budget_fills_batches_and_keeps_acks_within_it(tmp_path: Path) -> None:
    budget = 0.3
    st = SharedStorage(f"file://{tmp_path}/shared", options=CommitOptions(latency_budget=budget))
    s = st.create_stream("S", {"name": "S"}, 0)
    s.attach(asyncio.get_running_loop(), st.executor)
    waits: list[float] = []
    n = 0
    start = time.monotonic()
    while time.monotonic() - start < 1.5:  # about 400 messages a second, as publishers send them
        for _ in range(4):
            seq = s.store("t", None, f"m{n}".encode())[0]
            t0 = time.monotonic()
            s.ack_when_durable(seq, lambda err, t0=t0: waits.append(time.monotonic() - t0))
            n += 1
        await asyncio.sleep(0.01)
    await until(lambda: len(waits) == n, "every ack", timeout=10)
    assert n > 100
    # a few objects a second, not one per loop turn (the first batches fill for the PUT time guessed before
    # any was measured)
    slowest = max(s.put_times.p99(), s.put_times.guess)
    assert s.uploads <= 1.5 / (budget * 0.9 - slowest) + 2
    assert s.uploads < n / 20
    assert max(waits) < budget * 2  # (generous: a loaded machine; the bench measures the p99)
    s.close()
    st.shutdown()
