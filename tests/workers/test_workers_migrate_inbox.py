"""A client moves with its inboxes (zonebus.workers.migrate): on a server of two workers, a requester whose
requests all go to a responder on the other worker, and a JetStream publisher on worker 1 (every stream lives on
worker 0), are handed over with their `_INBOX.` subscriptions, while requests are in flight. Every request gets
its one reply, before, during and after the move; the stream holds each publish once, in order; the client
stays connected and ends up on the other worker. A client with another kind of subscription stays."""

from __future__ import annotations

import asyncio
import json
import time

import nats
import pyarrow.parquet as pq
import pytest
from nats.aio.client import Client

from zonebus.testing.polling import wait_until
from zonebus.testing.processes import ServerProcess, free_port

pytestmark = pytest.mark.timeout(90)
WINDOW = 32  # requests in flight at once


def moved(server: ServerProcess) -> int:
    return sum(w["clients_moved_out"] for w in server.http_get("/varz")["workers"])


def worker_of(nc: Client) -> int:
    return int(nc.client_id) >> 32  # worker i: ids above i * 2^32 (a moved client keeps the id it was told)


async def two_clients(server: ServerProcess) -> tuple[Client, Client]:
    """Two clients on the two workers (new clients go to the worker with the fewest): (on worker 0, on 1)."""
    a = await nats.connect(server.url, connect_timeout=3, allow_reconnect=False)
    b = await nats.connect(server.url, connect_timeout=3, allow_reconnect=False)
    assert {worker_of(a), worker_of(b)} == {0, 1}
    return (a, b) if worker_of(a) == 0 else (b, a)


async def client_on(server: ServerProcess, worker: int) -> Client:
    """A third client, on `worker` (where a new connection lands is the kernel's pick when both have as many)."""
    for _ in range(40):
        nc = await nats.connect(server.url, connect_timeout=3, allow_reconnect=False)
        if worker_of(nc) == worker:
            return nc
        await nc.close()
    raise AssertionError(f"no client landed on worker {worker}")


async def serve(nc: Client, subject: str, echo: bool = False) -> None:
    """`nc` answers the requests on `subject`: `re:` and the request's data (`echo`), else `ok`."""
    async def answer(msg) -> None:  # noqa: ANN001
        await msg.respond(b"re:" + msg.data if echo else b"ok")

    await nc.subscribe(subject, cb=answer)
    await nc.flush()


async def requests_past_the_move(server: ServerProcess, nc: Client, subject: str, after: int) -> list[bytes]:
    """Requests numbered from 0, kept `WINDOW` in flight all the time (each task sends its next one as soon as it
    has its reply), until the client moved, then `after` more; returns every reply in the order of the requests
    (a missing one fails its request)."""
    replies: dict[int, bytes] = {}
    state = {"next": 0, "stop": None}
    deadline = time.monotonic() + 40

    async def loop() -> None:
        while state["stop"] is None or state["next"] < state["stop"]:
            n = state["next"]
            state["next"] += 1
            replies[n] = (await nc.request(subject, json.dumps({"n": n}).encode(), timeout=10)).data
            assert time.monotonic() < deadline, f"not moved after {n} requests"

    async def watch() -> None:
        while not await asyncio.to_thread(moved, server):
            assert time.monotonic() < deadline, "not moved"
            await asyncio.sleep(0.01)  # polling the monitoring endpoint
        state["stop"] = state["next"] + after

    await asyncio.gather(watch(), *[loop() for _ in range(WINDOW)])
    return [replies[i] for i in range(len(replies))]


async def test_a_requester_moves_to_its_responder_with_its_inbox() -> None:
    server = ServerProcess("zonebus", "", http_port=free_port(), workers=2).start(timeout=30)
    clients: list[Client] = []
    try:
        responder, requester = clients[:] = await two_clients(server)

        await serve(responder, "svc.echo", echo=True)
        replies = await requests_past_the_move(server, requester, "svc.echo", 200)
        assert replies == [b"re:" + json.dumps({"n": i}).encode() for i in range(len(replies))]
        assert moved(server) == 1 and requester.is_connected
        conns = server.http_get("/connz?subs=1")["connections"]
        assert len(conns) == 2
        # both clients are now on worker 0 (the ids /connz shows are the adopting worker's)
        assert all(int(c["cid"]) >> 32 == 0 for c in conns)
    finally:
        for nc in clients:
            await nc.close()
        server.stop()


async def test_a_moved_publishers_pubacks_stay_in_the_ledger(tmp_path) -> None:  # noqa: ANN001
    """The traffic ledger counts every publish and every PubAck once, though the PubAcks on their way during the
    move (waiting for their fsync) were delivered by the stand-in on the other worker."""
    conf = f'jetstream {{ store_dir: "{tmp_path / "js"}" }}\nledger {{ dir: "{tmp_path}", interval: 1s }}\n'
    server = ServerProcess("zonebus", conf, http_port=free_port(), workers=2).start(timeout=30)
    clients: list[Client] = []
    try:
        other, publisher = clients[:] = await two_clients(server)
        await other.jetstream().add_stream(name="ORDERS", subjects=["orders.>"])
        sent = len(await requests_past_the_move(server, publisher, "orders.new", 300))

        def counted() -> dict[str, tuple[int, int]]:
            got: dict[str, list[int]] = {"orders.new": [0, 0], "_INBOX": [0, 0]}
            for path in sorted((tmp_path / "ledger" / "traffic").rglob("*.parquet")):
                if not path.name.startswith("."):
                    for row in pq.read_table(path).to_pylist():
                        if row["link_kind"] == "client" and row["subject_prefix"] in got:
                            got[row["subject_prefix"]][row["direction"] != "in"] += row["msgs"]
            return {k: (v[0], v[1]) for k, v in got.items()}

        want = {"orders.new": (sent, 0), "_INBOX": (0, sent + 1)}  # (+ the reply to the other client's add_stream)
        assert await asyncio.to_thread(wait_until, lambda: counted() == want, f"{want} in the ledger", 20,
                                       show=counted)
    finally:
        for nc in clients:
            await nc.close()
        server.stop()


async def test_a_jetstream_publisher_moves_to_its_streams_worker(tmp_path) -> None:  # noqa: ANN001
    server = ServerProcess("zonebus", f'jetstream {{ store_dir: "{tmp_path}" }}\n', http_port=free_port(),
                           workers=2).start(timeout=30)
    clients: list[Client] = []
    try:
        other, publisher = clients[:] = await two_clients(server)
        js = other.jetstream()
        await js.add_stream(name="ORDERS", subjects=["orders.>"])
        acks = await requests_past_the_move(server, publisher, "orders.new", 300)
        seqs = [json.loads(a)["seq"] for a in acks]
        assert seqs == list(range(1, len(acks) + 1))  # every publish acknowledged once, in order
        info = await js.stream_info("ORDERS")
        assert info.state.messages == len(acks)  # nothing stored twice
        first, last = await js.get_msg("ORDERS", 1), await js.get_msg("ORDERS", len(acks))
        assert json.loads(first.data)["n"] == 0 and json.loads(last.data)["n"] == len(acks) - 1
        assert moved(server) == 1 and publisher.is_connected
    finally:
        for nc in clients:
            await nc.close()
        server.stop()


async def test_a_client_with_other_subscriptions_stays() -> None:
    """A requester that also subscribes to a subject of its own is not moved (only inboxes go along)."""
    server = ServerProcess("zonebus", "", http_port=free_port(), workers=2).start(timeout=30)
    clients: list[Client] = []
    try:
        responder, requester = clients[:] = await two_clients(server)

        await serve(responder, "svc.ping")
        mine = await requester.subscribe("events.mine")
        for _ in range(10):
            await asyncio.gather(*[requester.request("svc.ping", b"", timeout=10) for _ in range(WINDOW)])
            await asyncio.sleep(0.02)  # pacing: the windows span several of the migrator's looks (50 ms apart)
        assert moved(server) == 0
        conns = server.http_get("/connz")["connections"]
        assert sorted(int(c["cid"]) >> 32 for c in conns) == [0, 1]
        # without it, the same requester moves: its subscription was what kept it
        await mine.unsubscribe()
        replies = await requests_past_the_move(server, requester, "svc.ping", 50)
        assert replies == [b"ok"] * len(replies) and moved(server) == 1
    finally:
        for nc in clients:
            await nc.close()
        server.stop()


async def test_what_the_peer_sends_an_inbox_during_the_move_arrives_once_in_order() -> None:
    """A client on the responder's worker streams numbered messages into the requester's own inbox while the
    requester moves there: each arrives once and in order, whether it came over the link before the move, to the
    stand-in while the socket was on its way, or straight there after it."""
    server = ServerProcess("zonebus", "", http_port=free_port(), workers=2).start(timeout=30)
    clients: list[Client] = []
    try:
        responder, requester = await two_clients(server)
        clients += [responder, requester]
        feeder = await client_on(server, worker_of(responder))
        clients.append(feeder)
        await feeder.subscribe("feeder.stays")  # (not an inbox: the feeder itself does not follow its messages)

        await serve(responder, "svc.ping")
        inbox = requester.new_inbox()
        got: list[int] = []
        async def note(msg) -> None:  # noqa: ANN001
            got.append(int(msg.data))

        feed = await requester.subscribe(inbox, cb=note)
        await requester.flush()
        done = asyncio.Event()

        async def stream() -> int:
            n = 0
            while not done.is_set() or n < 2000:
                for _ in range(50):
                    await feeder.publish(inbox, b"%d" % n)
                    n += 1
                await feeder.flush()
            return n

        streaming = asyncio.create_task(stream())
        await requests_past_the_move(server, requester, "svc.ping", 300)
        done.set()
        sent = await streaming
        await asyncio.to_thread(wait_until, lambda: len(got) >= sent, f"{sent} fed messages", 20,
                                show=lambda: len(got))
        assert got == list(range(sent))
        assert moved(server) == 1 and feed.delivered == sent
    finally:
        for nc in clients:
            await nc.close()
        server.stop()


async def raw_client_on(server: ServerProcess, worker: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A raw-socket client that the server put on `worker` (new connections land where the kernel says)."""
    for _ in range(40):
        reader, writer = await asyncio.open_connection(server.host, server.port)
        info = json.loads((await reader.readline()).split(b" ", 1)[1])
        if info["client_id"] >> 32 == worker:
            return reader, writer
        writer.close()
    raise AssertionError(f"no connection landed on worker {worker}")


async def read_msgs(reader: asyncio.StreamReader, want: int) -> list[tuple[bytes, bytes, bytes]]:
    """(subject, payload, headers) of the next `want` MSGs and HMSGs (PINGs answered by nobody: none come in this
    short test)."""
    out = []
    while len(out) < want:
        line = await reader.readline()
        if line.startswith((b"MSG ", b"HMSG ")):
            parts = line.split()
            body = (await reader.readexactly(int(parts[-1]) + 2))[:-2]
            hlen = int(parts[-2]) if line.startswith(b"HMSG ") else 0
            out.append((parts[1], body[hlen:], body[:hlen]))
    return out


async def test_a_client_that_reads_slowly_moves_with_what_came_meanwhile() -> None:
    """The mover waits for the client's output to be written before it hands the socket over: here the requester
    does not read for a while, so its output backs up on its worker, and what the peer sends its inbox meanwhile
    is kept by the stand-in there. Once it reads again, it gets every reply and every fed message, in order."""
    server = ServerProcess("zonebus", "", http_port=free_port(), workers=2).start(timeout=30)
    clients: list[Client] = []
    writer = None
    try:
        responder = await nats.connect(server.url, connect_timeout=3, allow_reconnect=False)
        clients.append(responder)

        await serve(responder, "svc.ping")
        await responder.subscribe("responder.stays")  # (the responder stays where it is)
        here = worker_of(responder)
        reader, writer = await raw_client_on(server, 1 - here)
        writer.write(b'CONNECT {"verbose":false,"pedantic":false,"protocol":1,"headers":true}\r\n'
                     b'SUB _INBOX.raw.* 1\r\nPING\r\n')
        while (await reader.readline()) != b"PONG\r\n":
            pass
        feeder = await client_on(server, here)
        clients.append(feeder)
        await feeder.subscribe("feeder.stays")
        chunk = b"x" * 32_000
        fed = requests = 0
        deadline = time.monotonic() + 30
        def stand_in() -> bool:  # the stand-in is a client of the responder's worker while the socket is not there
            return len(server.http_get("/connz")["connections"]) == 4

        async def feed(n: int, headers: bool = False) -> None:
            nonlocal fed
            for _ in range(n):
                await feeder.publish("_INBOX.raw.feed", b"%d " % fed + chunk,
                                     headers={"Fed": str(fed)} if headers else None)
                fed += 1
            await feeder.flush()

        # the feeder floods the requester's inbox (about 10 MB, more than the kernel buffers: the rest waits on
        # the requester's worker, under the 16 MB at which it would stall its producers); nobody reads
        flood = 300
        await feed(flood)
        # the requester publishes until its move began (then it is no longer read)
        while not await asyncio.to_thread(stand_in):
            for _ in range(5):
                writer.write(b"PUB svc.ping _INBOX.raw.%d 0\r\n\r\n" % requests)
                requests += 1
            await writer.drain()
            await asyncio.sleep(0.005)  # pacing (not a synchronisation)
            assert time.monotonic() < deadline and not moved(server), "the move did not begin (or did not wait)"
        await feed(20, headers=True)  # these go to the stand-in, which keeps them as the client asked: with headers
        assert moved(server) == 0 and stand_in()
        msgs = await asyncio.wait_for(read_msgs(reader, fed + requests), 20)  # reading lets the move finish
        feed = [int(p.split(b" ", 1)[0]) for s, p, _ in msgs if s == b"_INBOX.raw.feed"]
        replies = sorted(int(s.rsplit(b".", 1)[1]) for s, _, _ in msgs if s != b"_INBOX.raw.feed")
        assert feed == list(range(fed)) and replies == list(range(requests))
        numbered = [(int(p.split(b" ", 1)[0]), h) for s, p, h in msgs if s == b"_INBOX.raw.feed"]
        kept = [(n, h) for n, h in numbered if n >= flood]
        assert len(kept) == 20 and all(b"Fed: %d\r\n" % n in h for n, h in kept), kept[:2]
        await asyncio.to_thread(wait_until, lambda: moved(server) == 1, "the requester moved", 10)
        writer.write(b"PING\r\n")  # still connected, now on the responder's worker
        while (await asyncio.wait_for(reader.readline(), 5)) != b"PONG\r\n":
            pass
        assert sorted(int(c["cid"]) >> 32 for c in server.http_get("/connz")["connections"]) == [here] * 3
    finally:
        if writer is not None:
            writer.close()
        for nc in clients:
            await nc.close()
        server.stop()
