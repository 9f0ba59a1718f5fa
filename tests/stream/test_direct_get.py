"""Direct get (`$JS.API.DIRECT.GET.<stream>[.<subject>]`) and nats-py's key-value store, the same scenario
against nats-server and zonebus: the frames (status, headers, payload) must be equal modulo timestamps."""

from __future__ import annotations

import asyncio
import itertools

import nats
import pytest
from nats.js.errors import KeyNotFoundError

from zonebus.testing.processes import ServerProcess

pytestmark = pytest.mark.timeout(60)
_n = itertools.count()

Frame = tuple[str, dict[str, str], bytes]


def _frame(msg) -> Frame:
    headers = dict(msg.headers or {})
    if "Nats-Time-Stamp" in headers:  # timing differs; its presence and shape does not
        stamp = headers.pop("Nats-Time-Stamp")
        assert stamp.endswith("Z") and "T" in stamp, stamp
        headers["Nats-Time-Stamp"] = "<ts>"
    return (msg.subject, {str(k): v for k, v in headers.items()}, msg.data)


async def _frames(nc, subject: str, body: bytes, inbox: str) -> list[Frame]:
    """Everything the server sends back to one request: the first frame within 5 s (a busy machine), the rest
    until 300 ms of quiet (a batch ends with EOB)."""
    sub = await nc.subscribe(inbox)
    await nc.publish(subject, body, reply=inbox)
    got: list[Frame] = []
    while True:
        try:
            got.append(_frame(await sub.next_msg(timeout=0.3 if got else 5.0)))
        except nats.errors.TimeoutError:
            break
    await sub.unsubscribe()
    return got


async def _scenario(url: str, tag: str) -> list[list[Frame]]:
    nc = await nats.connect(url, allow_reconnect=False)
    try:
        js = nc.jetstream()
        plain, direct = f"DGP{tag}", f"DGD{tag}"
        await js.add_stream(name=plain, subjects=[f"{plain}.>"])
        await js.add_stream(name=direct, subjects=[f"{direct}.>"], allow_direct=True)
        await js.publish(f"{direct}.a", b"one", headers={"X-Own": "1"})
        await js.publish(f"{direct}.b", b"two")
        await js.publish(f"{direct}.a", b"three")
        await js.publish(f"{direct}.c", b"")
        get = f"$JS.API.DIRECT.GET.{direct}"
        requests = [
            (f"$JS.API.DIRECT.GET.{plain}", b'{"seq":1}'),     # stream without allow_direct: no responders
            ("$JS.API.DIRECT.GET.NOSUCH", b'{"seq":1}'),       # no stream: no responders
            (get, b'{"seq":1}'), (get, b'{"seq":2}'), (get, b'{"seq":99}'),
            (get, b""), (get, b"not json"), (get, b'{"unknown":1}'), (get, b'{"seq":"x"}'),
            (get, b'{"last_by_subj":"' + f"{direct}.a".encode() + b'"}'),
            (get, b'{"next_by_subj":"' + f"{direct}.b".encode() + b'","seq":1}'),
            (get, b'{"seq":1,"last_by_subj":"x"}'), (get, b'{"last_by_subj":"x","batch":2}'),
            (get + f".{direct}.a", b""), (get + f".{direct}.zz", b""), (get + f".{direct}.a", b'{"seq":1}'),
            (get, b'{"seq":1,"batch":3}'), (get, b'{"seq":3,"batch":5}'),
            (get, b'{"next_by_subj":"' + f"{direct}.a".encode() + b'","seq":1,"batch":5}'),
            (get, b'{"multi_last":["' + f"{direct}.>".encode() + b'"]}'),
            (get, b'{"multi_last":["' + f"{direct}.a".encode() + b'"],"up_to_seq":2}'),
        ]
        out = []
        for i, (subject, body) in enumerate(requests):
            frames = await _frames(nc, subject, body, f"_INBOX.dg.{tag}.{i}")
            out.append([(s, {k: v.replace(tag, "#") for k, v in h.items()}, d) for s, h, d in frames])
        for name in (plain, direct):
            await js.delete_stream(name)
        return out
    finally:
        await nc.close()


async def test_direct_get_answers_as_nats_server(js_servers: dict[str, ServerProcess]) -> None:
    want = await _scenario(js_servers["nats"].url, f"n{next(_n)}")
    got = await _scenario(js_servers["zonebus"].url, f"z{next(_n)}")
    assert len(want) == len(got)
    for i, (w, g) in enumerate(zip(want, got, strict=True)):
        w = [(s.rsplit(".", 1)[-1], h, d) for s, h, d in w]
        g = [(s.rsplit(".", 1)[-1], h, d) for s, h, d in g]
        assert g == w, f"request {i}"
    assert any(len(frames) > 2 for frames in want)  # the scenario does exercise batches


async def _kv_story(url: str, bucket: str, direct: bool) -> list[object]:
    nc = await nats.connect(url, allow_reconnect=False)
    seen: list[object] = []
    try:
        js = nc.jetstream()
        kv = await js.create_key_value(bucket=bucket, history=3, direct=direct)
        info = await js.stream_info(f"KV_{bucket}")
        seen.append(("allow_direct", info.config.allow_direct))
        r1 = await kv.put("color", b"red")
        r2 = await kv.put("color", b"blue")
        await kv.put("size", b"L")
        entry = await kv.get("color")
        seen.append(("get", entry.key, entry.value, entry.revision, (r1, r2)))
        old = await kv.get("color", revision=r1)
        seen.append(("get rev", old.value, old.revision))
        seen.append(("update", await kv.update("color", b"green", last=r2)))
        await kv.delete("size")
        with pytest.raises(KeyNotFoundError):
            await kv.get("size")
        with pytest.raises(KeyNotFoundError):
            await kv.get("never")
        seen.append(("keys", sorted(await kv.keys())))
        history = await kv.history("color")
        seen.append(("history", [(e.value, e.revision) for e in history]))
        await js.delete_key_value(bucket)
    finally:
        await nc.close()
    return seen


@pytest.mark.parametrize("direct", [False, True], ids=["msg-get", "direct-get"])
async def test_key_value_through_nats_py_matches_nats_server(js_servers: dict[str, ServerProcess],
                                                             direct: bool) -> None:
    want, got = await asyncio.gather(_kv_story(js_servers["nats"].url, f"kvn{next(_n)}", direct),
                                     _kv_story(js_servers["zonebus"].url, f"kvz{next(_n)}", direct))
    assert got == want
    assert ("allow_direct", direct) in got
    assert ("keys", ["color"]) in got
