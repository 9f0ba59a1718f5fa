"""Differential test of JetStream message counters (`allow_msg_counter`, ADR-49) against nats-server.

One scenario, run unchanged on nats-server -js and zonebus -js (the session's shared processes): stream
config checks on create and update, increments (+, -, zero, beyond 64 bits) and their PubAck `val`, the
stored `{"val": ...}` read back by STREAM.MSG.GET, and every publish error (no `Nats-Incr`, a bad increment,
a payload, headers a counter refuses, `Nats-Incr` on a plain stream). Replies are compared after
normalisation (times and the source header's server hash dropped). A second scenario sources two counter
streams into a third, which sums them per subject (`Nats-Counter-Sources`). A third runs an R3 counter stream
on a 3-server cluster of each (increments, stored values, the refused update).
"""

from __future__ import annotations

import base64
import itertools
import json
import re
from pathlib import Path

import nats
import pytest

from tests.stream.kit_cluster import api
from tests.stream.kit_scenarios import Probe, first_difference, run_scenarios
from tests.stream.test_clustered_differential import on_both
from zonebus.testing.polling import until

_counter = itertools.count()
BIG = "123456789012345678901234567890"


async def read_last(p: Probe, stream: str, subject: str) -> None:
    """Record the last message on `subject` as the stream stores it: payload and headers decoded."""
    doc = await p.api(f"STREAM.MSG.GET.{stream}", {"last_by_subj": subject})
    msg = doc.get("message")
    if msg is None:
        p.note("get", subject, doc)
        return
    data = base64.b64decode(msg.get("data", "")).decode()
    hdrs = base64.b64decode(msg.get("hdrs", "")).decode() if msg.get("hdrs") else ""
    hdrs = re.sub(r"(Nats-Stream-Source: [^\r]*) [^ \r]+\r", r"\1 <server hash>\r", hdrs)
    p.note("get", subject, msg["seq"], data, hdrs)


async def counters(p: Probe) -> None:
    s, subj = f"CNT{p.tag}", f"cnt{p.tag}"
    base = {"name": s, "subjects": [f"{subj}.>"], "allow_msg_counter": True}
    for bad in ({"discard": "new"}, {"allow_msg_ttl": True}, {"retention": "interest"},
                {"retention": "workqueue"}):
        await p.call(f"STREAM.CREATE.{s}", {**base, **bad})
    # delete markers turn message TTLs on, yet nats-server takes them on a counter stream
    await p.call(f"STREAM.CREATE.{s}", {**base, "subject_delete_marker_ttl": 2_000_000_000}, keep=("config",))
    await p.call(f"STREAM.DELETE.{s}")
    await p.call(f"STREAM.CREATE.{s}", base)
    a, b = f"{subj}.a", f"{subj}.b"
    for incr in ("+5", "-2", "0", BIG, "-" + BIG, "007", "-10"):
        await p.pub(a, b"", {"Nats-Incr": incr})
    await read_last(p, s, a)
    await p.pub(b, b"", {"Nats-Incr": "1"})
    await read_last(p, s, b)
    # errors: no increment, a bad one, a payload, headers a counter refuses
    await p.pub(a, b"")
    await p.pub(a, b"", {"Other": "x"})
    for incr in ("abc", "1.5", "+", "1_000", "0x10", "--1", "1e3"):
        await p.pub(a, b"", {"Nats-Incr": incr})
    await p.pub(a, b"x", {"Nats-Incr": "1"})
    for hdr in ({"Nats-Expected-Stream": s}, {"Nats-Rollup": "sub"}, {"Nats-Expected-Last-Sequence": "1"},
                {"Nats-Expected-Last-Subject-Sequence": "1"}, {"Nats-Expected-Last-Msg-Id": "x"},
                {"Nats-TTL": "5s"}, {"Nats-Expected-Stream": "OTHER"}):
        await p.pub(a, b"", {"Nats-Incr": "1", **hdr})
    # a message id dedupes an increment
    await p.pub(a, b"", {"Nats-Incr": "3", "Nats-Msg-Id": "m1"})
    await p.pub(a, b"", {"Nats-Incr": "3", "Nats-Msg-Id": "m1"})
    await read_last(p, s, a)
    # the value continues from the last message still stored on the subject
    last = (await p.api(f"STREAM.MSG.GET.{s}", {"last_by_subj": a}))["message"]["seq"]
    await p.call(f"STREAM.MSG.DELETE.{s}", {"seq": last})
    await p.pub(a, b"", {"Nats-Incr": "1"})
    await p.call(f"STREAM.PURGE.{s}", {"filter": b})
    await p.pub(b, b"", {"Nats-Incr": "2"})
    await read_last(p, s, b)
    # the setting cannot change after creation
    await p.call(f"STREAM.UPDATE.{s}", {**base, "allow_msg_counter": False})
    await p.call(f"STREAM.UPDATE.{s}", {**base, "max_msgs_per_subject": 1})
    await p.pub(a, b"", {"Nats-Incr": "-1"})
    await p.call(f"STREAM.INFO.{s}", keep=("state",))
    await p.call(f"STREAM.DELETE.{s}")
    # a plain stream: Nats-Incr is refused, a bad one as invalid; counters cannot be turned on
    plain = {"name": s, "subjects": [f"{subj}.>"]}
    await p.call(f"STREAM.CREATE.{s}", plain, keep=("config",))
    await p.pub(a, b"", {"Nats-Incr": "1"})
    await p.pub(a, b"x", {"Nats-Incr": "1"})
    await p.pub(a, b"", {"Nats-Incr": "abc"})
    await p.pub(a, b"plain")
    await p.call(f"STREAM.UPDATE.{s}", {**plain, "allow_msg_counter": True})
    await p.call(f"STREAM.DELETE.{s}")


async def wait_last_seq(p: Probe, stream: str, seq: int) -> None:
    async def reached() -> bool:
        return (await p.api(f"STREAM.INFO.{stream}")).get("state", {}).get("last_seq", 0) >= seq

    await until(reached, f"{stream} to hold {seq} messages", 10)


async def sourced_counters(p: Probe) -> None:
    """Two counter streams sourced into a third: it sums them per subject (Nats-Counter-Sources)."""
    one, two, agg = f"ONE{p.tag}", f"TWO{p.tag}", f"AGG{p.tag}"
    for s in (one, two):
        await p.call(f"STREAM.CREATE.{s}", {"name": s, "subjects": [f"{s.lower()}.>"], "allow_msg_counter": True},
                     keep=("config",))
    await p.pub(f"{one.lower()}.x", b"", {"Nats-Incr": "5"})
    await p.pub(f"{two.lower()}.x", b"", {"Nats-Incr": "7"})
    await p.call(f"STREAM.CREATE.{agg}", {
        "name": agg, "allow_msg_counter": True,
        "sources": [{"name": one, "subject_transforms": [{"src": f"{one.lower()}.>", "dest": f"{agg.lower()}.>"}]},
                    {"name": two, "subject_transforms": [{"src": f"{two.lower()}.>", "dest": f"{agg.lower()}.>"}]}],
    }, keep=("config",))
    await wait_last_seq(p, agg, 2)
    await p.pub(f"{one.lower()}.x", b"", {"Nats-Incr": "-2"})
    await wait_last_seq(p, agg, 3)
    await read_last(p, agg, f"{agg.lower()}.x")
    for s in (agg, one, two):
        await p.call(f"STREAM.DELETE.{s}")


@pytest.mark.timeout(30)
async def test_counters_as_nats_server(js_servers) -> None:
    tag = f"c{next(_counter)}"
    ref = await run_scenarios(js_servers["nats"].url, tag, counters, sourced_counters)
    got = await run_scenarios(js_servers["zonebus"].url, tag, counters, sourced_counters)
    assert got == ref, first_difference(ref, got)


async def clustered_counters(nc: nats.NATS) -> list:
    """An R3 counter stream on a 3-server cluster: increments sum on the stream's leader wherever the client is,
    the PubAck's `val` and the stored value agree, and an update may not turn counters off."""
    out: list = []

    async def incr(subject: str, by: str) -> None:
        msg = await nc.request(subject, b"", timeout=5, headers={"Nats-Incr": by})
        doc = json.loads(msg.data)
        out.append(("ack", doc.get("val"), doc.get("error", {}).get("err_code")))

    cfg = {"name": "CC", "subjects": ["cc.>"], "num_replicas": 3, "allow_msg_counter": True}
    out.append(("create", "error" in await api(nc, "$JS.API.STREAM.CREATE.CC", cfg)))
    for subject, by in (("cc.a", "+5"), ("cc.a", "-2"), ("cc.b", BIG), ("cc.a", "+1"), ("cc.b", "1")):
        await incr(subject, by)
    for subject in ("cc.a", "cc.b"):
        doc = await api(nc, "$JS.API.STREAM.MSG.GET.CC", {"last_by_subj": subject})
        out.append(("stored", subject, base64.b64decode(doc["message"]["data"]).decode()))
    resp = await api(nc, "$JS.API.STREAM.UPDATE.CC", {**cfg, "allow_msg_counter": False})
    out.append(("update", resp.get("error", {}).get("err_code")))
    await api(nc, "$JS.API.STREAM.DELETE.CC", {})
    return out


@pytest.mark.timeout(180)
async def test_counters_clustered_as_nats_server(tmp_path: Path) -> None:
    results = await on_both(tmp_path, clustered_counters)
    assert results["zonebus"] == results["nats"], first_difference(results["nats"], results["zonebus"])
    assert ("stored", "cc.a", '{"val":"4"}') in results["zonebus"], results["zonebus"]
