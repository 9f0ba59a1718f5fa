"""JetStream domains with the zone router: the API by `$JS.<domain>.API.` from every zone, PubAcks (the
proxy's too) naming the domain, and a pull consumer read by domain in another zone than the leader's."""

from __future__ import annotations

import asyncio

import nats
import pytest
from nats.js.api import AckPolicy, ConsumerConfig

from tests.zonerouter.kit import FULL, LAYOUT, full_view, start_zoned
from zonebus.testing.jsapi import api
from zonebus.testing.polling import until, wait_until

pytestmark = pytest.mark.timeout(120)


async def test_domain_api_through_the_router(tmp_path) -> None:
    zoned = start_zoned(tmp_path, LAYOUT, js_extra=", domain: hub")
    try:
        s = zoned.servers
        await asyncio.to_thread(wait_until, full_view(zoned, FULL), "the full mapping")
        na = await nats.connect(s["a1"].url, name="a?az=z1")
        nc = await nats.connect(s["c1"].url, name="c?az=z3")
        try:
            created: dict = {}

            async def create() -> bool:
                created.update(await api(na, "$JS.hub.API.STREAM.CREATE.DOM", {
                    "name": "DOM", "subjects": ["dom.>"], "storage": "file", "placement": {"tags": ["az:z2"]}}))
                return "error" not in created

            await until(create, "the stream created by domain", timeout=30, interval=0.2,
                        show=lambda: created)
            assert created["cluster"]["leader"] == "b1"
            js_a = na.jetstream(domain="hub", timeout=5)
            acks = [await js_a.publish("dom.x", f"m{i}".encode()) for i in range(5)]
            assert [(a.stream, a.seq, a.domain) for a in acks] == [("DOM", i + 1, "hub") for i in range(5)]
            js_c = nc.jetstream(domain="hub", timeout=5)
            await js_c.add_consumer("DOM", ConsumerConfig(durable_name="d", ack_policy=AckPolicy.NONE))
            psub = await js_c.pull_subscribe_bind(durable="d", stream="DOM")
            got = [m.data for m in await psub.fetch(5, timeout=5)]
            assert got == [f"m{i}".encode() for i in range(5)]
            info = await js_c.account_info()
            assert info.domain == "hub"
        finally:
            await na.close()
            await nc.close()
    finally:
        zoned.stop()
