"""Copies of a damaged batch object from the cluster's members, for a stream's new writer (a repair from
another copy), with or without the zone router.

A new writer loads the stream's whole chain from the shared store; an object there that fails its checks (torn,
a flipped bit: `sharedlayout.DamagedBatch`) stops the takeover. Every server keeps checked copies of batch
objects on its disk: a writer on an s3:// store caches each batch it uploads, durably, before the batch is
acknowledged (`sharedcommit`), and a reader caches what it fetches (`SharedView._fetch`; the zone router's
snapshots too). So the new writer asks every live member for batch `b` of epoch `e`: each answers with the
first checked copy its sources hold (its stream cache directory, then the sources an extension adds, e.g. the
zone router's snapshots: `add_source`) or nothing; the first answer that passes the same checks is PUT back
over the damaged object and the takeover goes on (`clusterleaders`). With no copy among the live members the
stream is not served, and the leader asks again while it leads it: the server that wrote the batch (and
cached it) may be down for a restart. Before (2026-11-29, a 30-minute campaign without the zone router,
seed 25), only the zone router asked: a stream on a plain clustered shared store stayed unservable for good
after one bit flip.

Frames on the `copies` link channel (`copies.<account>` for an account's own JetStream):
- 1 query (writer -> member): query id u64, batch u64, epoch u64, then the stream's name;
- 2 copy (member -> writer): query id u64, then the batch object zstd-compressed (empty: no copy here).
"""

from __future__ import annotations

import asyncio
import logging
import struct
from collections.abc import Callable
from typing import TYPE_CHECKING

import zstandard

from zonebus.link.memberqueries import MemberQueries
from zonebus.store import sharedlayout as L
from zonebus.store.cachecopies import read_copy

if TYPE_CHECKING:
    from zonebus.link.channels import LinkChannels
    from zonebus.store.shared import SharedStorage

log = logging.getLogger(__name__)

QUERY, COPY = 1, 2
WAIT = 5.0  # seconds the writer waits for the members' answers
_Q = struct.Struct("!BQQQ")
_C = struct.Struct("!BQ")

LocalCopy = Callable[[str, int, int], bytes | None]  # (stream, batch, epoch) -> a copy held here (unchecked)


class FrameError(ValueError):
    """A frame of the `copies` channel that cannot be decoded."""


def query_frame(qid: int, stream: str, batch: int, epoch: int) -> bytes:
    return _Q.pack(QUERY, qid, batch, epoch) + stream.encode()


def decode_query(frame: bytes) -> tuple[int, str, int, int]:
    if len(frame) < _Q.size:
        raise FrameError("truncated copy query")
    _kind, qid, batch, epoch = _Q.unpack_from(frame)
    try:
        stream = bytes(frame[_Q.size :]).decode()
    except UnicodeDecodeError as exc:
        raise FrameError(f"bad copy query: {exc}") from None
    return qid, stream, batch, epoch


def copy_frame(qid: int, compressed: bytes) -> bytes:
    return _C.pack(COPY, qid) + compressed


class BatchCopies:
    """One JetStream's end of the `copies` channel: answers members' queries, and asks them for its takeovers."""

    def __init__(self, name: str, channels: LinkChannels, shared: SharedStorage, channel: str = "copies") -> None:
        self.shared = shared
        self.channel = channels.register(channel, self._frame)
        self.queries = MemberQueries(name, self.channel.send, self.channel.peers, lambda _peer: True)
        self.sources: list[LocalCopy] = [self._cached]
        self._cctx = zstandard.ZstdCompressor(level=3)
        self._dctx = zstandard.ZstdDecompressor()
        self.stats = {"asked": 0, "answered": 0, "found": 0, "repaired": 0}

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        """The event loop the channel runs on (takeovers run in worker threads and ask through it)."""
        self.queries.loop = loop
        self.shared.copy_source = self.fetch

    def add_source(self, source: LocalCopy) -> None:
        """Another place this server keeps copies of batch objects (called on the event loop)."""
        self.sources.append(source)

    def _cached(self, stream: str, batch: int, epoch: int) -> bytes | None:
        """The copy in this server's cache directory of the stream (a writer's uploads, a reader's fetches)."""
        return read_copy(self.shared.cache_dir(stream), batch, epoch)

    def local(self, stream: str, batch: int, epoch: int) -> bytes | None:
        """The first copy held here that passes every check of the layout, or None."""
        for source in self.sources:
            data = source(stream, batch, epoch)
            if data is None:
                continue
            try:
                L.check_batch(data, batch, epoch)
            except L.LayoutError:
                continue
            return data
        return None

    # -- the new writer's side ----------------------------------------------------------------------
    def fetch(self, stream: str, batch: int, epoch: int) -> bytes | None:
        """Worker thread: a checked copy of batch `batch` of epoch `epoch` from this server or a live member;
        None when none has one."""
        loop = self.queries.loop
        if loop is None:
            return None
        fut = asyncio.run_coroutine_threadsafe(self._fetch(stream, batch, epoch), loop)
        try:
            data = fut.result(WAIT + 5)
        except TimeoutError:  # the loop did not get to it: no copy this time (the leader asks again)
            fut.cancel()
            return None
        if data is not None:
            self.stats["repaired"] += 1
        return data

    async def _fetch(self, stream: str, batch: int, epoch: int) -> bytes | None:
        own = self.local(stream, batch, epoch)
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

    # -- frames ----------------------------------------------------------------------------------------
    def _frame(self, peer: str, frame: bytes) -> None:
        try:
            if frame[:1] == bytes([QUERY]):
                qid, stream, batch, epoch = decode_query(frame)
                self.stats["answered"] += 1
                data = self.local(stream, batch, epoch)
                self.channel.send(peer, copy_frame(qid, self._cctx.compress(data) if data else b""))
            elif frame[:1] == bytes([COPY]) and len(frame) >= _C.size:
                self.queries.answer(_C.unpack_from(frame)[1], bytes(frame[_C.size :]))
            else:
                raise FrameError(f"unknown frame kind {frame[:1]!r}")
        except FrameError as exc:
            log.warning("batch copies: bad frame from %s: %s", peer, exc)
