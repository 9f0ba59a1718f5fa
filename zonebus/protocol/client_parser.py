"""Parser of the NATS client protocol (client -> server), on top of the shared framing in `frames.py`.

Op tuples (subjects, reply subjects, queues and sids are `bytes`):
  (PUB, PubHeader, data)          PUB and HPUB; data = payload (header block included) + b"\\r\\n"
  (SUB, subject, queue|None, sid)
  (UNSUB, sid, max_msgs)          max_msgs 0 = none
  (CONNECT, json_bytes) (PING,) (PONG,) (INFO, json_bytes) (OK,) (ERR, text_bytes)
"""

from __future__ import annotations

from zonebus.protocol import errors
from zonebus.protocol.errors import ProtocolError, malformed
from zonebus.protocol.frames import FrameParser, size_arg, split_args, split_op

PUB, SUB, UNSUB, CONNECT, PING, PONG, INFO, OK, ERR = range(9)

_SIMPLE = {b"PING": (PING,), b"PONG": (PONG,), b"+OK": (OK,)}
_NEED_ARGS = (b"PUB", b"HPUB", b"SUB", b"UNSUB")


class PubHeader:
    """A parsed PUB/HPUB control line. Lines without a reply repeat, so the parser caches these per
    connection by line bytes (`again`); a server's parser makes them with the fields of its fast path
    (`header_type`: `zonebus.server.fastpath.PubLine`)."""

    __slots__ = ("subject", "reply", "hdr_len", "size", "again")

    def __init__(self, subject: bytes, reply: bytes | None, hdr_len: int, size: int) -> None:
        self.subject = subject
        self.reply = reply
        self.hdr_len = hdr_len
        self.size = size
        self.again: bytes | None = None  # set by the parser once the line is cached (frames.py)


class ClientParser(FrameParser):
    PAYLOAD_OP = PUB
    OP_NAMES = (b"PUB", b"HPUB", b"SUB", b"UNSUB", b"PING", b"PONG", b"CONNECT", b"INFO", b"+OK", b"-ERR")

    def __init__(self, max_control_line: int = 4096, max_payload: int = 1024 * 1024,
                 header_type: type[PubHeader] = PubHeader) -> None:
        super().__init__(max_control_line, max_payload)
        self.header_type = header_type  # the class of the PubHeaders it makes

    def _header(self, line: bytes, ops: list[tuple]) -> PubHeader | None:
        op, rest = split_op(line)
        if not rest and op in _NEED_ARGS:  # "PUB\r\n": nats-server's parser fails on the op itself
            raise ProtocolError(errors.UNKNOWN_OP)
        if op == b"PUB":
            args = split_args(rest)
            if len(args) not in (2, 3):
                raise malformed()
            size = self._checked_size(args[-1])
            return self._remember(line, self.header_type(args[0], args[1] if len(args) == 3 else None, -1, size))
        if op == b"HPUB":
            args = split_args(rest)
            if len(args) not in (3, 4):
                raise malformed()
            hdr_len = size_arg(args[-2])
            size = self._checked_size(args[-1])
            if hdr_len > size:
                raise malformed()
            reply = args[1] if len(args) == 4 else None
            return self._remember(line, self.header_type(args[0], reply, hdr_len if hdr_len > 0 else -1, size))
        simple = _SIMPLE.get(op)
        if simple is not None:
            ops.append(simple)
        elif op == b"SUB":
            args = split_args(rest)
            if len(args) == 2:
                ops.append((SUB, args[0], None, args[1]))
            elif len(args) == 3:
                ops.append((SUB, args[0], args[1], args[2]))
            else:
                raise malformed()
        elif op == b"UNSUB":
            args = split_args(rest)
            if len(args) == 1:
                ops.append((UNSUB, args[0], 0))
            elif len(args) == 2:
                ops.append((UNSUB, args[0], size_arg(args[1])))
            else:
                raise malformed()
        elif op == b"CONNECT":
            ops.append((CONNECT, rest.strip()))
        elif op == b"INFO":
            ops.append((INFO, rest.strip()))
        elif op == b"-ERR":  # a client has no business sending -ERR: closed silently
            raise malformed()
        else:
            raise ProtocolError(errors.UNKNOWN_OP)
        return None

    def unparsed(self) -> bytes:
        """The bytes held but not turned into ops yet (a partial line or payload), as the client sent them: a
        connection handed to another process (zonebus.workers) goes on from there."""
        pending = self._pending
        if pending is None:
            return self._buf
        reply = b" " + pending.reply if pending.reply else b""
        if pending.hdr_len >= 0:
            line = b"HPUB %b%b %d %d\r\n" % (pending.subject, reply, pending.hdr_len, pending.size)
        else:
            line = b"PUB %b%b %d\r\n" % (pending.subject, reply, pending.size)
        return line + b"".join(self._chunks)

    def _checked_size(self, tok: bytes) -> int:
        if not tok.isdigit():
            raise malformed()
        size = int(tok)
        if size > self.max_payload:
            raise ProtocolError(errors.MAX_PAYLOAD)
        return size


def pub_wire_bytes(hdr: PubHeader) -> int:
    """Bytes a PUB/HPUB with this header took on the wire: control line, payload, CRLFs."""
    line = 4 + len(hdr.subject) + (len(hdr.reply) + 1 if hdr.reply else 0) + 1 + len(str(hdr.size)) + 2
    if hdr.hdr_len >= 0:  # "HPUB" is one byte longer, plus the header length argument
        line += 1 + 1 + len(str(hdr.hdr_len))
    return line + hdr.size + 2
