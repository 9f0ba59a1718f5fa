"""JetStreamService on a shared file:// store over an in-memory client: replies wait for durability,
consumers never see a message before it is durable, pending counts stay exact while batches are in flight,
limits act on messages not yet durable, and a restart on an empty store_dir restores streams and consumers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.stream.kit import FakeClient
from zonebus.options import JetStreamOptions
from zonebus.stream.service import JetStreamService
from zonebus.testing.polling import until


async def make_service(tmp_path: Path, local: str) -> tuple[JetStreamService, FakeClient]:
    fc = FakeClient()
    opts = JetStreamOptions(enabled=True, store_dir=str(tmp_path / local), shared_store=f"file://{tmp_path}/shared",
                            shared_store_linger=0.002)
    svc = JetStreamService(opts, "srv", fc)
    await svc.start()
    return svc, fc


def api(svc: JetStreamService, subject: str, body: dict | None = None) -> dict:
    resp = svc.api.handle(f"$JS.API.{subject}", json.dumps(body).encode() if body is not None else b"")
    assert resp is not None
    return resp


def replies(fc: FakeClient, inbox: str) -> list[dict]:
    return [json.loads(p) for subj, _m, _r, _h, p in fc.published if subj == inbox]


@pytest.mark.timeout(30)
async def test_replies_and_deliveries_wait_for_durability(tmp_path: Path) -> None:
    svc, fc = await make_service(tmp_path, "l1")
    api(svc, "STREAM.CREATE.S", {"name": "S", "subjects": ["s.>"], "max_msgs_per_subject": 2})
    stream = svc.streams["S"]
    store = stream.store
    api(svc, "CONSUMER.DURABLE.CREATE.S.D", {"stream_name": "S", "config": {
        "durable_name": "D", "ack_policy": "explicit", "filter_subject": "s.a"}})
    cons = stream.consumers["D"]
    early: list[int] = []
    real_publish = fc.publish

    def watch(subject, payload, reply=None, headers=None, msg_subject=None):
        if reply and reply.startswith("$JS.ACK.S."):
            seq = int(reply.split(".")[5])
            if seq > store.durable_seq:
                early.append(seq)  # a delivery before the message is durable
        if subject == "inbox" and store.durable_seq < json.loads(payload).get("seq", 0):
            early.append(-1)  # a PubAck before the message is durable
        real_publish(subject, payload, reply, headers, msg_subject)

    fc.publish = watch  # type: ignore[method-assign]
    fc.subscribe("inbox", lambda *a: None)
    fc.subscribe("pull", lambda *a: None)
    cons.waiting.add("pull", json.dumps({"batch": 100, "expires": 5_000_000_000}).encode())
    for i in range(30):
        stream.on_publish(f"s.{'ab'[i % 2]}", "inbox", None, f"m{i}".encode())
        assert cons.num_pending == cons.stream.store.count(cons.sseq, cons.filters)
    assert replies(fc, "inbox") == []  # nothing is durable yet
    await until(lambda: len(replies(fc, "inbox")) == 30, "30 PubAcks", timeout=5)
    assert [r["seq"] for r in replies(fc, "inbox")] == list(range(1, 31))
    assert early == []
    # the per-subject limit removed most messages while they were not durable yet: counts stay exact
    assert stream.store.state().msgs == 4
    await until(lambda: cons.dseq == 2, "2 deliveries to the consumer", timeout=5)
    assert (cons.num_pending, len(cons.pending)) == (0, 2)
    api(svc, "STREAM.CREATE.T", {"name": "T", "subjects": ["t"]})
    svc.streams["T"].on_publish("t", "inbox", b"NATS/1.0\r\nNats-Msg-Id: x\r\n\r\n", b"1")
    svc.streams["T"].on_publish("t", "inbox", b"NATS/1.0\r\nNats-Msg-Id: x\r\n\r\n", b"1")
    await until(lambda: len(replies(fc, "inbox")) == 32, "T's 2 PubAcks (the 2nd a duplicate)", timeout=5)
    assert replies(fc, "inbox")[-1] == {"stream": "T", "seq": 1, "duplicate": True}
    await svc.stop()

    svc2, _fc2 = await make_service(tmp_path, "l2")  # an empty local directory
    assert sorted(svc2.streams) == ["S", "T"]
    s2 = svc2.streams["S"]
    assert s2.store.state().msgs == 4 and s2.store.state().last_seq == 30
    c2 = s2.consumers["D"]
    assert (c2.dseq, sorted(c2.pending)) == (2, [27, 29])
    api(svc2, "CONSUMER.DELETE.S.D")
    api(svc2, "STREAM.DELETE.T")
    await svc2.stop()
    svc3, _fc3 = await make_service(tmp_path, "l3")
    assert sorted(svc3.streams) == ["S"] and svc3.streams["S"].consumers == {}
    await svc3.stop()


@pytest.mark.timeout(30)
async def test_consumer_states_are_one_document_per_stream(tmp_path: Path) -> None:
    """Every durable consumer's state goes into the stream's `consumers/states` document (one PUT per flush on
    s3://, not one per consumer); a consumer missing from it is read from its own older `state` document."""
    svc, fc = await make_service(tmp_path, "l1")
    api(svc, "STREAM.CREATE.S", {"name": "S", "subjects": ["s.>"]})
    stream = svc.streams["S"]
    for name, subject in (("A", "s.a"), ("B", "s.b")):
        api(svc, f"CONSUMER.DURABLE.CREATE.S.{name}", {"stream_name": "S", "config": {
            "durable_name": name, "ack_policy": "explicit", "filter_subject": subject}})
    fc.subscribe("inbox", lambda *a: None)
    for i in range(10):
        stream.on_publish(f"s.{'ab'[i % 2]}", "inbox", None, f"m{i}".encode())
    await until(lambda: len(replies(fc, "inbox")) == 10, "10 PubAcks", timeout=5)
    for name, n in (("A", 2), ("B", 3)):
        fc.subscribe(f"pull.{name}", lambda *a: None)
        stream.consumers[name].waiting.add(f"pull.{name}", json.dumps({"batch": n}).encode())
    await until(lambda: (stream.consumers["A"].dseq, stream.consumers["B"].dseq) == (2, 3), "deliveries", timeout=5)
    await svc.stop()

    folder = tmp_path / "shared" / "streams" / "S" / "consumers"
    assert [p.name.split(".")[0] for p in folder.iterdir() if p.is_file()] == ["states"]
    assert not list(folder.glob("*/state.*.json"))  # no consumer's own state document
    states = json.loads(next(folder.glob("states.*.json")).read_bytes())
    assert sorted(states) == ["A", "B"]
    # a consumer of an older writer: its meta and its own state document, not in `states`
    old = folder / "C"
    old.mkdir()
    (old / "meta.00000000000000000001.json").write_text(json.dumps(
        {"name": "C", "config": {"durable_name": "C", "ack_policy": "explicit", "filter_subject": "s.a"},
         "created": 1}))
    (old / "state.00000000000000000001.json").write_text(json.dumps({**states["A"], "dseq": 7}))

    svc2, _fc2 = await make_service(tmp_path, "l2")
    s2 = svc2.streams["S"]
    assert (s2.consumers["A"].dseq, s2.consumers["B"].dseq, s2.consumers["C"].dseq) == (2, 3, 7)
    assert sorted(s2.consumers["B"].pending) == [2, 4, 6]
    await svc2.stop()
