"""A tiny send/expect NATS client over a plain socket, for protocol and differential tests.

`RawClient` connects, reads INFO, sends whatever bytes a scenario wants (whole, or split into many writes) and
reads the server's replies as normalised frames with a deadline. Frames are short strings, so transcripts from
nats-server and zonebus compare with `==`:

- `INFO` (its JSON is kept on `RawClient.info`, never compared verbatim: ids, ports and versions differ),
- `+OK`, `PING`, `PONG`, `-ERR '<text>'` exactly as sent,
- `MSG <subj> <sid> [reply] <size> <payload repr>`,
- `HMSG <subj> <sid> [reply] <hlen> <tlen> <header repr> <payload repr>`,
- `CLOSED` when the peer closed (EOF or reset), `TIMEOUT` when the deadline passed first.

Subjects, sids and reply subjects are chosen by the scenario, so nothing else needs normalising.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable, Iterable

CRLF = b"\r\n"
CLOSED = "CLOSED"
TIMEOUT = "TIMEOUT"
DEFAULT_TIMEOUT = 2.0


def connect_line(**fields: object) -> bytes:
    """A CONNECT line with nats-py's usual fields, overridden by `fields` (None drops a field)."""
    opts: dict[str, object] = {"verbose": False, "pedantic": False, "lang": "raw", "version": "0", "protocol": 1}
    opts.update(fields)
    opts = {k: v for k, v in opts.items() if v is not None}
    return b"CONNECT " + json.dumps(opts, separators=(",", ":")).encode() + CRLF


class RawClient:
    """One plain-socket client connection. Use as a context manager."""

    def __init__(self, port: int, *, timeout: float = DEFAULT_TIMEOUT, read_info: bool = True, rcvbuf: int = 0) -> None:
        """`rcvbuf` > 0 shrinks the receive buffer before connecting (a small TCP window: a slow reader)."""
        self.port = port
        self.timeout = timeout
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.settimeout(timeout)
        self.sock.connect(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""
        self.closed = False
        self.info: dict = {}
        if read_info:
            first = self.read_frame(time.monotonic() + timeout)
            if first != "INFO":
                raise AssertionError(f"expected INFO first, got {first!r}")

    # -- sending ------------------------------------------------------------------------------------
    def send(self, data: bytes) -> bool:
        """Write all of `data`; False when the peer already closed (the write failed)."""
        try:
            self.sock.sendall(data)
            return True
        except OSError:
            self.closed = True
            return False

    def send_bytewise(self, data: bytes, step: int = 1) -> bool:
        """Write `data` in `step`-byte writes (TCP_NODELAY is on, so they leave as separate segments)."""
        return all(self.send(data[i : i + step]) for i in range(0, len(data), step))

    def connect(self, **fields: object) -> list[str]:
        """Send CONNECT (+ a PING barrier) and return the replies up to PONG."""
        self.send(connect_line(**fields))
        return self.sync()

    # -- reading ------------------------------------------------------------------------------------
    def _fill(self, deadline: float) -> bool:
        """Read more bytes into the buffer; False on close or timeout (self.closed tells which)."""
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        self.sock.settimeout(remaining)
        try:
            chunk = self.sock.recv(65536)
        except TimeoutError:
            return False
        except OSError:  # reset by peer
            chunk = b""
        if not chunk:
            self.closed = True
            return False
        self.buf += chunk
        return True

    def _read_line(self, deadline: float) -> bytes | None:
        while CRLF not in self.buf:
            if not self._fill(deadline):
                return None
        line, _, self.buf = self.buf.partition(CRLF)
        return line

    def _read_exact(self, n: int, deadline: float) -> bytes | None:
        while len(self.buf) < n:
            if not self._fill(deadline):
                return None
        data, self.buf = self.buf[:n], self.buf[n:]
        return data

    def read_frame(self, deadline: float | None = None) -> str:
        """The next normalised frame, `CLOSED` or `TIMEOUT`."""
        if deadline is None:
            deadline = time.monotonic() + self.timeout
        line = self._read_line(deadline)
        if line is None:
            return CLOSED if self.closed else TIMEOUT
        text = line.decode("utf-8", "replace")
        op = text.split(" ", 1)[0].upper()
        if op == "INFO":
            self.info = json.loads(text[5:])
            return "INFO"
        if op in ("MSG", "HMSG"):
            args = text.split()
            total = int(args[-1])
            body = self._read_exact(total + 2, deadline)
            if body is None:
                return f"{text} <truncated: {CLOSED if self.closed else TIMEOUT}>"
            if not body.endswith(CRLF):
                raise AssertionError(f"{op} payload not followed by CRLF: {body[-10:]!r}")
            body = body[:-2]
            if op == "MSG":
                return f"{text} {body!r}"
            hlen = int(args[-2])
            return f"{text} {body[:hlen]!r} {body[hlen:]!r}"
        return text

    def frames(self, until: Callable[[str], bool], timeout: float | None = None) -> list[str]:
        """Frames up to and including the first one where `until` is true, or CLOSED/TIMEOUT.

        INFO frames are skipped here and in `collect` (the server may send INFO at any time); the latest INFO
        is on `self.info`."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        out: list[str] = []
        while True:
            frame = self.read_frame(deadline)
            if frame == "INFO":  # async INFO (nats-server sends one after CONNECT): kept on self.info only
                continue
            if frame == "PING" and not until(frame):  # server keepalive: answer it, keep it out of transcripts
                self.send(b"PONG\r\n")
                continue
            out.append(frame)
            if frame in (CLOSED, TIMEOUT) or until(frame):
                return out

    def sync(self, timeout: float | None = None) -> list[str]:
        """Send PING and return every frame up to its PONG (or CLOSED/TIMEOUT)."""
        self.send(b"PING\r\n")
        return self.frames(lambda f: f == "PONG", timeout)

    def until_closed(self, timeout: float | None = None) -> list[str]:
        """Every frame until the server closes the connection (ends with CLOSED, or TIMEOUT)."""
        return self.frames(lambda f: False, timeout)

    def collect(self, count: int, timeout: float | None = None) -> list[str]:
        """Exactly `count` frames (fewer when the connection closed or the deadline passed)."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        out: list[str] = []
        while len(out) < count:
            frame = self.read_frame(deadline)
            if frame == "INFO":
                continue
            out.append(frame)
            if frame in (CLOSED, TIMEOUT):
                break
        return out

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    def __enter__(self) -> RawClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def strip_sync(frames: Iterable[str]) -> list[str]:
    """Frames without the trailing PONG of a barrier."""
    out = list(frames)
    if out and out[-1] == "PONG":
        out.pop()
    return out
