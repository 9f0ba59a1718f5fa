"""Durable queue groups on one server: store first, nothing lost while nobody listens, explicit acks."""

from __future__ import annotations

import nats
import pytest

from tests.queue.kit import group_info, lone_server
from zonebus.testing.polling import until
from zonebus.testing.tally import settled

pytestmark = pytest.mark.timeout(60)


async def test_store_first_and_nothing_lost_while_nobody_listens(tmp_path):
    s = lone_server(tmp_path)
    try:
        pub = await nats.connect(s.url)
        plain: list[nats.aio.msg.Msg] = []

        async def on_plain(m):
            plain.append(m)

        await pub.subscribe("orders.>", cb=on_plain)
        await pub.flush()
        js = pub.jetstream()
        seqs = [(await js.publish("orders.new", b"acked-%d" % i)).seq for i in range(30)]
        assert seqs == list(range(1, 31))
        ack = await js.publish("orders.new", b"one-more")
        assert ack.stream == "QG_workers"
        for i in range(30):
            await pub.publish("orders.fire", b"fire-%d" % i)
        await pub.flush()
        await until(lambda: len(plain) == 61, "plain subscriber gets every message", timeout=5)
        assert all(m.reply for m in plain[:31]), "plain subscribers keep the publisher's reply"
        info = group_info(s)
        assert info["stored"] == 61 and info["pending"] == 61 and info["delivered"] == 0

        member = await nats.connect(s.url)
        got: list[nats.aio.msg.Msg] = []

        async def on_member(m):
            got.append(m)

        await member.subscribe("orders.>", "workers", cb=on_member)
        await until(lambda: len(got) == 61, "the member gets what waited", timeout=10)
        assert {m.data for m in got} == {m.data for m in plain}
        assert not any(m.reply for m in got), "members never see the publisher's reply (ack none)"
        await until(lambda: group_info(s)["pending"] == 0, "log emptied", timeout=5)
        info = group_info(s)
        assert info["delivered"] == 61 and info["redelivered"] == 0
        # a core queue group on another name is untouched
        other: list[bytes] = []

        async def on_other(m):
            other.append(m.data)

        await member.subscribe("orders.>", "others", cb=on_other)
        await settled(member)  # (flush() alone: nats-py's PING may overtake the SUB)
        await pub.publish("orders.x", b"live")
        await until(lambda: other == [b"live"] and len(got) == 62, "live delivery", timeout=5,
                    show=lambda: (other, [m.data for m in got[61:]], group_info(s)))
        await pub.close()
        await member.close()
    finally:
        s.stop()


async def test_explicit_ack_redelivery_nak_term_and_member_gone(tmp_path):
    s = lone_server(tmp_path, ack="explicit", ack_wait="1s")
    try:
        pub = await nats.connect(s.url)
        js = pub.jetstream()
        for i in range(6):
            await js.publish("orders.x", b"m%d" % i)
        # member A takes everything and acks nothing, then leaves: its messages go to B at once
        a = await nats.connect(s.url)
        a_got: list[bytes] = []

        async def on_a(m):
            a_got.append(m.data)
            assert m.metadata.stream == "QG_workers" and m.metadata.num_delivered == 1

        await a.subscribe("orders.>", "workers", cb=on_a)
        await until(lambda: len(a_got) == 6, "member A gets all", timeout=5)
        await a.close()
        b_seen: list[tuple[bytes, int]] = []

        async def on_b(m):
            n = m.metadata.num_delivered
            b_seen.append((m.data, n))
            if m.data == b"m0" and n == 2:
                await m.nak()
            elif m.data == b"m1" and n == 2:
                return  # not acked: comes again after ack_wait
            elif m.data == b"m2":
                await m.term()
            else:
                await m.in_progress()
                await m.ack()

        b = await nats.connect(s.url)
        await b.subscribe("orders.>", "workers", cb=on_b)
        await until(lambda: (b"m0", 3) in b_seen and (b"m1", 3) in b_seen, "nak and timeout redeliver", timeout=10)
        await until(lambda: group_info(s)["pending"] == 0, "all acked", timeout=5)
        info = group_info(s)
        assert info["terminated"] == 1
        assert info["delivered"] == 5
        assert info["redelivered"] >= 8  # 6 after A left, m0 after nak, m1 after ack_wait
        assert {d for d, _ in b_seen} == {b"m%d" % i for i in range(6)}
        await b.close()
        await pub.close()
    finally:
        s.stop()
