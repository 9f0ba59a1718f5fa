"""Every server of a cluster loses power at once: the R3 stream and every acknowledged message survive.

Three zonebus servers (default settings, default workers), each store on its own power-loss file system
(`zonebus.testing.powerloss`), and the shared store (`file://`, what a cluster's file streams live on: an NFS
or EFS directory) on a fourth, which loses power too. Publishers await the PubAcks of unique values on an R3
file stream; once 200 are acknowledged, every server is killed (SIGKILL) while publishes are still in flight
(so each store has writes not yet fsynced: a cut after the publishers stopped found none once, and proved
nothing), and every file system drops what was not fsynced. Restarted on what survived, the meta group must still
know the stream (its Raft log and vote are fsynced before any Raft message leaves: `zonebus.meta.durability`;
before that, this ended in "stream not found"), and the stream must hold every acknowledged value once.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path

import nats
import pytest
from nats.js.api import AckPolicy, ConsumerConfig

from zonebus.testing.jsapi import create_stream_retrying
from zonebus.testing.polling import until
from zonebus.testing.powerloss import PowerLossMount, PowerLossUnavailable, loss_report, power_cycle
from zonebus.testing.processes import ServerProcess, cluster_config, free_port, start_parallel

pytestmark = pytest.mark.timeout(240)

NAMES = ("a", "b", "c")
PUBLISHERS = 6
ACKED_BEFORE = 200


def _servers(tmp: Path, mounts: list[PowerLossMount]) -> list[ServerProcess]:
    """Servers a, b, c on mounts 0..2; the shared store on mount 3."""
    ports = [free_port() for _ in NAMES]
    servers = []
    shared = f"file://{mounts[3].mountpoint}/shared"
    for i, name in enumerate(NAMES):
        conf = cluster_config(name, ports[i], [p for j, p in enumerate(ports) if j != i], tags=[f"az:z{i + 1}"],
                              extra=f'jetstream {{ store_dir: "{mounts[i].mountpoint}/store", '
                                    f'shared_store: "{shared}" }}')
        (tmp / name).mkdir(exist_ok=True)
        servers.append(ServerProcess("zonebus", conf, workdir=tmp / name))
    return servers


async def _publish(urls: list[str], acked: set[str], attempted: set[str], stop: asyncio.Event) -> None:
    """Publish unique values from PUBLISHERS publishers, each awaiting its PubAck, until `stop`; `acked` and
    `attempted` fill as they go (a publish that fails once `stop` is set ends its publisher)."""
    nc = await nats.connect(servers=urls, max_reconnect_attempts=-1, reconnect_time_wait=0.2)
    try:
        await create_stream_retrying(nc, {"name": "PLC", "subjects": ["plc.>"], "storage": "file",
                                          "num_replicas": 3}, time.monotonic() + 30, "the R3 stream")
        js = nc.jetstream(timeout=2)
        await js.add_consumer("PLC", ConsumerConfig(durable_name="kept", ack_policy=AckPolicy.EXPLICIT))

        async def publisher(w: int) -> None:
            n = 0
            while not stop.is_set():
                value = f"{w}-{n}"
                attempted.add(value)
                try:
                    await js.publish(f"plc.{w}", value.encode())
                except (nats.errors.Error, TimeoutError):
                    if stop.is_set():
                        return
                    raise
                acked.add(value)
                n += 1

        await asyncio.gather(*(publisher(w) for w in range(PUBLISHERS)))
    finally:
        with contextlib.suppress(Exception):
            await nc.close()


async def _read_back(urls: list[str]) -> tuple[list[str], int]:
    """Every value in the stream once it is served again, and how many "stream not found" answers came before
    (a stream lost by the meta group is never served again: the wait fails)."""
    nc = await nats.connect(servers=urls, max_reconnect_attempts=-1, reconnect_time_wait=0.2)
    try:
        js = nc.jetstream(timeout=5)
        info = None
        not_found = 0

        async def stream_served() -> bool:
            nonlocal info, not_found
            try:
                info = await js.stream_info("PLC")
            except nats.js.errors.NotFoundError:
                not_found += 1  # (seen once in 16 runs, right after the restart; which server answered so is open)
                return False
            except (nats.errors.Error, TimeoutError):
                return False
            return True

        await until(stream_served, "the stream served again (not lost by the meta group)", timeout=90)
        assert info is not None
        assert (await js.consumer_info("PLC", "kept")).config.durable_name == "kept"
        sub = await js.pull_subscribe("plc.>", durable="reader", stream="PLC")
        read: list[str] = []
        while len(read) < info.state.messages:
            read.extend(m.data.decode() for m in await sub.fetch(500, timeout=10))
        return read, not_found
    finally:
        await nc.close()


async def test_every_server_loses_power_and_nothing_acknowledged_is_lost(tmp_path: Path) -> None:
    mounts: list[PowerLossMount] = []
    try:
        for name in (*NAMES, "shared"):
            mounts.append(PowerLossMount(tmp_path / f"fs-{name}").start())
    except PowerLossUnavailable as exc:
        for m in mounts:
            m.stop()
        pytest.skip(f"power loss simulation unavailable: {exc}")
    servers = _servers(tmp_path, mounts)
    try:
        start_parallel(servers, timeout=60)
        acked: set[str] = set()
        attempted: set[str] = set()
        stop = asyncio.Event()
        publishing = asyncio.create_task(_publish([s.url for s in servers], acked, attempted, stop))
        await until(lambda: len(acked) >= ACKED_BEFORE or publishing.done(), f"{ACKED_BEFORE} publishes acked",
                    timeout=60)
        if publishing.done():
            publishing.result()  # (a publisher failed before the power loss: its error)
        dropped = power_cycle(servers, mounts)  # while publishes are in flight
        stop.set()
        await asyncio.wait_for(publishing, 60)
        read, not_found = await _read_back([s.url for s in servers])
    finally:
        for s in servers:
            s.stop()
        for m in mounts:
            m.stop()
    r = loss_report(acked, attempted, read, dropped)
    lost, unexpected, report = r.lost, r.unexpected, r.line
    print(f"{report}; 'stream not found' answers before it was served again: {not_found}")
    assert any(d["bytes"] or d["entries"] for d in dropped), f"nothing was pending: {report}"
    assert not lost, f"{report}: lost {sorted(lost)[:20]}"
    assert not unexpected, report
