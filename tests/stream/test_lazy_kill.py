"""kill -9 under a lazy `sync_interval`: a run of publishes is written to the kernel with one `os.write` per segment
before its PubAcks go out (`FileStore.store_run`), so a SIGKILL of every worker (no power loss) loses nothing
acknowledged. Four publishers keep 200 publishes in flight each (nats-py's `publish_async`, so the server reads
them in runs), header-less, on varied subjects and sizes; once 3,000 are acked the server is killed mid-stream,
restarted on the same directory, and the stream read back whole: lost = acked - read must be 0, duplicates and
unexpected values are counted and reported. The server runs with its default worker count."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import nats
import pytest

from zonebus.testing.faultload import read_back
from zonebus.testing.powerloss import loss_report
from zonebus.testing.processes import ServerProcess

PUBLISHERS = 4
WINDOW = 200
ACKED_BEFORE_KILL = 3000


async def _publish_until_killed(server: ServerProcess) -> tuple[set[str], set[str]]:
    nc = await nats.connect(server.url, allow_reconnect=False, connect_timeout=2)
    js = nc.jetstream(timeout=2)  # (after the kill, an unknown outcome within 2 s)
    await js.add_stream(name="LZ", subjects=["lz.>"])
    acked: set[str] = set()
    attempted: set[str] = set()
    enough = asyncio.Event()

    async def publisher(w: int) -> None:
        n = 0
        while True:
            window = []
            for _ in range(WINDOW):
                value = f"{w}-{n}"
                attempted.add(value)
                payload = f"{value} ".encode() + b"x" * (n * 37 % 700)
                try:
                    window.append((value, await js.publish_async(f"lz.{w}.{n % 50}", payload)))
                except Exception:  # the connection is gone (the kill)
                    break
                n += 1
            for value, fut in window:
                try:  # (a PubAck takes ms; after the kill nats-py may never settle the future: an unknown outcome)
                    await asyncio.wait_for(fut, 5)
                except (Exception, asyncio.CancelledError):  # the kill: an unknown outcome
                    return
                acked.add(value)
            if len(window) < WINDOW:
                return
            if len(acked) >= ACKED_BEFORE_KILL:
                enough.set()

    tasks = [asyncio.create_task(publisher(w)) for w in range(PUBLISHERS)]
    await asyncio.wait_for(enough.wait(), 60)
    server.kill()  # mid-stream: every publisher has a window in flight
    await asyncio.wait_for(asyncio.gather(*tasks), 20)
    with contextlib.suppress(Exception):
        await nc.close()
    return acked, attempted


@pytest.mark.timeout(120)
async def test_kill_9_with_a_lazy_sync_interval_loses_nothing_acknowledged(tmp_path: Path) -> None:
    conf = f'jetstream {{ store_dir: "{tmp_path}/store", sync_interval: "2m" }}\n'
    server = ServerProcess("zonebus", conf).start()
    try:
        acked, attempted = await _publish_until_killed(server)
    finally:
        server.kill()
        server.stop()
    again = ServerProcess("zonebus", conf).start()
    try:
        nc = await nats.connect(again.url, allow_reconnect=False, connect_timeout=2)
        try:
            read = [data.split(b" ", 1)[0].decode() for _seq, data in await read_back(nc, "LZ")]
        finally:
            await nc.close()
    finally:
        again.stop()
    r = loss_report(acked, attempted, read, "nothing (a SIGKILL only)")
    print(r.line)
    assert len(acked) >= ACKED_BEFORE_KILL
    assert not r.lost, f"{r.line}: lost {sorted(r.lost)[:20]}"
    assert not r.unexpected and not r.duplicates, r.line
    for w in range(PUBLISHERS):  # each publisher's values in the order it published them
        mine = [int(v.split("-")[1]) for v in read if v.startswith(f"{w}-")]
        assert mine == sorted(mine), f"publisher {w} out of order: {mine[:30]}"
