"""Differential tests of JetStream stream mirrors and the 2.12 mirror removal (promotion) against nats-server.

Scenarios run unchanged on nats-server -js and zonebus -js (the session's shared processes) and their notes
are compared after normalisation (times dropped, a mirror's `active` reduced to its sign): a mirror copies its
origin's messages under the same sequences and times (origin deletions before the copy are deleted slots, the
first copy sets the first sequence), with `filter_subject`, `subject_transforms`, `opt_start_seq` and
`opt_start_time`; `mirror_direct` follows the origin's `allow_direct`; the config errors; an update may not
change `mirror` but may drop it, promoting the mirror to a normal stream that takes subjects and publishes.
nats.py's own `test_stream_mirror_removal` runs on both through nats.py, and a mirror and its promotion on a
3-server cluster of each. Then zonebus alone: a mirror resumes after a restart without copying twice, a mirror
of another account's stream is refused clearly, and a mirror on the zone router is read from other zones.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import tempfile
from typing import Any

import nats
import pytest

from tests.stream.kit import normalize, start_js
from tests.stream.kit_scenarios import Probe, first_difference, run_scenarios
from zonebus.testing.polling import until

_counter = itertools.count()


def _view(doc: Any) -> Any:
    """`normalize`, with a mirror's `active` (ns since the last contact) reduced to -1 or "seen"."""
    doc = normalize(doc)
    if isinstance(doc, dict) and isinstance(doc.get("mirror"), dict) and "active" in doc["mirror"]:
        active = doc["mirror"]["active"]
        assert isinstance(active, int)
        doc = {**doc, "mirror": {**doc["mirror"], "active": -1 if active < 0 else "seen"}}
    if isinstance(doc, dict) and isinstance(doc.get("config"), dict) and doc["config"].get("mirror", {}).get(
            "opt_start_time"):
        doc = {**doc, "config": {**doc["config"], "mirror": {**doc["config"]["mirror"], "opt_start_time": "<t>"}}}
    return doc


async def info(p: Probe, stream: str) -> dict:
    doc = await p.api(f"STREAM.INFO.{stream}")
    p.note("info", stream, _view(doc))
    return doc


async def synced(p: Probe, stream: str, last_seq: int) -> None:
    """Until the mirror holds `last_seq` and says it has no lag (unrecorded)."""
    async def caught_up() -> bool:
        doc = await p.api(f"STREAM.INFO.{stream}")
        return doc["state"]["last_seq"] >= last_seq and doc.get("mirror", {}).get("lag") == 0 and \
            doc["mirror"].get("active", -1) >= 0

    await until(caught_up, f"{stream} to mirror up to {last_seq}", 10)


async def messages(p: Probe, stream: str, origin: str | None = None) -> None:
    """Every sequence of the stream: subject, data, headers, and whether its time is the origin's."""
    state = (await p.api(f"STREAM.INFO.{stream}"))["state"]
    out = []
    for seq in range(max(1, state["first_seq"]), state["last_seq"] + 1):
        doc = await p.api(f"STREAM.MSG.GET.{stream}", {"seq": seq})
        msg = doc.get("message")
        if msg is None:
            out.append((seq, doc["error"]["err_code"]))
            continue
        same_time = None
        if origin is not None:
            o = (await p.api(f"STREAM.MSG.GET.{origin}", {"seq": seq})).get("message")
            same_time = o is not None and o["time"] == msg["time"]
        hdrs = base64.b64decode(msg["hdrs"]).decode() if msg.get("hdrs") else ""
        out.append((seq, msg["subject"], base64.b64decode(msg.get("data", "")).decode(), hdrs, same_time))
    p.note("messages", stream, out)


async def mirrors(p: Probe) -> None:
    o = f"MO{p.tag}"
    lo = o.lower()
    await p.call(f"STREAM.CREATE.{o}", {"name": o, "subjects": [f"{lo}.>"], "allow_direct": True},
                 keep=("config",))
    for i in range(6):
        await p.pub(f"{lo}.{i % 2}", f"m{i}".encode(), {"Nats-Msg-Id": f"id{i}"} if i == 4 else None)
    for seq in (1, 3):  # deleted before any mirror copies them: deleted slots (1: the first sequence moves)
        await p.call(f"STREAM.MSG.DELETE.{o}", {"seq": seq})
    variants = {
        "M": {"name": o},
        "F": {"name": o, "filter_subject": f"{lo}.1"},
        "S": {"name": o, "opt_start_seq": 5},
        "T": {"name": o, "subject_transforms": [{"src": f"{lo}.>", "dest": f"t{lo}.>"}]},
    }
    second = (await p.api(f"STREAM.MSG.GET.{o}", {"seq": 4}))["message"]["time"]
    variants["A"] = {"name": o, "opt_start_time": second}
    for key, mirror in variants.items():
        doc = await p.api(f"STREAM.CREATE.{key}{o}", {"name": f"{key}{o}", "mirror": mirror})
        p.note("create", key, _view(doc))
    for key in variants:
        await synced(p, f"{key}{o}", 6)
        await info(p, f"{key}{o}")
        await messages(p, f"{key}{o}", o)
    # the mirror keeps what the origin deletes afterwards, and follows new messages
    await p.call(f"STREAM.MSG.DELETE.{o}", {"seq": 2})
    await p.pub(f"{lo}.1", b"late", {"Nats-Expected-Last-Sequence": "6"})
    await synced(p, f"M{o}", 7)
    await info(p, f"M{o}")
    await messages(p, f"M{o}", o)
    # a consumer on a mirror sees the origin's sequences
    await p.call(f"CONSUMER.CREATE.M{o}.c", {"stream_name": f"M{o}", "config": {
        "durable_name": "c", "ack_policy": "none", "filter_subject": f"{lo}.1"}}, keep=("num_pending",))
    await p.pull(f"M{o}", "c", {"batch": 5, "no_wait": True}, 3)
    # a mirror of a stream that does not exist: an error in its info (nats-server retries with a backoff)
    n = f"NO{p.tag}"
    doc = await p.api(f"STREAM.CREATE.N{o}", {"name": f"N{o}", "mirror": {"name": n}})
    p.note("create missing", _view(doc))

    async def missing() -> bool:
        return "error" in (await p.api(f"STREAM.INFO.N{o}")).get("mirror", {})

    await until(missing, "the missing origin reported", 10)
    await info(p, f"N{o}")
    for s in [*(f"{k}{o}" for k in [*variants, "N"]), o]:
        await p.call(f"STREAM.DELETE.{s}")


async def config_errors(p: Probe) -> None:
    o, m = f"EO{p.tag}", f"EM{p.tag}"
    lo = o.lower()
    await p.call(f"STREAM.CREATE.{o}", {"name": o, "subjects": [f"{lo}.>"]}, keep=("config",))
    for mirror in ({"name": o, "subject_transforms": [{"src": "a..b", "dest": "x.>"}]},
                   {"name": o, "subject_transforms": [{"src": f"{lo}.*", "dest": "x.$3"}]},
                   {"name": o, "subject_transforms": [{"src": f"{lo}.>", "dest": "x.>"},
                                                      {"src": f"{lo}.a", "dest": "y"}]},
                   {"name": ""}):
        await p.call(f"STREAM.CREATE.{m}", {"name": m, "mirror": mirror})
    await p.call(f"STREAM.CREATE.{m}", {"name": m, "mirror_direct": True})
    await p.call(f"STREAM.CREATE.{m}", {"name": m, "mirror": {"name": o}}, keep=("config",))
    await p.call(f"STREAM.CREATE.{m}", {"name": m, "mirror": {"name": o}}, keep=("config",))  # idempotent
    await p.call(f"STREAM.CREATE.{m}", {"name": m, "mirror": {"name": o, "opt_start_seq": 2}})
    # a mirror's config may change, its `mirror` may not (only go)
    await p.call(f"STREAM.UPDATE.{m}", {"name": m, "mirror": {"name": o}, "max_msgs": 10}, keep=("config",))
    await p.call(f"STREAM.UPDATE.{m}", {"name": m, "mirror": {"name": o, "filter_subject": f"{lo}.a"}})
    await p.call(f"STREAM.UPDATE.{m}", {"name": m, "mirror": {"name": f"X{o}"}})
    await p.call(f"STREAM.UPDATE.{m}", {"name": m, "mirror": {"name": o}, "subjects": ["em.>"]})
    # promotion with subjects that overlap another stream's: refused; then without subjects: its name
    await p.call(f"STREAM.UPDATE.{m}", {"name": m, "subjects": [f"{lo}.x"]})
    await p.call(f"STREAM.UPDATE.{m}", {"name": m, "mirror_direct": True}, keep=("config",))
    await p.call(f"STREAM.UPDATE.{m}", {"name": m, "mirror": {"name": o}})
    for s in (m, o):
        await p.call(f"STREAM.DELETE.{s}")


async def promotion(p: Probe) -> None:
    o, m, k = f"PO{p.tag}", f"PM{p.tag}", f"PK{p.tag}"
    lo = o.lower()
    await p.call(f"STREAM.CREATE.{o}", {"name": o, "subjects": [f"{lo}.>"]}, keep=("config",))
    for i in range(3):
        await p.pub(f"{lo}.{i}", f"v{i}".encode())
    for s in (m, k):
        await p.call(f"STREAM.CREATE.{s}", {"name": s, "mirror": {"name": o}}, keep=("config",))
        await synced(p, s, 3)
    await p.call(f"CONSUMER.CREATE.{m}.d", {"stream_name": m, "config": {
        "durable_name": "d", "ack_policy": "explicit"}}, keep=("num_pending",))
    promoted = await p.api(f"STREAM.UPDATE.{m}", {"name": m, "subjects": [f"{m.lower()}.>"], "max_msgs": 10})
    p.note("promoted", _view(promoted))
    await p.pub(f"{m.lower()}.own", b"own")  # its own sequence continues from the origin's
    await p.pub(f"{lo}.after", b"after")
    await synced(p, k, 4)  # the other mirror follows; the promoted stream does not
    await info(p, k)
    await info(p, m)
    await messages(p, m)
    await p.pull(m, "d", {"batch": 10, "no_wait": True}, 4)
    await p.call(f"STREAM.UPDATE.{m}", {"name": m, "subjects": [f"{m.lower()}.>"], "mirror": {"name": o}})
    for s in (m, k, o):
        await p.call(f"STREAM.DELETE.{s}")


SCENARIOS = (mirrors, config_errors, promotion)


@pytest.mark.timeout(90)
async def test_mirrors_as_nats_server(js_servers) -> None:
    tag = f"m{next(_counter)}"
    ref = await run_scenarios(js_servers["nats"].url, tag, *SCENARIOS)
    got = await run_scenarios(js_servers["zonebus"].url, tag, *SCENARIOS)
    assert got == ref, first_difference(ref, got)
    created = [n for n in ref if isinstance(n, list) and n[:1] == ["create"]]
    assert len(created) == 5 and all("mirror" in n[2]["config"] for n in created)


async def nats_py_mirror_removal(url: str, tag: str) -> list[Any]:
    """nats.py's tests/test_js.py `test_stream_mirror_removal`, with its names tagged and its sleep a poll."""
    nc = await nats.connect(url, allow_reconnect=False)
    try:
        js = nc.jetstream()
        src, mir = f"SOURCE{tag}", f"MIRROR{tag}"
        await js.add_stream(name=src, subjects=[f"source{tag}.>"])
        for i in range(5):
            await js.publish(f"source{tag}.{i}", f"message-{i}".encode())
        await js.add_stream(name=mir, mirror=nats.js.api.StreamSource(name=src))

        async def five() -> bool:
            return (await js.stream_info(mir)).state.messages == 5

        await until(five, "the mirror synced", 10)
        sinfo = await js.stream_info(mir)
        assert sinfo.state.messages == 5
        assert sinfo.config.mirror is not None
        assert sinfo.config.mirror.name == src
        updated = await js.update_stream(config=sinfo.config.evolve(mirror=None))
        assert updated.config.mirror is None
        assert updated.state.messages == 5
        seen = [updated.config.subjects, updated.config.mirror_direct, updated.state.first_seq,
                updated.state.last_seq]
        for s in (mir, src):
            await js.delete_stream(s)
        return seen
    finally:
        await nc.close()


@pytest.mark.timeout(30)
async def test_nats_py_mirror_removal(js_servers) -> None:
    tag = f"r{next(_counter)}"
    ref = await nats_py_mirror_removal(js_servers["nats"].url, tag)
    got = await nats_py_mirror_removal(js_servers["zonebus"].url, tag)
    assert got == ref


async def _api(nc: nats.NATS, subject: str, body: dict | None = None) -> dict:
    msg = await nc.request(subject, json.dumps(body).encode() if body is not None else b"", timeout=3)
    return json.loads(msg.data)


@pytest.mark.timeout(60)
async def test_mirror_resumes_after_a_restart() -> None:
    store = tempfile.mkdtemp(prefix="zb-mirror-restart-")
    proc = start_js("zonebus", store)
    try:
        nc = await nats.connect(proc.url, allow_reconnect=False)
        await _api(nc, "$JS.API.STREAM.CREATE.RO", {"name": "RO", "subjects": ["ro.>"]})
        for i in range(4):
            await nc.request(f"ro.{i}", b"x", timeout=3)
        await _api(nc, "$JS.API.STREAM.MSG.DELETE.RO", {"seq": 2})
        await _api(nc, "$JS.API.STREAM.CREATE.RM", {"name": "RM", "mirror": {"name": "RO"}})

        async def state(n: int) -> dict | None:
            st = (await _api(nc, "$JS.API.STREAM.INFO.RM"))["state"]
            return st if st["last_seq"] >= n else None

        await until(lambda: state(4), "RM mirrored 4", 10)
        await nc.close()
    finally:
        proc.stop()
    proc = start_js("zonebus", store)
    try:
        nc = await nats.connect(proc.url, allow_reconnect=False)
        for i in range(2):
            await nc.request(f"ro.n{i}", b"y", timeout=3)
        st = await until(lambda: state(6), "RM resumed to 6", 10)
        assert (st["messages"], st["first_seq"], st["num_deleted"]) == (5, 1, 1)  # seq 2: never copied
        got = await _api(nc, "$JS.API.STREAM.MSG.GET.RM", {"seq": 6})
        assert got["message"]["subject"] == "ro.n1"
        info = await _api(nc, "$JS.API.STREAM.INFO.RM")
        assert info["mirror"]["name"] == "RO" and info["mirror"]["lag"] == 0
        ext = await _api(nc, "$JS.API.STREAM.CREATE.RX", {"name": "RX", "mirror": {
            "name": "RO", "external": {"api": "$JS.other.API"}}})
        assert ext["error"]["err_code"] == 10052 and "other accounts or domains" in ext["error"]["description"]
        await nc.close()
    finally:
        proc.stop()


async def clustered(nc: nats.NATS) -> list[Any]:
    """A mirror on a 3-server cluster (origin and mirror placed on the same server: zonebus's mirror reads its
    origin where the mirror leads), then its promotion."""
    from tests.stream.kit_cluster import api

    out: list[Any] = []
    here = {"placement": {"tags": ["az:z1"]}}

    async def step(label: str, subject: str, body: dict | None = None) -> dict:
        resp = await api(nc, subject, body)
        out.append((label, resp.get("error", {}).get("err_code")))
        return resp

    await step("origin", "$JS.API.STREAM.CREATE.CO", {"name": "CO", "subjects": ["co.>"], **here})
    for i in range(4):
        await nc.request(f"co.{i}", b"x", timeout=3)
    await step("delete 2", "$JS.API.STREAM.MSG.DELETE.CO", {"seq": 2})
    await step("mirror", "$JS.API.STREAM.CREATE.CM", {"name": "CM", "mirror": {"name": "CO"}, **here})
    await step("mirror again", "$JS.API.STREAM.CREATE.CM", {"name": "CM", "mirror": {"name": "CO"}, **here})
    await nc.request("co.late", b"y", timeout=3)

    async def synced() -> dict | None:
        doc = await api(nc, "$JS.API.STREAM.INFO.CM")
        return doc if doc.get("state", {}).get("last_seq") == 5 and doc.get("mirror", {}).get("lag") == 0 else None

    doc = await until(synced, "CM mirrored CO", 20)
    st = doc["state"]
    out.append(("state", st["messages"], st["first_seq"], st["last_seq"], st.get("num_deleted", 0)))
    out.append(("mirror_direct", doc["config"]["mirror_direct"], "subjects" in doc["config"]))
    await step("change mirror", "$JS.API.STREAM.UPDATE.CM", {"name": "CM", "mirror": {"name": "X"}, **here})
    promoted = await step("promote", "$JS.API.STREAM.UPDATE.CM", {"name": "CM", "subjects": ["cm.>"], **here})
    out.append(("promoted", "mirror" in promoted.get("config", {}), promoted.get("config", {}).get("subjects")))
    ack = json.loads((await nc.request("cm.own", b"z", timeout=3)).data)
    out.append(("own publish", ack.get("seq")))
    for s in ("CM", "CO"):
        await step(f"delete {s}", f"$JS.API.STREAM.DELETE.{s}")
    return out


@pytest.mark.timeout(240)
async def test_clustered_mirror_as_nats_server(tmp_path) -> None:
    from tests.stream.test_clustered_differential import assert_same, on_both

    assert_same(await on_both(tmp_path, clustered))


@pytest.mark.timeout(150)
async def test_mirror_on_the_zone_router(tmp_path) -> None:
    """The zone router (out of scope for the differential): a mirror led in z2 copies its origin there, and
    clients in z1 and z3 read it (gaps included) as its leader answers."""
    from tests.zonerouter.kit import FULL, LAYOUT, full_view, start_zoned, stream_in_z2
    from zonebus.testing.polling import wait_until

    zoned = start_zoned(tmp_path, LAYOUT)
    try:
        s = zoned.servers
        await asyncio.to_thread(wait_until, full_view(zoned, FULL), "the full mapping")
        nc = await nats.connect(s["b1"].url)
        far = [await nats.connect(s[name].url, name=f"m-{name}?az={zone}") for name, zone in (("a2", "z1"),
                                                                                              ("c1", "z3"))]
        try:
            await stream_in_z2(nc, "ZO", ["zo.>"])

            async def stored_from_z1() -> bool:  # (once the stream's interest has reached a2's server)
                try:
                    await far[0].request("zo.0", b"v", timeout=5)
                except nats.errors.NoRespondersError:
                    return False
                return True

            await until(stored_from_z1, "a publish from z1 stored", 20)
            for i in range(1, 4):
                await far[0].request(f"zo.{i}", b"v", timeout=5)
            await _api(nc, "$JS.API.STREAM.MSG.DELETE.ZO", {"seq": 2})
            made = await stream_in_z2(nc, "ZM", [], mirror={"name": "ZO"})
            assert made["config"]["mirror"] == {"name": "ZO"}

            async def synced() -> bool:
                doc = await _api(nc, "$JS.API.STREAM.INFO.ZM")
                return doc["state"]["last_seq"] == 4 and doc["mirror"]["lag"] == 0

            await until(synced, "ZM mirrored ZO", 20)
            for seq in range(1, 5):
                want = await _api(nc, "$JS.API.STREAM.MSG.GET.ZM", {"seq": seq})
                assert ("error" in want) == (seq == 2), want
                for c in far:
                    got = json.loads((await c.request("$JS.API.STREAM.MSG.GET.ZM", json.dumps({"seq": seq}).encode(),
                                                      timeout=5)).data)
                    assert got == want, (seq, got, want)
        finally:
            for c in [nc, *far]:
                await c.close()
    finally:
        zoned.stop()

