"""A new stream writer gathers the replicated tail of the writer it fences (`zonebus.store.sharedtier`).

With `zone_router_ack: replicas` a leader acknowledges a publish once a proxy in another zone holds it; the
batch object follows seconds later. When the leader dies in between, the records it acknowledged are only in its
replicas' snapshots. The new leader's takeover (`SharedStore._takeover`, in a worker thread) calls `collect`,
which asks every live member of the cluster but the fenced writer (and this server's own snapshot) for the
records of the old writer's batches from the first one missing in the store, and takes the longest answer
(each replica holds a prefix of the same log). A member asked stops taking that writer's records before it
answers, so nothing the old writer acknowledges later is missed. A live member that does not answer within
`WAIT` fails the takeover with an OSError (the takeover is retried while this server still leads the stream):
it may hold an acknowledged record. A member that is down is waited for, up to `DOWN_WAIT` seconds, inside
the takeover's collect: replicas keep the tail on their disks (`heldtail`), and after every server lost power
at once the new writer may be up before the replica that holds the tail; past that wait a member still down
is left out (as before: a takeover does not stall for good on a server that is gone). The wait is not a failed
takeover: a failed one has already fenced the old writer with an empty batch in the slot its tail was for, so
its retry would ask for the tail from the slot after it and recover nothing (a takeover whose claim object of
the fenced writer was deleted, so that the dead writer counts as a down member, lost 130 of 163 acknowledged
messages that way: `tests/storage/test_damaged_s3.py`).

Frames on the `zr` link channel (after `records`' 4-byte head):
- 15 tail query (new leader -> member): query id u64, stream, fenced epoch u64, batch u64, new epoch u64;
- 16 tail (member -> new leader): query id u64, then the zstd-compressed records (empty: none held).
"""

from __future__ import annotations

import asyncio
import logging
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass

import zstandard

from zonebus.link.memberqueries import MemberQueries
from zonebus.zonerouter.records import _HEAD, MAGIC, VERSION, RecordError

log = logging.getLogger(__name__)

TAILQ, TAIL = 15, 16
WAIT = 5.0  # seconds the new leader waits for every live member's answer
DOWN_WAIT = 15.0  # seconds a takeover's collect waits for a member that is down (it may hold the tail)
_Q = struct.Struct("!QQQQ")
_U16 = struct.Struct("!H")
_U64 = struct.Struct("!Q")


@dataclass(frozen=True)
class TailQuery:
    qid: int
    stream: str
    epoch: int
    batch: int
    new_epoch: int

    def encode(self) -> bytes:
        raw = self.stream.encode()
        return (_HEAD.pack(MAGIC, VERSION, TAILQ) + _U16.pack(len(raw)) + raw
                + _Q.pack(self.qid, self.epoch, self.batch, self.new_epoch))

    @classmethod
    def decode(cls, frame: bytes) -> TailQuery:
        try:
            pos = _HEAD.size
            (n,) = _U16.unpack_from(frame, pos)
            stream = bytes(frame[pos + 2 : pos + 2 + n]).decode()
            qid, epoch, batch, new_epoch = _Q.unpack_from(frame, pos + 2 + n)
        except (struct.error, UnicodeDecodeError) as exc:
            raise RecordError(f"bad tail query: {exc}") from None
        return cls(qid, stream, epoch, batch, new_epoch)


def tail_frame(qid: int, compressed: bytes) -> bytes:
    return _HEAD.pack(MAGIC, VERSION, TAIL) + _U64.pack(qid) + compressed


def decode_tail(frame: bytes) -> tuple[int, bytes]:
    if len(frame) < _HEAD.size + 8:
        raise RecordError("truncated tail frame")
    return _U64.unpack_from(frame, _HEAD.size)[0], bytes(frame[_HEAD.size + 8 :])


class TailRecovery:
    def __init__(self, queries: MemberQueries,
                 local_tail: Callable[[str, int, int, int], asyncio.Future | None]) -> None:
        self.queries = queries
        self.local_tail = local_tail  # (stream, epoch, batch, new epoch) -> this server's snapshot's records
        self._cctx = zstandard.ZstdCompressor(level=3)
        self._dctx = zstandard.ZstdDecompressor()
        self.stats = {"queries": 0, "answered": 0, "recovered_bytes": 0, "waits_for_down": 0}

    def collect(self, stream: str, epoch: int, batch: int, new_epoch: int, fenced_writer: str) -> bytes:
        """Worker thread (a takeover): the fenced writer's replicated records; OSError when a live member does
        not answer."""
        loop = self.queries.loop
        if loop is None:
            return b""
        fut = asyncio.run_coroutine_threadsafe(self._collect(stream, epoch, batch, new_epoch, fenced_writer), loop)
        return fut.result(DOWN_WAIT + WAIT + 5)

    async def _collect(self, stream: str, epoch: int, batch: int, new_epoch: int, fenced_writer: str) -> bytes:
        queries = self.queries
        give_up = time.monotonic() + DOWN_WAIT
        down = queries.down([fenced_writer])
        if down:
            self.stats["waits_for_down"] += 1
        while down and time.monotonic() < give_up:
            await asyncio.sleep(0.2)
            down = queries.down([fenced_writer])
        if down:
            log.warning("zone router: stream %s: taking epoch %d's tail over without %s (down for %.0f s)", stream,
                        epoch, ", ".join(down), DOWN_WAIT)
        asked, unsent = queries.ask(lambda qid: TailQuery(qid, stream, epoch, batch, new_epoch).encode(),
                                    [fenced_writer])
        if unsent:
            queries.forget(asked)
            raise OSError(f"zone router: cannot ask {', '.join(unsent)} for the tail of {stream}")
        self.stats["queries"] += len(asked)
        answers: list[bytes] = []
        local = self.local_tail(stream, epoch, batch, new_epoch)
        if local is not None:
            answers.append(await local)
        try:
            if asked:
                _done, pending = await asyncio.wait(asked.values(), timeout=WAIT)
                if pending:  # (named before anything is cancelled: a cancelled future counts as done)
                    missing = sorted(p for p, f in asked.items() if f in pending)
                    raise OSError(f"zone router: {', '.join(missing)} did not give the tail of {stream}")
        finally:
            queries.forget(asked)
        answers += [self._dctx.decompress(x) if x else b"" for x in (f.result() for f in asked.values())]
        best = max(answers, key=len, default=b"")
        self.stats["recovered_bytes"] += len(best)
        if best:
            log.warning("zone router: stream %s: %d bytes of epoch %d's replicated tail recovered from %d "
                        "answer(s)", stream, len(best), epoch, len(answers))
        return best

    def on_tail(self, frame: bytes) -> None:
        self.queries.answer(*decode_tail(frame))

    async def on_query(self, peer: str, query: TailQuery) -> None:
        """A member's side: stop taking the old writer's records, then answer with what this server holds."""
        self.stats["answered"] += 1
        fut = self.local_tail(query.stream, query.epoch, query.batch, query.new_epoch)
        data = await fut if fut is not None else b""
        self.queries.send(peer, tail_frame(query.qid, self._cctx.compress(data) if data else b""))
