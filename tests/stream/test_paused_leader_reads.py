"""A stream leader paused past the failover timeout must not answer a read from its old state when it resumes.

Found by `bench/chaos.py --workloads kv` (issue 27): a client whose server was the KV bucket's leader read a value
two revisions old right after that server came back from a SIGSTOP; meanwhile the meta group had moved the
stream to another server, which had accepted newer writes. The history was not linearizable.

Here: three servers on a shared store, a stream (R1) led by L, the meta leader; a client connected to L only.
L is stopped (SIGSTOP, with its worker processes) until another server leads the stream and has acknowledged a
newer message; the client's `STREAM.MSG.GET` (last by subject) is sent while L is stopped, L is resumed, and the
client keeps reading for 3 s. Every answer must be the newer message (or an error): never the one L held before
it stopped; L's log says it noticed the stop (`MetaGroup.lease`)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import urllib.request
from pathlib import Path

import nats
import pytest
from nats.js.api import Placement

from tests.stream.kit_cluster import api, start_cluster, wait_meta_leader
from zonebus.testing.nemesis import send_signal, server_pids
from zonebus.testing.polling import until
from zonebus.testing.processes import ServerProcess, stop_all

pytestmark = pytest.mark.timeout(120)


def _meta_leader(server: ServerProcess) -> str | None:
    with contextlib.suppress(OSError, ValueError), \
            urllib.request.urlopen(f"http://127.0.0.1:{server.http_port}/jsz", timeout=2) as r:
        return (json.loads(r.read()).get("meta_cluster") or {}).get("leader") or None
    return None


async def test_resumed_leader_does_not_read_its_old_state(tmp_path: Path) -> None:
    servers = start_cluster(tmp_path, failover="2s")
    paused: list[int] = []
    try:
        await wait_meta_leader(servers)
        nc = await nats.connect(servers=[s.url for s in servers], max_reconnect_attempts=-1, reconnect_time_wait=0.1)
        js = nc.jetstream(timeout=5)
        # the stream led by the meta leader: resumed, it believes it still leads both until it hears otherwise
        meta_leader = await until(lambda: _meta_leader(servers[0]), "a meta leader in /jsz", timeout=20)
        old = next(s for s in servers if s.info["server_name"] == meta_leader)
        zone = f"az:z{servers.index(old) + 1}"
        await js.add_stream(name="KVP", subjects=["kvp.>"], num_replicas=1, max_msgs_per_subject=1,
                            placement=Placement(tags=[zone]))
        info = await api(nc, "$JS.API.STREAM.INFO.KVP")
        leader = info["cluster"]["leader"]
        assert leader == meta_leader, info
        others = [s for s in servers if s is not old]
        b = await nats.connect(servers=[s.url for s in others], max_reconnect_attempts=-1, reconnect_time_wait=0.1)
        bjs = b.jetstream(timeout=5)
        await bjs.publish("kvp.k", b"v1")
        a = await nats.connect(old.url, allow_reconnect=False)  # the reader: on the leader's server
        got = json.loads((await a.request("$JS.API.STREAM.MSG.GET.KVP", b'{"last_by_subj":"kvp.k"}', timeout=5)).data)
        assert got["message"]["seq"] == 1, got

        paused = server_pids(old)
        send_signal(paused, signal.SIGSTOP)

        async def moved() -> str | None:
            with contextlib.suppress(nats.errors.Error, asyncio.TimeoutError):
                lead = (await api(b, "$JS.API.STREAM.INFO.KVP", timeout=1.0)).get("cluster", {}).get("leader", "")
                if lead and lead != leader:
                    return lead
            return None

        new_leader = await until(moved, "another server leading KVP", timeout=30, interval=0.2)

        async def newer() -> int | None:
            with contextlib.suppress(nats.errors.Error, asyncio.TimeoutError):
                return (await bjs.publish("kvp.k", b"v2")).seq
            return None

        seq2 = await until(newer, f"{new_leader} acknowledging v2", timeout=30, interval=0.2)
        # the first read goes out while the old leader is stopped (it waits in that server's socket), the next
        # ones one after another as soon as each is answered
        answers: list[dict] = []

        async def reads() -> None:
            loop = asyncio.get_running_loop()
            end, last = loop.time() + 3.0, loop.time() + 20.0  # 3 s of reads, longer until one is answered
            while loop.time() < end or (loop.time() < last and not any("message" in x for x in answers)):
                try:
                    msg = await a.request("$JS.API.STREAM.MSG.GET.KVP", b'{"last_by_subj":"kvp.k"}', timeout=2)
                except (TimeoutError, nats.errors.TimeoutError):
                    answers.append({"error": "timeout"})
                    continue
                answers.append(json.loads(msg.data))

        reader = asyncio.create_task(reads())
        await asyncio.sleep(0.3)  # (the first request reaches the stopped server's socket buffer)
        send_signal(paused, signal.SIGCONT)
        paused = []
        await reader
        seqs = [x["message"]["seq"] for x in answers if "message" in x]
        errors = [x["error"] for x in answers if "error" in x]
        print(f"{len(answers)} reads: seqs {sorted(set(seqs))}, errors {errors[:3]} ({len(errors)}); newest {seq2}")
        stale = [s for s in seqs if s != seq2]
        assert not stale, f"the resumed server answered from its old state: {len(stale)} of {len(seqs)} reads"
        assert seqs, f"no read answered after the server resumed: {errors[:5]}"
        # the server knew it had been stopped (`MetaGroup.lease`: its leader reads waited for the meta group)
        assert "did not run for" in old.log(), old.log()[-3000:]
        for c in (a, b, nc):
            await c.close()
    finally:
        send_signal(paused, signal.SIGCONT)
        stop_all(servers)
