"""What the parser fuzzers check, shared by tests/security/test_fuzz.py (a short run in CI) and bench/fuzz.py
(a long run, atheris when installed).

`check_parser(kind, data, cuts)`: feeding `data` to a fresh client or route parser, whole and again split at
`cuts`, raises nothing but a reported `ProtocolError`, keeps at most a control line plus a payload buffered,
and gives the same ops both ways up to the first error (frames may be split anywhere on the wire).
`protocol_input(draw_bytes)` builds inputs that look like the protocol (real ops, sizes near the truth,
CRLF in odd places) from raw fuzzer bytes, so that the fuzzer reaches past the first token.
"""

from __future__ import annotations

from zonebus.protocol.client_parser import ClientParser
from zonebus.protocol.frames import FrameParser
from zonebus.protocol.route_parser import RouteParser

MAX_CONTROL_LINE = 4096
MAX_PAYLOAD = 64 * 1024
TOKENS = [b"PUB ", b"HPUB ", b"SUB ", b"UNSUB ", b"PING", b"PONG", b"CONNECT ", b"INFO ", b"+OK", b"-ERR ",
          b"RS+ ", b"RS- ", b"RMSG ", b"HMSG ", b"LS+ ", b"LMSG ", b"\r\n", b"\r", b"\n", b" ", b"\t", b"$G ",
          b"foo.bar", b"foo.*", b">", b"q1", b"1", b"5", b"12", b"-1", b"99999999999", b"hello", b"NATS/1.0\r\n\r\n",
          b"{}", b"{\"verbose\":true}", b"\x00", b"\xff"]


def new_parser(kind: str) -> FrameParser:
    if kind == "client":
        return ClientParser(MAX_CONTROL_LINE, MAX_PAYLOAD)
    return RouteParser(max_control_line=MAX_CONTROL_LINE, max_payload=MAX_PAYLOAD)


def _run(parser: FrameParser, chunks: list[bytes]) -> tuple[list[tuple], bool]:
    ops: list[tuple] = []
    for chunk in chunks:
        got, err = parser.feed(chunk)
        ops.extend(got)
        buffered = parser.buffered()
        assert buffered <= MAX_CONTROL_LINE + MAX_PAYLOAD + 2 + len(chunk), f"{buffered} bytes held"
        if err is not None:
            return ops, True  # the connection is closed on an error: nothing after it counts
    return ops, False


def _comparable(ops: list[tuple]) -> list[tuple]:
    out = []
    for op in ops:
        parts = []
        for part in op:
            if hasattr(part, "__slots__") or hasattr(part, "__dict__"):
                fields = getattr(part, "__slots__", None) or vars(part)
                parts.append(tuple((f, getattr(part, f)) for f in fields if f not in ("gen", "memo", "qmemo",
                                                                                     "ledger_n")))
            else:
                parts.append(part)
        out.append(tuple(parts))
    return out


def check_parser(kind: str, data: bytes, cuts: list[int]) -> None:
    whole, whole_err = _run(new_parser(kind), [data])
    bounds = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    pieces = [data[a:b] for a, b in zip(bounds, bounds[1:], strict=False)] or [b""]
    split, split_err = _run(new_parser(kind), pieces)
    if not whole_err and not split_err:
        assert _comparable(whole) == _comparable(split), "split input parsed differently"
    else:  # an error may be found at a different op when a chunk boundary falls inside it; the prefix agrees
        n = min(len(whole), len(split))
        assert _comparable(whole[:n]) == _comparable(split[:n])


SUBJECTS = [b"foo", b"foo.bar", b"foo.*", b"foo.>", b">", b"a.b.c", b"_INBOX.x", b"$JS.API.INFO", b"", b"foo..bar"]


def protocol_input(raw: bytes) -> bytes:
    """Map fuzzer bytes onto protocol-looking input, one directive per byte (and its arguments from the
    next bytes): well-formed PUB/HPUB/SUB/UNSUB/PING and route RS+/RMSG lines with right or slightly wrong
    sizes, known tokens, or raw bytes, so that the fuzzer reaches the states behind the first line."""
    out = bytearray()
    pos = 0

    def nxt() -> int:
        nonlocal pos
        pos += 1
        return raw[pos - 1] if pos - 1 < len(raw) else 0

    while pos < len(raw):
        kind = nxt() % 10
        subj = SUBJECTS[nxt() % len(SUBJECTS)]
        size = nxt() % 24
        skew = (nxt() % 5) - 2 if kind == 5 else 0  # a size off by -2..2
        body = bytes((65 + (i % 26)) for i in range(size))
        if kind in (0, 5):
            out += b"PUB %b %d\r\n%b\r\n" % (subj, max(size + skew, 0), body)
        elif kind == 1:
            hdr = b"NATS/1.0\r\nX: 1\r\n\r\n"
            out += b"HPUB %b r.%d %d %d\r\n%b%b\r\n" % (subj, size, len(hdr), len(hdr) + size, hdr, body)
        elif kind == 2:
            out += b"SUB %b %b%d\r\n" % (subj, b"q " if size % 2 else b"", size)
        elif kind == 3:
            out += b"UNSUB %d %d\r\n" % (size, nxt() % 3)
        elif kind == 4:
            out += (b"PING\r\n", b"PONG\r\n", b"CONNECT {}\r\n", b"+OK\r\n")[size % 4]
        elif kind == 6:
            out += b"RS+ $G %b%b\r\n" % (subj, b" q 1" if size % 2 else b"")
        elif kind == 7:
            out += b"RMSG $G %b %d\r\n%b\r\n" % (subj, size, body)
        elif kind == 8:
            out += TOKENS[size % len(TOKENS)]
        else:
            out += bytes(raw[pos : pos + size])
            pos += size
    return bytes(out)
