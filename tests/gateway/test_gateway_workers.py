"""Gateways of a server run as 2 worker processes (zonebus.workers): worker 0 holds the gateways and routes;
a queue group with a member in the publisher's cluster is served there, whichever worker the publisher is on.

Cluster A's servers run 2 workers each, cluster B's one process; A1's publishers are opened until they sit
on both of its workers.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator

import nats
import pytest

from tests.gateway.kit import Supercluster, in_thread, started, wait_remote_interest
from zonebus.testing.polling import until
from zonebus.testing.processes import wait_for_route_interest

pytestmark = pytest.mark.timeout(90)


@pytest.fixture(scope="module")
def workers_sc() -> Iterator[Supercluster]:
    sc = started("zonebus", names=("A", "B"), env={"A": {"ZONEBUS_TEST_WORKERS": "2"}})
    yield sc
    sc.stop()


async def test_queue_member_in_the_cluster_serves_publishers_of_every_worker(workers_sc: Supercluster) -> None:
    sc = workers_sc
    a1 = sc.server("A1")
    publishers: dict[int, nats.aio.client.Client] = {}
    others = []
    while len(publishers) < 2 and len(others) < 100:
        nc = await nats.connect(a1.url, allow_reconnect=False)
        publishers.setdefault(nc._client_id >> 32, nc)  # worker i hands out client ids above i * 2^32
        if publishers.get(nc._client_id >> 32) is not nc:
            others.append(nc)
    assert len(publishers) == 2, "the kernel put every client of A1 on one worker"
    got: dict[str, Counter[bytes]] = {"A2": Counter(), "B1": Counter()}
    members = []
    try:
        for name, counter in got.items():
            nc = await nats.connect(sc.server(name).url, allow_reconnect=False)
            members.append(nc)

            async def count(msg, counter: Counter[bytes] = counter) -> None:
                counter[msg.data] += 1

            await nc.subscribe("gww.q", queue="q", cb=count)
            await nc.flush()
        await in_thread(wait_for_route_interest, a1, "gww.q", "q", time.monotonic() + 10, peers={"A2"})
        await in_thread(wait_remote_interest, a1, "B", "gww.q", "q")
        for w, nc in publishers.items():  # until each worker knows A2's member (interest reaches workers too)

            async def probed(nc: nats.NATS = nc, probe: bytes = b"probe-%d" % w) -> bool:
                if got["A2"][probe]:
                    return True
                await nc.publish("gww.q", probe)
                await nc.flush()
                return False

            await until(probed, f"a probe published on worker {w} of A1 to reach A2's member", timeout=10)
        for w, nc in publishers.items():
            for i in range(50):
                await nc.publish("gww.q", b"%d-%d" % (w, i))
            await nc.publish("gww.q", b"end-%d" % w)
            await nc.flush()
        await until(lambda: got["A2"][b"end-0"] and got["A2"][b"end-1"], "A2's member to get both ends", timeout=10,
                    show=lambda: got)
        numbered = {b"%d-%d" % (w, i) for w in (0, 1) for i in range(50)}
        assert {k: v for k, v in got["A2"].items() if k in numbered} == dict.fromkeys(numbered, 1)
        assert not any(k in numbered for k in got["B1"]), "another cluster served a group with a member in A"
    finally:
        for nc in [*publishers.values(), *others, *members]:
            await nc.close()
