"""Route epochs on real servers (epochs of 1 s): the meta leader bumps them, every server reports what it
committed, proxies trim their channels; kill -9 of a proxy mid-stream loses nothing acknowledged, and three
epochs later none of its channel objects (nor its channel) remain on the shared store, nor any object of a
committed epoch in the live channels."""

from __future__ import annotations

import asyncio
import time

import nats
import pytest
from nats.js.api import AckPolicy, ConsumerConfig

from tests.zonerouter.kit import FULL, LAYOUT, Publisher, full_view, router_info, start_zoned, stream_in_z2
from zonebus.testing.polling import wait_until


@pytest.fixture(scope="module")
def zoned(tmp_path_factory: pytest.TempPathFactory):
    z = start_zoned(tmp_path_factory.mktemp("zrepoch"), LAYOUT, js_extra=', zone_router_epoch: "1s"')
    yield z
    z.stop()


@pytest.mark.timeout(90)
async def test_kill_proxy_then_three_epochs_leave_no_orphans(zoned) -> None:
    s = zoned.servers
    await asyncio.to_thread(wait_until, full_view(zoned, FULL), "the full mapping")
    nc = await nats.connect(s["b1"].url)
    try:
        await stream_in_z2(nc, "EP", ["ep.>"])
    finally:
        await nc.close()
    epochs = await asyncio.to_thread(
        wait_until, lambda: (e := router_info(s["c1"]).get("epochs", {})).get("current", 0) >= 2 and e,
        "route epochs advancing")
    assert epochs["fenced"] == max(epochs["current"] - 2, 0)
    proxy = router_info(s["a1"])["proxies"]["z1"]["b1"]
    home = "a2" if proxy == "a1" else "a1"
    victim = router_info(s[proxy])["channel"]["id"]
    assert victim in zoned.channels()
    pub = Publisher([s[home].url], "p", "ep")
    task = asyncio.create_task(pub.run(time.monotonic() + 60))
    try:
        await pub.wait_acked(150)
        s[proxy].kill()  # mid-stream: its hand-offs and batches in flight are never answered
        await asyncio.to_thread(wait_until, full_view(zoned, {"z1": [home], "z2": ["b1"], "z3": ["c1"]}),
                                "the proxy left out")
        at_kill = router_info(s["c1"])["epochs"]["current"]
        n = len(pub.acked)
        await pub.wait_acked(n + 150)  # the surviving server of z1 proxies now
        pub.stop = True
        await task
    finally:
        pub.stop = True
        if not task.done():
            task.cancel()
    # three epochs later the dead proxy's channel is gone, and no live channel holds a committed epoch
    def settled() -> dict | None:
        e = router_info(s["c1"])["epochs"]
        if e["current"] < at_kill + 3 or e["committed"] < at_kill:
            return None
        return e if victim not in zoned.channels() else None
    e = await asyncio.to_thread(wait_until, settled, "the dead proxy's channel trimmed", timeout=30)
    for path in zoned.channel_batches():
        assert int(path.parent.name) > e["committed"], path
    assert sum(router_info(s[n])["epochs"]["removed_channels"] for n in (home, "b1", "c1")) >= 1
    # nothing acknowledged was lost (read back through c1's proxy: the read path), publisher order kept
    nc = await nats.connect(s["c1"].url)
    try:
        js = nc.jetstream(timeout=10)
        await js.add_consumer("EP", ConsumerConfig(durable_name="chk", ack_policy=AckPolicy.NONE))
        psub = await js.pull_subscribe_bind(durable="chk", stream="EP")
        total = (await js.stream_info("EP")).state.messages
        seen: list[int] = []
        while len(seen) < total:
            seen += [int(m.data.split(b":")[1]) for m in await psub.fetch(200, timeout=5)]
        assert seen == list(range(len(seen)))  # Nats-Msg-Id: no duplicates, no gaps, in order
        assert len(seen) >= len(pub.acked) and pub.acked == sorted(pub.acked)
    finally:
        await nc.close()
