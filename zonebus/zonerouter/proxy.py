"""The proxy side of the publish path: batch publishes per leader, send each batch to the leader the cheaper
way, and fan its answer out as PubAcks.

The storage path writes the batch to our RouterChannel and sends the leader a link record; the link path sends
the batch itself, zstd-compressed, as an inline batch frame (no storage request). `paths.PathChooser` picks per
batch from its size and the flow's compression ratio at the configured prices. A batch closes after `linger` (the
link path) or `storage_linger` (a store without request prices, or `zone_router_path: storage`) or at
`max_bytes`. Where a leader's unanswered bytes (their peak within `PEAK_WINDOW`) reach the size at which storage
is the cheaper path (`PathChooser.gather_bytes`: a burst, many publishes in flight), the open batch gathers: it
closes once no batch to that leader is unanswered and publishes stopped coming for `GATHER_GAP` (the publishers wait for
their acks: the batch holds what they had in flight), at `STORAGE_BATCH`, or after `gather_linger`. Several
uploads run at once, but link records and inline batches leave in channel-offset order, so one publisher's
messages reach the leader in the order sent. A batch whose upload fails, whose leader cannot be reached or does
not answer within `timeout` is answered with a retriable JetStream error (503): the client's publish raises and
its retry goes through; nothing is acknowledged that the leader did not store. The streams this server leads
take the same way for its own clients (`here`): a batch goes to the leader side in this process (`local`), after
its upload on the storage path, never over a link. Runs on the event loop; uploads run in worker threads.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from zonebus.store import routerbatch as batchfmt
from zonebus.zonerouter.channel import RouterChannel
from zonebus.zonerouter.paths import GATHER_GAP, LINK, STORAGE, STORAGE_BATCH, PathChooser
from zonebus.zonerouter.records import BatchAnswer, LinkRecord, streamed_frame
from zonebus.zonerouter.tailrefs import SentBatches

log = logging.getLogger(__name__)

ANSWER_TIMEOUT = 3.0  # nats-py waits 5 s for a PubAck
OUT_OF_STEP = "compression stream out of step"  # the leader could not decode a streamed batch
PEAK_WINDOW = 2.0  # seconds a leader's most pending bytes count as its window of publishes in flight


def retry_error(why: str) -> bytes:
    return json.dumps({"error": {"code": 503, "err_code": 10008,
                                 "description": f"zone router: {why}, retry"}}, separators=(",", ":")).encode()


@dataclass
class _Batch:
    leader: str
    messages: list[batchfmt.Message] = field(default_factory=list)
    replies: list[str] = field(default_factory=list)
    size: int = 0
    epoch: int = 0
    offset: int = -1
    state: str = "open"  # open -> uploading -> uploaded -> sent (-> answered) | failed
    sent_at: float = 0.0
    inline: bytes | None = None  # the link path: the batch, sent (compressed) instead of a link record; a
    # batch for this server's own streams, either path: the batch, handed to its leader side as it is
    stored: bool = False  # a channel object was written (to be trimmed once the leader is done with it)
    opened: float = field(default_factory=time.monotonic)
    settled: bool = False  # answered or failed: its bytes left the target's pending count


class _Target:
    def __init__(self) -> None:
        self.open: _Batch | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.queue: deque[_Batch] = deque()  # sealed, link record not sent yet, in offset order
        self.pending = 0  # bytes submitted for this leader and not answered yet (open, queued or in flight)
        self.flying = 0  # sealed batches not answered yet
        self.gathering = False  # enough is in flight for a batch to fill up to the storage path's size
        self.last_add = 0.0  # when the last publish was added (monotonic)
        self.peak = 0  # the most bytes pending lately (within `PEAK_WINDOW` of `peak_at`)
        self.peak_at = 0.0


class Proxy:
    def __init__(self, channel: RouterChannel, send_link: Callable[[str, bytes], bool],
                 send_reply: Callable[[str, bytes], None], linger: float, max_bytes: int,
                 paths: PathChooser | None = None, sent: SentBatches | None = None) -> None:
        self.channel = channel
        self.send_link = send_link
        self.send_reply = send_reply
        self.linger = linger
        self.max_bytes = max_bytes
        self.paths = paths or PathChooser("storage", False, linger)
        self.targets: dict[str, _Target] = {}
        self.waiting: dict[int, _Batch] = {}  # channel offset -> batch sent, awaiting its answer
        self.done: list[tuple[int, int]] = []  # (epoch, offset) of batches the leader is done with: to trim
        self.tasks: set[asyncio.Task] = set()
        self.sent = sent  # kept for the replicated tail's references (`tailrefs`); None: no tail here
        self.domain = ""  # the JetStream domain, named in PubAcks as the leader's own do (zonebus.stream.domain)
        self.here = ""  # this server's name: batches for its own streams go to `local`, not over a link
        self.local: Callable[[LinkRecord, bytes, bool], None] | None = None  # (record, batch, stored)
        self.stats = {"msgs": 0, "bytes": 0, "batches": 0, "inline_batches": 0, "acked": 0, "errors": 0,
                      "link_bytes": 0, "gathered_batches": 0, "largest_batch": 0, "own_batches": 0}

    # -- intake --------------------------------------------------------------------------------------
    def submit(self, leader: str, stream: str, subject: str, reply: str, headers: bytes, payload: bytes) -> None:
        target = self.targets.get(leader)
        if target is None:
            target = self.targets[leader] = _Target()
        b = target.open
        if b is None:
            b = target.open = _Batch(leader)
        b.messages.append(batchfmt.Message(stream, subject, headers, payload))
        b.replies.append(reply)
        size = len(subject) + len(headers) + len(payload) + 16
        b.size += size
        target.pending += size
        now = target.last_add = time.monotonic()
        if target.pending >= target.peak or now - target.peak_at > PEAK_WINDOW:
            target.peak, target.peak_at = target.pending, now
        self.stats["msgs"] += 1
        self.stats["bytes"] += len(payload)
        self.paths.seen(leader, len(payload))
        if b.size >= (STORAGE_BATCH if target.gathering else self.max_bytes):
            self._seal(leader, target)
        elif target.timer is None:
            loop = asyncio.get_running_loop()
            paths = self.paths
            short = paths.flows[leader].path == LINK or (paths.billed and paths.mode != STORAGE)
            linger = self.linger if short else paths.storage_linger
            target.timer = (loop.call_later(linger, self._linger_done, leader, target) if linger > 0
                            else loop.call_soon(self._linger_done, leader, target))  # type: ignore[assignment]

    def _linger_done(self, leader: str, target: _Target) -> None:
        """The open batch's linger is over: seal it, unless it gathers (publishes still coming, enough in
        flight for a batch the storage path carries cheaper) and may fill a while longer."""
        target.timer = None
        b = target.open
        if b is None:
            return
        gather = self.paths.gather_bytes(leader)
        now = time.monotonic()
        window = target.peak if now - target.peak_at <= PEAK_WINDOW else target.pending
        target.gathering = bool(gather) and max(target.pending, window) >= gather
        if target.gathering:  # publishes come back as the batches in flight are answered: wait for them all
            idle, age = now - target.last_add, now - b.opened
            if (idle < GATHER_GAP or target.flying) and age < self.paths.gather_linger:
                wait = min(max(GATHER_GAP - idle, 0.001), self.paths.gather_linger - age)
                target.timer = asyncio.get_running_loop().call_later(wait, self._linger_done, leader, target)
                return
        self._seal(leader, target)

    def _seal(self, leader: str, target: _Target) -> None:
        if target.timer is not None:
            target.timer.cancel()
            target.timer = None
        b, target.open = target.open, None
        if b is None:
            return
        b.epoch, b.offset = self.channel.next_offset()
        target.flying += 1
        own = leader == self.here
        if self.sent is not None and not own:  # the leader's tail may send these back to us by reference
            self.sent.add(b.offset, b.messages)
        target.queue.append(b)
        self.stats["batches"] += 1
        self.stats["gathered_batches"] += target.gathering
        data = batchfmt.encode(b.messages)
        self.stats["largest_batch"] = max(self.stats["largest_batch"], len(data))
        link = self.paths.choose(leader, len(data)) == LINK
        if link or own:  # (link: compressed when sent, blocks of the stream to the leader in send order)
            b.inline = data
        if link:
            if own:
                self.paths.measure(leader, data)  # (a batch sent over the link is measured as it is compressed)
            b.state = "uploaded"
            self.stats["inline_batches"] += 1
            self._send_ready(target)
            return
        self.paths.measure(leader, data)
        b.state = "uploading"
        task = asyncio.get_running_loop().create_task(self._upload(target, b, data))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _upload(self, target: _Target, b: _Batch, data: bytes) -> None:
        try:
            await asyncio.to_thread(self.channel.append, b.epoch, b.offset, data)
            b.state, b.stored = "uploaded", True
        except Exception as exc:  # storage unavailable: the clients retry
            log.warning("zone router: writing batch %d failed: %r", b.offset, exc)
            self._fail(b, "shared store write failed")
        self._send_ready(target)

    def _send_ready(self, target: _Target) -> None:
        """Send the link records of the uploaded batches at the head of the queue, in offset order."""
        while target.queue and target.queue[0].state != "uploading":
            b = target.queue.popleft()
            if b.state != "uploaded":
                continue
            link = LinkRecord(self.channel.id, b.offset, b.epoch, time.time_ns(), len(b.messages))
            if b.leader == self.here and b.inline is not None and self.local is not None:  # our own stream
                data, b.inline = b.inline, None
                self.stats["own_batches"] += 1
                b.state, b.sent_at = "sent", time.monotonic()
                self.waiting[b.offset] = b
                self.local(link, data, b.stored)
                continue
            rec = link.encode() if b.inline is None else streamed_frame(link, *self.paths.compress_stream(
                b.leader, b.inline))
            b.inline = None
            if not self.send_link(b.leader, rec):
                self.paths.reset_stream(b.leader)
                self._fail(b, f"leader {b.leader} unreachable")
                continue
            self.stats["link_bytes"] += len(rec)
            b.state, b.sent_at = "sent", time.monotonic()
            self.waiting[b.offset] = b

    # -- answers -------------------------------------------------------------------------------------
    def on_answer(self, peer: str, ans: BatchAnswer) -> None:
        if ans.source != self.channel.id:
            return
        b = self.waiting.get(ans.offset)
        if b is None or b.leader != peer:
            return  # (not ours, or from another server: the batch still waits for its leader's answer)
        del self.waiting[ans.offset]
        self._settle(b)
        if b.stored and self.sent is None:  # (a replicated tail may name its records: the epoch trim deletes it)
            self.done.append((b.epoch, b.offset))
        outcomes = ans.outcomes()
        if any(k == "err" and isinstance(v, bytes) and OUT_OF_STEP.encode() in v for k, v in outcomes):
            self.paths.reset_stream(peer)
        for i, reply in enumerate(b.replies):
            kind, value = outcomes[i] if i < len(outcomes) else ("err", retry_error("short answer"))
            stream = b.messages[i].stream
            if kind == "err":
                body = value if isinstance(value, bytes) else retry_error("leader error")
                self.stats["errors"] += 1
            else:
                dup = ',"duplicate": true' if kind == "dup" else ""
                domain = f',"domain":{json.dumps(self.domain)}' if self.domain else ""
                body = f'{{"stream":{json.dumps(stream)}{domain},"seq":{value}{dup}}}'.encode()
                self.stats["acked"] += 1
            if reply:
                self.send_reply(reply, body)

    def _settle(self, b: _Batch) -> None:
        if not b.settled:
            b.settled = True
            target = self.targets.get(b.leader)
            if target is not None:
                target.pending -= b.size
                target.flying -= 1

    def _fail(self, b: _Batch, why: str) -> None:
        self._settle(b)
        if b.state in ("uploaded", "sent") and b.stored and self.sent is None:
            self.done.append((b.epoch, b.offset))
        b.state = "failed"
        self.stats["errors"] += len(b.replies)
        body = retry_error(why)
        for reply in b.replies:
            if reply:
                self.send_reply(reply, body)

    def leader_down(self, leader: str) -> None:
        """The link to `leader` went down: every batch it has not answered fails (the clients retry)."""
        self.paths.forget(leader)
        for offset, b in list(self.waiting.items()):
            if b.leader == leader:
                del self.waiting[offset]
                self._fail(b, f"link to leader {leader} lost")

    def expire(self, now: float | None = None) -> None:
        """Fail batches whose answer is overdue (called periodically)."""
        now = time.monotonic() if now is None else now
        for offset, b in list(self.waiting.items()):
            if now - b.sent_at > ANSWER_TIMEOUT:
                del self.waiting[offset]
                self._fail(b, f"no answer from leader {b.leader}")

    def info(self) -> dict[str, object]:
        return {**self.stats, "awaiting_answer": len(self.waiting), "paths": self.paths.info(),
                "pending_bytes": {leader: t.pending for leader, t in self.targets.items()},
                "gathering": sorted(leader for leader, t in self.targets.items() if t.gathering)}
