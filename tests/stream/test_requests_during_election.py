"""API requests that arrive while the meta group elects a new leader are answered once it has one, not with a
503 (10008) the client would have to retry: nats-py's `pull_subscribe` asks `CONSUMER.INFO` first and gives up
on that error (seen once in CI right after a stream's creation, `tests/cluster/test_route_compression.py`).

Three zonebus servers (default workers); the meta leader steps down again and again while clients on every
server keep asking `STREAM.INFO` and `CONSUMER.INFO`: every answer is the stream's or the consumer's info.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import nats
import pytest

from tests.stream.kit_cluster import start_cluster, wait_meta_leader
from zonebus.testing.jsapi import api, create_stream_retrying
from zonebus.testing.polling import until

pytestmark = pytest.mark.timeout(180)


async def test_requests_during_meta_elections_wait_for_the_new_leader(tmp_path: Path) -> None:
    servers = start_cluster(tmp_path)
    ncs: list[nats.NATS] = []
    try:
        await wait_meta_leader(servers)
        ncs = [await nats.connect(s.url) for s in servers]
        loop = asyncio.get_running_loop()
        await create_stream_retrying(ncs[0], {"name": "EL", "subjects": ["el.>"], "storage": "file"},
                                     loop.time() + 60, "EL")
        cons = await api(ncs[0], "$JS.API.CONSUMER.CREATE.EL.C",
                         {"stream_name": "EL", "config": {"durable_name": "C", "ack_policy": "explicit"}})
        assert "error" not in cons, cons
        answers: dict[str, int] = {}
        stop = asyncio.Event()

        async def ask(nc: nats.NATS) -> None:
            subjects = ["$JS.API.STREAM.INFO.EL", "$JS.API.CONSUMER.INFO.EL.C"]
            i = 0
            while not stop.is_set():
                resp = await api(nc, subjects[i % 2], timeout=8.0)
                err = resp.get("error")
                key = "ok" if err is None else f"{err.get('code')} {err.get('err_code')}"
                answers[key] = answers.get(key, 0) + 1
                i += 1
                await asyncio.sleep(0.01)

        askers = [asyncio.create_task(ask(nc)) for nc in ncs]
        try:
            for _ in range(4):
                resp = await api(ncs[1], "$JS.API.META.LEADER.STEPDOWN", timeout=8.0)
                assert resp.get("success"), resp

                async def answered(n: int = sum(answers.values())) -> bool:  # requests went on after it
                    return sum(answers.values()) > n + 30

                await until(answered, "requests answered after the stepdown", timeout=30, show=lambda: answers)
        finally:
            stop.set()
            await asyncio.gather(*askers)
        assert set(answers) == {"ok"}, answers
    finally:
        for nc in ncs:
            await nc.close()
        for s in servers:
            s.stop()
