"""What a durable queue group is, and the small formats it uses: ack subjects, PubAcks, log records."""

from __future__ import annotations

import json
from dataclasses import dataclass

from zonebus.options import QueueGroupOptions
from zonebus.subjects.patterns import matches

ACK_PREFIX = "$JS.ACK."  # nats-py's Msg.ack()/nak()/term()/in_progress() publish to the reply subject
STREAM_PREFIX = "QG_"  # the group's log shows as stream QG_<group> in PubAcks and ack subjects


def stream_name(group: str) -> str:
    return STREAM_PREFIX + group


def durable_groups(specs: dict[str, QueueGroupOptions]) -> dict[str, QueueGroupOptions]:
    return {name: g for name, g in specs.items() if g.durable and g.subjects}


def group_of(specs: dict[str, QueueGroupOptions], subject: str) -> QueueGroupOptions | None:
    """The durable group whose subjects match `subject` (groups never overlap: config refuses it)."""
    for g in specs.values():
        if any(matches(f, subject) for f in g.subjects):
            return g
    return None


def ack_subject(group: str, primary_hash: str, deliveries: int, seq: int, ts: int, pending: int) -> str:
    """`$JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ts>.<pending>`, as JetStream's: nats-py parses
    it for `msg.metadata`. The consumer token is the primary's hash, so acks reach the primary that sent it."""
    return f"{ACK_PREFIX}{stream_name(group)}.{primary_hash}.{deliveries}.{seq}.{seq}.{ts}.{pending}"


def parse_ack_subject(subject: str) -> tuple[str, int] | None:
    """(group, seq) of an ack subject made by `ack_subject`, or None."""
    toks = subject.split(".")
    if len(toks) != 9 or not toks[2].startswith(STREAM_PREFIX):
        return None
    try:
        return toks[2][len(STREAM_PREFIX):], int(toks[5])
    except ValueError:
        return None


def pub_ack(group: str, seq: int) -> bytes:
    return json.dumps({"stream": stream_name(group), "seq": seq}, separators=(",", ":")).encode()


@dataclass(slots=True)
class Record:
    """One stored message: what the publisher sent, and where it was published (server, zone)."""

    seq: int
    subject: str
    hdrs: bytes | None
    payload: bytes
    ts: int
    origin: str
    zone: str

    @property
    def data(self) -> bytes:
        """Headers + payload + CRLF, as the server core delivers a message."""
        return (self.hdrs or b"") + self.payload + b"\r\n"

    @property
    def hdr_len(self) -> int:
        return len(self.hdrs) if self.hdrs is not None else -1


def encode_origin(origin: str, zone: str, hdrs: bytes | None) -> bytes:
    """The stored header block: one `ZBQ <origin> <zone|-> <has headers>` line, then the publisher's headers."""
    return f"ZBQ {origin} {zone or '-'} {1 if hdrs is not None else 0}\r\n".encode() + (hdrs or b"")


def decode_origin(stored: bytes | None) -> tuple[str, str, bytes | None]:
    if not stored or not stored.startswith(b"ZBQ "):
        return "", "", stored
    line, _, rest = stored.partition(b"\r\n")
    parts = line.decode(errors="replace").split(" ")
    if len(parts) != 4:
        return "", "", rest or None
    zone = "" if parts[2] == "-" else parts[2]
    return parts[1], zone, rest if parts[3] == "1" else None
