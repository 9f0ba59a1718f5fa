"""JetStreamService over an in-memory internal client: cursor over several filters, pending counts,
redelivery timers, retention, restart recovery, and API input that must never raise."""

from __future__ import annotations

import asyncio
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.stream.kit import FakeClient
from zonebus.options import JetStreamOptions
from zonebus.stream.service import JetStreamService
from zonebus.testing.polling import until


async def make_service(store_dir: str) -> tuple[JetStreamService, FakeClient]:
    fc = FakeClient()
    # the lazy mode: these tests follow consumer bookkeeping loop turn by loop turn, and the default's group commit
    # shows a message only after an fsync in a thread (tests/stream/test_group_commit.py)
    svc = JetStreamService(JetStreamOptions(enabled=True, store_dir=store_dir, sync_always=False), "srv", fc)
    await svc.start()
    return svc, fc


def api(svc: JetStreamService, subject: str, body: dict | bytes | None = None) -> dict:
    data = body if isinstance(body, bytes) else json.dumps(body).encode() if body is not None else b""
    resp = svc.api.handle(f"$JS.API.{subject}", data)
    assert resp is not None
    return resp


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def deliveries(fc: FakeClient, to: str) -> list[tuple[str, int, int, int]]:
    """(stream subject, stream seq, consumer seq, pending) of messages sent to `to`."""
    out = []
    for subject, msg_subject, reply, _h, _p in fc.published:
        if subject == to and reply and reply.startswith("$JS.ACK."):
            t = reply.split(".")
            out.append((msg_subject, int(t[5]), int(t[6]), int(t[8])))
    return out


def pull(fc: FakeClient, svc: JetStreamService, stream: str, consumer: str, body: dict, inbox: str) -> None:
    if not fc.has_interest(inbox):
        fc.subscribe(inbox, lambda *a: None)
    svc.streams[stream].consumers[consumer].waiting.add(inbox, json.dumps(body).encode())


async def test_cursor_interleaves_filters_and_keeps_pending_exact(tmp_path) -> None:
    svc, fc = await make_service(str(tmp_path))
    api(svc, "STREAM.CREATE.S", {"name": "S", "subjects": ["s.>"], "max_msgs": 8})
    for subj in ["s.a", "s.b", "s.c.1", "s.a", "s.d", "s.c.2"]:
        svc.streams["S"].on_publish(subj, None, None, b"x")
    cfg = {"durable_name": "D", "ack_policy": "explicit", "filter_subjects": ["s.a", "s.c.*"]}
    info = api(svc, "CONSUMER.DURABLE.CREATE.S.D", {"stream_name": "S", "config": cfg})
    assert info["num_pending"] == 4
    pull(fc, svc, "S", "D", {"batch": 2}, "in1")
    await settle()
    assert deliveries(fc, "in1") == [("s.a", 1, 1, 3), ("s.c.1", 3, 2, 2)]
    # a subject first seen after the consumer was created joins its wildcard filter
    for subj in ["s.c.3", "s.b", "s.b"]:
        svc.streams["S"].on_publish(subj, None, None, b"x")
    c = svc.streams["S"].consumers["D"]
    assert c.num_pending == 3  # 4 (s.a), 6 (s.c.2), 7 (s.c.3)
    # max_msgs 8 pushed out seq 1 (delivered) -> pending unchanged; now push out 4 (undelivered)
    for _ in range(3):
        svc.streams["S"].on_publish("s.b", None, None, b"x")
    assert svc.streams["S"].store.index.first_seq == 5
    assert c.num_pending == 2  # 6, 7
    assert c.num_pending == svc.streams["S"].store.count(c.sseq, c.filters)
    pull(fc, svc, "S", "D", {"batch": 5, "no_wait": True}, "in2")
    await settle()
    assert deliveries(fc, "in2") == [("s.c.2", 6, 3, 1), ("s.c.3", 7, 4, 0)]
    await svc.stop()


async def test_ack_wait_backoff_and_max_deliver(tmp_path) -> None:
    svc, fc = await make_service(str(tmp_path))
    api(svc, "STREAM.CREATE.R", {"name": "R", "subjects": ["r"]})
    svc.streams["R"].on_publish("r", None, None, b"x")
    cfg = {"durable_name": "D", "ack_policy": "explicit", "backoff": [50_000_000, 100_000_000], "max_deliver": 3}
    api(svc, "CONSUMER.DURABLE.CREATE.R.D", {"stream_name": "R", "config": cfg})
    pull(fc, svc, "R", "D", {"batch": 10, "expires": 2_000_000_000}, "in")
    await until(lambda: len(deliveries(fc, "in")) >= 3, "three deliveries", timeout=3, interval=0.01)
    got = deliveries(fc, "in")
    assert [(s, d) for _, s, d, _ in got] == [(1, 1), (1, 2), (1, 3)]
    await asyncio.sleep(0.3)  # the third delivery was the last one allowed
    assert len(deliveries(fc, "in")) == 3
    info = api(svc, "CONSUMER.INFO.R.D")
    assert (info["num_ack_pending"], info["num_redelivered"]) == (0, 1)
    await svc.stop()


async def test_workqueue_and_interest_retention(tmp_path) -> None:
    svc, fc = await make_service(str(tmp_path))
    api(svc, "STREAM.CREATE.W", {"name": "W", "subjects": ["w.*"], "retention": "workqueue"})
    for i in range(3):
        svc.streams["W"].on_publish("w.a", None, None, str(i).encode())
    api(svc, "CONSUMER.DURABLE.CREATE.W.D", {"stream_name": "W", "config": {
        "durable_name": "D", "ack_policy": "explicit"}})
    pull(fc, svc, "W", "D", {"batch": 3}, "in")
    await settle()
    c = svc.streams["W"].consumers["D"]
    c.on_ack(2, 2, b"+ACK", None)
    assert list(svc.streams["W"].store.index.live_seqs()) == [1, 3]
    api(svc, "STREAM.CREATE.I", {"name": "I", "subjects": ["i.*"], "retention": "interest"})
    for name, flt in (("A", "i.a"), ("B", "i.*")):
        api(svc, f"CONSUMER.DURABLE.CREATE.I.{name}", {"stream_name": "I", "config": {
            "durable_name": name, "ack_policy": "explicit", "filter_subject": flt}})
    for subj in ("i.a", "i.b", "i.c"):
        svc.streams["I"].on_publish(subj, None, None, b"x")
    pull(fc, svc, "I", "B", {"batch": 3}, "inb")
    await settle()
    b = svc.streams["I"].consumers["B"]
    for seq in (1, 2, 3):
        b.on_ack(seq, seq, b"", None)
    # i.b and i.c only interested B; i.a waits for A too
    assert list(svc.streams["I"].store.index.live_seqs()) == [1]
    api(svc, "CONSUMER.DELETE.I.A")
    assert list(svc.streams["I"].store.index.live_seqs()) == []
    await svc.stop()


async def test_restart_restores_consumer_cursor_and_pending(tmp_path) -> None:
    svc, fc = await make_service(str(tmp_path))
    api(svc, "STREAM.CREATE.P", {"name": "P", "subjects": ["p.*"]})
    for subj in ["p.a", "p.b", "p.a", "p.b", "p.a"]:
        svc.streams["P"].on_publish(subj, None, None, b"x")
    api(svc, "CONSUMER.DURABLE.CREATE.P.D", {"stream_name": "P", "config": {
        "durable_name": "D", "ack_policy": "explicit", "filter_subjects": ["p.a"]}})
    pull(fc, svc, "P", "D", {"batch": 2}, "in")
    await settle()
    svc.streams["P"].consumers["D"].on_ack(1, 1, b"+ACK", None)
    await svc.stop()
    svc2, fc2 = await make_service(str(tmp_path))
    info = api(svc2, "CONSUMER.INFO.P.D")
    assert (info["delivered"]["consumer_seq"], info["delivered"]["stream_seq"]) == (2, 3)
    assert (info["num_ack_pending"], info["num_pending"]) == (1, 1)
    assert (info["ack_floor"]["consumer_seq"], info["ack_floor"]["stream_seq"]) == (1, 2)
    assert api(svc2, "STREAM.INFO.P")["state"]["messages"] == 5
    await svc2.stop()


_SUBJECTS = [
    "INFO", "STREAM.CREATE.X", "STREAM.UPDATE.X", "STREAM.INFO.X", "STREAM.DELETE.X", "STREAM.PURGE.X",
    "STREAM.NAMES", "STREAM.LIST", "STREAM.MSG.GET.X", "STREAM.MSG.DELETE.X", "CONSUMER.CREATE.X",
    "CONSUMER.CREATE.X.C", "CONSUMER.CREATE.X.C.x.>", "CONSUMER.DURABLE.CREATE.X.C", "CONSUMER.INFO.X.C",
    "CONSUMER.DELETE.X.C", "CONSUMER.NAMES.X", "CONSUMER.LIST.X",
]
_json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.sampled_from(["name", "subjects", "config", "stream_name", "max_msgs", "filter_subjects", "seq",
                         "ack_policy", "deliver_policy", "durable_name", "retention", "bogus", "keep"]),
        inner, max_size=5),
    max_leaves=12,
)


@pytest.fixture
def offline_service(tmp_path):
    """A service that is not started: the API handlers run synchronously, timers are never fired."""
    loop = asyncio.new_event_loop()
    svc = JetStreamService(JetStreamOptions(enabled=True, store_dir=str(tmp_path)), "srv", FakeClient(loop))
    svc.loop = loop
    svc.root = tmp_path / "jetstream" / "streams"
    svc.root.mkdir(parents=True)
    api(svc, "STREAM.CREATE.X", {"name": "X", "subjects": ["x.>"]})
    yield svc
    for stream in list(svc.streams.values()):
        stream.close()
    loop.close()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(subject=st.sampled_from(_SUBJECTS), body=_json_values | st.binary(max_size=40))
def test_api_never_raises_on_any_input(offline_service, subject, body, caplog) -> None:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    resp = offline_service.api.handle(f"$JS.API.{subject}", data)
    assert resp is not None and resp["type"].startswith("io.nats.jetstream.api.v1.")
    if "error" in resp:
        assert set(resp["error"]) == {"code", "err_code", "description"}
        assert resp["error"]["description"] != "internal error", (subject, body)
    assert "Traceback" not in caplog.text


@pytest.mark.parametrize("flt,subject,ok", [("a.*", "a.b", True), ("a.>", "a", False), ("a.*.c", "a.b.c", True)])
def test_filter_matching(flt, subject, ok) -> None:
    from zonebus.subjects.patterns import matches

    assert matches(flt, subject) is ok
