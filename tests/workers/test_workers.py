"""`zonebus server --workers N`: N processes that look like one server to nats-py clients.

Each scenario runs with 2 and 4 workers against a real server (a supervisor and its worker processes); many
clients are opened until they sit on at least two workers (the kernel spreads connections over the shared
port), as `/varz`'s `workers` list shows, so that messages and interest have to cross the local links.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import nats
import pytest
from nats.aio.client import Client
from nats.errors import NoRespondersError

from zonebus.testing.polling import until
from zonebus.testing.processes import ServerProcess, free_port

CLIENTS = 12


@pytest.fixture(scope="module", params=[2, 4], ids=["workers2", "workers4"])
def server(request: pytest.FixtureRequest) -> Iterator[ServerProcess]:
    proc = ServerProcess("zonebus", "server_name: wk\n", http_port=free_port(), workers=request.param)
    proc.start(timeout=30)
    yield proc
    proc.stop()


async def connect(url: str, **kw: object) -> Client:
    return await nats.connect(url, connect_timeout=3, **{"allow_reconnect": False, **kw})


def per_worker(server: ServerProcess) -> list[int]:
    return [w.get("connections", 0) for w in server.http_get("/varz")["workers"]]


def worker_of(server: ServerProcess, nc: Client) -> int:
    return int(nc.client_id) >> 32  # worker i hands out client ids above i * 2^32 (zonebus.workers.stats)


async def spread_clients(server: ServerProcess, count: int = CLIENTS, **kw: object) -> list[Client]:
    """`count` clients, of which at least two sit on different workers."""
    clients = [await connect(server.url, **kw) for _ in range(count)]
    while len({worker_of(server, c) for c in clients}) < 2 and len(clients) < 200:
        clients.append(await connect(server.url, **kw))
    assert len({worker_of(server, c) for c in clients}) >= 2, "the kernel put every client on one worker"
    return clients


async def synced(nc: Client) -> None:
    """The server processed all `nc` sent (two PINGs: nats-py's first may overtake queued commands, see
    tests/client/test_client_core.py); with workers, every worker has then seen it too (zonebus.workers.mesh)."""
    await nc.flush()
    await nc.flush()


async def close_all(clients: list[Client]) -> None:
    for c in clients:
        await c.close()


async def test_one_server_in_info_and_clients_on_every_worker(server: ServerProcess) -> None:
    clients = await spread_clients(server)
    try:
        ids = {(c._server_info["server_id"], c._server_info["server_name"]) for c in clients}
        assert ids == {(server.info["server_id"], "wk")}
        varz = server.http_get("/varz")
        assert varz["connections"] == len(clients)
        assert sum(per_worker(server)) == len(clients)
        assert sorted({worker_of(server, c) for c in clients}) == sorted(
            w["worker"] for w in varz["workers"] if w["connections"])
        assert sorted(c["cid"] for c in server.http_get("/connz")["connections"]) == sorted(
            c.client_id for c in clients)
    finally:
        await close_all(clients)


async def test_pub_sub_across_workers(server: ServerProcess) -> None:
    clients = await spread_clients(server)
    try:
        subs = [await c.subscribe("fan.*") for c in clients]
        for c in clients:
            await synced(c)  # the PONG comes once every worker has this worker's interest
        for i, c in enumerate(clients):
            await c.publish(f"fan.{i}", str(i).encode())
            await synced(c)
        for sub in subs:
            got = [await sub.next_msg(timeout=5) for _ in clients]
            assert sorted(m.subject for m in got) == sorted(f"fan.{i}" for i in range(len(clients)))
            with pytest.raises(nats.errors.TimeoutError):
                await sub.next_msg(timeout=0.05)
    finally:
        await close_all(clients)


async def test_queue_group_delivers_each_message_once(server: ServerProcess) -> None:
    clients = await spread_clients(server)
    seen: Counter[bytes] = Counter()
    by_worker: Counter[int] = Counter()
    total = 600
    done = asyncio.Event()

    def member(worker: int):
        async def cb(msg) -> None:
            seen[msg.data] += 1
            by_worker[worker] += 1
            if sum(seen.values()) >= total:
                done.set()
        return cb

    try:
        members, pubs = clients[: len(clients) // 2], clients[len(clients) // 2 :]
        for m in members:
            await m.subscribe("jobs", queue="q", cb=member(worker_of(server, m)))
            await synced(m)
        for i in range(total):
            await pubs[i % len(pubs)].publish("jobs", str(i).encode())
        for p in pubs:
            await synced(p)
        await asyncio.wait_for(done.wait(), 10)
        for m in members:
            await synced(m)
        assert set(seen) == {str(i).encode() for i in range(total)}
        assert max(seen.values()) == 1, "a queue group delivers each message once, across workers"
        assert set(by_worker) == {worker_of(server, m) for m in members}  # members of every worker served
    finally:
        await close_all(clients)


async def test_request_reply_and_no_responders(server: ServerProcess) -> None:
    clients = await spread_clients(server)
    try:
        responder = clients[0]

        async def answer(msg) -> None:
            await msg.respond(b"re:" + msg.data)

        sub = await responder.subscribe("svc.echo", cb=answer)
        await synced(responder)
        for i, c in enumerate(clients):
            reply = await c.request("svc.echo", str(i).encode(), timeout=5)
            assert reply.data == f"re:{i}".encode()
        for c in clients:  # no subscriber on any worker: 503 at once
            with pytest.raises(NoRespondersError):
                await c.request("svc.nobody", b"x", timeout=5)
        await sub.unsubscribe()
        await synced(responder)  # the other workers no longer have the interest once this returns
        for c in clients:
            with pytest.raises(NoRespondersError):
                await c.request("svc.echo", b"x", timeout=5)
    finally:
        await close_all(clients)


def test_the_supervisor_is_a_small_interpreter_with_the_same_pid(server: ServerProcess) -> None:
    """The process that read the options became the supervisor (exec): same pid, no asyncio or uvloop
    loaded (/proc/<pid>/maps), and the parent of every worker."""
    pid = server.proc.pid
    assert b"zonebus.workers.supervisor" in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    maps = Path(f"/proc/{pid}/maps").read_text()
    assert "_asyncio" not in maps and "uvloop" not in maps
    for worker in server.http_get("/varz")["workers"]:
        status = Path(f"/proc/{worker['pid']}/status").read_text()
        assert f"PPid:\t{pid}\n" in status


async def test_varz_sums_the_workers(server: ServerProcess) -> None:
    # the clients of the tests before are gone, with their subscriptions
    before = await until(lambda: (varz := server.http_get("/varz"))["connections"] == 0 and varz,
                         "no connections left from the tests before", timeout=10)
    clients = await spread_clients(server)
    try:
        got = asyncio.Event()
        received = []

        async def cb(msg) -> None:
            received.append(msg)
            if len(received) == 5 * len(clients):
                got.set()

        watcher = clients[0]
        await watcher.subscribe("count.>", cb=cb)
        await watcher.subscribe("idle.a")
        await watcher.subscribe("idle.b", queue="g")
        await synced(watcher)
        for c in clients:
            for _ in range(5):
                await c.publish("count.x", b"0123456789")
            await synced(c)
        await asyncio.wait_for(got.wait(), 10)
        varz = server.http_get("/varz")
        n = 5 * len(clients)
        assert varz["connections"] == len(clients)
        assert varz["total_connections"] - before["total_connections"] == len(clients)
        assert varz["subscriptions"] - before["subscriptions"] == 3  # not counted once per worker
        assert varz["in_msgs"] - before["in_msgs"] == n  # a message crossing workers is one message in
        assert varz["out_msgs"] - before["out_msgs"] == n
        assert varz["in_bytes"] - before["in_bytes"] == 10 * n
        assert varz["out_client_bytes"] - before["out_client_bytes"] == 10 * n
        assert varz["routes"] == 0 and server.http_get("/routez")["routes"] == []
        assert [w["up"] for w in varz["workers"]] == [True] * len(varz["workers"])
        assert sum(w["in_msgs"] for w in varz["workers"]) == varz["in_msgs"]
    finally:
        await close_all(clients)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("workers", [2, 4])
async def test_killed_worker_restarts_and_only_its_clients_reconnect(workers: int) -> None:
    server = ServerProcess("zonebus", "", http_port=free_port(), workers=workers).start(timeout=30)
    disconnects: Counter[int] = Counter()
    clients: list[Client] = []
    try:
        for i in range(CLIENTS):
            async def lost(i: int = i) -> None:
                disconnects[i] += 1
            clients.append(await connect(server.url, allow_reconnect=True, reconnect_time_wait=0.05,
                                         max_reconnect_attempts=-1, disconnected_cb=lost))
        while len({worker_of(server, c) for c in clients}) < 2:
            clients.append(await connect(server.url))
        victim = worker_of(server, clients[0])
        old = server.http_get("/varz")["workers"][victim]["pid"]
        on_victim = {i for i, c in enumerate(clients) if worker_of(server, c) == victim}
        others = [c for i, c in enumerate(clients) if i not in on_victim]
        subs = [await c.subscribe("after") for c in clients]
        for c in clients:
            await synced(c)
        os.kill(old, signal.SIGKILL)
        seen: dict = {}

        def back() -> bool:  # the supervisor starts the worker again, with a new pid
            seen.clear()  # (OSError: worker 0 serves monitoring, it may be the one restarting)
            seen.update(server.http_get("/varz")["workers"][victim])
            return bool(seen.get("up") and seen["pid"] != old and all(c.is_connected for c in clients))

        await until(back, f"worker {victim} back", timeout=20, show=lambda: seen)
        assert set(disconnects) == on_victim  # only the killed worker's clients lost their connection
        assert all(c.is_connected for c in others)
        for c in clients:
            await synced(c)  # resubscribed after reconnecting, and every worker knows it
        await others[0].publish("after", b"x")
        await synced(others[0])
        for sub in subs:
            assert (await sub.next_msg(timeout=5)).data == b"x"
    finally:
        await close_all(clients)
        server.stop()


def test_workers_config_check_accepts_every_block(tmp_path) -> None:
    """`-t`: several workers run with any block (the zone router and durable queue groups included); `workers`
    must be at least 1."""
    conf = tmp_path / "s.conf"
    conf.write_text(f'workers: 2\njetstream {{ shared_store: "file://{tmp_path}/shared", zone_router: true }}\n')
    run = subprocess.run([sys.executable, "-m", "zonebus", "server", "-t", "-c", str(conf)], capture_output=True,
                         text=True, timeout=30)
    assert run.returncode == 0, run.stderr
    conf.write_text('workers: 2\nqueue_groups { w: { subjects: ["orders.>"] } }\n')
    run = subprocess.run([sys.executable, "-m", "zonebus", "server", "-t", "-c", str(conf)], capture_output=True,
                         text=True, timeout=30)
    assert run.returncode == 0, run.stderr
    conf.write_text("workers: 0\n")
    run = subprocess.run([sys.executable, "-m", "zonebus", "server", "-t", "-c", str(conf)], capture_output=True,
                         text=True, timeout=30)
    assert run.returncode == 1 and "workers: expected integer >= 1" in run.stderr, run.stderr


async def test_clients_are_spread_and_a_publisher_moves_to_its_subscriber() -> None:
    """New clients go to the worker with the fewest; a publisher whose messages all cross to one other worker
    is handed over to it (its socket, mid-stream): every message arrives, in order, and nothing is noticed."""
    server = ServerProcess("zonebus", "", http_port=free_port(), workers=2).start(timeout=30)
    clients: list[Client] = []
    try:
        clients = [await connect(server.url) for _ in range(6)]
        assert sorted(per_worker(server)) == [3, 3]
        sub_nc = clients[0]
        pub_nc = next(c for c in clients if worker_of(server, c) != worker_of(server, sub_nc))
        sub = await sub_nc.subscribe("moving")
        await synced(sub_nc)
        total = 20000
        for i in range(total):
            await pub_nc.publish("moving", b"%d" % i)
            if i % 1000 == 999:
                await asyncio.sleep(0.01)  # long enough for the worker to look at its publishers
        await synced(pub_nc)
        got = [int((await sub.next_msg(timeout=5)).data) for _ in range(total)]
        assert got == list(range(total))
        workers = server.http_get("/varz")["workers"]
        assert sum(w["clients_moved_out"] for w in workers) == 1
        assert sum(w["clients_moved_in"] for w in workers) == 1
        assert pub_nc.is_connected
        with pytest.raises(NoRespondersError):  # the moved client still talks to the server
            await pub_nc.request("nobody.home", b"", timeout=2)
        assert server.http_get("/varz")["connections"] == 6
    finally:
        await close_all(clients)
        server.stop()


def test_default_is_one_worker_per_core_with_any_config(tmp_path) -> None:
    """Neither config nor flag says `workers`: one per core this process may run on, whatever the config
    (durable queue groups, the zone router); `--workers 1` keeps one."""
    from zonebus.cli.flags import parse_server_args

    cores = len(os.sched_getaffinity(0))
    assert parse_server_args([])[0].workers == cores
    assert parse_server_args(["--workers", "1"])[0].workers == 1
    conf = tmp_path / "q.conf"
    conf.write_text('queue_groups { w: { subjects: ["orders.>"] } }\n')  # durable queue groups: any number
    assert parse_server_args(["-c", str(conf)])[0].workers == cores
    conf.write_text(f'jetstream {{ shared_store: "file://{tmp_path}/shared", zone_router: true }}\n')
    assert parse_server_args(["-c", str(conf)])[0].workers == cores
    assert parse_server_args(["-c", str(conf), "--workers", "1"])[0].workers == 1
    conf.write_text("jetstream { }\n")
    assert parse_server_args(["-c", str(conf)])[0].workers == cores


async def test_default_server_runs_a_worker_per_core() -> None:
    cores = len(os.sched_getaffinity(0))
    if cores < 2:
        pytest.skip("one core: the default is one process")
    conf_text = "server_name: dflt\n"
    with ServerProcess("zonebus", conf_text, http_port=free_port(), workers=0) as server:
        assert len(server.http_get("/varz")["workers"]) == cores
        assert len(server.worker_pids()) == cores
        nc = await connect(server.url)
        try:
            sub = await nc.subscribe("d.x")
            await synced(nc)
            await nc.publish("d.x", b"1")
            assert (await sub.next_msg(timeout=5)).data == b"1"
        finally:
            await nc.close()
        # a reload (SIGHUP) reaches every worker, which applies it
        (server.workdir / "server.conf").write_text(conf_text + 'server_tags: ["az:z9"]\n')
        os.kill(server.proc.pid, signal.SIGHUP)
        await until(lambda: server.log().count("tags=['az:z9']") >= cores, "every worker applied the reload",
                    timeout=10)
        assert server.log().count("tags=['az:z9']") == cores, server.log()
        assert "reload failed" not in server.log()
        assert server.proc.poll() is None
