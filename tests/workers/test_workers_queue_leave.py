"""A queue member leaves while messages stream to its group, on a server of two workers (core NATS queue
groups, not durable ones): every message still reaches exactly one member, as on one nats-server process.

The publisher's worker picks a member on the other worker until that worker's UNSUB reaches it over the
local link; the messages picked in between find no member there. They used to be dropped; they go back
to the publisher's worker now, as a queue-only frame (`Server.queue_fallback`, zonebus.workers.mesh), and
are served by the member that stays. The publisher and the leaving member are raw sockets: the publisher
writes a burst and the member its UNSUB at once, so that messages are on their way while the UNSUB is
processed; and every message the server wrote to the member, before or after its UNSUB, is counted (nats-py
drops what arrives for a subscription it ended).
"""

from __future__ import annotations

import asyncio
from collections import Counter

import nats
import pytest
from nats.aio.client import Client

from zonebus.testing.polling import until
from zonebus.testing.processes import (
    ServerProcess,
    cluster_config,
    free_port,
    start_parallel,
    stop_all,
    wait_for_mesh,
    wait_for_route_interest,
)

pytestmark = pytest.mark.timeout(90)

SUBJECT = b"leave.q"
ROUNDS = 6  # members that leave mid-stream, one after the other
LEAVE_AFTER = 100  # messages the leaving member gets before its UNSUB
BURST = 4000  # messages written at once, just before the UNSUB


class RawConn:
    """A client on a plain socket: a queue member (`sid`) that counts every numbered MSG it reads, before and
    after its UNSUB, or a publisher (no `sid`)."""

    def __init__(self) -> None:
        self.got: list[int] = []
        self.worker = -1
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._task: asyncio.Task | None = None

    async def open(self, port: int, sid: int | None) -> None:
        self._reader, self._writer = await asyncio.open_connection("127.0.0.1", port)
        info = await self._reader.readline()
        self.worker = int(info.split(b'"client_id":')[1].split(b",")[0]) >> 32  # worker i: ids above i * 2^32
        sub = b"" if sid is None else b"SUB %b q %d\r\n" % (SUBJECT, sid)
        self._writer.write(b'CONNECT {"verbose":false,"protocol":1}\r\n' + sub + b"PING\r\n")
        await self._writer.drain()
        while (line := await self._reader.readline()) != b"PONG\r\n":  # (answered once the other worker has it)
            assert line, "the server closed the raw connection"
        self._task = asyncio.create_task(self._read())

    async def _read(self) -> None:
        assert self._reader is not None
        while line := await self._reader.readline():
            if line.startswith(b"MSG "):
                size = int(line.split()[-1])
                self.got.append(int((await self._reader.readexactly(size + 2))[:-2]))

    async def write(self, data: bytes) -> None:
        assert self._writer is not None
        self._writer.write(data)
        await self._writer.drain()

    async def publish(self, numbers: range) -> None:
        await self.write(b"".join(b"PUB %b %d\r\n%d\r\n" % (SUBJECT, len(b"%d" % n), n) for n in numbers))

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        if self._writer is not None:
            self._writer.close()


async def _raw_on(port: int, worker: int, sid: int | None, tries: int = 40) -> RawConn:
    """A raw connection on `worker` (new clients land where the kernel puts them, or on the least loaded)."""
    for _ in range(tries):
        raw = RawConn()
        await raw.open(port, sid)
        if raw.worker == worker:
            return raw
        await raw.close()
    raise AssertionError(f"no raw connection landed on worker {worker} in {tries} tries")


async def _client_on(url: str, worker: int, tries: int = 40) -> Client:
    for _ in range(tries):
        nc = await nats.connect(url, connect_timeout=3, allow_reconnect=False)
        if int(nc.client_id) >> 32 == worker:
            return nc
        await nc.close()
    raise AssertionError(f"no client landed on worker {worker} in {tries} tries")


async def _leave_rounds(port: int, first: RawConn, pub: RawConn, stays: Counter[int], raws: list[RawConn]) -> None:
    """`ROUNDS` leaving members on `first`'s worker, one after the other (`first` is the first): each gets
    `LEAVE_AFTER` messages from `pub`, then leaves while a burst is on its way. Asserts that every message
    reached exactly one member (the leaving ones or those counted in `stays`). `raws`: for closing."""
    sent = 0
    raw = first

    def received() -> int:
        return sum(stays.values()) + sum(len(r.got) for r in raws)

    for round_ in range(ROUNDS):
        if round_:  # a new leaving member on that worker for each round (the old one closed)
            raw = await _raw_on(port, first.worker, round_ + 1)
            raws.append(raw)
        while len(raw.got) < LEAVE_AFTER:  # until it was picked often enough
            await pub.publish(range(sent, sent + 50))
            sent += 50
            await asyncio.sleep(0.002)  # pacing (the reader counts meanwhile)
            assert sent < 100_000, f"round {round_}: the leaving member got {len(raw.got)} messages"
        await pub.publish(range(sent, sent + BURST))  # on its way while the UNSUB is processed
        sent += BURST
        await raw.write(b"UNSUB %d\r\n" % (round_ + 1))
        try:  # the round's messages are all in before its member's socket closes
            await until(lambda n=sent: received() >= n, f"round {round_}: every message at a member", 10)
        except TimeoutError:
            pass  # counted below
        await raw.close()  # (so that the next one lands on that worker: new clients go to the least loaded)

    got = Counter(n for r in raws for n in r.got) + stays
    lost = [n for n in range(sent) if not got[n]]
    dups = [n for n, k in got.items() if k > 1]
    assert not lost, f"{len(lost)} of {sent} messages lost, e.g. {lost[:10]}"
    assert not dups, f"{len(dups)} messages delivered twice, e.g. {dups[:10]}"


def _counter(stays: Counter[int]):  # noqa: ANN202
    async def stayed(msg) -> None:  # noqa: ANN001
        stays[int(msg.data)] += 1
    return stayed


async def test_messages_picked_for_a_member_that_just_left_reach_one_that_stays() -> None:
    server = ServerProcess("zonebus", "", http_port=free_port(), workers=2).start(timeout=30)
    raws: list[RawConn] = []
    stay_nc: Client | None = None
    try:
        stays: Counter[int] = Counter()
        first = RawConn()
        raws.append(first)
        await first.open(server.port, 1)
        here = 1 - first.worker  # the publisher and the member that stays: on the other worker
        stay_nc = await _client_on(server.url, here)
        await stay_nc.subscribe(SUBJECT.decode(), queue="q", cb=_counter(stays))
        await stay_nc.flush()
        pub = await _raw_on(server.port, here, None)
        raws.append(pub)
        await _leave_rounds(server.port, first, pub, stays, raws)
    finally:
        for r in raws:
            await r.close()
        if stay_nc is not None:
            await stay_nc.close()
        server.stop()


async def test_in_a_cluster_with_nats_server_they_reach_its_member() -> None:
    """The same with the member that stays on a nats-server routed to the zonebus server: the messages go
    back to worker 0 (which holds the route) and on to nats-server as plain RMSGs naming the group (it takes
    no queue-only frames: sent one, it would close the route)."""
    zb_port, ns_port = free_port(), free_port()
    zb = ServerProcess("zonebus", cluster_config("zb", zb_port, [ns_port]), http_port=free_port(), workers=2)
    ns = ServerProcess("nats", cluster_config("ns", ns_port, [zb_port]), http_port=free_port())
    start_parallel([zb, ns])
    raws: list[RawConn] = []
    stay_nc: Client | None = None
    try:
        await asyncio.to_thread(wait_for_mesh, [zb, ns])
        stays: Counter[int] = Counter()
        stay_nc = await nats.connect(ns.url, connect_timeout=3, allow_reconnect=False)
        await stay_nc.subscribe(SUBJECT.decode(), queue="q", cb=_counter(stays))
        await stay_nc.flush()
        await asyncio.to_thread(wait_for_route_interest, zb, SUBJECT.decode(), "q")
        first = await _raw_on(zb.port, 1, 1)  # the leaving members on worker 1
        raws.append(first)
        pub = await _raw_on(zb.port, 0, None)  # the publisher on worker 0, which holds the route
        raws.append(pub)
        await _leave_rounds(zb.port, first, pub, stays, raws)
        assert ns.http_get("/routez")["num_routes"] == 1, "the route to zonebus stayed up"
    finally:
        for r in raws:
            await r.close()
        if stay_nc is not None:
            await stay_nc.close()
        stop_all([zb, ns])
