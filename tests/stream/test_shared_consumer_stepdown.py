"""`$JS.API.CONSUMER.LEADER.STEPDOWN.<stream>.<consumer>` against nats-server's own 3-server JetStream cluster:
the same requests get the same answers (success, or the same error code), the consumer's leader moves (to the
preferred server when one is named), and the consumer carries on from its acknowledged position afterwards.

zonebus's consumers live beside their stream's writer on the shared store, so there the stepdown moves the
stream with its consumers; nats-server moves only the consumer's Raft group. Both must answer alike.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from pathlib import Path

import nats
import pytest

from tests.stream.kit_cluster import api
from tests.stream.test_clustered_differential import assert_same, on_both, outcome
from zonebus.testing.polling import until

STEPDOWN = "$JS.API.CONSUMER.LEADER.STEPDOWN"


async def consumer_leader(nc: nats.NATS, stream: str, name: str, timeout: float = 20.0, not_: str = "") -> str:
    """The consumer's leader once it has one (other than `not_`); nats-server has none for a moment after a
    stepdown and does not answer then."""

    async def leader() -> str:
        with contextlib.suppress(nats.errors.Error, asyncio.TimeoutError):
            info = await api(nc, f"$JS.API.CONSUMER.INFO.{stream}.{name}", timeout=1.0)
            leader = info.get("cluster", {}).get("leader", "")
            if "error" not in info and leader and leader != not_:
                return leader
        return ""

    return await until(leader, f"a leader of consumer {stream}/{name} (other than {not_!r})", timeout=timeout,
                       interval=0.2)


async def scenario(nc: nats.NATS) -> list[tuple[str, object]]:
    out: list[tuple[str, object]] = []

    async def step(label: str, subject: str, body: dict | None = None, raw: bytes | None = None) -> dict:
        for _ in range(10):  # 10008 (503): busy electing; no answer: the consumer has no leader for a moment
            try:
                if raw is not None:
                    msg = await nc.request(subject, raw, timeout=2.0)
                    resp = json.loads(msg.data)
                else:
                    resp = await api(nc, subject, body, timeout=2.0)
            except (nats.errors.TimeoutError, nats.errors.NoRespondersError):
                await asyncio.sleep(0.3)
                continue
            if resp.get("error", {}).get("code") != 503:
                break
            await asyncio.sleep(0.5)
        out.append((label, outcome(resp), resp.get("type")))
        return resp

    await step("r3 stream", "$JS.API.STREAM.CREATE.SD3", {"name": "SD3", "subjects": ["sd3"], "num_replicas": 3})
    await step("r1 stream", "$JS.API.STREAM.CREATE.SD1", {"name": "SD1", "subjects": ["sd1"]})
    durable = {"ack_policy": "explicit", "ack_wait": 2_000_000_000}
    await step("consumer", "$JS.API.CONSUMER.CREATE.SD3.C3",
               {"stream_name": "SD3", "config": {"durable_name": "C3", **durable}})
    await step("r1 consumer", "$JS.API.CONSUMER.CREATE.SD3.CR1",
               {"stream_name": "SD3", "config": {"durable_name": "CR1", "num_replicas": 1, **durable}})
    await step("consumer of r1", "$JS.API.CONSUMER.CREATE.SD1.D",
               {"stream_name": "SD1", "config": {"durable_name": "D", **durable}})
    js = nc.jetstream(timeout=5)
    for i in range(4):
        await js.publish("sd3", f"m{i}".encode())
    sub = await js.pull_subscribe_bind(durable="C3", stream="SD3")
    first = await sub.fetch(1, timeout=5)
    await first[0].ack_sync()  # acked: 1; the consumer resumes at 2 wherever it is led

    await step("missing stream", f"{STEPDOWN}.NOPE.C3")
    await step("missing consumer", f"{STEPDOWN}.SD3.NOPE")
    await step("r1 stream, bad json", f"{STEPDOWN}.SD1.D", raw=b"{bad")
    await step("r1 consumer, unknown preferred", f"{STEPDOWN}.SD3.CR1", {"placement": {"preferred": "nobody"}})
    leader = await consumer_leader(nc, "SD3", "C3")
    await step("bad json", f"{STEPDOWN}.SD3.C3", raw=b"{bad")
    await step("preferred is the leader", f"{STEPDOWN}.SD3.C3", {"placement": {"preferred": leader}})
    await step("preferred unknown", f"{STEPDOWN}.SD3.C3", {"placement": {"preferred": "nobody"}})
    await step("no such tags", f"{STEPDOWN}.SD3.C3", {"placement": {"tags": ["az:z9"]}})
    await step("other cluster", f"{STEPDOWN}.SD3.C3", {"placement": {"cluster": "elsewhere"}})
    assert await consumer_leader(nc, "SD3", "C3") == leader  # refused stepdowns move nothing

    preferred = next(s for s in ("s1", "s2", "s3") if s != leader)
    await step("preferred", f"{STEPDOWN}.SD3.C3", {"placement": {"preferred": preferred}})
    moved = await consumer_leader(nc, "SD3", "C3", not_=leader)
    out.append(("moved to the preferred server", moved == preferred))
    await step("plain", f"{STEPDOWN}.SD3.C3")
    again = await consumer_leader(nc, "SD3", "C3", not_=moved)
    out.append(("moved again", again != moved))

    got = []
    deadline = time.monotonic() + 20
    while len(got) < 3 and time.monotonic() < deadline:  # a pull request may hit the moment without a leader
        with contextlib.suppress(nats.errors.TimeoutError):
            for m in await sub.fetch(3 - len(got), timeout=2):
                got.append(m.metadata.sequence.stream)
                await m.ack_sync()
    out.append(("resumed after the acked message", sorted(set(got))))
    for name in ("SD3", "SD1"):
        await step(f"delete {name}", f"$JS.API.STREAM.DELETE.{name}")
    return out


@pytest.mark.timeout(150)
async def test_consumer_stepdown_answers_like_nats_server(tmp_path: Path) -> None:
    results = await on_both(tmp_path, scenario)
    assert ("resumed after the acked message", [2, 3, 4]) in results["nats"]  # the scenario itself holds
    assert_same(results)
