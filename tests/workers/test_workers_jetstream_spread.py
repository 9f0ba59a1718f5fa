"""JetStream on every worker (zonebus.stream.shards): each stream lives on one worker, and the server answers as one.

- The same scenario on nats-server and on zonebus with two workers: four streams, PubAcks, STREAM.NAMES / LIST /
  INFO, the account's totals, a subject overlap with a stream of the other worker, pull consumers, a delete,
  `/jsz`, and a restart of the whole server; the answers agree. On zonebus the streams are two per worker.
- kill -9 of the worker that owns streams (worker 1, or worker 0, which also fronts the API) while publishers
  wait for PubAcks: its streams move to the live worker, publishing goes on, and every acknowledged message is
  read back (lost 0; duplicates from retried publishes are counted and reported).
- A mirror of a stream that worker 1 owns: the origin moves to worker 0, where streams that source live, and the
  mirror gets every message, before and after; a stream of worker 1 updated to source moves to worker 0 too.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from pathlib import Path

import nats
import pytest
from nats.aio.client import Client

from zonebus.testing.jsapi import api
from zonebus.testing.polling import until
from zonebus.testing.processes import ServerProcess, free_port

pytestmark = pytest.mark.timeout(120)

STREAMS = ["A", "B", "C", "D"]


def js_server(impl: str, store: Path, workers: int | None = 2) -> ServerProcess:
    conf = f'server_name: spread\njetstream {{ store_dir: "{store}" }}\n'
    return ServerProcess(impl, conf, http_port=free_port(), workers=workers if impl == "zonebus" else None)


def owners(store: Path) -> dict[str, int]:
    """zonebus: the worker each stream's directory names as its owner."""
    root = store / "jetstream" / "streams"
    return {d.name: int((d / "worker").read_text()) for d in sorted(root.iterdir()) if (d / "worker").exists()}


async def read_all(nc: Client, stream: str, subject: str) -> list[bytes]:
    """Every message of `stream`, through an ephemeral pull consumer."""
    js = nc.jetstream()
    psub = await js.pull_subscribe(subject, stream=stream)
    got: list[bytes] = []
    try:
        while True:
            try:
                msgs = await psub.fetch(200, timeout=1)
            except (nats.errors.TimeoutError, TimeoutError):
                return got
            got += [m.data for m in msgs]
    finally:
        await psub.unsubscribe()


async def scenario(server: ServerProcess) -> dict:
    nc = await nats.connect(server.url)
    out: dict = {}
    try:
        js = nc.jetstream()
        for name in STREAMS:
            await js.add_stream(name=name, subjects=[f"{name.lower()}.>"])
        acks = [await js.publish(f"{name.lower()}.{i % 5}", json.dumps({"n": i}).encode())
                for name in STREAMS for i in range(25)]
        out["acks"] = sorted((a.stream, a.seq) for a in acks)
        out["names"] = (await api(nc, "$JS.API.STREAM.NAMES"))["streams"]
        listed = await api(nc, "$JS.API.STREAM.LIST")
        out["list"] = (listed["total"], [(s["config"]["name"], s["state"]["messages"]) for s in listed["streams"]])
        out["filtered"] = (await api(nc, "$JS.API.STREAM.NAMES", {"subject": "c.1"}))["streams"]
        overlap = await api(nc, "$JS.API.STREAM.CREATE.X", {"name": "X", "subjects": ["d.3"]})
        out["overlap"] = overlap["error"]["err_code"]
        for name in STREAMS:
            sub = await js.pull_subscribe(f"{name.lower()}.>", durable=f"c{name}", stream=name)
            msgs = await sub.fetch(25, timeout=5)
            for m in msgs:
                await m.ack_sync()
            out.setdefault("consumed", []).append((name, len(msgs), msgs[0].subject, msgs[-1].metadata.sequence.stream))
        info = await api(nc, "$JS.API.INFO")
        out["info"] = {k: info[k] for k in ("streams", "consumers")} | {"storage>0": info["storage"] > 0}
        out["missing"] = (await api(nc, "$JS.API.STREAM.INFO.NOPE"))["error"]["err_code"]
        await js.delete_stream("B")
        out["after_delete"] = (await api(nc, "$JS.API.STREAM.NAMES"))["streams"]
        jsz = server.http_get("/jsz?streams=1")
        out["jsz"] = (jsz["streams"], jsz["messages"], jsz["consumers"],
                      sorted(d["name"] for d in jsz["account_details"][0]["stream_detail"]))
    finally:
        await nc.close()
    return out


async def test_streams_spread_over_the_workers_answer_as_nats_server_does(tmp_path: Path) -> None:
    answers = {}
    for impl in ("nats", "zonebus"):
        store = tmp_path / impl
        server = js_server(impl, store).start(timeout=30)
        try:
            answers[impl] = await scenario(server)
            placed = owners(store) if impl == "zonebus" else {}
            if impl == "zonebus":
                assert sorted(placed) == ["A", "C", "D"]
                assert set(placed.values()) == {0, 1}  # both workers own streams
            server.stop()
            if impl == "zonebus":  # (a stop is no death: no worker took another's streams on the way down)
                assert owners(store) == placed
            server.start(timeout=30)  # the whole server again: every stream back, with its messages
            nc = await nats.connect(server.url)
            try:
                answers[impl]["restarted"] = [
                    (n, (await api(nc, f"$JS.API.STREAM.INFO.{n}"))["state"]["messages"]) for n in ("A", "C", "D")]
                answers[impl]["restarted_read"] = len(await read_all(nc, "D", "d.>"))
            finally:
                await nc.close()
        finally:
            server.stop()
    assert answers["zonebus"] == answers["nats"]
    assert answers["zonebus"]["list"] == (4, [(n, 25) for n in STREAMS])
    assert answers["zonebus"]["overlap"] == 10065 and answers["zonebus"]["missing"] == 10059


@pytest.mark.parametrize("victim", [1, 0])
async def test_kill_9_of_a_worker_moves_its_streams_and_loses_nothing_acknowledged(tmp_path: Path,
                                                                                  victim: int) -> None:
    server = js_server("zonebus", tmp_path).start(timeout=30)
    clients: list[Client] = []
    try:
        opts = {"allow_reconnect": True, "reconnect_time_wait": 0.05, "max_reconnect_attempts": -1}
        admin = await nats.connect(server.url, **opts)
        clients.append(admin)
        for name in STREAMS:
            await admin.jetstream().add_stream(name=name, subjects=[f"{name.lower()}.>"])
        placed = owners(tmp_path)
        theirs = sorted(n for n, w in placed.items() if w == victim)
        assert theirs and len(theirs) < len(STREAMS)
        pid = server.http_get("/varz")["workers"][victim]["pid"]
        total = 600
        acked: dict[str, set[bytes]] = {n: set() for n in STREAMS}
        failed = 0

        async def publish(nc: Client, name: str) -> None:
            nonlocal failed
            js = nc.jetstream()
            for i in range(total // len(STREAMS)):
                body = json.dumps({"stream": name, "n": i}).encode()
                deadline = time.monotonic() + 30
                while True:  # a publish not acknowledged is sent again (a duplicate when the first was stored)
                    try:
                        await js.publish(f"{name.lower()}.{i % 7}", body, timeout=1)
                        acked[name].add(body)
                        break
                    except Exception:
                        failed += 1
                        assert time.monotonic() < deadline, f"{name}: no PubAck for 30 s"
                        await asyncio.sleep(0.05)
                if name == theirs[0] and i == total // 12:
                    os.kill(pid, signal.SIGKILL)

        pubs = [await nats.connect(server.url, **opts) for _ in STREAMS]
        clients += pubs
        await asyncio.gather(*(publish(nc, name) for nc, name in zip(pubs, STREAMS, strict=True)))

        await until(lambda: server.http_get("/varz")["workers"][victim].get("pid") not in (pid, None),
                    "the killed worker started again", timeout=20)
        for name in theirs:  # moved to the live worker, and kept there when the killed one came back
            await until(lambda n=name: owners(tmp_path)[n] != victim, f"{name} taken over", timeout=20)
        lost, dups = 0, 0
        reader = await nats.connect(server.url, **opts)
        clients.append(reader)
        for name in STREAMS:
            got = await read_all(reader, name, f"{name.lower()}.>")
            lost += len(acked[name] - set(got))
            dups += len(got) - len(set(got))
            assert len(acked[name]) == total // len(STREAMS)
        print(f"victim worker {victim} ({theirs}): {failed} publishes retried, lost {lost}, duplicates {dups}")
        assert lost == 0
    finally:
        for nc in clients:
            await nc.close()
        server.stop()


async def test_a_mirror_brings_its_origin_to_worker_0(tmp_path: Path) -> None:
    server = js_server("zonebus", tmp_path).start(timeout=30)
    try:
        nc = await nats.connect(server.url)
        try:
            js = nc.jetstream()
            for name in ("P", "Q"):
                await js.add_stream(name=name, subjects=[f"{name.lower()}.>"])
            origin = next(n for n, w in owners(tmp_path).items() if w == 1)
            for i in range(20):
                await js.publish(f"{origin.lower()}.x", b"%d" % i)
            mirror = await api(nc, "$JS.API.STREAM.CREATE.M", {"name": "M", "mirror": {"name": origin}})
            assert "error" not in mirror, mirror
            await until(lambda: owners(tmp_path).get(origin) == 0, f"{origin} moved to worker 0", timeout=10)
            assert owners(tmp_path)["M"] == 0

            async def mirrored(n: int) -> bool:
                return (await api(nc, "$JS.API.STREAM.INFO.M"))["state"]["messages"] == n

            await until(lambda: mirrored(20), "the mirror has the origin's 20 messages", timeout=20)
            for i in range(20, 30):  # the moved origin takes publishes on worker 0
                await js.publish(f"{origin.lower()}.x", b"%d" % i)
            await until(lambda: mirrored(30), "the mirror follows", timeout=20)
            info = await api(nc, f"$JS.API.STREAM.INFO.{origin}")
            assert info["state"]["messages"] == 30
            # a stream of worker 1 updated to source: it moves to worker 0 first, then sources there
            await js.add_stream(name="U", subjects=["u.>"])
            assert owners(tmp_path)["U"] == 1  # (worker 0 holds P, Q and M)
            await js.publish("u.x", b"own")
            updated = await api(nc, "$JS.API.STREAM.UPDATE.U", {"name": "U", "subjects": ["u.>"],
                                                                 "sources": [{"name": origin}]})
            assert "error" not in updated, updated
            assert owners(tmp_path)["U"] == 0

            async def sourced() -> bool:
                return (await api(nc, "$JS.API.STREAM.INFO.U"))["state"]["messages"] == 31

            await until(sourced, "U has its own message and the origin's 30", timeout=20)
        finally:
            await nc.close()
    finally:
        server.stop()
