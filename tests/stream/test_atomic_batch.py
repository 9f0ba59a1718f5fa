"""Differential test of atomic batch publish (`allow_atomic`, ADR-50) and `persist_mode` against nats-server.

Scenarios run unchanged on nats-server -js and zonebus -js and their replies are compared: batches committed
with `Nats-Batch-Commit: 1` and `eob` (the empty replies to staged messages, the one PubAck with `batch` and
`count`, the stored messages and their headers read back), and every error nats-server answers a batch with:
atomic publish disabled, a bad id, a missing or bad sequence, gaps, an invalid commit, a batch too large, too
many batches in flight, headers a batch refuses or checks (message ids, expected sequences, expected stream,
TTLs, rollups, counters, discard new), on a sealed stream; after a refused commit nothing of the batch is
stored. A second pair of servers runs with small `limits { batch {} }` for the size, in-flight and timeout
limits. `persist_mode` on create, update and info is compared as well.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path

import nats
import pytest

from tests.stream.kit_cluster import api
from tests.stream.kit_scenarios import Probe, first_difference, run_scenarios
from tests.stream.test_clustered_differential import on_both
from tests.stream.test_counters import wait_last_seq
from zonebus.testing.polling import until
from zonebus.testing.processes import ServerProcess

_counter = itertools.count()


async def bpub(p: Probe, subject: str, data: bytes = b"x", headers: dict | None = None) -> None:
    """Publish and record the reply as it is: empty for a staged batch message, else the JSON."""
    msg = await p.nc.request(subject, data, timeout=3, headers=headers)
    p.note("pub", subject, json.loads(msg.data) if msg.data else "")


async def batch(p: Probe, batch_id: str, subject: str, n: int, commit: str | None = "1",
                extra: dict[int, dict] | None = None, data: bytes | None = None) -> None:
    """Messages 1..n of a batch (the n-th with `Nats-Batch-Commit: <commit>` unless commit is None)."""
    for i in range(1, n + 1):
        h = {"Nats-Batch-Id": batch_id, "Nats-Batch-Sequence": str(i), **(extra or {}).get(i, {})}
        if i == n and commit is not None:
            h["Nats-Batch-Commit"] = commit
        await bpub(p, subject, f"m{i}".encode() if data is None else data, h)


async def stored(p: Probe, stream: str) -> None:
    """Record the stream's state and every stored message with its headers."""
    info = await p.api(f"STREAM.INFO.{stream}")
    st = info["state"]
    p.note("state", st["messages"], st["first_seq"], st["last_seq"])
    for seq in range(st["first_seq"], st["last_seq"] + 1):
        doc = await p.api(f"STREAM.MSG.GET.{stream}", {"seq": seq})
        m = doc.get("message")
        if m is None:
            p.note("get", seq, doc.get("error"))
            continue
        hdrs = base64.b64decode(m["hdrs"]).decode() if m.get("hdrs") else ""
        hdrs = re.sub(r"(Nats-Stream-Source: [^\r]*) [^ \r]+\r", r"\1 <server hash>\r", hdrs)
        p.note("get", seq, m["subject"], base64.b64decode(m.get("data", "")).decode(), hdrs)


async def atomic_commits(p: Probe) -> None:
    s, subj = f"AT{p.tag}", f"at{p.tag}"
    cfg = {"name": s, "subjects": [f"{subj}.>"], "allow_atomic": True}
    await p.call(f"STREAM.CREATE.{s}", cfg, keep=("config",))
    await batch(p, "b1", f"{subj}.a", 3)
    await batch(p, "b2", f"{subj}.b", 3, commit="eob")  # the 3rd message ends the batch and is not stored
    await batch(p, "b3", f"{subj}.c", 1)  # a batch of one
    await bpub(p, f"{subj}.d", b"plain", {"Nats-Batch-Id": "", "Nats-Batch-Sequence": "1"})  # empty id: no batch
    await bpub(p, f"{subj}.d", b"seq-only", {"Nats-Batch-Sequence": "7"})
    # two batches interleaved; the same id again once committed
    await batch(p, "x", f"{subj}.x", 1, commit=None)
    await batch(p, "y", f"{subj}.y", 1, commit=None)
    await bpub(p, f"{subj}.x", b"x2", {"Nats-Batch-Id": "x", "Nats-Batch-Sequence": "2", "Nats-Batch-Commit": "1"})
    await bpub(p, f"{subj}.y", b"y2", {"Nats-Batch-Id": "y", "Nats-Batch-Sequence": "2", "Nats-Batch-Commit": "1"})
    await batch(p, "b1", f"{subj}.a", 2)
    # message ids, expected sequences and rollups that hold
    await batch(p, "ok1", f"{subj}.e", 2, extra={1: {"Nats-Msg-Id": "id1", "Nats-Expected-Last-Sequence": "14"},
                                                 2: {"Nats-Msg-Id": "id2", "Nats-Expected-Stream": s}})
    await batch(p, "ok2", f"{subj}.e", 2, extra={1: {"Nats-Expected-Last-Subject-Sequence": "16"},
                                                 2: {"Nats-Expected-Last-Subject-Sequence": "14",
                                                     "Nats-Expected-Last-Subject-Sequence-Subject": f"{subj}.a"}})
    await stored(p, s)
    await p.call(f"STREAM.DELETE.{s}")


async def atomic_errors(p: Probe) -> None:
    s, subj = f"AE{p.tag}", f"ae{p.tag}"
    await p.call(f"STREAM.CREATE.{s}", {"name": s, "subjects": [f"{subj}.>"]}, keep=("config",))
    await batch(p, "off", f"{subj}.a", 2)  # atomic publish disabled: each message is refused
    cfg = {"name": s, "subjects": [f"{subj}.>"], "allow_atomic": True, "max_msg_size": 400}
    await p.call(f"STREAM.UPDATE.{s}", cfg, keep=("config",))
    a = f"{subj}.a"
    await bpub(p, a, b"x", {"Nats-Batch-Id": "i" * 65, "Nats-Batch-Sequence": "1"})
    await bpub(p, a, b"x", {"Nats-Batch-Id": "i" * 64, "Nats-Batch-Sequence": "1", "Nats-Batch-Commit": "1"})
    for seq in ("", "abc", "-1", "1.0", "99999999999999999999999"):
        await bpub(p, a, b"x", {"Nats-Batch-Id": "s", "Nats-Batch-Sequence": seq} if seq else {"Nats-Batch-Id": "s"})
    for seq in ("0", "2", "1000", "1001"):  # no such batch: incomplete, or too large
        await bpub(p, a, b"x", {"Nats-Batch-Id": "new", "Nats-Batch-Sequence": seq})
    await bpub(p, a, b"x", {"Nats-Batch-Id": "new", "Nats-Batch-Sequence": "1001", "Nats-Batch-Commit": "eob"})
    await bpub(p, a, b"x" * 500, {"Nats-Batch-Id": "big", "Nats-Batch-Sequence": "1"})
    # a gap drops the batch; its later messages are incomplete
    await batch(p, "gap", a, 1, commit=None)
    await bpub(p, a, b"x", {"Nats-Batch-Id": "gap", "Nats-Batch-Sequence": "3"})
    await bpub(p, a, b"x", {"Nats-Batch-Id": "gap", "Nats-Batch-Sequence": "2", "Nats-Batch-Commit": "1"})
    await bpub(p, a, b"x", {"Nats-Batch-Id": "eob1", "Nats-Batch-Sequence": "1", "Nats-Batch-Commit": "eob"})
    for commit in ("2", "true", "EOB"):
        await batch(p, f"c{commit}", a, 2, commit=commit)
    # checks run at the commit: each refuses the whole batch
    refused = [
        {2: {"Nats-Expected-Last-Msg-Id": "x"}},
        {1: {"Nats-Msg-Id": "d"}, 2: {"Nats-Msg-Id": "d"}},
        {1: {"Nats-Expected-Last-Sequence": "0"}, 2: {"Nats-Expected-Last-Sequence": "1"}},
        {1: {"Nats-Expected-Last-Sequence": "5"}},
        {2: {"Nats-Expected-Last-Sequence": "9"}},
        {1: {"Nats-Expected-Last-Subject-Sequence": "4"}},
        {2: {"Nats-Expected-Last-Subject-Sequence": "1"}},
        {2: {"Nats-Expected-Last-Subject-Sequence-Subject": f"{subj}.b"}},
        {2: {"Nats-Expected-Stream": "OTHER"}},
        {2: {"Nats-TTL": "5s"}},
        {2: {"Nats-Rollup": "sub"}},
        {2: {"Nats-Incr": "1"}},
        {2: {"Nats-Stream-Source": "X 1 > > x"}},
    ]
    for i, extra in enumerate(refused):
        await batch(p, f"r{i}", a, 2, extra=extra)
    await stored(p, s)  # nothing of a refused batch
    await bpub(p, a, b"one", {"Nats-Msg-Id": "seen"})
    await batch(p, "dup", a, 2, extra={2: {"Nats-Msg-Id": "seen"}})
    rollup = {**cfg, "allow_rollup_hdrs": True}
    await p.call(f"STREAM.UPDATE.{s}", rollup, keep=("config",))
    await batch(p, "ru1", a, 2, extra={2: {"Nats-Rollup": "all"}})
    await batch(p, "ru2", a, 2, extra={2: {"Nats-Rollup": "sub"}})
    await batch(p, "ru3", a, 2, extra={2: {"Nats-Rollup": "bad"}})
    await batch(p, "ru4", a, 2, extra={1: {"Nats-Rollup": "all"}, 2: {"Nats-Rollup": "sub"}})
    await batch(p, "ru5", f"{subj}.r", 2, extra={1: {"Nats-Rollup": "sub"}})
    await stored(p, s)
    # discard new: the batch's own messages count
    dn = {**cfg, "discard": "new", "max_msgs": 8, "max_msgs_per_subject": 3, "discard_new_per_subject": True}
    await p.call(f"STREAM.UPDATE.{s}", dn, keep=("config",))
    await batch(p, "dn1", f"{subj}.n", 4)
    await batch(p, "dn2", f"{subj}.n", 3)
    await batch(p, "dn3", f"{subj}.m", 3)
    await stored(p, s)
    # an open batch, then the stream is sealed / atomic publish turned off
    await batch(p, "open", a, 1, commit=None)
    await p.call(f"STREAM.UPDATE.{s}", {**dn, "allow_atomic": False}, keep=("config",))
    await p.call(f"STREAM.UPDATE.{s}", dn, keep=("config",))
    await bpub(p, a, b"x", {"Nats-Batch-Id": "open", "Nats-Batch-Sequence": "2", "Nats-Batch-Commit": "1"})
    await p.call(f"STREAM.UPDATE.{s}", {**dn, "sealed": True}, keep=("config",))
    await batch(p, "sealed", a, 1)
    await p.call(f"STREAM.DELETE.{s}")


async def atomic_counters_ttl(p: Probe) -> None:
    s, subj = f"AC{p.tag}", f"ac{p.tag}"
    await p.call(f"STREAM.CREATE.{s}", {"name": s, "subjects": [f"{subj}.>"], "allow_atomic": True,
                                        "allow_msg_counter": True}, keep=("config",))
    await batch(p, "c1", f"{subj}.a", 3, extra={i: {"Nats-Incr": str(i * 10)} for i in (1, 2, 3)}, data=b"")
    await batch(p, "c2", f"{subj}.a", 2, extra={1: {"Nats-Incr": "-5"}}, data=b"")  # the 2nd has no increment
    await batch(p, "c3", f"{subj}.a", 2, extra={1: {"Nats-Incr": "1"}, 2: {"Nats-Incr": "zz"}}, data=b"")
    await batch(p, "c4", f"{subj}.a", 2, extra={1: {"Nats-Incr": "1"}, 2: {"Nats-Incr": "1"}})  # a payload
    await batch(p, "c5", f"{subj}.b", 2, extra={1: {"Nats-Incr": "-5"}, 2: {"Nats-Incr": "+2"}}, data=b"")
    await stored(p, s)
    await p.call(f"STREAM.DELETE.{s}")
    t = f"AT2{p.tag}"
    await p.call(f"STREAM.CREATE.{t}", {"name": t, "subjects": [f"{t.lower()}.>"], "allow_atomic": True,
                                        "allow_msg_ttl": True}, keep=("config",))
    await batch(p, "t1", f"{t.lower()}.a", 2, extra={1: {"Nats-TTL": "1h"}, 2: {"Nats-TTL": "bogus"}})
    await batch(p, "t2", f"{t.lower()}.a", 2, extra={1: {"Nats-TTL": "1h"}})
    await stored(p, t)
    await p.call(f"STREAM.DELETE.{t}")


async def atomic_inflight(p: Probe) -> None:
    """50 open batches per stream (nats-server's default); deleting the stream drops them."""
    s, subj = f"AI{p.tag}", f"ai{p.tag}"
    await p.call(f"STREAM.CREATE.{s}", {"name": s, "subjects": [f"{subj}.>"], "allow_atomic": True},
                 keep=("config",))
    for i in range(50):
        await p.nc.request(f"{subj}.a", b"x", timeout=3,
                           headers={"Nats-Batch-Id": f"o{i}", "Nats-Batch-Sequence": "1"})
    await batch(p, "o50", f"{subj}.a", 1, commit=None)
    await batch(p, "o50", f"{subj}.a", 1)  # (a batch of one needs a slot too)
    await bpub(p, f"{subj}.a", b"x", {"Nats-Batch-Id": "o7", "Nats-Batch-Sequence": "2", "Nats-Batch-Commit": "1"})
    await batch(p, "o50", f"{subj}.a", 1)  # o7's slot is free again
    await p.call(f"STREAM.DELETE.{s}")


async def persist_mode(p: Probe) -> None:
    s = f"PM{p.tag}"
    base = {"name": s, "subjects": [f"{s.lower()}.>"]}
    for extra in ({"persist_mode": "async", "storage": "memory"}, {"persist_mode": "async", "allow_atomic": True},
                  {"persist_mode": "bogus"}, {"persist_mode": "async", "num_replicas": 3}):
        await p.call(f"STREAM.CREATE.{s}", {**base, **extra})
    await p.call(f"STREAM.CREATE.{s}", {**base, "persist_mode": "default"}, keep=("config",))
    await p.call(f"STREAM.UPDATE.{s}", {**base, "persist_mode": "async"})
    await p.call(f"STREAM.UPDATE.{s}", base, keep=("config",))
    await p.call(f"STREAM.DELETE.{s}")
    await p.call(f"STREAM.CREATE.{s}", {**base, "persist_mode": "async"}, keep=("config",))
    await p.call(f"STREAM.INFO.{s}", keep=("config",))
    await p.pub(f"{s.lower()}.a")
    await p.call(f"STREAM.UPDATE.{s}", base)
    await p.call(f"STREAM.UPDATE.{s}", {**base, "persist_mode": "default"})
    await p.call(f"STREAM.UPDATE.{s}", {**base, "persist_mode": "async", "allow_atomic": True})
    await p.call(f"STREAM.UPDATE.{s}", {**base, "persist_mode": "async", "max_msgs": 5}, keep=("config",))
    await p.call(f"STREAM.DELETE.{s}")


async def mirror_checks(p: Probe) -> None:
    """The mirror configs nats-server refuses, and adding a mirror to a stream on update (mirrors themselves:
    tests/stream/test_mirrors.py)."""
    o, m = f"MO{p.tag}", f"MM{p.tag}"
    await p.call(f"STREAM.CREATE.{o}", {"name": o, "subjects": [f"{o.lower()}.>"], "max_msg_size": 100},
                 keep=("config",))
    mirror = {"name": o}
    for extra in ({"first_seq": 5}, {"subjects": ["x.>"]}, {"sources": [{"name": o}]}, {"allow_msg_counter": True},
                  {"allow_atomic": True}, {"allow_batched": True}, {"allow_msg_schedules": True},
                  {"subject_delete_marker_ttl": 2_000_000_000}, {"max_msg_size": 50},
                  {"mirror": {"name": o, "filter_subject": "a", "subject_transforms": [{"src": "b", "dest": "c"}]}},
                  {"mirror": {"name": "bad.name"}}):
        await p.call(f"STREAM.CREATE.{m}", {"name": m, "mirror": mirror, **extra})
    await p.call(f"STREAM.UPDATE.{o}", {"name": o, "subjects": [f"{o.lower()}.>"], "max_msg_size": 100,
                                        "mirror": {"name": "ELSEWHERE"}})
    await p.call(f"STREAM.UPDATE.{o}", {"name": o, "max_msg_size": 100, "mirror": {"name": "ELSEWHERE"}})
    await p.call(f"STREAM.UPDATE.{o}", {"name": o, "subjects": [f"{o.lower()}.>"], "max_msg_size": 100,
                                        "mirror": None}, keep=("config",))
    await p.call(f"STREAM.DELETE.{o}")


async def sourced_batch(p: Probe) -> None:
    """A stream sourcing an atomic-batch stream copies its messages without their Nats-Batch-* headers."""
    o, d = f"SO{p.tag}", f"SD{p.tag}"
    await p.call(f"STREAM.CREATE.{o}", {"name": o, "subjects": [f"{o.lower()}.>"], "allow_atomic": True},
                 keep=("config",))
    await batch(p, "b", f"{o.lower()}.a", 2, extra={1: {"Nats-Msg-Id": "one", "Other": "kept"}})
    await p.call(f"STREAM.CREATE.{d}", {"name": d, "sources": [{"name": o}]}, keep=("config",))
    await wait_last_seq(p, d, 2)
    await stored(p, d)
    for s in (d, o):
        await p.call(f"STREAM.DELETE.{s}")


SCENARIOS = (atomic_commits, atomic_errors, atomic_counters_ttl, atomic_inflight, persist_mode, mirror_checks,
             sourced_batch)


@pytest.mark.timeout(60)
async def test_atomic_batch_as_nats_server(js_servers) -> None:
    tag = f"a{next(_counter)}"
    ref = await run_scenarios(js_servers["nats"].url, tag, *SCENARIOS)
    got = await run_scenarios(js_servers["zonebus"].url, tag, *SCENARIOS)
    assert got == ref, first_difference(ref, got)


# -- configured limits ----------------------------------------------------------------------------------

LIMITS = 'limits { batch { max_inflight_per_stream: 2, max_inflight_total: 3, max_msgs: 3, timeout: "1s" } }'


@pytest.fixture(scope="module")
def limited_servers() -> Iterator[dict[str, ServerProcess]]:
    procs: dict[str, ServerProcess] = {}
    try:
        for impl in ("nats", "zonebus"):
            store = tempfile.mkdtemp(prefix=f"zb-atomic-{impl}-")
            procs[impl] = ServerProcess(impl=impl, config=f'jetstream {{ store_dir: "{store}"\n  {LIMITS} }}\n')
            procs[impl].start()
        yield procs
    finally:
        for proc in procs.values():
            proc.stop()


async def limited(p: Probe) -> None:
    streams = [f"L{i}{p.tag}" for i in range(2)]
    for s in streams:
        await p.call(f"STREAM.CREATE.{s}", {"name": s, "subjects": [f"{s.lower()}.>"], "allow_atomic": True},
                     keep=("config",))
    one, two = (s.lower() for s in streams)
    await batch(p, "big", f"{one}.a", 4)  # max_msgs 3
    await batch(p, "eob", f"{one}.a", 4, commit="eob")  # 3 messages and the end marker
    await batch(p, "big2", f"{one}.a", 4, commit=None)
    await bpub(p, f"{one}.a", b"x", {"Nats-Batch-Id": "big2", "Nats-Batch-Sequence": "5"})
    for i in range(3):  # 2 per stream, 3 in all
        await batch(p, f"p{i}", f"{one}.a", 1, commit=None)
    await batch(p, "q0", f"{two}.a", 1, commit=None)
    await batch(p, "q1", f"{two}.a", 1, commit=None)
    # a batch waiting longer than the timeout for its next message is dropped (and its slot freed)
    await asyncio.sleep(1.6)  # (no poll: nothing shows an open batch but its next message, which would reset it)
    await bpub(p, f"{one}.a", b"x", {"Nats-Batch-Id": "p0", "Nats-Batch-Sequence": "2", "Nats-Batch-Commit": "1"})
    await batch(p, "q1", f"{two}.a", 2)
    await batch(p, "after", f"{two}.a", 2)
    for s in streams:
        await stored(p, s)
        await p.call(f"STREAM.DELETE.{s}")


@pytest.mark.timeout(60)
async def test_atomic_batch_limits_as_nats_server(limited_servers) -> None:
    tag = f"l{next(_counter)}"
    ref = await run_scenarios(limited_servers["nats"].url, tag, limited)
    got = await run_scenarios(limited_servers["zonebus"].url, tag, limited)
    assert got == ref, first_difference(ref, got)


# -- clustered (R3) -------------------------------------------------------------------------------------

async def clustered(nc: nats.NATS) -> list:
    """An R3 stream on a 3-server cluster: batches commit, a refused one stores nothing; async persist is
    refused on a replicated stream."""
    out: list = []

    async def pub(subject: str, data: bytes, headers: dict) -> None:
        # (a publish nothing received is retried: the stream's interest reaches the client's server, and its
        # worker, over routes and the local mesh, and may come after the create's answer; nothing was stored)
        async def answered() -> tuple | None:
            try:
                return (await nc.request(subject, data, timeout=5, headers=headers),)
            except nats.errors.NoRespondersError:
                return None

        (msg,) = await until(answered, f"a responder for {subject}", timeout=5)
        out.append(json.loads(msg.data) if msg.data else "")

    async def call(subject: str, body: dict | None = None) -> dict:
        resp = await api(nc, f"$JS.API.{subject}", body)
        out.append(("error", resp["error"]) if "error" in resp else ("ok", subject))
        return resp

    base = {"name": "CA", "subjects": ["ca.>"], "num_replicas": 3}
    await call("STREAM.CREATE.CP", {"name": "CP", "subjects": ["cp"], "num_replicas": 3, "persist_mode": "async"})
    await call("STREAM.CREATE.CA", {**base, "allow_atomic": True})
    for bid, commit, extra in (("b1", "1", {}), ("b2", "eob", {}), ("b3", "1", {"Nats-Msg-Id": "m"}),
                               ("b4", "1", {"Nats-Msg-Id": "m"})):
        for i in (1, 2, 3):
            h = {"Nats-Batch-Id": bid, "Nats-Batch-Sequence": str(i), **extra}
            if i == 3:
                h["Nats-Batch-Commit"] = commit
            await pub(f"ca.{bid}", f"m{i}".encode(), h)
    info = await call("STREAM.INFO.CA")
    out.append(info.get("state", {}).get("messages"))
    await call("STREAM.DELETE.CA")
    return out


@pytest.mark.timeout(180)
async def test_atomic_batch_clustered_as_nats_server(tmp_path: Path) -> None:
    results = await on_both(tmp_path, clustered)
    assert results["zonebus"] == results["nats"], first_difference(results["nats"], results["zonebus"])
