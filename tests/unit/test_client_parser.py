"""The client-protocol parser on its own: frames split anywhere, line cache, and its errors."""

from __future__ import annotations

import pytest

from zonebus.protocol.client_parser import CONNECT, PING, PONG, PUB, SUB, UNSUB, ClientParser
from zonebus.protocol.errors import ProtocolError

STREAM = (
    b'CONNECT {"verbose":false}\r\nPING\r\nsub foo.* q 1\r\nPUB foo.a 5\r\nhello\r\n'
    b"PUB foo.a reply 0\r\n\r\nHPUB foo.b 12 14\r\nNATS/1.0\r\n\r\nhi\r\nUNSUB 1 5\r\nPONG\r\n"
    b"PUB foo.a 5\r\nhello\r\n"
)


def _norm(ops: list[tuple]) -> list[tuple]:
    out = []
    for op in ops:
        if op[0] == PUB:
            h = op[1]
            out.append((PUB, h.subject, h.reply, h.hdr_len, h.size, op[2]))
        else:
            out.append(op)
    return out


EXPECTED = [
    (CONNECT, b'{"verbose":false}'),
    (PING,),
    (SUB, b"foo.*", b"q", b"1"),
    (PUB, b"foo.a", None, -1, 5, b"hello\r\n"),
    (PUB, b"foo.a", b"reply", -1, 0, b"\r\n"),
    (PUB, b"foo.b", None, 12, 14, b"NATS/1.0\r\n\r\nhi\r\n"),
    (UNSUB, b"1", 5),
    (PONG,),
    (PUB, b"foo.a", None, -1, 5, b"hello\r\n"),
]


def test_whole_stream() -> None:
    ops, err = ClientParser().feed(STREAM)
    assert err is None
    assert _norm(ops) == EXPECTED


def test_one_byte_at_a_time() -> None:
    p = ClientParser()
    ops: list[tuple] = []
    for i in range(len(STREAM)):
        got, err = p.feed(STREAM[i : i + 1])
        assert err is None
        ops += got
    assert _norm(ops) == EXPECTED


@pytest.mark.parametrize("cut", range(1, len(STREAM), 7))
def test_split_in_two(cut: int) -> None:
    p = ClientParser()
    a, e1 = p.feed(STREAM[:cut])
    b, e2 = p.feed(STREAM[cut:])
    assert e1 is None and e2 is None
    assert _norm(a + b) == EXPECTED


def test_repeated_lines_share_one_header() -> None:
    ops, _ = ClientParser().feed(b"PUB x 1\r\na\r\nPUB x 1\r\nb\r\nPUB x r 1\r\nc\r\nPUB x r 1\r\nd\r\n")
    assert ops[0][1] is ops[1][1]
    assert ops[2][1] is not ops[3][1]  # lines with a reply subject are not cached


@pytest.mark.parametrize(
    "data, text",
    [
        (b"FOO\r\n", "Unknown Protocol Operation"),
        (b"\x00\x01garbage", "Unknown Protocol Operation"),  # rejected before any newline arrives
        (b"PUB\r\n", "Unknown Protocol Operation"),
        (b"PUB foo\r\n", ""),  # malformed arguments: closed without -ERR
        (b"PUB foo x\r\n", ""),
        (b"PUB foo 3\r\nabcd\r\n", "Unknown Protocol Operation"),  # payload longer than announced
        (b"PUB foo 2000000\r\n", "Maximum Payload Violation"),
        (b"SUB " + b"a" * 5000 + b" 1\r\n", "maximum control line exceeded"),
        (b"SUB " + b"a" * 5000, "maximum control line exceeded"),  # no CRLF yet
    ],
)
def test_errors(data: bytes, text: str) -> None:
    ops, err = ClientParser().feed(data)
    assert isinstance(err, ProtocolError)
    assert err.text == text
    assert err.close


def test_error_after_good_ops_keeps_them() -> None:
    ops, err = ClientParser().feed(b"PING\r\nPUB a 1\r\nx\r\nBAD\r\n")
    assert [o[0] for o in ops] == [PING, PUB]
    assert err is not None and err.text == "Unknown Protocol Operation"


@pytest.mark.parametrize("sent, held", [
    (b"PUB a 5\r\nhel", b"PUB a 5\r\nhel"),  # a payload under way
    (b"PUB a r 5\r\n", b"PUB a r 5\r\n"),  # the line, no payload yet
    (b"HPUB a r 12 14\r\nNATS/1.0\r\n", b"HPUB a r 12 14\r\nNATS/1.0\r\n"),  # headers under way
    (b"PUB a 2\r\nhi\r\nSUB b", b"SUB b"),  # a partial line after a whole message
    (b"PING\r\n", b""),
])
def test_unparsed_is_what_a_handed_over_connection_goes_on_from(sent: bytes, held: bytes) -> None:
    """zonebus.workers hands a client's socket to another process with `unparsed()`: fed to a fresh parser,
    those bytes and the rest of the stream give the ops the first parser would have given."""
    p = ClientParser(4096, 1 << 20)
    ops, err = p.feed(sent)
    assert err is None
    assert p.unparsed() == held
    assert p.buffered() <= len(held)  # (a payload under way: its bytes, not its line)
    rest = b"lo\r\n" if held.endswith(b"hel") else b""
    fresh = ClientParser(4096, 1 << 20)
    whole, err = ClientParser(4096, 1 << 20).feed(sent + rest)
    got, err2 = fresh.feed(held + rest)
    assert err is None and err2 is None
    assert _norm(ops + got) == _norm(whole)


def test_cached_headers_are_the_remembered_lines() -> None:
    p = ClientParser(4096, 1 << 20)
    p.feed(b"PUB a 1\r\nx\r\nPUB a 1\r\ny\r\nPUB b 1\r\nz\r\n")
    assert sorted(h.subject for h in p.cached_headers()) == [b"a", b"b"]
