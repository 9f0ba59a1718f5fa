"""nats-py's JetStream client, unchanged, against zonebus -js: streams, publishes, pull and push consumers,
acks and redelivery, limits, retention, several filters and the API errors it raises."""

from __future__ import annotations

import asyncio
import itertools
import json

import nats
import pytest
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy, RetentionPolicy, StreamConfig
from nats.js.errors import APIError, BadRequestError, NotFoundError

from zonebus.testing.polling import until

_n = itertools.count()


@pytest.fixture
async def js(zb_url):
    nc = await nats.connect(zb_url, allow_reconnect=False)
    yield nc.jetstream()
    await nc.close()


def uniq(prefix: str) -> str:
    return f"{prefix}{next(_n)}"


async def test_stream_crud_and_publish_acks(js) -> None:
    name = uniq("CRUD")
    info = await js.add_stream(name=name, subjects=[f"{name}.>"], max_msgs=100)
    assert info.config.name == name and info.state.messages == 0
    acks = [await js.publish(f"{name}.s{i % 2}", f"m{i}".encode()) for i in range(5)]
    assert [(a.stream, a.seq) for a in acks] == [(name, s) for s in range(1, 6)]
    dup = await js.publish(f"{name}.s0", b"x", headers={"Nats-Msg-Id": "once"})
    again = await js.publish(f"{name}.s0", b"x", headers={"Nats-Msg-Id": "once"})
    assert (dup.seq, again.seq, again.duplicate) == (6, 6, True)
    info = await js.stream_info(name)
    assert (info.state.messages, info.state.first_seq, info.state.last_seq) == (6, 1, 6)
    msg = await js._jsm.get_msg(name, seq=2)
    assert (msg.subject, msg.data) == (f"{name}.s1", b"m1")
    last = await js._jsm.get_last_msg(name, f"{name}.s1")
    assert last.seq == 4
    assert await js._jsm.delete_msg(name, 3)
    assert await js.purge_stream(name, subject=f"{name}.s1") is True
    info = await js.stream_info(name)
    assert info.state.messages == 3  # seqs 1, 5, 6
    names = await js._jsm.streams_info()
    assert name in [s.config.name for s in names]
    await js.update_stream(name=name, subjects=[f"{name}.>"], max_msgs=2)
    assert (await js.stream_info(name)).state.messages == 2
    assert await js.delete_stream(name)
    with pytest.raises(NotFoundError):
        await js.stream_info(name)


async def test_pull_fetch_ack_and_consumer_info(js) -> None:
    name = uniq("PULL")
    await js.add_stream(name=name, subjects=[f"{name}.*"])
    for i in range(10):
        await js.publish(f"{name}.a", str(i).encode())
    sub = await js.pull_subscribe(f"{name}.a", durable="worker", stream=name)
    msgs = await sub.fetch(4, timeout=2)
    assert [m.data for m in msgs] == [b"0", b"1", b"2", b"3"]
    assert [m.metadata.sequence.stream for m in msgs] == [1, 2, 3, 4]
    assert msgs[0].subject == f"{name}.a"
    assert msgs[3].metadata.num_pending == 6
    for m in msgs:
        await m.ack_sync()
    info = await js.consumer_info(name, "worker")
    assert (info.num_pending, info.num_ack_pending) == (6, 0)
    assert (info.delivered.stream_seq, info.ack_floor.stream_seq) == (4, 4)
    rest = await sub.fetch(20, timeout=1)
    assert [m.metadata.sequence.consumer for m in rest] == list(range(5, 11))
    with pytest.raises(nats.errors.TimeoutError):
        await sub.fetch(1, timeout=0.3)
    await js.delete_stream(name)


async def test_nak_term_and_ack_wait_redelivery(js) -> None:
    name = uniq("REDL")
    await js.add_stream(name=name, subjects=[f"{name}"])
    for i in range(3):
        await js.publish(name, str(i).encode())
    cfg = ConsumerConfig(durable_name="d", ack_policy=AckPolicy.EXPLICIT, ack_wait=0.4, max_deliver=3)
    sub = await js.pull_subscribe(name, durable="d", stream=name, config=cfg)
    first = await sub.fetch(3, timeout=2)
    await first[0].nak()
    await first[1].term()
    # msg 0 comes back at once (nak); msg 2 after ack wait; msg 1 never (term)
    again = await sub.fetch(1, timeout=2)
    assert (again[0].data, again[0].metadata.num_delivered) == (b"0", 2)
    await again[0].ack_sync()
    late = await sub.fetch(1, timeout=3)
    assert (late[0].data, late[0].metadata.num_delivered) == (b"2", 2)
    await late[0].ack_sync()
    info = await js.consumer_info(name, "d")
    assert (info.num_ack_pending, info.num_pending) == (0, 0)
    await js.delete_stream(name)


async def test_push_subscribe_with_callback_and_queue(js) -> None:
    name = uniq("PUSH")
    await js.add_stream(name=name, subjects=[f"{name}.>"])
    for i in range(6):
        await js.publish(f"{name}.{'ab'[i % 2]}", str(i).encode())
    got: list[tuple[str, bytes]] = []
    done = asyncio.Event()

    async def cb(msg) -> None:
        got.append((msg.subject, msg.data))
        await msg.ack()
        if len(got) == 3:
            done.set()

    sub = await js.subscribe(f"{name}.a", cb=cb, durable="pd", manual_ack=True)
    await asyncio.wait_for(done.wait(), 5)
    assert got == [(f"{name}.a", b"0"), (f"{name}.a", b"2"), (f"{name}.a", b"4")]
    info = await sub.consumer_info()
    assert info.config.deliver_subject and info.num_pending == 0
    await sub.unsubscribe()
    # a queue push consumer (deliver_group) hands each message to one member
    seen: list[bytes] = []
    q_done = asyncio.Event()

    async def qcb(msg) -> None:
        seen.append(msg.data)
        await msg.ack()
        if len(seen) == 3:
            q_done.set()

    subs = [await js.subscribe(f"{name}.b", queue="workers", cb=qcb, stream=name) for _ in range(2)]
    await asyncio.wait_for(q_done.wait(), 5)
    await asyncio.sleep(0.1)
    assert sorted(seen) == [b"1", b"3", b"5"]
    for s in subs:
        await s.unsubscribe()
    await js.delete_stream(name)


async def test_several_filters_interleave_in_stream_order(js) -> None:
    name = uniq("MULTI")
    await js.add_stream(name=name, subjects=[f"{name}.>"])
    order = ["orders.eu", "audit", "orders.us", "pay", "orders.eu", "audit", "pay"]
    for i, s in enumerate(order):
        await js.publish(f"{name}.{s}", str(i).encode())
    cfg = ConsumerConfig(durable_name="mf", ack_policy=AckPolicy.EXPLICIT,
                         filter_subjects=[f"{name}.orders.*", f"{name}.pay"])
    info = await js.add_consumer(name, cfg)
    assert info.num_pending == 5
    assert info.config.filter_subjects == [f"{name}.orders.*", f"{name}.pay"]
    sub = await js.pull_subscribe_bind(durable="mf", stream=name)
    msgs = await sub.fetch(10, timeout=1)
    assert [m.metadata.sequence.stream for m in msgs] == [1, 3, 4, 5, 7]
    assert [m.metadata.sequence.consumer for m in msgs] == [1, 2, 3, 4, 5]
    assert [m.metadata.num_pending for m in msgs] == [4, 3, 2, 1, 0]
    for m in msgs:
        await m.ack_sync()
    # update the filters: audit joins, pay leaves
    await js.publish(f"{name}.audit", b"7")
    await js.publish(f"{name}.pay", b"8")
    cfg.filter_subjects = [f"{name}.orders.*", f"{name}.audit"]
    info = await js.add_consumer(name, cfg)
    assert info.num_pending == 1
    more = await sub.fetch(5, timeout=1)
    assert [(m.subject, m.data) for m in more] == [(f"{name}.audit", b"7")]
    await js.delete_stream(name)


@pytest.mark.parametrize(
    ("cfg", "subject_filter", "err_code"),
    [
        ({"filter_subject": "F.a", "filter_subjects": ["F.b"]}, None, 10136),
        ({"filter_subjects": ["F.*", "F.a"]}, None, 10138),
        ({"filter_subjects": ["F.a", "F.a"]}, None, 10138),
        ({"filter_subjects": ["F.a", ""]}, None, 10139),
        ({"filter_subjects": ["F.a", "F.b"]}, "F.a", 10137),
        ({"filter_subject": "F.b"}, "F.a", 10131),
    ],
)
async def test_filter_errors_reach_nats_py_as_api_errors(js, cfg, subject_filter, err_code) -> None:
    name = uniq("FERR")
    await js.add_stream(name=name, subjects=[f"{name}.>"])
    fix = {k: ([s.replace("F", name) for s in v] if isinstance(v, list) else v.replace("F", name))
           for k, v in cfg.items()}
    body = {"stream_name": name, "config": {"name": "c", **fix}}
    tail = f".{subject_filter.replace('F', name)}" if subject_filter else ""
    resp = await js._nc.request(f"$JS.API.CONSUMER.CREATE.{name}.c{tail}", json.dumps(body).encode())
    doc = json.loads(resp.data)
    assert set(doc["error"]) == {"code", "err_code", "description"}
    assert (doc["error"]["code"], doc["error"]["err_code"]) == (400, err_code)
    # through nats-py: with a single filter_subject it uses the subject-based API, where nats-server
    # reports the multiple-filters error (10137) before the both-set error (10136)
    expected = 10137 if fix.get("filter_subject") and fix.get("filter_subjects") else err_code
    if not subject_filter:  # (nats-py builds the create subject itself)
        with pytest.raises(APIError) as exc:
            await js.add_consumer(name, ConsumerConfig(name="c2", **fix))
        assert exc.value.err_code == expected
    await js.delete_stream(name)


async def test_limits_and_retention(js) -> None:
    name = uniq("LIM")
    await js.add_stream(StreamConfig(name=name, subjects=[f"{name}.*"], max_msgs=3, max_msg_size=16))
    for i in range(5):
        await js.publish(f"{name}.x", str(i).encode())
    info = await js.stream_info(name)
    assert (info.state.messages, info.state.first_seq) == (3, 3)
    with pytest.raises(APIError) as exc:
        await js.publish(f"{name}.x", b"y" * 17)
    assert exc.value.err_code == 10054
    wq = uniq("WQ")
    await js.add_stream(name=wq, subjects=[f"{wq}.*"], retention=RetentionPolicy.WORK_QUEUE)
    for i in range(4):
        await js.publish(f"{wq}.job", str(i).encode())
    sub = await js.pull_subscribe(f"{wq}.job", durable="w", stream=wq)
    for m in await sub.fetch(4, timeout=1):
        await m.ack_sync()
    assert (await js.stream_info(wq)).state.messages == 0
    with pytest.raises(BadRequestError) as exc:
        await js.add_consumer(wq, ConsumerConfig(durable_name="other", ack_policy=AckPolicy.EXPLICIT))
    assert exc.value.err_code == 10099
    for s in (name, wq):
        await js.delete_stream(s)


async def test_deliver_policies_with_nats_py(js) -> None:
    name = uniq("DPOL")
    await js.add_stream(name=name, subjects=[f"{name}.*"])
    for i, s in enumerate("abab"):
        await js.publish(f"{name}.{s}", str(i).encode())
    last = await js.add_consumer(name, ConsumerConfig(durable_name="l", deliver_policy=DeliverPolicy.LAST))
    new = await js.add_consumer(name, ConsumerConfig(durable_name="n", deliver_policy=DeliverPolicy.NEW))
    lps = await js.add_consumer(name, ConsumerConfig(durable_name="p", deliver_policy=DeliverPolicy.LAST_PER_SUBJECT,
                                                     filter_subject=f"{name}.*"))
    start = await js.add_consumer(name, ConsumerConfig(durable_name="s", opt_start_seq=3,
                                                       deliver_policy=DeliverPolicy.BY_START_SEQUENCE))
    assert [c.num_pending for c in (last, new, lps, start)] == [1, 0, 2, 2]
    sub = await js.pull_subscribe_bind(durable="p", stream=name)
    assert [m.data for m in await sub.fetch(5, timeout=1)] == [b"2", b"3"]
    await js.delete_stream(name)


async def test_bad_requests_keep_the_server_serving(js) -> None:
    nc = js._nc
    for subject, body in [
        ("$JS.API.STREAM.CREATE.B1", b"{not json"),
        ("$JS.API.STREAM.CREATE.B1", b'{"name":"B1","max_msgs":"many"}'),
        ("$JS.API.STREAM.CREATE.B1", b'{"name":"B1","surprise":true}'),
        ("$JS.API.STREAM.CREATE.B.1", b'{"name":"B.1"}'),
        ("$JS.API.CONSUMER.CREATE.NOPE", b'{"stream_name":"NOPE","config":{}}'),
        ("$JS.API.STREAM.MSG.GET.NOPE", b"\xff\xfe"),
        ("$JS.API.CONSUMER.MSG.NEXT.NOPE.NOPE", b"{}"),
        ("$JS.ACK.NOPE.x.1.2.3.4.5", b"+ACK"),
        ("$JS.ACK.garbage", b"+ACK"),
    ]:
        try:
            resp = await nc.request(subject, body, timeout=0.5)
            doc = json.loads(resp.data) if resp.data else {}
            if "error" in doc:
                assert set(doc["error"]) == {"code", "err_code", "description"}
        except (nats.errors.TimeoutError, nats.errors.NoRespondersError):
            pass  # nats-server does not answer these subjects either
    info = await js.account_info()
    assert info.api.errors >= 4
    name = uniq("ALIVE")
    await js.add_stream(name=name, subjects=[name])
    assert (await js.publish(name, b"ok")).seq == 1
    await js.delete_stream(name)


@pytest.mark.timeout(30)
async def test_push_flow_control_heartbeats_and_ordered_consumer(js) -> None:
    name = uniq("FLOW")
    await js.add_stream(name=name, subjects=[f"{name}.*"])
    payload = b"z" * 1024
    futs = [await js.publish_async(f"{name}.{i % 3}", payload + str(i).encode()) for i in range(3000)]
    await asyncio.gather(*futs)
    # 3 MB through a flow-controlled push consumer: the server must pause for, and resume on, FC replies
    got: list[int] = []
    done = asyncio.Event()

    async def cb(msg) -> None:
        got.append(msg.metadata.sequence.stream)
        if len(got) == 3000:
            done.set()

    sub = await js.subscribe(f"{name}.*", cb=cb, stream=name, flow_control=True, idle_heartbeat=0.5,
                             config=ConsumerConfig(ack_policy=AckPolicy.NONE))
    await asyncio.wait_for(done.wait(), 20)
    assert got == list(range(1, 3001))
    await sub.unsubscribe()
    # nats-py's ordered consumer (ephemeral, flow control, heartbeats, sequence checks)
    seen: list[bytes] = []
    odone = asyncio.Event()

    async def ocb(msg) -> None:
        seen.append(msg.data)
        if len(seen) == 1000:
            odone.set()

    osub = await js.subscribe(f"{name}.1", cb=ocb, ordered_consumer=True, stream=name)
    await asyncio.wait_for(odone.wait(), 20)
    assert seen == [payload + str(i).encode() for i in range(1, 3000, 3)]
    await osub.unsubscribe()
    await js.delete_stream(name)


@pytest.mark.timeout(30)
async def test_ephemeral_consumers_go_away_when_inactive(js) -> None:
    name = uniq("EPH")
    await js.add_stream(name=name, subjects=[name])
    await js.publish(name, b"x")
    info = await js.add_consumer(name, ConsumerConfig(ack_policy=AckPolicy.EXPLICIT, inactive_threshold=0.5))
    assert info.config.durable_name is None and info.name
    sub = await js.subscribe(name, stream=name, config=ConsumerConfig(inactive_threshold=0.5))
    push_name = (await sub.consumer_info()).name
    names: set[str] = set()

    async def pull_consumer_gone() -> bool:
        names.clear()
        names.update(c.name for c in await js._jsm.consumers_info(name))
        return info.name not in names

    await until(pull_consumer_gone, "the inactive pull consumer to be gone", timeout=10, interval=0.2,
                show=lambda: names)
    assert push_name in names  # its deliver subject still has interest
    await sub.unsubscribe()
    await js.delete_stream(name)
