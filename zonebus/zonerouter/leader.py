"""The leader side of the publish path: resolve link records through the proxies' channels and append.

For each link record the leader reads the batch object from shared storage (reads are started at once, so several
are in flight; an inline batch from the link path brings its batch along), then, strictly in the order the
records arrived from that channel, appends every message through the stream's normal publish path
(`Stream.process`: Nats-Msg-Id dedupe, expected-last-* headers, limits, discard policy), waits until the stream's
store made them durable, and answers the proxy with one `BatchAnswer`. A message for a stream this server does
not lead is answered with a retriable error. Runs on the event loop; reads run in worker threads.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from zonebus.protocol.jserrors import JSError
from zonebus.store import routerbatch as batchfmt
from zonebus.zonerouter.channel import RouterChannel
from zonebus.zonerouter.proxy import retry_error
from zonebus.zonerouter.records import BatchAnswer, LinkRecord, answer_entries
from zonebus.zonerouter.tailrefs import Origin, Origins

log = logging.getLogger(__name__)

StreamLookup = Callable[[str], Awaitable[Any]]  # stream name -> the Stream this server leads, or None
Outcome = tuple[str, int | bytes]


class _Source:
    def __init__(self) -> None:
        self.queue: deque[tuple[str, LinkRecord, asyncio.Task, bool]] = deque()  # (peer, record, read, stored)
        self.runner: asyncio.Task | None = None


class LeaderSide:
    def __init__(self, channel: RouterChannel, lookup: StreamLookup,
                 send_answer: Callable[[str, bytes], bool],
                 fenced_epoch: Callable[[], int] = lambda: -1, origins: Origins | None = None) -> None:
        self.channel = channel
        self.origins = origins  # a replicated tail sends each proxy its own records back by reference
        self.lookup = lookup
        self.send_answer = send_answer
        self.fenced_epoch = fenced_epoch
        self.sources: dict[bytes, _Source] = {}
        self.inflight: dict[int, int] = {}  # route epoch -> link records of it not answered yet
        self.stats = {"batches": 0, "inline_batches": 0, "msgs": 0, "rejected": 0, "answer_bytes": 0}

    def on_link(self, peer: str, rec: LinkRecord, data: bytes | None = None, stored: bool | None = None) -> None:
        """A link record (the batch is read from its channel), or an inline batch (`data`, already here;
        `stored`: it is a channel object as well, so the replicated tail may name its records by link)."""
        loop = asyncio.get_running_loop()
        src = self.sources.get(rec.source)
        if src is None:
            src = self.sources[rec.source] = _Source()
        if data is None:
            read = loop.create_task(asyncio.to_thread(self.channel.get, rec.source, rec.epoch, rec.offset))
        else:
            read = loop.create_task(_ready(data))
            self.stats["inline_batches"] += 1
        self.inflight[rec.epoch] = self.inflight.get(rec.epoch, 0) + 1
        src.queue.append((peer, rec, read, data is None if stored is None else stored))
        if src.runner is None or src.runner.done():
            src.runner = loop.create_task(self._drain(src))

    async def stop(self) -> None:
        self.inflight.clear()
        for src in self.sources.values():
            if src.runner is not None:
                src.runner.cancel()
            for _, _, read, _ in src.queue:
                read.cancel()

    async def _drain(self, src: _Source) -> None:
        while src.queue:
            peer, rec, read, stored = src.queue.popleft()
            try:
                outcomes = await self._apply(rec, read, stored)
            except Exception:  # never leave the proxy without an answer
                log.exception("zone router: applying batch %d failed", rec.offset)
                outcomes = [("err", retry_error("leader failed to apply"))] * rec.count
            ans = BatchAnswer(rec.source, rec.offset, answer_entries(outcomes)).encode()
            self.stats["answer_bytes"] += len(ans)
            self.send_answer(peer, ans)
            left = self.inflight.get(rec.epoch, 1) - 1
            if left > 0:
                self.inflight[rec.epoch] = left
            else:
                self.inflight.pop(rec.epoch, None)

    def inflight_floor(self) -> int | None:
        """The oldest route epoch of a link record still being handled, or of a channel object that records not
        yet in a stored log object came from (the replicated tail names them by link record), or None."""
        low = min(self.inflight) if self.inflight else None
        kept = self.origins.floor() if self.origins is not None else None
        return kept if low is None else low if kept is None else min(low, kept)

    async def _apply(self, rec: LinkRecord, read: asyncio.Task, stored: bool) -> list[Outcome]:
        if rec.epoch <= self.fenced_epoch():
            read.cancel()
            self.stats["rejected"] += 1
            return [("err", retry_error(f"route epoch {rec.epoch} is fenced"))] * rec.count
        try:
            messages = batchfmt.decode(await read)
        except Exception as exc:
            log.warning("zone router: reading batch %d failed: %r", rec.offset, exc)
            return [("err", retry_error("batch unreadable on the shared store"))] * rec.count
        self.stats["batches"] += 1
        self.stats["msgs"] += len(messages)
        outcomes: list[Outcome] = []
        last: dict[str, tuple[Any, int]] = {}  # stream -> (Stream, highest sequence to be durable)
        streams: dict[str, Any] = {}
        for i, m in enumerate(messages):
            if m.stream not in streams:
                streams[m.stream] = await self.lookup(m.stream)
            stream = streams[m.stream]
            if stream is None:
                outcomes.append(("err", retry_error(f"this server does not lead stream {m.stream}")))
                continue
            outcome = _append(stream, m)
            outcomes.append(outcome)
            if outcome[0] != "err":
                prev = last.get(m.stream)
                seq = stream.store.index.last_seq if outcome[0] == "reply" else int(outcome[1])
                last[m.stream] = (stream, max(seq, prev[1] if prev else 0))
                if outcome[0] == "ok" and self.origins is not None and getattr(stream.store, "tiered", False):
                    self.origins.add(m.stream, int(outcome[1]), Origin(rec.source, rec.epoch, rec.offset, i, m, stored))
        if self.origins is not None:
            for name, (stream, _seq) in last.items():
                self.origins.prune(name, getattr(stream.store, "durable_seq", 0))
        for name, (stream, seq) in last.items():
            err = await _durable(stream, seq)
            if err is not None:
                body = json.dumps({"error": JSError("stream_store_failed", err=err).to_dict()}).encode()
                outcomes = [("err", body) if o[0] != "err" and messages[i].stream == name else o
                            for i, o in enumerate(outcomes)]
        return outcomes


async def _ready(data: bytes) -> bytes:
    return data


def _append(stream: Any, m: batchfmt.Message) -> Outcome:
    try:
        resp = stream.process(m.subject, m.headers or None, m.payload)
    except JSError as err:
        return "err", json.dumps({"error": err.to_dict(), "stream": stream.name}).encode()
    except Exception:
        log.exception("zone router: storing a message on %s failed", m.subject)
        return "err", retry_error("store failure")
    if not resp:  # a staged message of an atomic batch (zonebus.stream.atomic): its empty reply, as it is
        return "reply", resp
    doc = json.loads(resp)
    if "error" in doc:
        return "err", resp
    if "batch" in doc:  # the PubAck of an atomic batch's commit goes back as it is (answer entry ERR: verbatim)
        return "reply", resp
    return ("dup" if doc.get("duplicate") else "ok"), int(doc["seq"])


async def _durable(stream: Any, seq: int) -> str | None:
    """Wait until the stream's store made `seq` durable; the store's error text, or None."""
    fut: asyncio.Future[str | None] = asyncio.get_running_loop().create_future()

    def done(err: str | None) -> None:
        if not fut.done():
            fut.set_result(err)

    if not stream.store.ack_when_durable(seq, done):
        return None
    return await fut
