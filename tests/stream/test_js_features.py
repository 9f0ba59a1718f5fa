"""JetStream features of nats-server 2.11+, the same script against nats-server and zonebus through nats-py:
stream `first_seq`, sealing, per-message TTL and subject delete markers, consumer pause/resume, consumer
`num_replicas`, pull idle heartbeats, subject transforms, server resource limits and the object store.

Each scenario returns what a client sees (API replies without times and metadata, PubAcks, deliveries); the
two servers run it side by side and the results must be equal once the run's names are masked.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import tempfile
import time
from collections.abc import Awaitable, Callable
from typing import Any

import nats
import pytest
from nats.js.errors import KeyNotFoundError

from tests.stream.kit import normalize
from zonebus.testing.polling import until
from zonebus.testing.processes import ServerProcess

pytestmark = pytest.mark.timeout(60)
_n = itertools.count()
SECOND = 1_000_000_000

Scenario = Callable[[Any, str], Awaitable[list[Any]]]


def _mask(doc: Any, tag: str) -> Any:
    if isinstance(doc, str):
        return doc.replace(tag, "#")
    if isinstance(doc, dict):
        return {_mask(k, tag): _mask(v, tag) for k, v in doc.items()}
    if isinstance(doc, list):
        return [_mask(v, tag) for v in doc]
    if isinstance(doc, tuple):
        return tuple(_mask(v, tag) for v in doc)
    return doc


async def _api(nc, subject: str, body: Any = b"") -> Any:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    msg = await nc.request(subject, data, timeout=3)
    return normalize(json.loads(msg.data))


async def _pub(nc, subject: str, data: bytes = b"x", headers: dict[str, str] | None = None) -> Any:
    msg = await nc.request(subject, data, timeout=3, headers=headers)
    return json.loads(msg.data)


async def _run(url: str, scenario: Scenario, tag: str) -> list[Any]:
    nc = await nats.connect(url, allow_reconnect=False)
    try:
        return _mask(await scenario(nc, tag), tag)
    finally:
        await nc.close()


async def _both(servers: dict[str, ServerProcess], scenario: Scenario) -> tuple[list[Any], list[Any]]:
    k = next(_n)
    want, got = await asyncio.gather(_run(servers["nats"].url, scenario, f"Qn{k}x"),
                                     _run(servers["zonebus"].url, scenario, f"Qz{k}x"))
    return want, got


def _assert_same(want: list[Any], got: list[Any]) -> None:
    assert len(want) == len(got), (want, got)
    for i, (w, g) in enumerate(zip(want, got, strict=True)):
        assert g == w, f"step {i}:\n  nats-server: {w}\n  zonebus:     {g}"


# -- first_seq, sealing ----------------------------------------------------------------------------------
async def _first_seq_and_seal(nc, tag: str) -> list[Any]:
    js = nc.jetstream()
    out: list[Any] = []
    s = f"FS{tag}"
    info = await js.add_stream(name=s, subjects=[f"{s}.>"], first_seq=100)
    out.append(("created", info.config.first_seq, info.state.first_seq, info.state.last_seq))
    out.append(await _pub(nc, f"{s}.a"))
    out.append(await _pub(nc, f"{s}.b"))
    out.append(await _api(nc, f"$JS.API.STREAM.MSG.GET.{s}", {"seq": 100}))
    out.append(await _api(nc, f"$JS.API.STREAM.INFO.{s}"))
    cfg = {"name": s, "subjects": [f"{s}.>"], "first_seq": 100}
    out.append(await _api(nc, f"$JS.API.STREAM.CREATE.{s}Z", {**cfg, "name": f"{s}Z", "subjects": ["z"],
                                                             "sealed": True}))
    out.append(await _api(nc, f"$JS.API.STREAM.UPDATE.{s}", {**cfg, "sealed": True}))
    out.append(await _pub(nc, f"{s}.c"))
    out.append(await _api(nc, f"$JS.API.STREAM.PURGE.{s}"))
    out.append(await _api(nc, f"$JS.API.STREAM.MSG.DELETE.{s}", {"seq": 100}))
    out.append(await _api(nc, f"$JS.API.STREAM.UPDATE.{s}", {**cfg, "sealed": False}))
    out.append(await _api(nc, f"$JS.API.STREAM.INFO.{s}"))
    await js.delete_stream(s)
    return out


async def test_first_seq_and_sealed_streams(js_servers: dict[str, ServerProcess]) -> None:
    want, got = await _both(js_servers, _first_seq_and_seal)
    _assert_same(want, got)
    assert want[0] == ("created", 100, 100, 99) and want[1]["seq"] == 100
    assert want[8]["error"]["err_code"] == 10109  # purge of a sealed stream


# -- per-message TTL, subject delete markers --------------------------------------------------------------
async def _ttl_errors(nc, tag: str) -> list[Any]:
    out: list[Any] = []
    t, u = f"TE{tag}", f"TU{tag}"
    base = {"name": t, "subjects": [f"{t}.>"]}
    out.append(await _api(nc, f"$JS.API.STREAM.CREATE.{t}", {**base, "allow_msg_ttl": True,
                                                             "subject_delete_marker_ttl": SECOND // 2}))
    out.append(await _api(nc, f"$JS.API.STREAM.CREATE.{t}", {**base, "subject_delete_marker_ttl": SECOND,
                                                             "deny_purge": True}))
    for ttl in ("1s", "never", "NEVER", "bad", "0", "500ms", "-1", "30", "1m30s", "1.5s", ""):
        out.append((ttl, await _pub(nc, f"{t}.a", headers={"Nats-TTL": ttl})))
    await _api(nc, f"$JS.API.STREAM.CREATE.{u}", {"name": u, "subjects": [f"{u}.>"]})
    out.append(await _pub(nc, f"{u}.a", headers={"Nats-TTL": "1s"}))
    for name in (t, u):
        await _api(nc, f"$JS.API.STREAM.DELETE.{name}")
    return out


async def test_msg_ttl_validation(js_servers: dict[str, ServerProcess]) -> None:
    want, got = await _both(js_servers, _ttl_errors)
    _assert_same(want, got)
    codes = {ttl: r.get("error", {}).get("err_code") for ttl, r in want[2:-1]}
    assert codes["bad"] == 10165 and codes["1s"] is None and want[-1]["error"]["err_code"] == 10166


async def _ttl_expiry(nc, tag: str) -> list[Any]:
    """TTL'd messages expire, `never` outlives max_age, the last message of a subject leaves a marker that
    expires in turn; a push consumer sees all of it."""
    t = f"TX{tag}"
    out: list[Any] = [await _api(nc, f"$JS.API.STREAM.CREATE.{t}", {
        "name": t, "subjects": [f"{t}.>"], "allow_msg_ttl": True, "subject_delete_marker_ttl": SECOND,
        "max_age": 2 * SECOND})]
    sub = await nc.subscribe(f"dlv.{t}")
    await _api(nc, f"$JS.API.CONSUMER.CREATE.{t}.c", {"stream_name": t, "config": {
        "durable_name": "c", "deliver_subject": f"dlv.{t}", "ack_policy": "none"}})
    for subj, ttl in (("a", "1s"), ("b", "never"), ("c", None), ("a", "1"), ("d", "1h")):
        out.append(await _pub(nc, f"{t}.{subj}", headers={"Nats-TTL": ttl} if ttl else None))
    deadline = time.monotonic() + 12
    state: dict[str, Any] = {}
    while time.monotonic() < deadline:  # until only the `never` message is left
        state = (await _api(nc, f"$JS.API.STREAM.INFO.{t}", {"subjects_filter": ">"}))["state"]
        if state["messages"] == 1 and state["last_seq"] >= 7:
            break
        await asyncio.sleep(0.1)
    out.append(state)
    seen = []
    while True:
        try:
            m = await sub.next_msg(timeout=0.3)
        except nats.errors.TimeoutError:
            break
        seen.append((m.subject, dict(m.headers or {}), m.data, m.reply.split(".")[5]))  # stream seq
    out.append(sorted(seen, key=lambda x: int(x[3])))
    msg = await _api(nc, f"$JS.API.STREAM.MSG.GET.{t}", {"seq": 2})
    out.append((msg["message"]["subject"], base64.b64decode(msg["message"]["hdrs"])))
    await _api(nc, f"$JS.API.STREAM.DELETE.{t}")
    return out


async def test_msg_ttl_expiry_and_delete_markers(js_servers: dict[str, ServerProcess]) -> None:
    want, got = await _both(js_servers, _ttl_expiry)
    _assert_same(want, got)
    markers = [h for _s, h, _d, _q in want[-2] if h.get("Nats-Marker-Reason") == "MaxAge"]
    assert markers and all(h["Nats-TTL"] == "1s" for h in markers)
    assert want[-3]["messages"] == 1 and list(want[-3]["subjects"]) == ["TX#.b"]


async def _kv_ttl(nc, tag: str) -> list[Any]:
    js = nc.jetstream()
    kv = await js.create_key_value(bucket=f"kt{tag}", limit_marker_ttl=1)
    out: list[Any] = [("marker_ttl", (await js.stream_info(f"KV_kt{tag}")).config.subject_delete_marker_ttl)]
    await kv.create("short", b"v", msg_ttl=1)
    await kv.put("keep", b"k")
    out.append((await kv.get("short")).value)
    deadline = time.monotonic() + 8
    gone = False
    while time.monotonic() < deadline and not gone:
        try:
            await kv.get("short")
            await asyncio.sleep(0.1)
        except KeyNotFoundError:
            gone = True
    out.append(("expired", gone, (await kv.get("keep")).value))
    await js.delete_key_value(f"kt{tag}")
    return out


async def test_kv_per_key_ttl(js_servers: dict[str, ServerProcess]) -> None:
    want, got = await _both(js_servers, _kv_ttl)
    _assert_same(want, got)
    assert want[-1] == ("expired", True, b"k")


# -- consumer pause / resume, num_replicas ----------------------------------------------------------------
def _rfc3339(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def _pause_view(doc: dict[str, Any]) -> dict[str, Any]:
    doc = dict(doc)
    if "pause_remaining" in doc:
        assert doc["pause_remaining"] > 0
        doc["pause_remaining"] = "<ns>"
    if doc.get("paused") and "pause_until" in doc:
        doc["pause_until"] = "<future>"
    if isinstance(doc.get("config"), dict) and "pause_until" in doc["config"]:
        doc["config"] = {**doc["config"], "pause_until": "<set>"}
    return doc


async def _pause(nc, tag: str) -> list[Any]:
    js = nc.jetstream()
    p = f"PA{tag}"
    out: list[Any] = []
    await js.add_stream(name=p, subjects=[f"{p}.>"])
    for i in range(3):
        await _pub(nc, f"{p}.x", str(i).encode())
    api = f"$JS.API.CONSUMER.PAUSE.{p}"

    def create(name: str, **extra: Any) -> Awaitable[Any]:
        return _api(nc, f"$JS.API.CONSUMER.CREATE.{p}.{name}", {"stream_name": p, "config": {
            "durable_name": name, "ack_policy": "explicit", **extra}})

    out.append(_pause_view(await create("c", pause_until="2099-01-01T00:00:00Z")))
    out.append(_pause_view(await create("past", pause_until="2001-01-01T00:00:00Z")))
    sub = await nc.subscribe(f"_INBOX.pa.{tag}")
    await nc.publish(f"$JS.API.CONSUMER.MSG.NEXT.{p}.c", b'{"batch":1,"no_wait":true}', reply=f"_INBOX.pa.{tag}")
    m = await sub.next_msg(timeout=2)
    out.append(("paused fetch", m.headers, m.data))
    out.append(_pause_view(await _api(nc, f"$JS.API.CONSUMER.INFO.{p}.c")))
    out.append(_pause_view(await create("c")))  # an update without pause_until keeps the pause
    for body in (b"", b"not json", b'{"foo":1}', {"pause_until": "2001-01-01T00:00:00Z"},
                 {"pause_until": "2099-01-01T00:00:00Z"}):
        out.append(_pause_view(await _api(nc, f"{api}.c", body)))
    out.append(_pause_view(await _api(nc, f"{api}.nope", b"")))
    out.append(_pause_view(await _api(nc, f"$JS.API.CONSUMER.PAUSE.NOPE{tag}.c", b"")))
    resumed = await js.resume_consumer(p, "c")
    out.append(("resume", resumed.paused))
    psub = await js.pull_subscribe_bind("c", p)
    msgs = await psub.fetch(3, timeout=2)
    out.append([m.data for m in msgs])
    # paused for a second: a waiting pull request is served once the pause ends, not before
    until = time.time() + 1.5
    paused = await js.pause_consumer(p, "past", _rfc3339(until))
    out.append(("pause", paused.paused))
    psub2 = await js.pull_subscribe_bind("past", p)
    msgs = await psub2.fetch(1, timeout=5)
    out.append(("after pause", [m.data for m in msgs], time.time() >= int(until)))
    out.append(_pause_view(await _api(nc, f"$JS.API.CONSUMER.INFO.{p}.past")))
    await js.delete_stream(p)
    return out


async def test_consumer_pause_and_resume(js_servers: dict[str, ServerProcess]) -> None:
    want, got = await _both(js_servers, _pause)
    _assert_same(want, got)
    assert want[0]["paused"] is True and want[2][2] == b""
    assert want[-2] == ("after pause", [b"0"], True)


async def _replicas(nc, tag: str) -> list[Any]:
    s = f"RE{tag}"
    await _api(nc, f"$JS.API.STREAM.CREATE.{s}", {"name": s, "subjects": [s]})
    out = []
    for i, extra in enumerate(({}, {"num_replicas": 0}, {"num_replicas": 1}, {"num_replicas": 1, "mem_storage": True},
                               {"num_replicas": 3})):
        out.append(await _api(nc, f"$JS.API.CONSUMER.CREATE.{s}.c{i}", {"stream_name": s, "config": {
            "durable_name": f"c{i}", **extra}}))
    out.append(await _api(nc, f"$JS.API.CONSUMER.INFO.{s}.c2"))
    await _api(nc, f"$JS.API.STREAM.DELETE.{s}")
    return out


async def test_consumer_num_replicas(js_servers: dict[str, ServerProcess]) -> None:
    want, got = await _both(js_servers, _replicas)
    _assert_same(want, got)
    assert want[-1]["config"]["num_replicas"] == 1


# -- pull idle heartbeats ----------------------------------------------------------------------------------
async def _pull_heartbeats(nc, tag: str) -> list[Any]:
    js = nc.jetstream()
    s = f"HB{tag}"
    await js.add_stream(name=s, subjects=[s])
    psub = await js.pull_subscribe(s, durable="d")
    inbox = f"_INBOX.hb.{tag}"
    sub = await nc.subscribe(inbox)
    await nc.publish(f"$JS.API.CONSUMER.MSG.NEXT.{s}.d",
                     json.dumps({"batch": 1, "expires": SECOND, "idle_heartbeat": SECOND // 5}).encode(), reply=inbox)
    frames = []
    while True:
        m = await sub.next_msg(timeout=3)
        frames.append((dict(m.headers or {}), m.data))
        if m.headers and m.headers.get("Status") != "100":
            break
    beats = [f for f in frames if f[0].get("Status") == "100"]
    out: list[Any] = [beats[:1], len(beats) >= 2, frames[-1]]
    await js.publish(s, b"one")
    msgs = await psub.fetch(1, timeout=1, heartbeat=0.2)  # nats-py reads the heartbeats and carries on
    out.append([m.data for m in msgs])
    with pytest.raises(nats.errors.TimeoutError):
        await psub.fetch(1, timeout=0.7, heartbeat=0.2)
    await js.delete_stream(s)
    return out


async def test_pull_idle_heartbeats(js_servers: dict[str, ServerProcess]) -> None:
    want, got = await _both(js_servers, _pull_heartbeats)
    _assert_same(want, got)
    assert want[0][0][0]["Description"] == "Idle Heartbeat" and want[1] is True


# -- subject transforms ------------------------------------------------------------------------------------
TRANSFORMS = [("X.*.*", "Y.$2.$1"), ("X.*.*", "Y.{{wildcard(2)}}.{{ wildcard(1) }}"), ("X.>", "Y.>"),
              ("", "Y.>"), ("X.*", ""), ("X.*.>", "Y.$1.>"), ("Q.*", "Y.$1"),
              ("X.*", "Y.*"), ("X.*", "Y.$2"), ("X..a", "Y"), ("X.>", "Y"), ("X.*", "Y.>"), ("X.>", "Y.*"),
              ("X.*", "Y. a"), ("X.*", "Y.{{bogus(1)}}"), ("X.*.*", "Y.{{partition(3,1,2)}}.$1"),
              ("X.*.*", "Y.{{splitFromLeft(2,1)}}.{{partition(4)}}"), ("X.*", "Y.{{partition(x,1)}}")]


async def _transforms(nc, tag: str) -> list[Any]:
    out: list[Any] = []
    for i, (src, dest) in enumerate(TRANSFORMS):
        s = f"TR{i}{tag}"
        src = ".".join(t + tag if t in ("X", "Q") else t for t in src.split(".")) if src else ""
        dest = ".".join(t + tag if t == "Y" else t for t in dest.split(".")) if dest else ""
        created = await _api(nc, f"$JS.API.STREAM.CREATE.{s}", {"name": s, "subjects": [f"X{tag}.>"],
                                                                "subject_transform": {"src": src, "dest": dest}})
        out.append(created)
        if "error" in created:
            continue
        stored = []
        for subj in ("a.b", "a", "a.b.c"):
            ack = await _pub(nc, f"X{tag}.{subj}")
            got = await _api(nc, f"$JS.API.STREAM.MSG.GET.{s}", {"seq": ack["seq"]})
            stored.append(got["message"]["subject"])
        out.append(stored)
        await _api(nc, f"$JS.API.STREAM.DELETE.{s}")
    return out


async def test_subject_transforms(js_servers: dict[str, ServerProcess]) -> None:
    want, got = await _both(js_servers, _transforms)
    _assert_same(want, got)
    assert want[1] == ["Y#.b.a", "X#.a", "X#.a.b.c"]
    assert ["Y#.0.a", "X#.a", "X#.a.b.c"] in want  # partition(3,1,2) of X#.a.b: FNV-1a("ab") % 3


# -- server resource limits --------------------------------------------------------------------------------
async def _limits(nc, tag: str) -> list[Any]:
    out: list[Any] = []

    def create(name: str, **cfg: Any) -> Awaitable[Any]:
        return _api(nc, f"$JS.API.STREAM.CREATE.{name}", {"name": name, "subjects": [name], **cfg})

    out.append(await create("BIGF", max_bytes=10 << 20))
    out.append(await create("BIGM", storage="memory", max_bytes=10 << 20))
    out.append(await create("M1", storage="memory", max_bytes=600 << 10))
    out.append(await create("M2", storage="memory", max_bytes=600 << 10))
    out.append(await create("M3", storage="memory"))
    out.append(await _api(nc, "$JS.API.STREAM.UPDATE.M1", {"name": "M1", "subjects": ["M1"], "storage": "memory",
                                                           "max_bytes": 2 << 20}))
    out.append(await create("F1"))
    refused = None
    for i in range(40):
        ack = await _pub(nc, "F1", b"x" * 100_000)
        if "error" in ack:
            refused = (i, ack)
            break
    out.append(refused)
    info = await _api(nc, "$JS.API.INFO")
    info.pop("api", None)
    out.append(info)
    return out


async def test_server_limits_refuse_with_nats_errors() -> None:
    conf = 'jetstream {{ store_dir: "{}", max_mem: 1MB, max_file: 2MB }}\n'
    procs = {impl: ServerProcess(impl=impl, config=conf.format(tempfile.mkdtemp(prefix=f"zb-lim-{impl}-")))
             for impl in ("nats", "zonebus")}
    try:
        for p in procs.values():
            p.start()
        want, got = await _both(procs, _limits)
    finally:
        for p in procs.values():
            p.stop()
    _assert_same(want, got)
    assert want[0]["error"]["err_code"] == 10047 and want[1]["error"]["err_code"] == 10028
    assert want[7][1]["error"]["err_code"] == 10023


# -- object store ----------------------------------------------------------------------------------------
async def _object_store(nc, tag: str) -> list[Any]:
    js = nc.jetstream()
    name = f"ob{tag}"
    obs = await js.create_object_store(name)
    out: list[Any] = []
    info = await obs.put("file1", b"hello" * 50_000)
    out.append((info.name, info.size, info.chunks, info.digest))
    res = await obs.get("file1")
    out.append((len(res.data), res.data[:10], res.info.size))
    out.append([(o.name, o.size) for o in await obs.list()])
    await obs.put("file2", b"small")
    await obs.delete("file1")
    with pytest.raises(nats.js.errors.ObjectNotFoundError):
        await obs.get("file1")
    await obs.seal()
    status = await obs.status()
    out.append(("sealed", status.sealed, status.stream_info.config.deny_delete))
    with pytest.raises(nats.js.errors.BadRequestError):
        await obs.put("file3", b"x")
    out.append((await obs.get("file2")).data)
    out.append(await js.delete_object_store(name))
    return out


async def test_object_store_basics(js_servers: dict[str, ServerProcess]) -> None:
    want, got = await _both(js_servers, _object_store)
    _assert_same(want, got)
    assert want[3] == ("sealed", True, True)



# -- after a restart (zonebus only: the state on disk) ------------------------------------------------------
async def _wait_messages(nc, stream: str, n: int) -> dict[str, Any]:
    async def state_with_n() -> dict[str, Any] | None:
        state = (await _api(nc, f"$JS.API.STREAM.INFO.{stream}"))["state"]
        return state if state["messages"] >= n else None

    return await until(state_with_n, f"{n} messages in {stream}", timeout=5)


async def test_ttl_first_seq_and_pause_survive_a_restart() -> None:
    from tests.stream.kit import start_js

    store = tempfile.mkdtemp(prefix="zb-feat-restart-")
    proc = start_js("zonebus", store)
    try:
        nc = await nats.connect(proc.url, allow_reconnect=False)
        await _api(nc, "$JS.API.STREAM.CREATE.RT", {"name": "RT", "subjects": ["RT.>"], "allow_msg_ttl": True})
        await _api(nc, "$JS.API.STREAM.CREATE.FQ", {"name": "FQ", "subjects": ["FQ"], "first_seq": 50})
        await _api(nc, "$JS.API.CONSUMER.CREATE.RT.c", {"stream_name": "RT", "config": {
            "durable_name": "c", "ack_policy": "explicit", "pause_until": "2099-01-01T00:00:00Z"}})
        assert (await _pub(nc, "RT.short", headers={"Nats-TTL": "2s"}))["seq"] == 1
        await _pub(nc, "RT.keep")
        await _api(nc, "$JS.API.STREAM.CREATE.SRC", {"name": "SRC", "sources": [{"name": "FQ"}]})
        await _pub(nc, "FQ")
        await _wait_messages(nc, "SRC", 1)
        await nc.close()
    finally:
        proc.stop()
    proc = start_js("zonebus", store)
    try:
        nc = await nats.connect(proc.url, allow_reconnect=False)
        assert (await _pub(nc, "FQ"))["seq"] == 51
        state = await _wait_messages(nc, "SRC", 2)  # the source goes on after the restart, without copying twice
        assert state["messages"] == 2 and state["last_seq"] == 2
        info = await _api(nc, "$JS.API.CONSUMER.INFO.RT.c")
        assert info["paused"] is True and info["config"]["pause_until"] == "2099-01-01T00:00:00Z"

        async def one_left() -> dict[str, Any] | None:
            state = (await _api(nc, "$JS.API.STREAM.INFO.RT", {"subjects_filter": ">"}))["state"]
            return state if state["messages"] == 1 else None

        state = await until(one_left, "one message left in RT", timeout=10, interval=0.1)
        assert state["messages"] == 1 and state["subjects"] == {"RT.keep": 1}  # the TTL ran out after the restart
        await nc.close()
    finally:
        proc.stop()


# -- sources from a stream of the same server -------------------------------------------------------------
def _source_view(doc: Any) -> Any:
    """Timing-dependent fields masked: `active` (ns since the last contact) and the run's `opt_start_time`."""
    if isinstance(doc, dict) and isinstance(doc.get("config"), dict) and doc["config"].get("sources"):
        doc = {**doc, "config": {**doc["config"], "sources": [
            {k: ("<t>" if k == "opt_start_time" else v) for k, v in s.items()} for s in doc["config"]["sources"]]}}
    if isinstance(doc, dict) and "sources" in doc and isinstance(doc.get("state"), dict):
        doc = {**doc, "sources": [{k: v for k, v in s.items() if k != "active"} for s in doc["sources"]]}
        assert all(isinstance(s["active"], int) for s in doc.get("sources", ()) if "active" in s)
    return doc


async def _sources(nc, tag: str) -> list[Any]:
    o = f"OR{tag}"
    await _api(nc, f"$JS.API.STREAM.CREATE.{o}", {"name": o, "subjects": [f"{o}.>"], "allow_msg_ttl": True})
    headers = {"b": {"Nats-Msg-Id": "idb", "Nats-Expected-Stream": o}, "c": {"Nats-TTL": "1h"}}
    for subj in ("a", "b", "a", "c"):  # a TTL'd message is copied into streams without TTLs too
        await _pub(nc, f"{o}.{subj}", subj.encode(), headers=headers.get(subj))
    third = json.loads((await nc.request(f"$JS.API.STREAM.MSG.GET.{o}", b'{"seq":3}', timeout=3)).data)
    variants = [
        [{"name": o}],
        [{"name": o, "filter_subject": f"{o}.a"}],
        [{"name": o, "subject_transforms": [{"src": f"{o}.>", "dest": f"P{tag}.>"}]}],
        [{"name": o, "opt_start_seq": 2}],
        [{"name": o, "opt_start_time": third["message"]["time"]}],
        [{"name": o, "filter_subject": f"{o}.zz"}],
        [{"name": f"NOPE{tag}"}],
        [{"name": ""}],
        [{"name": o}, {"name": o}],
    ]
    out: list[Any] = []
    made = []
    for i, sources in enumerate(variants):
        s = f"SO{i}{tag}"
        created = await _api(nc, f"$JS.API.STREAM.CREATE.{s}", {"name": s, "sources": sources})
        out.append(_source_view(created))
        if "error" not in created:
            made.append(s)
    await _pub(nc, f"{o}.a", b"late")
    for s in made:
        deadline = time.monotonic() + 5
        info: dict[str, Any] = {}
        while time.monotonic() < deadline:
            info = await _api(nc, f"$JS.API.STREAM.INFO.{s}")
            if all(src.get("lag") == 0 and (src.get("seq") == 5 or "error" in src or "zz" in str(src))
                   for src in info.get("sources", ())):
                break
            await asyncio.sleep(0.05)
        out.append(_source_view(info))
        msgs = []
        for seq in range(1, info["state"]["last_seq"] + 1):
            m = (await _api(nc, f"$JS.API.STREAM.MSG.GET.{s}", {"seq": seq}))["message"]
            hdrs = base64.b64decode(m.get("hdrs", "")).decode()
            msgs.append((m["subject"], hdrs.rsplit(" ", 1)[0], base64.b64decode(m.get("data", ""))))
        out.append(msgs)
    for s in [*made, o]:
        await _api(nc, f"$JS.API.STREAM.DELETE.{s}")
    return out


async def test_sources_from_a_local_stream(js_servers: dict[str, ServerProcess]) -> None:
    want, got = await _both(js_servers, _sources)
    _assert_same(want, got)
    by_time = want[9 + 2 * 4 + 1]  # messages of the opt_start_time source: from the third message on
    assert [d for _s, _h, d in by_time] == [b"a", b"c", b"late"]
