"""Every server of a cluster loses power at once: the R3 stream and every acknowledged message survive.

Three zonebus servers (default settings, default workers), each store on its own power-loss file system
(`zonebus.testing.powerloss`), and the shared store (`file://`, what a cluster's file streams live on: an NFS
or EFS directory) on a fourth, which loses power too. Publishers await the PubAcks of unique values on an R3
file stream; once 200 are acknowledged, every server is killed (SIGKILL) and every file system drops what was
not fsynced. Restarted on what survived, the meta group must still know the stream (its Raft log and vote
are fsynced before any Raft message leaves: `zonebus.meta.durability`; before that, this ended in "stream not
found"), and the stream must hold every acknowledged value once.
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


async def _publish(urls: list[str]) -> tuple[set[str], set[str]]:
    """Publish until ACKED_BEFORE are acknowledged; (acknowledged, attempted) at that moment."""
    nc = await nats.connect(servers=urls, max_reconnect_attempts=-1, reconnect_time_wait=0.2)
    try:
        await create_stream_retrying(nc, {"name": "PLC", "subjects": ["plc.>"], "storage": "file",
                                          "num_replicas": 3}, time.monotonic() + 30, "the R3 stream")
        js = nc.jetstream(timeout=2)
        await js.add_consumer("PLC", ConsumerConfig(durable_name="kept", ack_policy=AckPolicy.EXPLICIT))
        acked: set[str] = set()
        attempted: set[str] = set()

        async def publisher(w: int) -> None:
            n = 0
            while len(acked) < ACKED_BEFORE:
                value = f"{w}-{n}"
                attempted.add(value)
                await js.publish(f"plc.{w}", value.encode())
                acked.add(value)
                n += 1

        await asyncio.wait_for(asyncio.gather(*(publisher(w) for w in range(PUBLISHERS))), 60)
        return set(acked), set(attempted)
    finally:
        with contextlib.suppress(Exception):
            await nc.close()


async def _read_back(urls: list[str]) -> list[str]:
    nc = await nats.connect(servers=urls, max_reconnect_attempts=-1, reconnect_time_wait=0.2)
    try:
        js = nc.jetstream(timeout=5)
        info = None

        async def stream_served() -> bool:
            nonlocal info
            try:
                info = await js.stream_info("PLC")
            except nats.js.errors.NotFoundError:
                raise AssertionError("stream not found after the power loss") from None
            except (nats.errors.Error, TimeoutError):
                return False
            return True

        await until(stream_served, "the stream served again", timeout=90)
        assert info is not None
        assert (await js.consumer_info("PLC", "kept")).config.durable_name == "kept"
        sub = await js.pull_subscribe("plc.>", durable="reader", stream="PLC")
        read: list[str] = []
        while len(read) < info.state.messages:
            read.extend(m.data.decode() for m in await sub.fetch(500, timeout=10))
        return read
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
        acked, attempted = await _publish([s.url for s in servers])
        dropped = power_cycle(servers, mounts)
        read = await _read_back([s.url for s in servers])
    finally:
        for s in servers:
            s.stop()
        for m in mounts:
            m.stop()
    r = loss_report(acked, attempted, read, dropped)
    lost, unexpected, report = r.lost, r.unexpected, r.line
    print(report)
    assert any(d["bytes"] or d["entries"] for d in dropped), f"nothing was pending: {report}"
    assert not lost, f"{report}: lost {sorted(lost)[:20]}"
    assert not unexpected, report
