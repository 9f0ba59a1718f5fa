"""Gateways into a cluster that spans zones (issue #25), with real servers and every route and gateway connection
through a byte-counting proxy (`zonebus.testing.zonesuper`): cluster A has one server per zone (a1 z1, a2 z2,
a3 z3), cluster B two (b1 b2 z1, b3 b4 z2, b5 b6 z3); A's servers list only b1's gateway URL, B learns A by
gossip.

zonebus: every server's outbound gateway connection ends up at a server of its own zone (a2 and a3 move off
b1), a message published on a1 for an `events.>` subscriber on every B server crosses zones about twice (one
copy into z2 and one into z3: the gateway hop stays in z1, the zone relay fans it out in B), every subscriber
gets every message once, and a queue group across the gateway gets each message once (and, with
`prefer_matching_tags`, without crossing zones). nats-server in the same scenario delivers the same, with more
bytes between zones; zonebus with `cluster { zone_relay: false }` dials as nats-server does.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import nats
import pytest
from nats.aio.msg import Msg

from zonebus.gateway.dialing import RemoteGateway
from zonebus.testing.polling import until
from zonebus.testing.zonesuper import FanOut, ZoneSupercluster, fan_out

pytestmark = pytest.mark.timeout(420)

PREFER = "prefer_matching_tags: true"
START_TIMEOUT = 180  # nine servers starting at once on a shared 2-core machine


def started(tmp: Path, impl: str, cluster_extra: str = "") -> ZoneSupercluster:
    sc = ZoneSupercluster(f"{impl} supercluster", impl, [("A", 1), ("B", 2)], cluster_extra=cluster_extra)
    sc.start(tmp, START_TIMEOUT)
    try:
        sc.wait_gateways(same_zone=impl == "zonebus" and "zone_relay: false" not in cluster_extra, timeout=90)
    except Exception:
        sc.stop()
        raise
    return sc


@pytest.fixture(scope="module")
def zonebus_sc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ZoneSupercluster]:
    sc = started(tmp_path_factory.mktemp("gwzones"), "zonebus", PREFER)
    yield sc
    sc.stop()


def check_delivery(run: FanOut) -> None:
    assert run.plain_exactly_once() == [], {n: (len(g), max(g.values())) for n, g in run.plain.items()}
    if run.queue:
        assert len(run.queue) == run.msgs and set(run.queue.values()) == {1}, \
            f"queue deliveries: {len(run.queue)} of {run.msgs} seqs, counts {set(run.queue.values())}"


def test_url_order_prefers_the_dialling_servers_zone() -> None:
    remote = RemoteGateway("B", True, urls={f"h:{p}": f"nats://h:{p}" for p in (1, 2, 3, 4)},
                           zones={"h:1": "z1", "h:2": "z2", "h:3": "z2"})
    rng = random.Random(7)
    assert {remote.url_for(0, rng, "z2") for _ in range(20)} == {"nats://h:2", "nats://h:3"}
    tried = [remote.url_for(k, rng, "z2") for k in range(1, 5)]  # after a failure: every URL in turn
    assert sorted(tried) == [f"nats://h:{p}" for p in (1, 2, 3, 4)]
    assert {remote.url_for(0, rng, "z9") for _ in range(40)} == set(remote.urls.values())  # no server there
    assert {remote.url_for(0, rng, "") for _ in range(40)} == set(remote.urls.values())  # no zone: random


def test_a_failed_successor_url_is_tried_after_the_others_until_its_server_shows_up() -> None:
    """Seen in CI: with b5 and b6 (z3) down, a3's random pick went to b6 again and again after b5 came back; the
    backoff reached 60 s and the move back waited past the test's 90 s."""
    remote = RemoteGateway("B", True, urls={f"h:{p}": f"nats://h:{p}" for p in (1, 2, 3)},
                           zones={"h:1": "z1", "h:2": "z3", "h:3": "z3"})
    rng = random.Random(7)
    assert {remote.successor_url("z3", rng) for _ in range(20)} == {"nats://h:2", "nats://h:3"}
    assert remote.successor_url("z2", rng) == ""
    remote.move_failed_at["h:2"] = 5.0
    assert {remote.successor_url("z3", rng) for _ in range(20)} == {"nats://h:3"}
    remote.move_failed_at["h:3"] = 9.0  # both failed: the one that failed longest ago
    assert {remote.successor_url("z3", rng) for _ in range(20)} == {"nats://h:2"}
    remote.move_failed_at["h:2"] = 12.0
    assert {remote.successor_url("z3", rng) for _ in range(20)} == {"nats://h:3"}


async def test_outbound_connections_land_in_the_own_zone(zonebus_sc: ZoneSupercluster) -> None:
    """(The fixture waited for it: each server dialled its zone at once, when it knew the zones before its first
    dial, or moved there; a2 and a3 list only b1's URL, in z1.)"""
    zones = zonebus_sc.outbound_zones()
    assert zones == {name: {("B" if name[0] == "a" else "A"): zonebus_sc.zone_of(name)} for name in zones}


async def test_fan_out_crosses_into_each_remote_zone_once(zonebus_sc: ZoneSupercluster) -> None:
    run = await fan_out(zonebus_sc, msgs=400)
    check_delivery(run)
    # one copy into z2 and one into z3 (RMSG/ZMSG lines add ~5%), heartbeats included; none on the gateway hop
    assert 1.8 < run.per_payload() < 2.3, (run.per_payload(), run.route_cross, run.gateway_cross)
    assert run.gateway_total > run.payload_bytes  # (the messages did cross the gateway, through the proxy)
    assert run.gateway_cross < 0.01 * run.payload_bytes, zonebus_sc.gateway_flows()


async def test_queue_group_across_the_gateway_gets_each_message_once(zonebus_sc: ZoneSupercluster) -> None:
    run = await fan_out(zonebus_sc, msgs=300, plain=True, queue=True)
    check_delivery(run)
    alone = await fan_out(zonebus_sc, msgs=300, plain=False, queue=True)
    check_delivery(alone)
    # b1 (z1) takes the message from a1 and, preferring its zone, serves the group there: nothing crosses
    assert alone.per_payload() < 0.05, (alone.route_cross, alone.gateway_cross)


@pytest.mark.parametrize("setup", ["nats", "zonebus, zone_relay: false"])
async def test_same_scenario_without_the_zone_preference(setup: str, zonebus_sc: ZoneSupercluster,
                                                         tmp_path: Path) -> None:
    """nats-server (random gateway URL, one copy per remote server) and zonebus with the relay off deliver the
    same, at a cost of at least four copies per message (all five B servers but the gateway hop's zone twin);
    zonebus with the preference moves at most 0.6 of that."""
    impl = "nats" if setup == "nats" else "zonebus"
    sc = started(tmp_path, impl, "" if impl == "nats" else PREFER + "\n  zone_relay: false")
    try:
        run = await fan_out(sc, msgs=400, queue=True)
        check_delivery(run)
        assert run.per_payload() > 3.8, (run.per_payload(), sc.gateway_flows())
    finally:
        sc.stop()
    ours = await fan_out(zonebus_sc, msgs=400, queue=True)
    check_delivery(ours)
    assert ours.per_payload() < 0.6 * run.per_payload(), (ours.per_payload(), run.per_payload())


async def test_a_move_back_to_the_own_zone_loses_nothing(zonebus_sc: ZoneSupercluster) -> None:
    """b5 and b6 (z3) stop: a3 reconnects to B in another zone. b5 comes back: a3 dials it as a successor and
    moves there while a client of a3 publishes without pause to a subscriber on b1; the subscriber gets every
    message once (the old connection carries everything up to the switch, the new one the rest)."""
    sc = zonebus_sc
    a3, b5, b6 = sc.server("a3"), sc.server("b5"), sc.server("b6")
    moves_before = a3.log().count("moved to")
    b5.stop()
    b6.stop()
    try:
        def a3_zone() -> object:  # (a coroutine: /gatewayz is read in a thread)
            return asyncio.to_thread(lambda: sc.outbound_zone("a3")["B"])

        async def a3_in(zones: tuple[str, ...]) -> bool:
            return await a3_zone() in zones

        def a3_gateway_log() -> list[str]:
            return [line for line in a3.log().splitlines() if "gateway" in line][-30:]

        await until(lambda: a3_in(("z1", "z2")), "a3 reconnected to B in another zone", timeout=60, interval=0.25)
        got: Counter[int] = Counter()
        sub = await nats.connect(sc.server("b1").url)
        pub = await nats.connect(a3.url)
        try:
            async def on_msg(msg: Msg) -> None:
                got[int(msg.data)] += 1

            await sub.subscribe("moves.>", cb=on_msg)
            await sub.flush()

            async def probe() -> bool:
                await pub.publish("moves.probe", b"-1")
                await pub.flush()
                return -1 in got

            await until(probe, "a probe from a3 on b1", timeout=30, interval=0.2)
            sent = 0
            stop = asyncio.Event()

            async def publish() -> None:
                nonlocal sent
                while not stop.is_set():
                    for _ in range(10):
                        await pub.publish("moves.seq", str(sent).encode())
                        sent += 1
                    await pub.flush()
                    await asyncio.sleep(0.005)

            task = asyncio.create_task(publish())
            await asyncio.to_thread(b5.start, START_TIMEOUT)
            await until(lambda: a3.log().count("moved to") > moves_before, "a3 moving back to z3", timeout=90,
                        interval=0.25, show=a3_gateway_log)
            assert await a3_in(("z3",)), a3_gateway_log()
            after = sent
            await until(lambda: sent > after + 200, "200 messages over the new connection", timeout=30)
            stop.set()
            await task
            await until(lambda: len(got) - (-1 in got) >= sent, "every message on b1", timeout=30,
                        show=lambda: (len(got), sent))
            assert {n for n in got if n >= 0} == set(range(sent)), "a message was lost"
            assert {got[n] for n in range(sent)} == {1}, "a message arrived twice"
        finally:
            await sub.close()
            await pub.close()
    finally:
        for s in (b5, b6):
            if s.proc is None or s.proc.poll() is not None:
                await asyncio.to_thread(s.start, START_TIMEOUT)
