"""The framing every NATS-style text protocol shares: CRLF control lines, some followed by a sized payload.

`FrameParser.feed(data)` returns `(ops, error)` and keeps state across calls, so frames may be split
anywhere. A subclass says what a control line means in `_header(line, ops)`: it either appends a control
op and returns None, or returns a header object with a `size` for a payload that follows (the op emitted is
then `(PAYLOAD_OP, header, payload + CRLF)`). Lines of payload-carrying ops that repeat are cached by their
bytes (`_remember`), so a stream of identical PUB lines is parsed once; a cached header's `again` (CRLF, its
line, CRLF; None when not cached) lets a run of messages with that line be framed by one check per message.
`stop_after` (an op code, None by default) makes `_parse` stop right after a control op of that code: the
bytes behind it stay unparsed (`held`) until the owner takes them with `take_rest()` (links stop after INFO
while a switch to a compressed stream may come, zonebus.link.compression). No I/O, no routing.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from zonebus.protocol import errors
from zonebus.protocol.errors import ProtocolError

LINE_CACHE_MAX = 256


class FrameParser:
    PAYLOAD_OP = 0
    OP_NAMES: tuple[bytes, ...] = ()  # ops this protocol knows, to reject garbage before its line ends

    def __init__(self, max_control_line: int = 4096, max_payload: int = 1024 * 1024) -> None:
        self.max_control_line = max_control_line
        self.max_payload = max_payload
        self._buf = b""  # unparsed bytes (a partial control line)
        self._pending: Any = None  # header whose payload is still arriving
        self._chunks: list[bytes] = []  # payload bytes received so far for _pending
        self._have = 0
        self._lines: dict[bytes, Any] = {}
        self.stop_after: int | None = None
        self.held = False  # parsing stopped after a `stop_after` op; the rest is in `_buf`

    def take_rest(self) -> bytes:
        """The bytes left unparsed after a `stop_after` op (the parser goes on with the next feed)."""
        rest, self._buf, self.held = self._buf, b"", False
        return rest

    def pending_need(self) -> int:
        """Bytes still missing from a payload that is arriving (0: none is)."""
        return 0 if self._pending is None else self._pending.size + 2 - self._have

    def hold(self, raw: bytes) -> None:
        """Keep `raw`, the start of a frame the owner read but did not parse (a message whose payload is still
        arriving), to be parsed with the next feed (`zonebus.server.corepath`)."""
        self._buf = raw

    def buffered(self) -> int:
        """How many bytes are held that have not become ops yet (a partial line, a partial payload)."""
        return len(self._buf) + self._have

    def cached_headers(self) -> Iterable[Any]:
        """The headers of the control lines this parser remembers (see `_remember`), each with its memo."""
        return self._lines.values()

    def feed(self, data: bytes) -> tuple[list[tuple], ProtocolError | None]:
        ops: list[tuple] = []
        if self._pending is not None:
            rest = self._continue_payload(data, ops)
            if rest is None:
                return ops, None
            if isinstance(rest, ProtocolError):
                return ops, rest
            data = rest
        buf = self._buf + data if self._buf else data
        self._buf = b""
        try:
            self._parse(buf, ops)
        except ProtocolError as exc:
            self._buf = b""
            return ops, exc
        return ops, None

    def _continue_payload(self, data: bytes, ops: list[tuple]) -> bytes | ProtocolError | None:
        """A payload larger than what arrived: gather chunks until complete, without re-parsing."""
        hdr = self._pending
        need = hdr.size + 2  # payload + CRLF
        self._chunks.append(data)
        self._have += len(data)
        if self._have < need:
            if self._have == need - 1 and data and data[-1] != 13:
                return ProtocolError(errors.UNKNOWN_OP)  # the byte after the payload must be CR
            return None
        whole = b"".join(self._chunks)
        self._chunks = []
        self._have = 0
        self._pending = None
        if whole[need - 2 : need] != b"\r\n":
            return ProtocolError(errors.UNKNOWN_OP)
        ops.append((self.PAYLOAD_OP, hdr, whole[:need]))
        return whole[need:]

    def _parse(self, buf: bytes, ops: list[tuple]) -> None:
        pos = 0
        n = len(buf)
        mcl = self.max_control_line
        find = buf.find
        startswith = buf.startswith
        append = ops.append
        lines = self._lines
        header = self._header
        payload_op = self.PAYLOAD_OP
        hold = self.stop_after
        prev = None
        while pos < n:
            eol = find(b"\n", pos)
            if eol < 0:
                if n - pos > mcl and _args_len(buf, pos, n) > mcl:
                    raise ProtocolError(errors.MAX_CONTROL_LINE)
                self._check_partial(buf[pos : pos + 9])
                self._buf = buf[pos:]
                return
            end = eol - 1 if eol > pos and buf[eol - 1] == 13 else eol
            if end - pos > mcl and _args_len(buf, pos, end) > mcl:
                raise ProtocolError(errors.MAX_CONTROL_LINE)
            line = buf[pos:end]
            hdr = lines.get(line)
            if hdr is None:
                hdr = header(line, ops)
                if hdr is None:
                    pos = eol + 1
                    if hold is not None and ops and ops[-1][0] == hold:
                        self._buf = buf[pos:]
                        self.held = True
                        return
                    continue
            size = hdr.size
            start = eol + 1
            stop = start + size
            # a run of messages with one cached line (a publisher's usual stream), seen once the line came twice
            # in a row: one check finds the payload's CRLF and the next identical line, which then needs neither
            # a search nor a cache lookup
            if hdr is prev and (again := hdr.again) is not None and startswith(again, stop):
                skip = len(again)
                while True:
                    append((payload_op, hdr, buf[start : stop + 2]))
                    start = stop + skip
                    stop = start + size
                    if not startswith(again, stop):
                        break
            prev = hdr
            if stop + 2 <= n:
                if buf[stop] != 13 or buf[stop + 1] != 10:  # payload CRLF (indexing makes no new bytes)
                    raise ProtocolError(errors.UNKNOWN_OP)
                append((payload_op, hdr, buf[start : stop + 2]))
                pos = stop + 2
                continue
            # payload incomplete: wait for more data
            if stop < n and buf[stop] != 13:
                raise ProtocolError(errors.UNKNOWN_OP)
            self._pending = hdr
            rest = buf[start:]
            self._chunks = [rest]
            self._have = len(rest)
            return

    def _header(self, line: bytes, ops: list[tuple]) -> Any:
        raise NotImplementedError

    def _check_partial(self, head: bytes) -> None:
        """An incomplete line must still be able to become a known op (nats-server rejects garbage at once)."""
        if not self.OP_NAMES or not head:
            return
        word = head.upper()
        for name in self.OP_NAMES:
            k = min(len(word), len(name))
            if word[:k] == name[:k] and (len(word) <= len(name) or word[len(name)] in (32, 9, 13)):
                return
        raise ProtocolError(errors.UNKNOWN_OP)

    def _remember(self, line: bytes, hdr: Any) -> Any:
        """Cache a payload header by its line when the line is likely to repeat (no reply subject)."""
        if hdr.reply is None:
            if len(self._lines) >= LINE_CACHE_MAX:
                self._lines.clear()
            self._lines[line] = hdr
            hdr.again = b"\r\n" + line + b"\r\n"
        return hdr


def _args_len(buf: bytes, start: int, end: int) -> int:
    """Length of a control line's arguments (what max_control_line limits): the line less the op name."""
    i = start
    while i < end and buf[i] not in (32, 9):
        i += 1
    return end - i - 1 if i < end else 0


def split_op(line: bytes) -> tuple[bytes, bytes]:
    """(OPNAME upper-cased, rest of the line) — the op may be followed by spaces or tabs."""
    if 9 not in line:  # no tab, the usual line: partition runs in C (an int operand makes `in` a memchr)
        op, _, rest = line.partition(b" ")
        return op.upper(), rest
    i = 0
    n = len(line)
    while i < n and line[i] not in (32, 9):
        i += 1
    return line[:i].upper(), line[i + 1 :]


def split_args(rest: bytes) -> list[bytes]:
    """Arguments separated by spaces or tabs only (bytes.split() would also split on other whitespace)."""
    if 9 in rest:  # a tab (an int operand: `b"\t" in rest` first fails an int conversion, slowly)
        rest = rest.replace(b"\t", b" ")
    args = rest.split(b" ")
    if b"" in args:  # separators in a row, at the start or at the end
        args = [a for a in args if a]
    return args


def size_arg(tok: bytes) -> int:
    if not tok.isdigit():
        raise ProtocolError("", close=True)  # malformed argument: closed without -ERR, as nats-server does
    return int(tok)
