"""Reads that wait: a message get shows only acknowledged messages.

nats-server answers `STREAM.MSG.GET` from applied entries, which are the acknowledged ones. A zonebus store
appends first and acknowledges later (once fsynced, uploaded, or held by a replica in another zone:
`visible_seq`); a get answered from what is merely appended could show a message that a crash then loses, which
a KV campaign (`bench/chaos.py --workloads kv`) showed as a value read once and gone after a failover. So a get
that comes while the stream holds messages not acknowledged yet is answered once they are, and after
`VISIBLE_WAIT` seconds without that, with 503 (10008) instead; so is one whose stream left this server
meanwhile (never "stream not found" for a stream that exists).
"""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING

from zonebus.stream.api import error_json

if TYPE_CHECKING:
    from zonebus.stream.service import JetStreamService
    from zonebus.stream.stream import Stream

MSG_GET = "$JS.API.STREAM.MSG.GET."
VISIBLE_WAIT = 5.0
POLL = 0.001  # seconds between checks while waiting (an acknowledgement takes milliseconds)

_waiting: set[asyncio.Task[None]] = set()


def defer_msg_get(svc: JetStreamService, subject: str, reply: str, payload: bytes) -> bool:
    """True when `subject` is a message get of a stream holding unacknowledged messages: it is then answered
    later, by `answer_when_visible`."""
    if not subject.startswith(MSG_GET):
        return False
    stream = svc.streams.get(subject[len(MSG_GET):])
    if stream is None or stream.store.visible_seq() >= stream.store.index.last_seq:
        return False
    task = asyncio.get_running_loop().create_task(answer_when_visible(svc, stream, subject, reply, payload))
    _waiting.add(task)
    task.add_done_callback(_waiting.discard)
    return True


async def answer_when_visible(svc: JetStreamService, stream: Stream, subject: str, reply: str,
                              payload: bytes) -> None:
    target = stream.store.index.last_seq
    loop = asyncio.get_running_loop()
    deadline = loop.time() + VISIBLE_WAIT
    while stream.store.visible_seq() < target and not stream.closed:
        if loop.time() >= deadline:
            _unavailable(svc, reply)
            return
        await asyncio.sleep(POLL)
    if stream.closed and not stream.deleted:
        # the stream left this server while the get waited (a newer leader fenced its store, or it stepped
        # down): 503, as for a get that waited too long; answered from here, the API would say "stream not
        # found" (404), which a KV client reads as "no such key" (a pause campaign saw exactly that)
        _unavailable(svc, reply)
        return
    resp = svc.api.handle(subject, payload)
    if resp is not None:
        svc.send(reply, json.dumps(resp, separators=(",", ":")).encode())


def _unavailable(svc: JetStreamService, reply: str) -> None:
    """503 (10008): JetStream system temporarily unavailable."""
    from zonebus.meta import MetaError  # (the meta group's package: imported by clustered JetStream only)

    svc.send(reply, error_json("stream_msg_get_response", MetaError("cluster_not_avail")))
