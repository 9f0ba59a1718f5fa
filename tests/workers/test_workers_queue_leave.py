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
from zonebus.testing.processes import ServerProcess, free_port

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


async def test_messages_picked_for_a_member_that_just_left_reach_one_that_stays() -> None:
    server = ServerProcess("zonebus", "", http_port=free_port(), workers=2).start(timeout=30)
    raws: list[RawConn] = []  # the leaving members, and the publisher last
    stay_nc: Client | None = None
    try:
        stays: Counter[int] = Counter()
        raw = RawConn()
        raws.append(raw)
        await raw.open(server.port, 1)
        here = 1 - raw.worker  # the publisher and the member that stays: on the other worker
        stay_nc = await _client_on(server.url, here)

        async def stayed(msg) -> None:  # noqa: ANN001
            stays[int(msg.data)] += 1

        await stay_nc.subscribe(SUBJECT.decode(), queue="q", cb=stayed)
        await stay_nc.flush()
        pub = await _raw_on(server.port, here, None)
        raws.append(pub)
        sent = 0
        members = len(raws)

        def received() -> int:
            return sum(stays.values()) + sum(len(r.got) for r in raws)

        for round_ in range(ROUNDS):
            if round_:  # a new leaving member on the raw side's worker for each round (the old one closed)
                raw = await _raw_on(server.port, 1 - here, round_ + 1)
                raws.insert(members, raw)
                members += 1
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
    finally:
        for r in raws:
            await r.close()
        if stay_nc is not None:
            await stay_nc.close()
        server.stop()
