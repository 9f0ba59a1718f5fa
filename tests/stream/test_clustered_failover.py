"""Failures of a clustered JetStream, with real servers killed by SIGKILL.

- The stream leader is killed while a nats-py publisher (retrying, with Nats-Msg-Id) runs, three rounds:
  every message whose PubAck was received is in the stream once, in publish order; a durable consumer
  resumes from its acked position.
- The meta leader is killed: a new one is elected and streams can be created again; the killed server
  restarts, rejoins and catches up (it sees streams created while it was down).
- Two of three servers killed: the last one refuses metadata writes (10008) instead of acting alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path

import nats
import pytest
from nats.js.api import AckPolicy, ConsumerConfig

from tests.stream.kit_cluster import api, restart, start_cluster, wait_meta_leader
from zonebus.testing.polling import until, wait_until
from zonebus.testing.processes import ServerProcess, stop_all

RETRIABLE = (nats.errors.Error, asyncio.TimeoutError)  # no responders, no stream response, 10008, timeouts


STATE_SETTLE = 0.5


def by_name(servers: list[ServerProcess], name: str) -> ServerProcess:
    return next(s for s in servers if s.info["server_name"] == name)


async def leader_of(nc: nats.NATS, stream: str, not_: str = "", timeout: float = 20.0) -> str:
    """The stream's leader as the cluster reports it (waiting until it is not `not_`)."""

    async def other_leader() -> str | None:
        with contextlib.suppress(*RETRIABLE):
            info = await api(nc, f"$JS.API.STREAM.INFO.{stream}", timeout=1.0)
            leader = info.get("cluster", {}).get("leader", "")
            if leader and leader != not_:
                return leader
        return None

    return await until(other_leader, f"{stream}: a leader other than {not_!r}", timeout=timeout, interval=0.1)


async def api_retry(nc: nats.NATS, subject: str, body: dict | None = None, timeout: float = 20.0) -> dict:
    """An API request retried while the client reconnects or the stream changes leader."""
    last: dict = {}

    async def answered() -> dict | None:
        with contextlib.suppress(*RETRIABLE):
            resp = last["resp"] = await api(nc, subject, body, timeout=1.0)
            if resp.get("error", {}).get("code") != 503:
                return resp
        return None

    return await until(answered, f"{subject}: an answer other than 503", timeout=timeout, interval=0.1,
                       show=lambda: last)


class Publisher:
    """Publishes numbered messages one after the other; each is retried until its PubAck arrives."""

    def __init__(self, js, subject: str) -> None:
        self.js = js
        self.subject = subject
        self.acked: dict[int, int] = {}  # message number -> stream sequence
        self.retries = 0
        self.stop = asyncio.Event()

    async def run(self) -> None:
        i = 0
        while not self.stop.is_set():
            while not self.stop.is_set():  # the message in flight is given up only when told to stop
                try:
                    ack = await self.js.publish(self.subject, str(i).encode(), timeout=1.0,
                                                headers={"Nats-Msg-Id": f"m-{i}"})
                    self.acked[i] = ack.seq
                    break
                except RETRIABLE:
                    self.retries += 1
                    await asyncio.sleep(0.05)
            i += 1


@pytest.mark.timeout(240)
async def test_stream_leader_killed_three_rounds(tmp_path: Path) -> None:
    servers = start_cluster(tmp_path, failover="2s")
    try:
        await wait_meta_leader(servers)
        urls = [s.url for s in servers]
        nc = await nats.connect(servers=urls, max_reconnect_attempts=-1, reconnect_time_wait=0.1)
        js = nc.jetstream(timeout=3)
        await js.add_stream(name="FAIL", subjects=["fail.>"], num_replicas=3)
        await js.add_consumer("FAIL", ConsumerConfig(durable_name="keep", ack_policy=AckPolicy.EXPLICIT))
        pub = Publisher(js, "fail.x")
        task = asyncio.create_task(pub.run())
        # the durable consumer acks the first messages before any failure
        reader = await nats.connect(servers=urls, max_reconnect_attempts=-1, reconnect_time_wait=0.1)
        rjs = reader.jetstream(timeout=3)
        psub = await rjs.pull_subscribe_bind(durable="keep", stream="FAIL")
        acked_by_consumer: set[int] = set()
        deadline = time.monotonic() + 60
        while len(acked_by_consumer) < 50:
            assert time.monotonic() < deadline, f"the consumer acked only {len(acked_by_consumer)} messages"
            with contextlib.suppress(*RETRIABLE):
                for m in await psub.fetch(50, timeout=2):
                    acked_by_consumer.add(m.metadata.sequence.stream)
                    await m.ack_sync()
        # consumer state reaches the shared store within STATE_FLUSH_DELAY (50 ms) plus one upload; acks younger
        # than that may be redelivered after a crash (at least once), older ones never
        await asyncio.sleep(STATE_SETTLE)
        leader = await leader_of(nc, "FAIL")
        for _ in range(3):
            before = len(pub.acked)
            victim = by_name(servers, leader)
            victim.kill()
            leader = await leader_of(nc, "FAIL", not_=leader)
            await until(lambda before=before: len(pub.acked) >= before + 100, "publishing going on with the new leader",
                        timeout=20, show=lambda: f"publisher stuck at {len(pub.acked)}")
            restart(victim)  # it rejoins as a standby
        pub.stop.set()
        await task
        info = await api_retry(nc, "$JS.API.STREAM.INFO.FAIL")
        seqs = sorted(pub.acked.values())
        assert len(set(seqs)) == len(seqs), "two acknowledged messages with one sequence"
        assert info["state"]["messages"] >= len(pub.acked)
        # read everything back: every acknowledged message once, at its acknowledged sequence, in order
        await api_retry(nc, "$JS.API.CONSUMER.DURABLE.CREATE.FAIL.all",
                        {"stream_name": "FAIL", "config": {"durable_name": "all", "ack_policy": "none"}})
        allsub = await js.pull_subscribe_bind(durable="all", stream="FAIL")
        stored: dict[int, int] = {}
        dup = 0
        deadline = time.monotonic() + 60
        while len(stored) + dup < info["state"]["messages"]:
            assert time.monotonic() < deadline, f"read back {len(stored)} of {info['state']['messages']}"
            with contextlib.suppress(*RETRIABLE):
                for m in await allsub.fetch(200, timeout=2):
                    n = int(m.data)
                    if n in stored:
                        dup += 1
                    stored[n] = m.metadata.sequence.stream
        lost = [n for n, seq in pub.acked.items() if stored.get(n) != seq]
        assert lost == [], f"{len(lost)} acknowledged messages lost or moved"
        assert dup == 0, f"{dup} duplicates"
        order = [stored[n] for n in sorted(stored)]
        assert order == sorted(order), "messages out of publish order"
        # the durable consumer resumes after its acked position
        rest: set[int] = set()
        deadline = time.monotonic() + 30
        while len(rest) < len(stored) - len(acked_by_consumer):
            assert time.monotonic() < deadline
            with contextlib.suppress(*RETRIABLE):
                for m in await psub.fetch(200, timeout=2):
                    rest.add(m.metadata.sequence.stream)
                    await m.ack()
        assert not (rest & acked_by_consumer), "acked messages delivered again"
        assert rest | acked_by_consumer >= set(stored.values())
        await nc.close()
        await reader.close()
    finally:
        stop_all(servers)


@pytest.mark.timeout(180)
async def test_meta_leader_killed_restart_catches_up_and_minority_refuses(tmp_path: Path) -> None:
    servers = start_cluster(tmp_path, failover="2s")
    try:
        await wait_meta_leader(servers)
        probe = await nats.connect(servers[0].url)
        meta = await api(probe, "$JS.API.STREAM.CREATE.M1", {"name": "M1", "subjects": ["m1"]})
        assert "error" not in meta, meta
        await probe.close()
        leader_name = _meta_leader(servers)
        victim = by_name(servers, leader_name)
        victim.kill()
        rest = [s for s in servers if s is not victim]
        await wait_meta_leader(rest)
        nc = await nats.connect(rest[0].url)
        created = await api(nc, "$JS.API.STREAM.CREATE.M2", {"name": "M2", "subjects": ["m2"]})
        assert "error" not in created, created
        assert _meta_leader(rest) != leader_name
        restart(victim)
        await wait_meta_leader([victim])
        back = await nats.connect(victim.url)
        names = await api(back, "$JS.API.STREAM.NAMES")
        assert {"M1", "M2"} <= set(names["streams"])  # caught up with what was created while it was down
        await back.close()
        # two of three down: the last one refuses writes rather than act alone
        last = servers[0]
        for s in servers[1:]:
            s.kill()
        to_last = nc if rest[0] is last else await nats.connect(last.url)

        async def refused() -> bool:
            resp = await api(to_last, "$JS.API.STREAM.CREATE.M3", {"name": "M3", "subjects": ["m3"]})
            assert "error" in resp, f"a minority created a stream: {resp}"
            return resp["error"].get("err_code") == 10008

        await until(refused, "the last server to refuse metadata writes (10008)", timeout=20, interval=0.2)
        if to_last is not nc:
            await to_last.close()
        await nc.close()
    finally:
        stop_all(servers)


def _meta_leader(servers: list[ServerProcess]) -> str:
    """The meta leader named by the servers' own logs is not stable; ask `/jsz` when it exists, else the log."""

    def named_leader() -> str | None:
        for s in servers:
            with contextlib.suppress(Exception):
                leader = s.http_get("/jsz").get("meta_cluster", {}).get("leader")
                if leader:
                    return leader
        return None

    return wait_until(named_leader, "a meta leader in /jsz", timeout=20, interval=0.1)


@pytest.mark.timeout(180)
async def test_s3_shared_store_leader_killed(tmp_path: Path, moto_s3) -> None:
    """The same cluster on an s3:// shared store (moto's S3 server on loopback): the leader's death loses
    nothing acknowledged; the new leader reads the stream from S3."""
    shared = f"s3://{moto_s3.bucket}/clustered-{tmp_path.name}"
    servers = start_cluster(tmp_path, failover="2s", shared=shared, env=moto_s3.env())
    try:
        await wait_meta_leader(servers)
        nc = await nats.connect(servers=[s.url for s in servers], max_reconnect_attempts=-1, reconnect_time_wait=0.1)
        js = nc.jetstream(timeout=3)
        await js.add_stream(name="S3C", subjects=["s3c.>"], num_replicas=2)
        pub = Publisher(js, "s3c.x")
        task = asyncio.create_task(pub.run())
        deadline = time.monotonic() + 30
        # (on s3:// a batch fills for the 250 ms latency budget: this one-at-a-time publisher gets ~4 acks a second)
        await until(lambda: len(pub.acked) >= 30, "30 PubAcks", timeout=30, show=lambda: len(pub.acked))
        leader = await leader_of(nc, "S3C")
        by_name(servers, leader).kill()
        await leader_of(nc, "S3C", not_=leader)
        before = len(pub.acked)
        await until(lambda: len(pub.acked) >= before + 20, "20 more PubAcks after the leader's death",
                    timeout=deadline + 30 - time.monotonic(), show=lambda: len(pub.acked) - before)
        pub.stop.set()
        await task
        info = await api_retry(nc, "$JS.API.STREAM.INFO.S3C")
        assert info["state"]["messages"] == len(pub.acked)
        assert info["state"]["last_seq"] == max(pub.acked.values())
        await nc.close()
    finally:
        stop_all(servers)


@pytest.mark.timeout(240)
async def test_a_restart_of_every_server_takes_a_stream_over_once(tmp_path: Path) -> None:
    """Every server killed at once, after the stream changed leader several times: each restarted server's meta
    log replays every one of those changes. The leader takes the stream over once and serves it; taking it over
    again (and releasing it) on each replayed change had left the chaos campaigns without a PubAck for about a
    minute after every `powerloss-all`."""
    servers = start_cluster(tmp_path, failover="2s")
    nc = None
    try:
        await wait_meta_leader(servers)
        nc = await nats.connect(servers=[s.url for s in servers], max_reconnect_attempts=-1,
                                reconnect_time_wait=0.1)
        js = nc.jetstream(timeout=3)
        await js.add_stream(name="REPLAY", subjects=["replay.>"], num_replicas=3)
        leader = await leader_of(nc, "REPLAY")
        for i in range(6):
            await api_retry(nc, "$JS.API.STREAM.LEADER.STEPDOWN.REPLAY")
            leader = await leader_of(nc, "REPLAY", not_=leader)
            await api_retry(nc, "$JS.API.STREAM.INFO.REPLAY")
            await js.publish("replay.x", f"{i}".encode())
        for s in servers:
            s.kill()
        marks = [len(s.log()) for s in servers]
        for s in servers:
            restart(s)
        await wait_meta_leader(servers)
        ack = await until(lambda: _try_publish(js, "replay.x", b"after"), "a PubAck after the restart",
                          timeout=60, interval=0.2)
        assert ack.seq == 7
        leader = await leader_of(nc, "REPLAY")
        after = {s.info["server_name"]: s.log()[m:] for s, m in zip(servers, marks, strict=True)}
        takeovers = after[leader].count("JetStream: leading stream REPLAY")
        releases = after[leader].count("JetStream: no longer leading stream REPLAY")
        lines = [ln for ln in after[leader].splitlines() if "REPLAY" in ln or "meta" in ln]
        assert (takeovers, releases) == (1, 0), (
            f"{leader} took the stream over {takeovers} times and released it {releases} times after the restart: "
            + "\n".join(lines[-30:]))
        info = await api_retry(nc, "$JS.API.STREAM.INFO.REPLAY")
        assert info["state"]["messages"] == 7
    finally:
        if nc is not None:
            await nc.close()
        stop_all(servers)


async def _try_publish(js, subject: str, data: bytes):
    with contextlib.suppress(*RETRIABLE):
        return await js.publish(subject, data, timeout=1.0)
    return None
