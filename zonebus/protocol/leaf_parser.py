"""Parser of nats-server's leaf node protocol, on the shared framing; the same op tuples as `route_parser`.

The leaf protocol names no account: a leaf connection is bound to one account on each side, and the parser
is told which (`account`), so that its ops look like the route protocol's and the link layer's dispatch
(`zonebus.link.connection`) serves both:
  `LS+ <subject> [<queue> <weight>]`  -> (RS_PLUS, account, subject, queue|None, weight)
  `LS- <subject> [<queue>]`           -> (RS_MINUS, account, subject, queue|None)
  `LMSG <subject> [reply] <size>`, `LMSG <subject> + <reply> <q1>... <size>`, `LMSG <subject> | <q1>... <size>`
  and `HMSG` likewise with `<hdr_len> <size>` at the end -> (RMSG, MsgHeader(account, ...), data)
  CONNECT, INFO, PING, PONG, +OK and -ERR as on routes.
`leaf_msg_line` is the inverse of the message lines.
"""

from __future__ import annotations

from zonebus.protocol import errors
from zonebus.protocol.errors import ProtocolError
from zonebus.protocol.frames import FrameParser, size_arg, split_args, split_op
from zonebus.protocol.route_parser import (
    CONNECT,
    ERR,
    INFO,
    OK,
    PING,
    PONG,
    RMSG,
    RS_MINUS,
    RS_PLUS,
    MsgHeader,
    parse_msg_args,
)

_SIMPLE = {b"PING": (PING,), b"PONG": (PONG,), b"+OK": (OK,)}


def leaf_msg_line(subject: bytes, reply: bytes | None, queues: list[bytes] | None, hdr_len: int,
                  size: int) -> bytes:
    """The control line of an LMSG/HMSG on a leaf connection."""
    parts = [b"HMSG" if hdr_len >= 0 else b"LMSG", subject]
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


class LeafParser(FrameParser):
    PAYLOAD_OP = RMSG
    OP_NAMES = (b"LMSG", b"HMSG", b"LS+", b"LS-", b"PING", b"PONG", b"CONNECT", b"INFO", b"+OK", b"-ERR")

    def __init__(self, account: bytes, max_control_line: int = 1 << 20, max_payload: int = 1 << 30) -> None:
        super().__init__(max_control_line, max_payload)
        self.account = account

    def _header(self, line: bytes, ops: list[tuple]) -> MsgHeader | None:
        op, rest = split_op(line)
        if op == b"LMSG":
            return self._remember(line, parse_msg_args([self.account, *split_args(rest)], False))
        if op == b"HMSG":
            return self._remember(line, parse_msg_args([self.account, *split_args(rest)], True))
        simple = _SIMPLE.get(op)
        if simple is not None:
            ops.append(simple)
        elif op == b"LS+":
            args = split_args(rest)
            if len(args) == 1:
                ops.append((RS_PLUS, self.account, args[0], None, 1))
            elif len(args) in (2, 3):
                weight = size_arg(args[2]) if len(args) == 3 else 1
                ops.append((RS_PLUS, self.account, args[0], args[1], max(weight, 1)))
            else:
                raise ProtocolError(errors.UNKNOWN_OP)
        elif op == b"LS-":
            args = split_args(rest)
            if len(args) not in (1, 2):
                raise ProtocolError(errors.UNKNOWN_OP)
            ops.append((RS_MINUS, self.account, args[0], args[1] if len(args) == 2 else None))
        elif op == b"CONNECT":
            ops.append((CONNECT, rest.strip()))
        elif op == b"INFO":
            ops.append((INFO, rest.strip()))
        elif op == b"-ERR":
            ops.append((ERR, rest.strip()))
        elif line:
            raise ProtocolError(errors.UNKNOWN_OP)
        return None
