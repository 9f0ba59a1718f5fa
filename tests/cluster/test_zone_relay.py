"""The zone relay with real servers: three zones of two zonebus servers each, every route through a byte-counting
proxy (`zonebus.testing.zonecluster`). A message with interest on both servers of another zone crosses into it
once (one relay frame, fanned out by that zone's relay), every plain subscriber still gets every message once
and in order, a queue group still gets each message once, a relay killed with -9 mid-stream costs only what
was in flight, a relay that goes silent (SIGSTOP) is passed over within two route ping intervals, and a
nats-server in a remote zone gets the one-hop traffic as before.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import nats
import pytest
from nats.aio.client import Client

from zonebus.cluster.relay import relay_among
from zonebus.cluster.route import RouteConnection
from zonebus.testing.payloads import json_event
from zonebus.testing.polling import until
from zonebus.testing.processes import wait_for_mesh
from zonebus.testing.zonecluster import ZoneCluster

pytestmark = pytest.mark.timeout(120)

PROBE = -1  # the seq of probe messages (sent until every subscriber saw one; left out of the counts)
SIZE = 750


def started(tmp: Path, zones: int, per_zone: int, impls: list[str] | None = None) -> ZoneCluster:
    def store(i: int, t: Path) -> str:  # ZoneCluster starts nats-server with -js: each its own store
        return f'jetstream {{ store_dir: "{t}/js{i}" }}' if impls and impls[i] == "nats" else ""

    zc = ZoneCluster("zone relay", "zonebus", store, zones=zones, per_zone=per_zone, impls=impls)
    zc.start(tmp)
    try:
        wait_for_mesh(zc.servers, time.monotonic() + 30)
    except Exception:
        zc.stop()
        raise
    return zc


@pytest.fixture(scope="module")
def six(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ZoneCluster]:
    """z1: s1 s2, z2: s3 s4, z3: s5 s6 (zonebus, relay on by default: the tags name zones)."""
    zc = started(tmp_path_factory.mktemp("relay6"), 3, 2)
    yield zc
    zc.stop()


def seqs(into: dict[str, list[int]], label: str):  # noqa: ANN201
    """A nats-py callback recording each JSON message's `seq` under `label`."""
    into[label] = []

    async def cb(msg) -> None:  # noqa: ANN001
        into[label].append(json.loads(msg.data)["seq"])
    return cb


async def probed(pub: Client, subject: str, got: dict[str, list[int]]) -> None:
    """Publish probes until every subscriber has one (the interest reached every server, over relays too)."""
    async def everyone() -> bool:
        await pub.publish(subject, json.dumps({"seq": PROBE}).encode())
        await pub.flush()
        return all(PROBE in v for v in got.values())
    await until(everyone, f"a probe on every subscriber of {subject}", show=lambda: {k: len(v) for k, v in got.items()})


def real(xs: list[int]) -> list[int]:
    return [x for x in xs if x != PROBE]


async def test_fan_out_crosses_into_each_zone_once(six: ZoneCluster) -> None:
    """A subscriber on every server, a publisher in z1: every subscriber gets every message once, in order, and
    each remote zone receives about one copy (two without the relay)."""
    s = six.servers
    for x in s:
        routes = x.http_get("/routez")["routes"]
        assert len(routes) == 5 and all(r["zone_relay"] for r in routes), routes
    rng = random.Random(3)
    n = 300
    payloads = [json_event(rng, i, SIZE) for i in range(n)]
    ncs = [await nats.connect(x.url) for x in s]
    pub = await nats.connect(s[0].url)
    got: dict[str, list[int]] = {}
    try:
        for name, nc in zip(six.names, ncs, strict=True):
            await nc.subscribe("events.fan", cb=seqs(got, name))
            await nc.flush()
        await probed(pub, "events.fan", got)
        six.reset_bytes()
        for p in payloads:
            await pub.publish("events.fan", p)
        await pub.flush()
        await until(lambda: all(len(real(v)) >= n for v in got.values()), "every message on every subscriber",
                    show=lambda: {k: len(real(v)) for k, v in got.items()})
        for name, v in got.items():
            assert real(v) == list(range(n)), f"{name}: not every message once and in order"
        payload_bytes = sum(len(p) for p in payloads)
        for zone in ("z2", "z3"):
            copies = six.bytes_into(zone) / payload_bytes
            assert copies < 1.3, f"{copies:.2f} copies into {zone}"
    finally:
        for nc in ncs + [pub]:
            await nc.close()


class Received:
    """Numbered messages (the number is the payload) per receiver label, in arrival order, with arrival times."""

    def __init__(self, subject: str) -> None:
        self.subject = subject
        self.by: dict[str, list[int]] = {}
        self.at: dict[str, list[float]] = {}

    async def join(self, nc: Client, label: str, queue: str = "") -> None:
        self.by[label], self.at[label] = [], []

        async def cb(msg) -> None:  # noqa: ANN001
            self.by[label].append(int(msg.data))
            self.at[label].append(time.monotonic())
        await nc.subscribe(self.subject, queue=queue, cb=cb)
        await nc.flush()

    async def publish(self, pub: Client, number: int) -> None:
        await pub.publish(self.subject, b"%d" % number)

    def labels(self, prefix: str, names: list[str]) -> set[str]:
        return {f"{prefix}.{x}" for x in names}

    def numbered(self, label: str, numbers: range) -> list[int]:
        return [n for n in self.by[label] if n in numbers]

    def queue_counts(self, numbers: range, labels: set[str]) -> dict[int, int]:
        counts = dict.fromkeys(numbers, 0)
        for label in labels:
            for n in self.by[label]:
                if n in counts:
                    counts[n] += 1
        return counts


async def members_everywhere(zc: ZoneCluster, rec: Received) -> list[Client]:
    """A plain subscriber (`p.<server>`) and a member of queue group `q` (`q.<server>`) on every server."""
    ncs = []
    for name, server in zip(zc.names, zc.servers, strict=True):
        nc = await nats.connect(server.url, allow_reconnect=False)  # (those of a killed server stay down)
        ncs.append(nc)
        await rec.join(nc, f"p.{name}")
        await rec.join(nc, f"q.{name}", "q")
    return ncs


async def reached(rec: Received, pub: Client, number: int, labels: set[str]) -> None:
    """Publish `number` (a probe or a trailer, same subject) until every plain subscriber in `labels` got it:
    then whatever that publisher sent before it has arrived there too."""
    async def everyone() -> bool:
        await rec.publish(pub, number)
        await pub.flush()
        return all(number in rec.by[label] for label in labels)
    await until(everyone, f"{number} on {sorted(labels)}")


async def test_queue_group_and_plain_subscribers_on_every_server(six: ZoneCluster) -> None:
    """A queue group with a member on every server and a plain subscriber on every server (so that queue picks
    in a remote zone meet relay frames), a publisher per zone: the group gets each message once, each plain
    subscriber every message once, in each publisher's order."""
    rec = Received("events.mix")
    ncs = await members_everywhere(six, rec)
    pubs = [await nats.connect(six.servers[i].url) for i in (0, 2, 4)]
    plain = rec.labels("p", six.names)
    try:
        for k, pub in enumerate(pubs):
            await reached(rec, pub, 100_000 + k, plain)
        for k, pub in enumerate(pubs):
            for n in range(k * 200, (k + 1) * 200):
                await rec.publish(pub, n)
            await pub.flush()
        for k, pub in enumerate(pubs):  # trailers on the same subject: whatever came before has arrived
            await reached(rec, pub, 200_000 + k, plain)
        for label in plain:
            for k in range(3):
                mine = rec.numbered(label, range(k * 200, (k + 1) * 200))
                assert mine == list(range(k * 200, (k + 1) * 200)), f"{label}: not publisher {k}'s messages once"
        counts = rec.queue_counts(range(600), rec.labels("q", six.names))
        assert all(c == 1 for c in counts.values()), {n: c for n, c in counts.items() if c != 1}
    finally:
        for nc in ncs + pubs:
            await nc.close()


async def test_a_silent_relay_is_passed_over(six: ZoneCluster) -> None:
    """SIGSTOP z3's relay (its routes stay open, its PONGs stop): within two route ping intervals its zone
    sibling gets new messages again through another path, none twice; after SIGCONT the stopped server catches up."""
    rec = Received("events.silent")
    s = six.servers
    ids = {name: x.info["server_id"] for name, x in zip(six.names, s, strict=True)}
    silent = "s5" if relay_among(rec.subject.encode(), [ids["s5"], ids["s6"]]) == ids["s5"] else "s6"
    sibling = "s6" if silent == "s5" else "s5"
    ncs = [await nats.connect(x.url, allow_reconnect=False) for x in s]
    for name, nc in zip(six.names, ncs, strict=True):
        await rec.join(nc, f"p.{name}")
    pub = ncs[0]
    stopped = s[six.names.index(silent)]
    pids = [stopped.proc.pid, *stopped.worker_pids()] if stopped.proc is not None else []
    try:
        await reached(rec, pub, 100_000, rec.labels("p", six.names))
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        stopped_at = time.monotonic()
        number = 0
        deadline = stopped_at + 2 * RouteConnection.PING_EVERY + 2.0
        while number not in rec.by[f"p.{sibling}"] and time.monotonic() < deadline:
            number += 1
            await rec.publish(pub, number)
            await asyncio.sleep(0.005)
        resumed = time.monotonic() - stopped_at
        assert number in rec.by[f"p.{sibling}"], "the sibling got nothing new while the relay was silent"
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)
    try:
        await reached(rec, pub, 200_000, rec.labels("p", six.names))
        assert resumed < 2 * RouteConnection.PING_EVERY + 1.0, f"resumed after {resumed:.1f} s"
        for label in rec.labels("p", six.names):
            mine = rec.numbered(label, range(1, number + 1))
            assert len(mine) == len(set(mine)), f"{label} got a message twice"
    finally:
        for nc in ncs:
            await nc.close()


async def test_kill_the_relay_mid_fan_out(six: ZoneCluster) -> None:
    """kill -9 z2's relay while z1 publishes: delivery to its zone sibling resumes within the route's ping
    interval, no plain subscriber gets a message twice or out of order, the queue group never gets one twice
    and gets every message published once the route was gone exactly once. (Last in this module: it kills s3
    or s4.)"""
    rec = Received("events.kill")
    s = six.servers
    ids = {name: x.info["server_id"] for name, x in zip(six.names, s, strict=True)}
    dead = "s3" if relay_among(rec.subject.encode(), [ids["s3"], ids["s4"]]) == ids["s3"] else "s4"
    sibling = "s4" if dead == "s3" else "s3"
    alive = [x for x in six.names if x != dead]
    ncs = await members_everywhere(six, rec)
    pub = await nats.connect(s[0].url)
    try:
        await reached(rec, pub, 100_000, rec.labels("p", six.names))
        number = 0
        for number in range(150):
            await rec.publish(pub, number)
            await asyncio.sleep(0.002)
        await asyncio.to_thread(s[six.names.index(dead)].kill)
        killed_at = time.monotonic()  # its processes have exited: their sockets are closed

        def route_gone() -> bool:
            return all(r["remote_name"] != dead for r in s[0].http_get("/routez")["routes"])
        while not await asyncio.to_thread(route_gone):
            number += 1
            await rec.publish(pub, number)
            await asyncio.sleep(0.002)
        resumed = number + 1  # published once s1 had dropped the route: every one must arrive
        for number in range(resumed, resumed + 150):
            await rec.publish(pub, number)
            await asyncio.sleep(0.002)
        total = range(number + 1)
        plain = rec.labels("p", alive)
        for k in range(3):
            await reached(rec, pub, 200_000 + k, plain)

        after = [t for t, n in zip(rec.at[f"p.{sibling}"], rec.by[f"p.{sibling}"], strict=True)
                 if 150 <= n < len(total)]  # published after the kill
        assert after and after[0] - killed_at < RouteConnection.PING_EVERY, \
            f"delivery did not resume in time: {after[0] - killed_at if after else None}"
        for label in plain:
            mine = rec.numbered(label, total)
            assert mine == sorted(set(mine)), f"{label}: a message twice or out of order: " + str(
                [(a, b) for a, b in zip(mine, mine[1:], strict=False) if b <= a][:5])
            assert set(range(resumed, len(total))) <= set(mine), f"{label}: lost a message after the route was gone"
        counts = rec.queue_counts(total, rec.labels("q", alive))
        assert all(c <= 1 for c in counts.values()), {n: c for n, c in counts.items() if c > 1}
        lost = [n for n in range(resumed, len(total)) if counts[n] != 1]
        assert not lost, (f"the queue group lost {len(lost)} after recovery (from {resumed}), e.g. {lost[:10]}; "
                          f"{ {k: len(rec.numbered(k, total)) for k in rec.by} } dead {dead}")
    finally:
        for nc in ncs + [pub]:
            if not nc.is_closed:
                await nc.close()


async def test_a_nats_server_in_a_remote_zone_gets_everything_once(tmp_path: Path) -> None:
    """z1: zonebus s1 (publisher), nats-server s2 and s3; z2: zonebus s4 and s5 (a relay), nats-server s6.
    Every subscriber gets every message once and in order; z2's zonebus servers receive about one copy; the
    routes to nats-server carry no relay."""
    zc = started(tmp_path, 2, 3, impls=["zonebus", "nats", "nats", "zonebus", "zonebus", "nats"])
    try:
        s = zc.servers
        relays = {r["remote_name"]: r["zone_relay"] for r in s[0].http_get("/routez")["routes"]}
        assert relays == {"s2": False, "s3": False, "s4": True, "s5": True, "s6": False}, relays
        rng = random.Random(5)
        n = 200
        payloads = [json_event(rng, i, SIZE) for i in range(n)]
        ncs = [await nats.connect(x.url) for x in s]
        pub = await nats.connect(s[0].url)
        got: dict[str, list[int]] = {}
        try:
            for name, nc in zip(zc.names, ncs, strict=True):
                await nc.subscribe("events.mixed", cb=seqs(got, name))
                await nc.flush()
            await probed(pub, "events.mixed", got)
            zc.reset_bytes()
            for p in payloads:
                await pub.publish("events.mixed", p)
            await pub.flush()
            await until(lambda: all(len(real(v)) >= n for v in got.values()), "every message on every subscriber",
                        show=lambda: {k: len(real(v)) for k, v in got.items()})
            for name, v in got.items():
                assert real(v) == list(range(n)), f"{name}: not every message once and in order"
            copies = zc.bytes_into("z2", only={"s4", "s5"}) / sum(len(p) for p in payloads)
            assert copies < 1.3, f"{copies:.2f} copies into z2's zonebus servers"
        finally:
            for nc in ncs + [pub]:
                await nc.close()
    finally:
        zc.stop()
