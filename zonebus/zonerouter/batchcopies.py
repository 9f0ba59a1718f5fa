"""Copies of a damaged batch object from other servers, for a stream's new writer (a repair from another copy).

A new writer loads the stream's whole chain from the shared store; an object there that fails its checks (torn,
a flipped bit: `sharedlayout.DamagedBatch`) stops the takeover. The writer that uploaded it may be gone, and its
checked copy with it (`SharedStore.repair_batch` repairs from the writer's copy while it lives), but the proxies'
snapshots read or replicated every batch of the streams they serve and keep recent ones in memory and fetched ones
in their cache directories. So the new writer asks every live member for batch `b` of epoch `e`; each answers
with its view's copy (`SharedView.local_copy`: checked whole against the layout, never a guess) or nothing; the
first answer that passes the same checks here is PUT back over the damaged object and the takeover goes on
(`zonebus.stream.clusterleaders`). With no copy anywhere the stream stays unservable with its clear error.

Frames on the `zr` link channel (after `records`' 4-byte head):
- 20 copy query (writer -> member): query id u64, batch u64, epoch u64, then the stream's name;
- 21 copy (member -> writer): query id u64, then the batch object zstd-compressed (empty: no copy here).
"""

from __future__ import annotations

import asyncio
import logging
import struct
from collections.abc import Callable

import zstandard

from zonebus.store import sharedlayout as L
from zonebus.zonerouter.memberqueries import MemberQueries
from zonebus.zonerouter.records import _HEAD, MAGIC, VERSION, RecordError

log = logging.getLogger(__name__)

COPYQ, COPY = 20, 21
WAIT = 5.0  # seconds the writer waits for the members' answers
_Q = struct.Struct("!QQQ")
_U64 = struct.Struct("!Q")

LocalCopy = Callable[[str, int, int], bytes | None]  # (stream, batch, epoch) -> this server's checked copy


def query_frame(qid: int, stream: str, batch: int, epoch: int) -> bytes:
    return _HEAD.pack(MAGIC, VERSION, COPYQ) + _Q.pack(qid, batch, epoch) + stream.encode()


def decode_query(frame: bytes) -> tuple[int, str, int, int]:
    if len(frame) < _HEAD.size + _Q.size:
        raise RecordError("truncated copy query")
    qid, batch, epoch = _Q.unpack_from(frame, _HEAD.size)
    try:
        stream = bytes(frame[_HEAD.size + _Q.size :]).decode()
    except UnicodeDecodeError as exc:
        raise RecordError(f"bad copy query: {exc}") from None
    return qid, stream, batch, epoch


def copy_frame(qid: int, compressed: bytes) -> bytes:
    return _HEAD.pack(MAGIC, VERSION, COPY) + _U64.pack(qid) + compressed


class BatchCopies:
    def __init__(self, queries: MemberQueries, local_copy: LocalCopy) -> None:
        self.queries = queries
        self.local_copy = local_copy
        self._cctx = zstandard.ZstdCompressor(level=3)
        self._dctx = zstandard.ZstdDecompressor()
        self.stats = {"asked": 0, "answered": 0, "found": 0}

    def fetch(self, stream: str, batch: int, epoch: int) -> bytes | None:
        """Worker thread: a checked copy of batch `batch` of epoch `epoch` from this server or a live member;
        None when none has one."""
        loop = self.queries.loop
        if loop is None:
            return None
        fut = asyncio.run_coroutine_threadsafe(self._fetch(stream, batch, epoch), loop)
        return fut.result(WAIT + 5)

    async def _fetch(self, stream: str, batch: int, epoch: int) -> bytes | None:
        own = self.local_copy(stream, batch, epoch)
        if own is not None:
            return own
        asked, _unsent = self.queries.ask(lambda qid: query_frame(qid, stream, batch, epoch))
        self.stats["asked"] += len(asked)
        try:
            for done in asyncio.as_completed(asked.values(), timeout=WAIT):
                raw = await done
                if not raw:
                    continue
                try:
                    data = self._dctx.decompress(raw)
                    L.check_batch(data, batch, epoch)
                except (zstandard.ZstdError, L.LayoutError):
                    continue
                self.stats["found"] += 1
                return data
        except TimeoutError:
            pass
        finally:
            self.queries.forget(asked)
        return None

    def on_copy(self, frame: bytes) -> None:
        if len(frame) < _HEAD.size + 8:
            raise RecordError("truncated copy frame")
        self.queries.answer(_U64.unpack_from(frame, _HEAD.size)[0], bytes(frame[_HEAD.size + 8 :]))

    def on_query(self, peer: str, frame: bytes) -> None:
        """A member's side: this server's checked copy of the batch, or an empty answer."""
        qid, stream, batch, epoch = decode_query(frame)
        self.stats["answered"] += 1
        data = self.local_copy(stream, batch, epoch)
        self.queries.send(peer, copy_frame(qid, self._cctx.compress(data) if data else b""))
