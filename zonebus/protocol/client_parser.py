"""Incremental parser of the NATS client protocol (client -> server). No I/O, no routing.

`ClientParser.feed(data)` takes whatever bytes arrived and returns `(ops, error)`: the complete operations
found, in order, and a `ProtocolError` if the stream became invalid after them (the caller handles the ops
first, then the error). State (a partial control line or a payload still arriving) is kept across calls,
so frames may be split anywhere. Control lines are located with `bytes.find`, payloads are sliced, never
copied byte by byte.

Op tuples (subjects, reply subjects, queues and sids are `bytes`):
  (PUB, PubHeader, data)                       data = payload (header block included) + b"\\r\\n"
  (SUB, subject, queue|None, sid)
  (UNSUB, sid, max_msgs)                       max_msgs 0 = none
  (CONNECT, json_bytes) (PING,) (PONG,) (INFO, json_bytes) (OK,) (ERR, text_bytes)
"""

from __future__ import annotations

from zonebus.protocol import errors
from zonebus.protocol.errors import ProtocolError

PUB, SUB, UNSUB, CONNECT, PING, PONG, INFO, OK, ERR = range(9)

_PING_OPS = {b"PING": (PING,), b"PONG": (PONG,), b"+OK": (OK,)}
LINE_CACHE_MAX = 256


class PubHeader:
    """A parsed PUB/HPUB control line. Lines without a reply repeat, so the parser caches these per
    connection by line bytes; `gen` and `memo` belong to the router, which may remember where messages
    with this exact line go (valid while the sublist generation equals `gen`)."""

    __slots__ = ("subject", "reply", "hdr_len", "size", "gen", "memo")

    def __init__(self, subject: bytes, reply: bytes | None, hdr_len: int, size: int) -> None:
        self.subject = subject
        self.reply = reply
        self.hdr_len = hdr_len
        self.size = size
        self.gen = -1
        self.memo: list | None = None


class ClientParser:
    __slots__ = ("max_control_line", "max_payload", "_buf", "_pending", "_chunks", "_have", "_lines")

    def __init__(self, max_control_line: int = 4096, max_payload: int = 1024 * 1024) -> None:
        self.max_control_line = max_control_line
        self.max_payload = max_payload
        self._buf = b""  # unparsed bytes (a partial control line)
        self._pending: PubHeader | None = None  # header whose payload is still arriving
        self._chunks: list[bytes] = []  # payload bytes received so far for _pending
        self._have = 0
        self._lines: dict[bytes, PubHeader] = {}

    def feed(self, data: bytes) -> tuple[list[tuple], ProtocolError | None]:
        ops: list[tuple] = []
        if self._pending is not None:
            data = self._continue_payload(data, ops)
            if data is None:
                return ops, None
            if isinstance(data, ProtocolError):
                return ops, data
        buf = self._buf + data if self._buf else data
        self._buf = b""
        try:
            self._parse(buf, ops)
        except ProtocolError as exc:
            self._buf = b""
            return ops, exc
        return ops, None

    # A payload larger than what arrived: gather chunks until complete, without re-parsing.
    def _continue_payload(self, data: bytes, ops: list[tuple]):
        hdr = self._pending
        need = hdr.size + 2  # payload + CRLF
        self._chunks.append(data)
        self._have += len(data)
        if self._have < need:
            return None
        whole = b"".join(self._chunks)
        self._chunks = []
        self._have = 0
        self._pending = None
        if whole[need - 2 : need] != b"\r\n":
            return ProtocolError(errors.UNKNOWN_OP)
        ops.append((PUB, hdr, whole[:need]))
        return whole[need:]

    def _parse(self, buf: bytes, ops: list[tuple]) -> None:
        pos = 0
        n = len(buf)
        mcl = self.max_control_line
        find = buf.find
        lines = self._lines
        while pos < n:
            eol = find(b"\n", pos)
            if eol < 0:
                if n - pos > mcl:
                    raise ProtocolError(errors.MAX_CONTROL_LINE)
                self._buf = buf[pos:]
                return
            end = eol - 1 if eol > pos and buf[eol - 1] == 13 else eol
            if end - pos > mcl:
                raise ProtocolError(errors.MAX_CONTROL_LINE)
            line = buf[pos:end]
            hdr = lines.get(line)
            if hdr is not None:
                pass
            elif line[:4] == b"PUB " or line[:4] == b"pub " or _is_op(line, b"PUB"):
                hdr = self._remember(line, self._pub_header(line[4:].split()))
            elif _is_op(line, b"HPUB"):
                hdr = self._remember(line, self._hpub_header(line[5:].split()))
            else:
                pos = eol + 1
                self._control(line, ops)
                continue
            start = eol + 1
            stop = start + hdr.size
            if stop + 2 <= n:
                if buf[stop : stop + 2] != b"\r\n":
                    raise ProtocolError(errors.UNKNOWN_OP)
                ops.append((PUB, hdr, buf[start : stop + 2]))
                pos = stop + 2
                continue
            # payload incomplete: wait for more data
            self._pending = hdr
            rest = buf[start:]
            self._chunks = [rest]
            self._have = len(rest)
            return

    def _remember(self, line: bytes, hdr: PubHeader) -> PubHeader:
        if hdr.reply is None:
            if len(self._lines) >= LINE_CACHE_MAX:
                self._lines.clear()
            self._lines[line] = hdr
        return hdr

    def _pub_header(self, args: list[bytes]) -> PubHeader:
        if len(args) not in (2, 3):
            raise ProtocolError(errors.UNKNOWN_OP)
        size = _size(args[-1])
        if size > self.max_payload:
            raise ProtocolError(errors.MAX_PAYLOAD)
        return PubHeader(args[0], args[1] if len(args) == 3 else None, -1, size)

    def _hpub_header(self, args: list[bytes]) -> PubHeader:
        if len(args) not in (3, 4):
            raise ProtocolError(errors.UNKNOWN_OP)
        hdr_len = _size(args[-2])
        size = _size(args[-1])
        if hdr_len > size:
            raise ProtocolError(errors.UNKNOWN_OP)
        if size > self.max_payload:
            raise ProtocolError(errors.MAX_PAYLOAD)
        return PubHeader(args[0], args[1] if len(args) == 4 else None, hdr_len, size)

    def _control(self, line: bytes, ops: list[tuple]) -> None:
        word, _, rest = line.partition(b" ")
        if b"\t" in word:
            word, _, rest2 = word.partition(b"\t")
            rest = rest2 + (b" " + rest if rest else b"")
        op = word.upper()
        simple = _PING_OPS.get(op)
        if simple is not None:
            ops.append(simple)
        elif op == b"SUB":
            args = rest.split()
            if len(args) == 2:
                ops.append((SUB, args[0], None, args[1]))
            elif len(args) == 3:
                ops.append((SUB, args[0], args[1], args[2]))
            else:
                raise ProtocolError(errors.UNKNOWN_OP)
        elif op == b"UNSUB":
            args = rest.split()
            if len(args) == 1:
                ops.append((UNSUB, args[0], 0))
            elif len(args) == 2:
                ops.append((UNSUB, args[0], _size(args[1])))
            else:
                raise ProtocolError(errors.UNKNOWN_OP)
        elif op == b"CONNECT":
            ops.append((CONNECT, rest.strip()))
        elif op == b"INFO":
            ops.append((INFO, rest.strip()))
        elif op == b"-ERR":
            ops.append((ERR, rest.strip()))
        elif not line:
            return  # stray CRLF is ignored
        else:
            raise ProtocolError(errors.UNKNOWN_OP)


def _is_op(head: bytes, name: bytes) -> bool:
    """`head` starts with `name` in any case followed by a space or tab."""
    n = len(name)
    return head[:n].upper() == name and head[n : n + 1] in (b" ", b"\t")


def _size(tok: bytes) -> int:
    if not tok.isdigit():
        raise ProtocolError(errors.UNKNOWN_OP)
    return int(tok)
