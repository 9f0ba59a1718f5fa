"""`$JS.API.STREAM.MSG.GET` served in the client's zone (issue #24, item 5): a stream led by b1 (z2); clients on
a2 (z1) and c1 (z3) get the very answers the leader gives (found, not found, by subject, bad requests), from
their zone's proxy, with no payload crossing zones; and what a client has just had acknowledged (a publish, a
delete) shows at once: the proxy first asks the leader for its durable batch and waits for its snapshot to
apply it."""

from __future__ import annotations

import asyncio
import json

import nats
import pytest

from tests.zonerouter.kit import FULL, LAYOUT, full_view, router_info, start_zoned, stream_in_z2
from zonebus.testing.polling import wait_until

BIG = 32 * 1024


@pytest.fixture(scope="module")
def zoned(tmp_path_factory: pytest.TempPathFactory):
    z = start_zoned(tmp_path_factory.mktemp("zrget"), LAYOUT, proxy=True)
    yield z
    z.stop()


async def _get(nc: nats.NATS, body: bytes) -> dict:
    return json.loads((await nc.request("$JS.API.STREAM.MSG.GET.MG", body, timeout=5)).data)


def _gets(zoned) -> tuple[int, int]:
    """(answered by a proxy, handed to the leader) over every server."""
    readers = [router_info(s).get("reader", {}) for s in zoned.servers.values()]
    return sum(r.get("msg_gets", 0) for r in readers), sum(r.get("msg_gets_to_leader", 0) for r in readers)


@pytest.mark.timeout(90)
async def test_msg_get_answered_in_the_clients_zone_like_the_leader(zoned) -> None:
    s = zoned.servers
    await asyncio.to_thread(wait_until, full_view(zoned, FULL), "the full mapping")
    nc = await nats.connect(s["b1"].url)
    far = {name: await nats.connect(s[name].url, name=f"get-{name}?az={zone}")
           for name, zone in (("a2", "z1"), ("c1", "z3"))}
    try:
        await stream_in_z2(nc, "MG", ["mg.>"])
        js = nc.jetstream(timeout=10)
        for i, subj in enumerate(["mg.a", "mg.b", "mg.a", "mg.c"]):
            await js.publish(subj, f"v{i}".encode(), headers={"K": str(i)})
        await js.publish("mg.big", b"x" * BIG)
        requests = [b'{"seq":2}', b'{"seq":99}', b'{"last_by_subj":"mg.a"}', b'{"next_by_subj":"mg.c","seq":1}',
                    b'{"next_by_subj":"mg.zz","seq":1}', b"{}", b"{", b'{"seq":5}']
        for body in requests:
            want = await _get(nc, body)
            for name, c in far.items():
                assert await _get(c, body) == want, (name, body)
        assert (await _get(nc, b'{"seq":2}'))["message"]["hdrs"]  # (headers are compared too)
        # nats-py's get_msg (no direct gets on this stream: it asks STREAM.MSG.GET)
        m = await far["a2"].jetstream(timeout=5).get_msg("MG", subject="mg.a")
        assert (m.seq, m.data, m.headers) == (3, b"v2", {"K": "2"})
        # what a client just had acknowledged shows at once: publishes and deletes from z1 and z3
        for name, c in far.items():
            cjs = c.jetstream(timeout=10)
            for i in range(10):
                ack = await cjs.publish(f"mg.{name}", f"{name}:{i}".encode())
                got = await _get(c, json.dumps({"last_by_subj": f"mg.{name}"}).encode())
                assert got["message"]["seq"] == ack.seq, (name, i, got)
            ok = json.loads((await c.request("$JS.API.STREAM.MSG.DELETE.MG", json.dumps({"seq": ack.seq}).encode(),
                                             timeout=5)).data)
            assert ok.get("success") is True, ok
            assert (await _get(c, json.dumps({"seq": ack.seq}).encode()))["error"]["err_code"] == 10037
        # no payload crosses zones for gets: 20 gets of the 32 KiB message from z1 and z3
        zoned.proxy.reset()
        for c in far.values():
            for _ in range(10):
                assert len((await _get(c, b'{"seq":5}'))["message"]["data"]) > BIG
        crossed = zoned.cross_zone_bytes()
        print(f"cross-zone bytes for 20 gets of {BIG} bytes: {crossed}")
        assert crossed < BIG, crossed
        proxied, to_leader = await asyncio.to_thread(_gets, zoned)
        assert proxied >= 2 * (len(requests) + 10 + 1 + 10) and to_leader == 0, (proxied, to_leader)
    finally:
        for c in (nc, *far.values()):
            await c.close()
