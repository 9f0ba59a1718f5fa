"""Parser of the server-to-server protocol used by routes (and gateways), on the shared framing.

Op tuples:
  (RMSG, MsgHeader, data)                 RMSG and HMSG; data = payload (header block included) + CRLF
  (RS_PLUS, account, subject, queue|None, weight)
  (RS_MINUS, account, subject, queue|None)
  (A_PLUS, account) (A_MINUS, account)
  (CONNECT, json) (INFO, json) (PING,) (PONG,) (ERR, text)
  (RMSG, MsgHeader(account=LINK_ACCOUNT, subject=channel), data)   LMSG: a frame on an extension's channel

Message lines: `RMSG <acc> <subj> [reply] <size>`, or with queue groups
`RMSG <acc> <subj> + <reply> <q1>... <size>` / `RMSG <acc> <subj> | <q1>... <size>`;
`HMSG` likewise with `<hdr_len> <size>` at the end. `LMSG <channel> <size>`: a frame for an extension's
channel (`zonebus.link.channels`), between zonebus servers only. Zone relay frames (`zonebus.cluster.relay`,
between zonebus servers that offered it) have RMSG's arguments: `ZMSG`/`ZHMSG` (the receiver is its zone's
relay: `MsgHeader.relay == RELAY`) and `QMSG`/`QHMSG` (deliver to the named queue groups only: QUEUES_ONLY).
"""

from __future__ import annotations

from zonebus.protocol import errors
from zonebus.protocol.errors import ProtocolError
from zonebus.protocol.frames import FrameParser, size_arg, split_args, split_op

RMSG, RS_PLUS, RS_MINUS, A_PLUS, A_MINUS, CONNECT, INFO, PING, PONG, ERR, OK = range(11)

LINK_ACCOUNT = b""  # the account of LMSG frames: no RMSG line can produce an empty account
PLAIN, RELAY, QUEUES_ONLY = 0, 1, 2  # MsgHeader.relay: what kind of message frame it came in
_RELAY_OPS = {b"ZMSG": (RELAY, False), b"ZHMSG": (RELAY, True), b"QMSG": (QUEUES_ONLY, False),
              b"QHMSG": (QUEUES_ONLY, True)}
_OP_OF = {(PLAIN, False): b"RMSG", (PLAIN, True): b"HMSG", **{v: k for k, v in _RELAY_OPS.items()}}
_SIMPLE = {b"PING": (PING,), b"PONG": (PONG,), b"+OK": (OK,)}


class MsgHeader:
    __slots__ = ("account", "subject", "reply", "queues", "hdr_len", "size", "again", "relay")

    def __init__(self, account: bytes, subject: bytes, reply: bytes | None, queues: list[bytes] | None,
                 hdr_len: int, size: int) -> None:
        self.account = account
        self.subject = subject
        self.reply = reply
        self.queues = queues
        self.hdr_len = hdr_len
        self.size = size
        self.again: bytes | None = None  # set by the parser once the line is cached (frames.py)
        self.relay = PLAIN  # RELAY / QUEUES_ONLY for a zone relay frame


def parse_msg_args(args: list[bytes], with_headers: bool) -> MsgHeader:
    """Arguments of an RMSG/HMSG line (after the op) -> MsgHeader."""
    tail = 2 if with_headers else 1
    if len(args) < 2 + tail:
        raise ProtocolError(errors.UNKNOWN_OP)
    size = size_arg(args[-1])
    hdr_len = size_arg(args[-2]) if with_headers else -1
    account, subject = args[0], args[1]
    middle = args[2 : len(args) - tail]
    reply = None
    queues = None
    if middle:
        marker = middle[0]
        if marker == b"+":
            if len(middle) < 2:
                raise ProtocolError(errors.UNKNOWN_OP)
            reply, queues = middle[1], middle[2:]
        elif marker == b"|":
            queues = middle[1:]
        elif len(middle) == 1:
            reply = marker
        else:
            raise ProtocolError(errors.UNKNOWN_OP)
    return MsgHeader(account, subject, reply, queues, hdr_len, size)


def msg_line(account: bytes, subject: bytes, reply: bytes | None, queues: list[bytes] | None,
             hdr_len: int, size: int, relay: int = PLAIN) -> bytes:
    """The control line of an RMSG/HMSG, or of a zone relay frame (the inverse of parse_msg_args)."""
    parts = [_OP_OF[(relay, hdr_len >= 0)], account, subject]
    if queues:
        if reply:
            parts += [b"+", reply]
        else:
            parts.append(b"|")
        parts += queues
    elif reply:
        parts.append(reply)
    if hdr_len >= 0:
        parts.append(b"%d" % hdr_len)
    parts.append(b"%d\r\n" % size)
    return b" ".join(parts)


class RouteParser(FrameParser):
    PAYLOAD_OP = RMSG
    OP_NAMES = (b"RMSG", b"HMSG", b"LMSG", b"ZMSG", b"ZHMSG", b"QMSG", b"QHMSG",
                b"RS+", b"RS-", b"A+", b"A-", b"PING", b"PONG", b"CONNECT", b"INFO",
                b"+OK", b"-ERR")

    def _header(self, line: bytes, ops: list[tuple]) -> MsgHeader | None:
        op, rest = split_op(line)
        if op == b"RMSG":
            return self._remember(line, parse_msg_args(split_args(rest), False))
        if op == b"HMSG":
            return self._remember(line, parse_msg_args(split_args(rest), True))
        relay = _RELAY_OPS.get(op)
        if relay is not None:
            hdr = parse_msg_args(split_args(rest), relay[1])
            hdr.relay = relay[0]
            return self._remember(line, hdr)
        if op == b"LMSG":
            args = split_args(rest)
            if len(args) != 2:
                raise ProtocolError(errors.UNKNOWN_OP)
            return self._remember(line, MsgHeader(LINK_ACCOUNT, args[0], None, None, -1, size_arg(args[1])))
        simple = _SIMPLE.get(op)
        if simple is not None:
            ops.append(simple)
        elif op == b"RS+":
            args = split_args(rest)
            if len(args) == 2:
                ops.append((RS_PLUS, args[0], args[1], None, 1))
            elif len(args) in (3, 4):
                weight = size_arg(args[3]) if len(args) == 4 else 1
                ops.append((RS_PLUS, args[0], args[1], args[2], weight))
            else:
                raise ProtocolError(errors.UNKNOWN_OP)
        elif op == b"RS-":
            args = split_args(rest)
            if len(args) not in (2, 3):
                raise ProtocolError(errors.UNKNOWN_OP)
            ops.append((RS_MINUS, args[0], args[1], args[2] if len(args) == 3 else None))
        elif op == b"A+":
            ops.append((A_PLUS, rest.strip()))
        elif op == b"A-":
            ops.append((A_MINUS, rest.strip()))
        elif op == b"CONNECT":
            ops.append((CONNECT, rest.strip()))
        elif op == b"INFO":
            ops.append((INFO, rest.strip()))
        elif op == b"-ERR":
            ops.append((ERR, rest.strip()))
        elif line:
            raise ProtocolError(errors.UNKNOWN_OP)
        return None
