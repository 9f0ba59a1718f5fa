"""Which way a proxy's batches for one leader cross zones: through the shared store, or over the link.

The storage path costs requests: one PUT of the channel object, one GET by the leader and, where the stream keeps
a replicated tail, one GET by the proxy of each further zone (the tail names the batch's records by link record,
`tailrefs`). The link path costs bytes: the batch, compressed (zstd), crosses to the leader, and the tail carries
its records, compressed again, to each further zone. `PathChooser` keeps, per leader, the rate of payload bytes
(a moving average over `WINDOW` seconds) and the compression ratio measured on the batches, and picks the
cheaper one at the configured prices (`zonebus.prices`: a transfer list and a storage list) for every batch as
it is sealed, from that batch's size:

    link:    bytes x ratio x price of a byte crossing x (1 + further zones)
    storage: PUT + GET x (1 + further zones)

The further zones are those whose replica gets the batch's records in full from the leader's tail: every zone
but the proxy's and the leader's with `zone_router_spread: all`; with `quorum`, none while this proxy is itself
the replica that gets the stream's tail (its own records come back by reference: `tail_seen`, the last snapshot
answer from that leader carried tail parts), else the one replica that does. `auto` is priced as `quorum`: where
batches grow large enough for the choice to matter (a burst), the other zones' readers fall behind and read
stored log objects (`spread`).

So a small batch goes over the link and a large one (about 0.7 MB of 1 KiB JSON at S3 Standard and AWS transfer
prices, with three zones) through storage; a `file://` store (no request price) always uses storage. A large
batch forms only where that much is in flight: when a leader's unanswered bytes (their peak of the last seconds)
reach the size at which storage is cheaper (`gather_bytes`), the proxy lets the open batch fill until publishes
stop coming (`GATHER_GAP`), it reaches `STORAGE_BATCH`, or `gather_linger` passed (`proxy.Proxy`). The leader's
own zone counts as a proxy too (its batches stay on the server, and the link path's price is the tail's: the
records cross to the tail's replicas, `tail_zones`, and through storage each of them GETs the object;
`measure`). The read path asks the same prices how large a compressed log object may be to go to a proxy
inline with the snapshot answer rather than as a GET (`inline_limit`). `mode` forces one path (`storage` or
`link`). `info()` says per leader which path is taken and why, for `/jsz`.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field

import zstandard

from zonebus.link.compression import ZSTD_LEVELS
from zonebus.prices import storage_prices, transfer_doc, transfer_per_byte

WINDOW = 2.0  # seconds over which the byte rate is averaged
STORAGE, LINK = "storage", "link"
STORAGE_BATCH = 4 << 20  # bytes at which a gathering batch is sealed (S3 charges per request, not per byte)
GATHER_FROM = 1.0  # a batch gathers where that many times its break-even size is in flight
GATHER_GAP = 0.005  # seconds without a publish after which a gathering batch is sealed
TAIL_SEEN = 2.0  # seconds after the last tail part from a leader during which this proxy counts as its replica
# the zstd level of what the router sends over the link, batches (here) and tail parts (`serving`), where the
# routes are not compressed; routes that are (`cluster { compression: s2_best }`) lend theirs (`level_for`)
ZSTD_LEVEL = 3


def level_for(route_mode: str) -> int:
    """The zstd level of the router's link traffic where the routes compress in `route_mode` (nats-server's names,
    normalised): the routes' own level (`s2_best`: 7) where it is higher than `ZSTD_LEVEL`. A user who asks for the
    best compression on the routes buys fewer bytes with CPU; the router's bytes cross the same zones."""
    return max(ZSTD_LEVEL, ZSTD_LEVELS.get(route_mode, 0))


@dataclass
class _Flow:
    rate: float = 0.0  # payload bytes per second, moving average
    last: float = field(default_factory=time.monotonic)
    ratio: float = 0.5  # compressed / raw, moving average over batches (the first batch measured sets it)
    measured: int = 0  # batches measured
    path: str = STORAGE
    why: str = ""
    batches: dict[str, int] = field(default_factory=lambda: {STORAGE: 0, LINK: 0})


class PathChooser:
    def __init__(self, mode: str, billed: bool, storage_linger: float, storage: str = "s3-standard",
                 transfer: str = "aws", level: int = ZSTD_LEVEL) -> None:
        self.mode = mode  # auto | storage | link
        self.level = level  # zstd level of the link path's batches
        self.billed = billed  # the store bills requests (s3://)
        self.storage_linger = storage_linger  # how long a storage-path batch fills (the proxy's timer)
        sp = storage_prices(storage)
        self.per_batch = sp.per_request("PUT") + sp.per_request("GET")
        self.per_get = sp.per_request("GET")
        self.per_byte = transfer_per_byte(transfer_doc(transfer)[0])
        self.further_zones = 0  # zones besides the proxy's and the leader's that a replicated tail reaches
        self.tail_zones: int | None = None  # zones a replicated tail of a stream led here reaches (None: no tail)
        self.spread_quorum = False  # `zone_router_spread: quorum` or `auto`: the tail may reach the quorum only
        self.here = ""  # this server's name (a batch for it is its own zone's)
        self._tail_seen: dict[str, float] = {}  # leader -> when its last tail part reached this server
        self.gather_linger = max(storage_linger, 0.001)  # the longest a gathering batch fills
        self.flows: dict[str, _Flow] = {}
        self._cctx = zstandard.ZstdCompressor(level=level)
        self._dctx = zstandard.ZstdDecompressor()
        # the link path's batches to a leader are blocks of one zstd stream (small batches compress like a large
        # one); a new generation starts after anything that may have lost a block (a failed send, a lost link)
        self._gen = random.getrandbits(31) | 1
        self._out: dict[str, tuple[int, object]] = {}  # leader -> (generation, compressobj)
        self._in: dict[str, tuple[int, object]] = {}  # proxy -> (generation, decompressobj)
        self._probe: dict[str, zstandard.ZstdCompressionObj] = {}  # (`measure`)

    def _flow(self, leader: str) -> _Flow:
        f = self.flows.get(leader)
        if f is None:
            f = self.flows[leader] = _Flow()
        return f

    def seen(self, leader: str, nbytes: int) -> None:
        """`nbytes` of payload were submitted for `leader` now."""
        f = self._flow(leader)
        now = time.monotonic()
        dt = now - f.last
        f.last = now
        decay = max(0.0, 1.0 - dt / WINDOW)
        f.rate = f.rate * decay + nbytes / WINDOW

    def choose(self, leader: str, size: int) -> str:
        """The path of a batch of `size` bytes for `leader`."""
        f = self._flow(leader)
        if self.mode in (STORAGE, LINK):
            f.path, f.why = self.mode, f"zone_router_path: {self.mode}"
        elif not self.billed:
            f.path, f.why = STORAGE, "the store bills no requests"
        else:
            crossings, gets = self._reach(leader)
            link = size * self._link_per_byte(f, crossings)
            storage = self._storage_per_batch(gets)
            f.path = LINK if link < storage else STORAGE
            f.why = (f"a batch of {size / 1e3:.0f} kB x {f.ratio:.2f} compressed crossing {crossings} zone "
                     f"boundar{'y' if crossings == 1 else 'ies'} costs ${link * 1e6:.2f} per million; "
                     f"through storage {1 + gets} requests cost ${storage * 1e6:.2f} per million")
        f.batches[f.path] += 1
        return f.path

    def break_even(self, leader: str) -> int:
        """The batch size from which storage is the cheaper path for `leader` (0: a store without request
        prices, or the link forced)."""
        if self.mode == LINK or not self.billed or self.per_byte <= 0:
            return 0
        crossings, gets = self._reach(leader)
        if crossings <= 0:
            return 0
        return int(self._storage_per_batch(gets) / self._link_per_byte(self._flow(leader), crossings))

    def tail_seen(self, leader: str) -> None:
        """A snapshot answer from `leader` carried tail parts: this proxy is (one of) its tail's replicas."""
        self._tail_seen[leader] = time.monotonic()

    def _reach(self, leader: str) -> tuple[int, int]:
        """(zone boundaries a batch's bytes cross over the link, GETs of its object through storage)."""
        if leader == self.here and self.tail_zones is not None:  # stays here; the tail carries it to its replicas
            return self.tail_zones, self.tail_zones  # (or names the object, which each of them GETs)
        further = self.further_zones
        if self.spread_quorum and time.monotonic() - self._tail_seen.get(leader, -1e9) < TAIL_SEEN:
            further = 0  # this proxy is the replica: its records come back by reference
        return 1 + further, 1 + further

    def _link_per_byte(self, f: _Flow, crossings: int) -> float:
        """A batch byte over the link: compressed, it crosses `crossings` zone boundaries."""
        return f.ratio * self.per_byte * crossings

    def _storage_per_batch(self, gets: int) -> float:
        """A batch through storage: its PUT and `gets` GETs (the leader's, one per further zone's replica)."""
        return self.per_batch - self.per_get + self.per_get * gets

    def gather_bytes(self, leader: str) -> int:
        """The unanswered bytes from which a batch for `leader` gathers (0: never): `GATHER_FROM` times the
        break-even size, so that a gathered batch (the publishes in flight, at most `STORAGE_BATCH`) is cheaper
        through storage by a margin that pays its wait. A smaller window of publishes in flight fills batches
        about as cheap either way; gathering would only cost it latency."""
        size = self.break_even(leader)
        return int(GATHER_FROM * size) if 0 < size < STORAGE_BATCH else 0

    def _note_ratio(self, leader: str, raw: int, packed: int) -> None:
        """A batch of `raw` bytes compressed to `packed`: the flow's ratio, a moving average over batches."""
        f = self._flow(leader)
        r = packed / max(raw, 1)
        f.ratio = r if not f.measured else 0.8 * f.ratio + 0.2 * r
        f.measured += 1

    def compress(self, leader: str, data: bytes) -> bytes:
        out = self._cctx.compress(data)
        self._note_ratio(leader, len(data), len(out))
        return out

    def compress_stream(self, leader: str, data: bytes) -> tuple[int, bytes]:
        """(generation, the batch as the next block of the stream to `leader`)."""
        s = self._out.get(leader)
        if s is None:
            self._gen = (self._gen + 1) & 0x7FFFFFFF or 1
            # a compressor of its own: compressobj()s of one ZstdCompressor share its context
            s = self._out[leader] = (self._gen, zstandard.ZstdCompressor(level=self.level).compressobj())
        obj: zstandard.ZstdCompressionObj = s[1]  # type: ignore[assignment]
        out = obj.compress(data) + obj.flush(zstandard.COMPRESSOBJ_FLUSH_BLOCK)
        self._note_ratio(leader, len(data), len(out))
        return s[0], out

    def reset_stream(self, leader: str) -> None:
        """A block to `leader` may be lost: the next batch starts a new stream."""
        self._out.pop(leader, None)

    def decompress_stream(self, proxy: str, gen: int, data: bytes) -> bytes:
        """The leader's side: the next block of `proxy`'s stream `gen` (zstandard.ZstdError when out of step)."""
        s = self._in.get(proxy)
        if s is None or s[0] != gen:
            s = self._in[proxy] = (gen, zstandard.ZstdDecompressor().decompressobj())
        try:
            return s[1].decompress(data)  # type: ignore[attr-defined, no-any-return]
        except zstandard.ZstdError:
            self._in.pop(proxy, None)
            raise

    def forget(self, peer: str) -> None:
        """The link to `peer` went down: both directions' streams start over."""
        self._out.pop(peer, None)
        self._in.pop(peer, None)

    def measure(self, leader: str, data: bytes) -> None:
        """A batch that is not sent over the link (a storage-path batch, or one that stays on this server because
        the leader is here and its replicated tail carries the records): measure the ratio the link would get on
        it, as the next block of one zstd stream, as the link and the tail send their batches, nothing is sent.
        (A batch compressed alone, or the first guess of 0.5, put the break-even size at half the true one for
        JSON, so that objects went to storage where the link was cheaper.)"""
        s = self._probe.get(leader)
        if s is None:
            s = self._probe[leader] = zstandard.ZstdCompressor(level=self.level).compressobj()
        out = s.compress(data) + s.flush(zstandard.COMPRESSOBJ_FLUSH_BLOCK)
        self._note_ratio(leader, len(data), len(out))

    def decompress(self, data: bytes) -> bytes:
        return self._dctx.decompress(data)

    def inline_limit(self) -> int:
        """The read path: the largest compressed log object that crosses cheaper inline (with the snapshot
        answer) than as a GET by the proxy; 0 on a store that bills no requests (or with `mode: storage`)."""
        if not self.billed or self.mode == STORAGE or self.per_byte <= 0:
            return 0 if self.mode != LINK else 1 << 20
        return min(int(self.per_get / self.per_byte), 1 << 20)

    def compress_object(self, data: bytes) -> bytes:
        return self._cctx.compress(data)

    def info(self) -> dict[str, object]:
        return {"mode": self.mode, "zstd_level": self.level, "leaders": {
            leader: {"path": f.path, "why": f.why, "bytes_per_s": round(f.rate), "compression_ratio": round(f.ratio, 3),
                     "batches": dict(f.batches)} for leader, f in self.flows.items()}}
