"""Power loss under a durable queue group's log: kill -9 the server and drop every write not fsynced, at once.

A lone server keeps the group's log in its store_dir, on `zonebus.testing.powerloss`'s FUSE file system. With
no member yet, eight publishers publish unique values and await every PubAck; once 300 are acked the server
is killed (SIGKILL, every worker) and the file system loses power. Restarted on what survived, a member joins
and must receive every acknowledged value (lost 0; duplicates and unexpected values counted). With the lazy
`sync_interval` acknowledged values are lost, which shows the simulation bites.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path

import nats
import pytest

from tests.queue.kit import groups_block
from zonebus.testing.polling import until
from zonebus.testing.powerloss import PowerLossMount, PowerLossUnavailable, loss_report
from zonebus.testing.processes import ServerProcess

pytestmark = pytest.mark.timeout(90)
PUBLISHERS = 8
ACKED_BEFORE_KILL = 300


async def _publish_until_killed(server: ServerProcess, fs: PowerLossMount) -> tuple[set[str], set[str], dict]:
    nc = await nats.connect(server.url, allow_reconnect=False, connect_timeout=2)
    js = nc.jetstream(timeout=1)  # (after the kill, an unknown outcome within 1 s)
    acked: set[str] = set()
    attempted: set[str] = set()
    enough = asyncio.Event()

    async def publisher(w: int) -> None:
        n = 0
        while True:
            value = f"{w}-{n}"
            attempted.add(value)
            try:
                ack = await js.publish(f"orders.{w}", value.encode())
            except Exception:  # the kill: an unknown outcome
                return
            assert ack.stream == "QG_workers", ack
            acked.add(value)
            if len(acked) >= ACKED_BEFORE_KILL:
                enough.set()
            n += 1

    tasks = [asyncio.create_task(publisher(w)) for w in range(PUBLISHERS)]
    await asyncio.wait_for(enough.wait(), 30)
    server.kill()
    dropped = fs.power_loss()
    await asyncio.wait_for(asyncio.gather(*tasks), 10)
    with contextlib.suppress(Exception):
        await nc.close()
    return acked, attempted, dropped


async def _members_read(server: ServerProcess, expect: set[str]) -> list[str]:
    """What a member receives after the restart: until every value in `expect` came, or no more for a second
    (none at all for 3 s)."""
    got: list[str] = []
    nc = await nats.connect(server.url, allow_reconnect=False)

    async def on_msg(m) -> None:
        got.append(m.data.decode())

    await nc.subscribe("orders.>", queue="workers", cb=on_msg)
    await nc.flush()
    seen = -1

    started = time.monotonic()

    def settled() -> bool:  # every value expected came, or nothing more for a second (none at all for 3 s)
        nonlocal seen
        quiet, seen = seen == len(got), len(got)
        return expect <= set(got) or (quiet and (bool(got) or time.monotonic() - started > 3))

    await until(settled, "the stored messages delivered", timeout=30, interval=1.0)
    await nc.close()
    return got


async def _run(tmp_path: Path, sync: str) -> tuple[set[str], set[str], list[str], dict]:
    try:
        fs = PowerLossMount(tmp_path / "fs").start()
    except PowerLossUnavailable as exc:
        pytest.skip(f"power loss simulation unavailable: {exc}")
    conf = f'jetstream {{ store_dir: "{fs.mountpoint}/store"{sync} }}\n' + groups_block()
    server = ServerProcess("zonebus", conf, http_port=None).start()
    try:
        acked, attempted, dropped = await _publish_until_killed(server, fs)
    finally:
        server.kill()
        server.stop()
        fs.stop()
    fs.start()
    again = ServerProcess("zonebus", conf).start()
    try:
        read = await _members_read(again, acked)
    finally:
        again.stop()
        fs.stop()
    return acked, attempted, read, dropped


async def test_power_loss_loses_no_acknowledged_publish(tmp_path: Path) -> None:
    acked, attempted, read, dropped = await _run(tmp_path, "")
    r = loss_report(acked, attempted, read, dropped)
    lost, unexpected, report = r.lost, r.unexpected, r.line
    print(report)
    assert len(acked) >= ACKED_BEFORE_KILL
    assert not lost, f"{report}: lost {sorted(lost)[:20]}"
    assert not unexpected, report


async def test_lazy_sync_interval_loses_acknowledged_publishes(tmp_path: Path) -> None:
    acked, _attempted, read, dropped = await _run(tmp_path, ', sync_interval: "1m"')
    assert dropped["bytes"] > 0, dropped
    assert acked - set(read), f"acked {len(acked)}, read {len(read)}: the lazy mode lost nothing ({dropped})"
