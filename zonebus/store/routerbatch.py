"""One RouterChannel object: the messages of one proxy batch, as the leader reads them back from shared storage.

Objects are named `zonerouter/channels/<channel id>/<epoch, 10 digits>/<offset, 20 digits>.zrb` (`object_key`);
the zone router writes them (`zonebus.zonerouter.channel`), and the leader's log points into them with link
records (`zonebus.store.linklog`), so the name and the encoding are part of the shared store's layout.

Layout: `ZRB2`, message count u32, then per message: stream name length u16, subject length u16, header
block length u32, payload length u32, and those four byte strings; last, the CRC-32 (zlib/IEEE) of every byte
before it, so that a damaged object is refused rather than stored (`ZRB1`, from servers before the checksum,
is the same without it). Replies stay with the proxy (the leader answers the proxy, which answers its clients).
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass

MAGIC = b"ZRB2"
UNCHECKED = b"ZRB1"  # written by servers before the checksum (read during an upgrade)
_HEAD = struct.Struct("!4sI")
_MSG = struct.Struct("!HHII")
_CRC = struct.Struct("!I")

PREFIX = "zonerouter/channels"


def object_key(channel: bytes, epoch: int, offset: int) -> str:
    return f"{PREFIX}/{channel.hex()}/{epoch:010d}/{offset:020d}.zrb"


class BatchFormatError(ValueError):
    """An object that is not a router batch, or a truncated or damaged one."""


@dataclass(frozen=True)
class Message:
    stream: str
    subject: str
    headers: bytes  # b"" when none
    payload: bytes


def encode(messages: list[Message]) -> bytes:
    parts = [_HEAD.pack(MAGIC, len(messages))]
    for m in messages:
        stream, subject = m.stream.encode(), m.subject.encode()
        parts.append(_MSG.pack(len(stream), len(subject), len(m.headers), len(m.payload)))
        parts += (stream, subject, m.headers, m.payload)
    body = b"".join(parts)
    return body + _CRC.pack(zlib.crc32(body))


def decode(raw: bytes) -> list[Message]:
    data: bytes | memoryview = raw
    try:
        magic, n = _HEAD.unpack_from(data)
        if magic == MAGIC:
            if len(data) < _HEAD.size + _CRC.size:
                raise BatchFormatError("truncated router batch")
            end = len(data) - _CRC.size
            if zlib.crc32(memoryview(data)[:end]) != _CRC.unpack_from(data, end)[0]:
                raise BatchFormatError("router batch checksum mismatch (a damaged object)")
            data = memoryview(raw)[:end]
        elif magic != UNCHECKED:
            raise BatchFormatError(f"not a router batch (magic {magic!r})")
        pos = _HEAD.size
        out = []
        view = memoryview(data)
        for _ in range(n):
            a, b, c, d = _MSG.unpack_from(data, pos)
            pos += _MSG.size
            stream = bytes(view[pos : pos + a]).decode()
            pos += a
            subject = bytes(view[pos : pos + b]).decode()
            pos += b
            headers = bytes(view[pos : pos + c])
            pos += c
            payload = bytes(view[pos : pos + d])
            pos += d
            out.append(Message(stream, subject, headers, payload))
    except struct.error as exc:
        raise BatchFormatError(f"truncated router batch: {exc}") from None
    if pos != len(data):
        raise BatchFormatError(f"router batch has {len(data) - pos} trailing bytes")
    return out
