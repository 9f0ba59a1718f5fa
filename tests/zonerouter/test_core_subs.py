"""Core subscribers keep NATS semantics with the zone router on (issue #24, item 5): a1 (z1), b1 and b2 (z2,
where the stream is placed), c1 (z3). A plain subscriber on `orders.>` on every server, the stream leader's
own server and the other server of its zone included, gets every message published on every server, core
`PUB` and JetStream publish alike, exactly once, with the subject, reply and headers it was published with (a
core queue group with members on b1 and b2 gets each once);
the stream holds every one of them once (the router stores what other zones publish; the copy the leader's
core subscribers get over the route is not stored again)."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter

import nats
import pytest
from nats.js.api import AckPolicy, ConsumerConfig

from tests.zonerouter.kit import full_view, router_info, start_zoned
from zonebus.testing.jsapi import api
from zonebus.testing.polling import until, wait_until

LAYOUT = [("a1", "z1"), ("b1", "z2"), ("b2", "z2"), ("c1", "z3")]
FULL = {"z1": ["a1"], "z2": ["b1", "b2"], "z3": ["c1"]}
N = 40  # core publishes and JetStream publishes per publisher


@pytest.fixture(scope="module")
def zoned(tmp_path_factory: pytest.TempPathFactory):
    z = start_zoned(tmp_path_factory.mktemp("zrcore"), LAYOUT, proxy=True)
    yield z
    z.stop()


async def _create(nc: nats.NATS) -> str:
    """The stream ORDERS placed in z2 (retried while the cluster forms); returns its leader (b1 or b2)."""
    async def create() -> dict | None:
        resp = await api(nc, "$JS.API.STREAM.CREATE.ORDERS", {
            "name": "ORDERS", "subjects": ["orders.>"], "storage": "file", "num_replicas": 1,
            "placement": {"tags": ["az:z2"]}})
        return resp if "error" not in resp else None
    resp = await until(create, "the stream created", timeout=15, interval=0.2)
    return resp["cluster"]["leader"]


@pytest.mark.timeout(120)
async def test_core_subscribers_in_every_zone_get_every_publish_once(zoned) -> None:
    s = zoned.servers
    await asyncio.to_thread(wait_until, full_view(zoned, FULL), "the full mapping")
    admin = await nats.connect(s["b1"].url)
    subs: dict[str, nats.NATS] = {}
    pubs: dict[str, nats.NATS] = {}
    got: dict[str, list[tuple[str, str, bytes, dict]]] = {name: [] for name in s}
    probes: dict[str, set[str]] = {name: set() for name in s}
    queued: list[tuple[str, str]] = []
    try:
        leader = await _create(admin)
        assert leader in ("b1", "b2")
        for name, zone in LAYOUT:
            subs[name] = await nats.connect(s[name].url, name=f"sub-{name}?az={zone}")
            pubs[name] = await nats.connect(s[name].url, name=f"pub-{name}?az={zone}")

            async def on_msg(m, name=name) -> None:
                who, kind = m.subject.split(".")[1:3]
                if kind == "probe":
                    probes[name].add(who)
                else:
                    got[name].append((m.subject, m.reply, m.data, dict(m.headers or {})))
            await subs[name].subscribe("orders.>", cb=on_msg)

            async def on_queued(m, name=name) -> None:
                if m.subject.split(".")[2] != "probe":
                    queued.append((name, m.data.decode()))
            if name in ("b1", "b2"):  # a core queue group in the stream's zone: each message to one member
                await subs[name].subscribe("orders.>", queue="workers", cb=on_queued)
            await subs[name].flush()
        # every subscription known on every server: probes (JetStream publishes, so each is acknowledged)
        # until every subscriber saw one from every server; one that never does shows the bug below
        async def probe() -> bool:
            for name in s:
                await pubs[name].jetstream(timeout=5).publish(f"orders.{name}.probe", b"probe")
            return all(len(seen) == len(s) for seen in probes.values())
        with contextlib.suppress(TimeoutError):  # the assertions below say what was missing
            await until(probe, "probes seen by every subscriber", timeout=10, interval=0.2)
        print("probes seen:", {k: sorted(v) for k, v in probes.items()})

        async def publish(name: str) -> None:
            nc = pubs[name]
            js = nc.jetstream(timeout=10)
            for i in range(N):
                await nc.publish(f"orders.{name}.core", f"{name}:core:{i}".encode())
            await nc.flush()
            acks = await asyncio.gather(*(js.publish(f"orders.{name}.js", f"{name}:js:{i}".encode(),
                                                     headers={"Nats-Msg-Id": f"{name}-{i}"}) for i in range(N)))
            assert all(a.stream == "ORDERS" and not a.duplicate for a in acks)
        await asyncio.gather(*(publish(name) for name in s))
        want = {f"{w}:{k}:{i}" for w in s for k in ("core", "js") for i in range(N)}

        def counts() -> dict[str, int]:
            return {name: len(msgs) for name, msgs in got.items()}
        with contextlib.suppress(TimeoutError):
            await until(lambda: all(len(m) >= len(want) for m in got.values()) and len(queued) >= len(want),
                        "every subscriber got all",
                        timeout=20, show=counts)
        # the stream holds every publish once (probes aside)
        info = await api(admin, "$JS.API.STREAM.INFO.ORDERS", {})
        js = admin.jetstream(timeout=10)
        await js.add_consumer("ORDERS", ConsumerConfig(durable_name="check", ack_policy=AckPolicy.NONE))
        psub = await js.pull_subscribe_bind(durable="check", stream="ORDERS")
        stored: list[str] = []
        total = info["state"]["messages"]
        while len(stored) < total:
            stored += [m.data.decode() for m in await psub.fetch(500, timeout=5)]
        stored = [x for x in stored if x != "probe"]
        assert Counter(stored) == Counter(want), "the stream holds each publish once"
        # the queue group got each message once (from one member)
        assert Counter(data for _, data in queued) == Counter(want), "the queue group got each message once"
        # every subscriber, each server of the leader's zone included, got every message once, as published
        print("received:", counts(), "leader", leader)
        for name, msgs in got.items():
            seen = Counter(data.decode() for _, _, data, _ in msgs)
            missing = want - set(seen)
            assert not missing, f"{name} missed {len(missing)} of {len(want)}, e.g. {sorted(missing)[:3]}"
            dupes = [k for k, n in seen.items() if n > 1]
            assert not dupes, f"{name} got {len(dupes)} twice, e.g. {dupes[:3]}"
            for subject, reply, data, headers in msgs:
                who, kind, i = data.decode().split(":")
                assert subject == f"orders.{who}.{kind}"
                if kind == "core":
                    assert reply == "" and headers == {}
                else:
                    assert reply.startswith("_INBOX.") and headers == {"Nats-Msg-Id": f"{who}-{i}"}
        info = await asyncio.to_thread(router_info, s[leader])
        assert info["leader"]["msgs"] >= 4 * N  # what a1 and c1 published went through it
    finally:
        for nc in (*subs.values(), *pubs.values(), admin):
            await nc.close()

