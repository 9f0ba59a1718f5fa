"""Power loss under a file stream: kill -9 the server and drop every write not fsynced, at once.

The store directory is on `zonebus.testing.powerloss`'s FUSE file system. Eight publishers each publish unique
values (`<publisher>-<n>`) and await every PubAck; once 300 are acked the server is killed (SIGKILL, every
worker) and the file system loses power. Restarted on what survived, the stream must hold every acknowledged
value: lost = acked - read is 0 with zonebus's default (`sync_interval: always`, group commit), duplicates
and unexpected values are counted. The same run with nats-server's lazy `sync_interval` loses acknowledged
values, which shows the simulation bites. In both modes the stream and its durable consumer survive (their
metadata is fsynced when they are created).
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import nats
import pytest
from nats.js.api import AckPolicy, ConsumerConfig

from zonebus.testing.powerloss import PowerLossMount, PowerLossUnavailable, loss_report
from zonebus.testing.processes import ServerProcess

PUBLISHERS = 8
ACKED_BEFORE_KILL = 300


def _mount(root: Path) -> PowerLossMount:
    try:
        return PowerLossMount(root).start()
    except PowerLossUnavailable as exc:
        pytest.skip(f"power loss simulation unavailable: {exc}")


async def _publish_until_killed(url: str, server: ServerProcess, fs: PowerLossMount
                                ) -> tuple[set[str], set[str], dict[str, int]]:
    """Publish until ACKED_BEFORE_KILL are acked, then kill -9 + power loss; (acked, attempted, dropped)."""
    nc = await nats.connect(url, allow_reconnect=False, connect_timeout=2)
    js = nc.jetstream(timeout=1)  # (after the kill, an unknown outcome within 1 s)
    await js.add_stream(name="PL", subjects=["pl.>"])
    await js.add_consumer("PL", ConsumerConfig(durable_name="kept", ack_policy=AckPolicy.EXPLICIT))
    acked: set[str] = set()
    attempted: set[str] = set()
    enough = asyncio.Event()

    async def publisher(w: int) -> None:
        n = 0
        while True:
            value = f"{w}-{n}"
            attempted.add(value)
            try:
                await js.publish(f"pl.{w}", value.encode())
            except Exception:  # the kill: an unknown outcome
                return
            acked.add(value)
            if len(acked) >= ACKED_BEFORE_KILL:
                enough.set()
            n += 1

    tasks = [asyncio.create_task(publisher(w)) for w in range(PUBLISHERS)]
    await asyncio.wait_for(enough.wait(), 30)
    acked_at_kill = set(acked)
    server.kill()
    dropped = fs.power_loss()
    await asyncio.wait_for(asyncio.gather(*tasks), 10)
    with contextlib.suppress(Exception):
        await nc.close()
    # an ack that raced the kill is a value the server stored: it counts as acked too
    return acked_at_kill | acked, attempted, dropped


async def _read_back(url: str) -> list[str]:
    nc = await nats.connect(url, allow_reconnect=False, connect_timeout=2)
    try:
        js = nc.jetstream(timeout=5)
        try:
            info = await js.stream_info("PL")
        except nats.js.errors.NotFoundError:
            return []
        assert (await js.consumer_info("PL", "kept")).config.durable_name == "kept"  # created before: kept too
        await js.add_consumer("PL", ConsumerConfig(durable_name="reader", ack_policy=AckPolicy.NONE))
        sub = await js.pull_subscribe_bind(durable="reader", stream="PL")
        read: list[str] = []
        while len(read) < info.state.messages:
            read.extend(m.data.decode() for m in await sub.fetch(500, timeout=5))
        return read
    finally:
        await nc.close()


async def _run(tmp_path: Path, sync: str) -> tuple[set[str], set[str], list[str], dict[str, int]]:
    fs = _mount(tmp_path / "fs")
    conf = f'jetstream {{ store_dir: "{fs.mountpoint}/store"{sync} }}\n'
    server = ServerProcess("zonebus", conf).start()
    try:
        acked, attempted, dropped = await _publish_until_killed(server.url, server, fs)
        dropped["warned"] = "can be lost on power loss" in server.log()  # the lazy mode's warning at start
    finally:
        server.kill()
        server.stop()
        fs.stop()
    fs.start()
    again = ServerProcess("zonebus", conf).start()
    try:
        read = await _read_back(again.url)
    finally:
        again.stop()
        fs.stop()
    return acked, attempted, read, dropped


@pytest.mark.timeout(90)
async def test_power_loss_loses_no_acknowledged_message(tmp_path: Path) -> None:
    acked, attempted, read, dropped = await _run(tmp_path, "")
    r = loss_report(acked, attempted, read, dropped)
    lost, unexpected, duplicates, report = r.lost, r.unexpected, r.duplicates, r.line
    print(report)
    assert len(acked) >= ACKED_BEFORE_KILL
    assert not lost, f"{report}: lost {sorted(lost)[:20]}"
    assert not unexpected and not duplicates, report
    assert not dropped["warned"]
    for w in range(PUBLISHERS):  # each publisher's values in the order it published them
        mine = [int(v.split("-")[1]) for v in read if v.startswith(f"{w}-")]
        assert mine == sorted(mine), f"publisher {w} out of order: {mine[:30]}"


@pytest.mark.timeout(90)
async def test_lazy_sync_interval_loses_acknowledged_messages(tmp_path: Path) -> None:
    """nats-server's default, an explicit opt-in in zonebus: acked messages not yet fsynced are lost."""
    acked, _attempted, read, dropped = await _run(tmp_path, ', sync_interval: "1m"')
    lost = acked - set(read)
    assert dropped["bytes"] > 0 and dropped["warned"], dropped
    assert len(lost) > 0, f"acked {len(acked)}, read {len(read)}: the lazy mode lost nothing (dropped {dropped})"
