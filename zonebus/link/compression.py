"""Compression on inter-server links (routes and gateways): nats-server's modes and negotiation, zstd between
zonebus servers.

Modes (`cluster { compression }`, `gateway { compression }`) are nats-server's (`server/server.go`): `off`,
`accept` (the default: compress only when the peer asks), `s2_fast`, `s2_better`, `s2_best`, `s2_auto` (the
level follows the link's RTT, `rtt_thresholds`: default 10 ms, 50 ms, 100 ms), `not supported`, `true` (=
`s2_fast`), `false` (= `off`), or `{mode, rtt_thresholds}`. `select_mode` is nats-server's
`selectCompressionMode`: a side keeps its own mode unless it is `accept`, which takes the peer's (`s2_auto`
becomes `s2_fast`); `off` or no field on either side means no compression, a mode nobody knows closes the link.
The mode names, their spellings in a config file and the threshold checks are in
`zonebus.protocol.compression_modes`, a leaf the config reader shares.

What a link does depends on the peer:
- nats-server compresses with S2, and PyPI has no maintained S2 binding (cramjam has Snappy but not S2, and
  S2 streams use block encodings Snappy cannot read), so zonebus cannot read what nats-server would send. A
  zonebus route therefore says `compression: "off"` in nats-server's INFO field whatever it is configured
  with, and a route to nats-server negotiates `off` (`not supported` when the peer sends no field), exactly as
  two nats-server routes where one side is `off`; `/routez` shows that mode and, in `compression_peer`, what
  the peer offered.
- between zonebus servers the INFO also carries `zonebus_compression` (the configured mode; nats-server
  ignores fields it does not know), negotiated by the same rules; a link that compresses uses zstd (the
  `zstandard` library).

The switch on the wire: a side that has the peer's first INFO and whose negotiated mode compresses sends
`INFO {"zonebus_compress":"zstd"}` (`MARKER`) uncompressed, and everything after it as one zstd stream,
flushed at the end of each write batch (`FLUSH_BLOCK`: the window carries over, so the ratio is that of one
long stream, not of each batch alone). Its reader switches right after that line: until then the link's
parser stops after every INFO (`FrameParser.stop_after`), so no compressed byte is ever parsed as protocol. A
level change (`s2_auto` after an RTT change) ends the zstd frame and starts the next one at the new level.

Levels: `s2_fast` -> zstd 1, `s2_better` -> zstd 3, `s2_best` -> zstd 7, picked with `bench/route_compression.py`
(~750 B JSON events, one server per zone): wire bytes per payload byte 0.204 at level 1 (servers' CPU 19 us per
message against 8.5 uncompressed), 0.201 at 3 (29 us), 0.178 at 7 (64 us); level 5 cost twice level 3's CPU
for 1% of ratio, and nats-server's S2 gets 0.299 (s2_fast) and 0.243 (s2_best, 99 us). Below the first RTT
threshold nats-server sends S2 frames uncompressed (`s2_uncompressed`); zonebus uses level 1 there too, since
bytes between zones are billed whatever the RTT.

Inside a zone nothing is compressed: a route between two zonebus servers whose INFO tags name the same zone
(`az:<zone>`, the ledger's `zone_tag_prefix`) negotiates no compression whatever the mode (both ends decide
alike from the same two tags; `/routez` shows `off (same zone)`). Those bytes are not billed, and on issue #25's
mixed workload (`bench/crosszone_mix.py`, 3 zones x 2 servers, the zone relay passing each message on inside
its zone) they were over half of what was compressed. Interleaved runs on the shared 2-core machine (load
average 15-25): compressing every route cost 324-465 server CPU s/GB (4 runs) against 199-292 without
compression, latency p99 1.5-4.3x; compressing only between zones 254-434 (10 runs, median 337 against 245),
p99 0.4-30x (median 1.8x: the machine's stalls dominate p99), at the same 0.182 cross-zone bytes per payload
byte. Levels 3 and 5 between zones (0.206 and 0.204 B/B, 0.29x of nats-server `s2_best`, at the edge of the
0.3x budget) showed no better p99 in those runs, so `s2_best` stays level 7.

A trained dictionary (`zstandard.train_dictionary` on 2,000 earlier events of the same generator, 16 or 64 KiB)
does not pay on a link's long-lived stream, whose window already holds the recent messages: ratio over 5,000
~750 B events flushed one per block / ten per block, level 7: 0.222 / 0.178 without, 0.231 / 0.194 with (worse);
level 3: 0.275 / 0.199 without, 0.227 / 0.199 with (better only for one-message blocks, and still behind level
7 without); over the first 100 messages of a stream, level 7: 0.238 / 0.182 without, 0.221 / 0.190 with. Both
ends would also need the same dictionary per account and subject prefix, retrained and shipped as traffic
changes, so it is not built.
"""

from __future__ import annotations

from typing import Any

import zstandard

from zonebus.options import CompressionOptions
from zonebus.protocol.compression_modes import (
    ACCEPT,
    NOT_SUPPORTED,
    OFF,
    S2_AUTO,
    S2_BEST,
    S2_BETTER,
    S2_FAST,
    S2_MODES,
    S2_UNCOMPRESSED,
)

NATS_FIELD = "compression"  # nats-server's route INFO field
ZONEBUS_FIELD = "zonebus_compression"  # zonebus's own offer (the configured mode)
MARKER_FIELD = "zonebus_compress"
MARKER = b'INFO {"zonebus_compress":"zstd"}\r\n'

# zstd level per (resolved) mode, and the name /routez shows for it
ZSTD_LEVELS = {S2_UNCOMPRESSED: 1, S2_FAST: 1, S2_BETTER: 3, S2_BEST: 7}
ZSTD_NAMES = {1: "zstd_fast", 3: "zstd_better", 7: "zstd_best"}


def needs_compression(mode: str) -> bool:
    return mode not in ("", OFF, NOT_SUPPORTED)


def select_mode(ours: str, theirs: str) -> str:
    """nats-server's `selectCompressionMode` (`ours` compresses or accepts); ValueError for a peer mode
    nobody knows."""
    if theirs in ("", NOT_SUPPORTED):
        return NOT_SUPPORTED
    if theirs == OFF:
        return OFF
    if theirs == ACCEPT:
        return OFF if ours == ACCEPT else ours
    if theirs in S2_MODES:
        if ours == ACCEPT:
            return S2_FAST if theirs == S2_AUTO else theirs
        return ours
    raise ValueError(f"unsupported route compression mode {theirs!r}")


def negotiate(ours: str, theirs: str) -> str:
    """The mode of a link from this side's configured mode and the peer's offer, as nats-server's
    `processRouteInfo` settles it (a side that does not compress shows `off`, or `not supported` when the
    peer offered nothing or it is so configured)."""
    if needs_compression(ours):
        return select_mode(ours, theirs)
    return NOT_SUPPORTED if theirs in ("", NOT_SUPPORTED) or ours == NOT_SUPPORTED else OFF


def auto_level(rtt: float, thresholds: tuple[float, ...]) -> str:
    """nats-server's `selectS2AutoModeBasedOnRTT`: the first threshold the RTT is within picks uncompressed,
    fast, better, best in that order (a 0 threshold is never within)."""
    for i, limit in enumerate(thresholds):
        if rtt <= limit:
            return (S2_UNCOMPRESSED, S2_FAST, S2_BETTER, S2_BEST)[i]
    return (S2_UNCOMPRESSED, S2_FAST, S2_BETTER, S2_BEST)[3 if len(thresholds) >= 3 else len(thresholds) - 1]


def offer_fields(opts: CompressionOptions, nats_field: bool) -> dict[str, Any]:
    """What this server's INFO says about compression: nats-server's field on routes (`off`: zonebus cannot
    read S2) and zonebus's own offer."""
    fields: dict[str, Any] = {ZONEBUS_FIELD: opts.mode}
    if nats_field:
        fields[NATS_FIELD] = NOT_SUPPORTED if opts.mode == NOT_SUPPORTED else OFF
    return fields


class StreamDeflater:
    """One direction's zstd stream: each batch compressed and flushed as a block; a level change ends the
    frame and the next batch starts a new one."""

    def __init__(self, level: int) -> None:
        self.level = level
        self._obj = zstandard.ZstdCompressor(level=level).compressobj()
        self._pending = b""

    def compress(self, data: bytes) -> bytes:
        obj = self._obj
        out = self._pending + obj.compress(data) + obj.flush(zstandard.COMPRESSOBJ_FLUSH_BLOCK)
        self._pending = b""
        return out

    def set_level(self, level: int) -> None:
        if level == self.level:
            return
        self._pending += self._obj.flush(zstandard.COMPRESSOBJ_FLUSH_FINISH)
        self.level = level
        self._obj = zstandard.ZstdCompressor(level=level).compressobj()


class StreamInflater:
    """The reading side: zstd frames one after the other (a new one after each level change)."""

    MAX_WINDOW = 1 << 23  # history a peer's frame may ask for (level 7 uses 2 MiB; zstd's own cap: 128 MiB)

    def __init__(self) -> None:
        self._dctx = zstandard.ZstdDecompressor(max_window_size=self.MAX_WINDOW)
        self._obj = self._dctx.decompressobj()

    def decompress(self, data: bytes) -> bytes:
        """ValueError on a corrupt stream."""
        try:
            out = self._obj.decompress(data)
            while self._obj.eof:
                rest = self._obj.unused_data
                self._obj = self._dctx.decompressobj()
                if not rest:
                    break
                out += self._obj.decompress(rest)
        except zstandard.ZstdError as exc:
            raise ValueError(str(exc)) from None
        return out


class LinkCompression:
    """One link's compression: the negotiated mode, the codecs once switched, and the bytes before and after
    (wire = on the socket, raw = the protocol the parser and the writer see)."""

    def __init__(self, opts: CompressionOptions, nats_field: bool, own_zone: str = "") -> None:
        self.opts = opts
        self.nats_field = nats_field  # routes: nats-server's field counts for a peer without ours
        self.own_zone = own_zone  # routes: this server's zone ("" = none: no in-zone rule)
        self.same_zone = False  # negotiated a compressing mode with a zonebus peer of our zone: sent as is
        self.mode = ""  # the negotiated mode, nats-server's names ("" = not negotiated yet)
        self.peer_mode = ""  # what the peer offered
        self.auto = False  # s2_auto: the level follows the RTT
        self.deflater: StreamDeflater | None = None
        self.inflater: StreamInflater | None = None
        self.raw_out = self.wire_out = self.raw_in = self.wire_in = 0
        self._mark = (0, 0, 0, 0)  # the counts at the ledger's last handover (`take_window`)

    @property
    def negotiated(self) -> bool:
        return bool(self.mode)

    def negotiate(self, info: dict[str, Any], rtt: float, peer_zone: str = "") -> bool:
        """Settle the mode from the peer's first INFO; True when this link compresses (the caller then sends
        `MARKER` and switches its writer). A zonebus peer in this server's own zone (`peer_zone`, from its
        INFO tags) is not compressed whatever the mode: bytes inside a zone are not billed, and both sides
        decide alike from the same two zones. ValueError for a mode nobody knows."""
        theirs = info.get(ZONEBUS_FIELD)
        zonebus_peer = isinstance(theirs, str)
        if zonebus_peer:
            ours = self.opts.mode
        else:  # nats-server, or a zonebus without compression: only nats-server's field, and ours is "off"
            theirs = info.get(NATS_FIELD) if self.nats_field else ""
            theirs = theirs if isinstance(theirs, str) else ""
            ours = NOT_SUPPORTED if self.opts.mode == NOT_SUPPORTED else OFF
        self.peer_mode = theirs or NOT_SUPPORTED
        mode = negotiate(ours, theirs)
        if mode == S2_AUTO:
            mode = auto_level(rtt, self.opts.rtt_thresholds)
            self.auto = True
        else:
            self.auto = False
        self.mode = mode
        self.same_zone = (zonebus_peer and bool(self.own_zone) and peer_zone == self.own_zone
                          and needs_compression(mode))
        if self.same_zone:
            self.mode, self.auto = OFF, False
        return needs_compression(self.mode)

    def start_deflate(self) -> None:
        self.deflater = StreamDeflater(ZSTD_LEVELS[self.mode])

    def start_inflate(self) -> None:
        self.inflater = StreamInflater()

    def deflate(self, data: bytes) -> bytes:
        out = self.deflater.compress(data)  # type: ignore[union-attr]
        self.raw_out += len(data)
        self.wire_out += len(out)
        return out

    def inflate(self, data: bytes) -> bytes:
        out = self.inflater.decompress(data)  # type: ignore[union-attr]
        self.wire_in += len(data)
        self.raw_in += len(out)
        return out

    def rtt_changed(self, rtt: float) -> None:
        """`s2_auto`: a new RTT may pick another level (from the next write batch on)."""
        if self.auto and self.deflater is not None:
            self.mode = auto_level(rtt, self.opts.rtt_thresholds)
            self.deflater.set_level(ZSTD_LEVELS[self.mode])

    @property
    def name(self) -> str:
        """The mode as monitoring shows it: nats-server's name when nothing is compressed, else zonebus's
        zstd level (`zstd_fast`, `zstd_better`, `zstd_best`)."""
        if self.same_zone:
            return "off (same zone)"
        if not needs_compression(self.mode):
            return self.mode or NOT_SUPPORTED
        return ZSTD_NAMES[ZSTD_LEVELS[self.mode]]

    def ratio(self) -> float:
        """Wire bytes per protocol byte, both directions since the switch (1.0 when nothing was compressed)."""
        raw = self.raw_out + self.raw_in
        return round((self.wire_out + self.wire_in) / raw, 4) if raw else 1.0

    def take_window(self) -> tuple[float, float]:
        """Wire bytes per protocol byte out and in since the last call (1.0 for a direction that compressed
        nothing): the traffic ledger scales a link's per-subject counts by them, so that its `bytes` stay
        the bytes on the wire."""
        now = (self.raw_out, self.wire_out, self.raw_in, self.wire_in)
        ro, wo, ri, wi = (a - b for a, b in zip(now, self._mark, strict=True))
        self._mark = now
        return (wo / ro if ro > 0 else 1.0), (wi / ri if ri > 0 else 1.0)

    def monitoring(self) -> dict[str, Any]:
        """The fields /routez and /gatewayz add to a link's entry."""
        return {
            "compression": self.name,
            "compression_peer": self.peer_mode,
            "compression_ratio": self.ratio(),
            "compression_bytes": {"raw_out": self.raw_out, "wire_out": self.wire_out,
                                  "raw_in": self.raw_in, "wire_in": self.wire_in},
        }


def is_marker(info: dict[str, Any]) -> bool:
    return info.get(MARKER_FIELD) == "zstd" and len(info) == 1
