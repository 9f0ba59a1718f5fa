"""Where the log goes: nats-server's `log_file`, `syslog: true` (the local syslog daemon) and `remote_syslog`.

    remote_syslog: "udp://127.0.0.1:514"     # or tcp://host:port, or unix:///path/of/a/socket

With either key the server's log goes to syslog instead of stderr: `start_syslog` points file descriptor 2
at a pipe before the server (and its worker processes, which inherit it) runs, and a thread sends each line
on, in nats-server's (Go's log/syslog) format and priorities (facility 0):

- remote: `<5>2026-01-02T03:04:05Z host zonebus[pid]: message`; local: `<5>Jan  2 03:04:05 zonebus[pid]: ...`;
- the pid is the logging process's (a worker's own); the `[INF]`-style level becomes the priority:
  INF 5 (notice), WRN 4, ERR 3, DBG and TRC 7, FTL 2; any other line (a traceback) goes as ERR.

`remote_syslog` wins over `syslog`, as in nats-server; a URL with another scheme means the local syslog.
Without a local syslog socket (`/dev/log`, `/var/run/syslog`, `/var/run/log`) the server does not start:
`error connecting to syslog: "Unix syslog delivery error"`, nats-server's words.
"""

from __future__ import annotations

import atexit
import os
import re
import select
import socket
import stat
import sys
import threading
import time
from urllib.parse import urlsplit

from zonebus.options import ServerOptions

LOCAL_SOCKETS = ("/dev/log", "/var/run/syslog", "/var/run/log")
TAG = "zonebus"
SEVERITY = {"FTL": 2, "ERR": 3, "WRN": 4, "INF": 5, "DBG": 7, "TRC": 7}
_LINE = re.compile(r"^\[(\d+)\] \S+ \S+ \[([A-Z]{3})\] (.*)$")
UNIX_ERROR = 'error connecting to syslog: "Unix syslog delivery error"'


class SyslogError(Exception):
    """The syslog destination cannot be reached: the server does not start."""


def destination(opts: ServerOptions) -> tuple[int, int, object, bool] | None:
    """(family, socket type, address, remote) of the configured syslog, or None when there is none."""
    if opts.remote_syslog:
        url = urlsplit(opts.remote_syslog)
        if url.scheme in ("udp", "tcp") and url.hostname:
            kind = socket.SOCK_DGRAM if url.scheme == "udp" else socket.SOCK_STREAM
            family = socket.AF_INET6 if ":" in url.hostname else socket.AF_INET
            return family, kind, (url.hostname, url.port or 514), True
        if url.scheme == "unix" and url.path:
            return socket.AF_UNIX, socket.SOCK_DGRAM, url.path, False
    elif not opts.syslog:
        return None
    path = local_socket()
    if path is None:
        raise SyslogError(UNIX_ERROR)
    return socket.AF_UNIX, socket.SOCK_DGRAM, path, False


def local_socket() -> str | None:
    """The local syslog daemon's socket, or None."""
    for path in LOCAL_SOCKETS:
        try:
            if stat.S_ISSOCK(os.stat(path).st_mode):
                return path
        except OSError:
            pass
    return None


def _connect(family: int, kind: int, address: object) -> socket.socket:
    sock = socket.socket(family, kind)
    try:
        sock.connect(address)  # type: ignore[arg-type]
    except OSError:
        sock.close()
        if family == socket.AF_UNIX and kind == socket.SOCK_DGRAM:  # a stream socket, as Go tries too
            sock = socket.socket(family, socket.SOCK_STREAM)
            try:
                sock.connect(address)  # type: ignore[arg-type]
                return sock
            except OSError:
                sock.close()
            raise SyslogError(UNIX_ERROR) from None
        raise
    return sock


def format_line(line: str, remote: bool, hostname: str) -> bytes:
    """One stderr line as a syslog message."""
    m = _LINE.match(line)
    pid, severity, msg = (int(m[1]), SEVERITY.get(m[2], 3), m[3]) if m else (os.getpid(), 3, line)
    now = time.gmtime()
    if remote:
        head = f"<{severity}>{time.strftime('%Y-%m-%dT%H:%M:%SZ', now)} {hostname} {TAG}[{pid}]: "
    else:
        stamp = time.strftime("%b ", now) + f"{now.tm_mday:2d}" + time.strftime(" %H:%M:%S", now)
        head = f"<{severity}>{stamp} {TAG}[{pid}]: "
    return (head + msg + "\n").encode("utf-8", "replace")


class StderrLines(threading.Thread):
    """This process's stderr (file descriptor 2, which worker processes inherit) through a pipe, each whole
    line handed to `line` (without its newline) in this thread: syslog here, the rotated log file in
    `zonebus.server.logrotation`. `take_stderr()` points stderr at the pipe, starts the thread and, at exit,
    `drain`s it; what is left unterminated at the pipe's end goes to `partial`."""

    def __init__(self, name: str) -> None:
        super().__init__(name=name, daemon=True)
        self.read_fd, self._write_fd = os.pipe()
        self.busy = False

    def line(self, raw: bytes) -> None:
        raise NotImplementedError

    def partial(self, raw: bytes) -> None:
        """The pipe closed in the middle of a line (nothing by default)."""

    def take_stderr(self) -> None:
        sys.stderr.flush()
        os.dup2(self._write_fd, 2)
        os.close(self._write_fd)
        self.start()
        atexit.register(self.drain)

    def run(self) -> None:
        pending = b""
        while True:
            try:
                chunk = os.read(self.read_fd, 65536)
            except OSError:
                return
            if not chunk:
                if pending:
                    self.partial(pending)
                return
            self.busy = True
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for raw in lines:
                self.line(raw)
            self.busy = False

    def drain(self, timeout: float = 1.0) -> None:
        """At exit: give the thread what is still in the pipe: wait, at most `timeout`, until the pipe is empty
        and the thread is not busy with a line."""
        try:
            sys.stderr.flush()
        except (OSError, ValueError):
            pass
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            readable, _, _ = select.select([self.read_fd], [], [], 0)
            if not readable and not self.busy:
                return
            time.sleep(0.01)


class _Forwarder(StderrLines):
    def __init__(self, sock: socket.socket, remote: bool) -> None:
        super().__init__("syslog")
        self.sock, self.remote = sock, remote
        self.hostname = socket.gethostname()

    def line(self, raw: bytes) -> None:
        if raw.strip():
            self._send(format_line(raw.decode("utf-8", "replace").rstrip("\r"), self.remote, self.hostname))

    def _send(self, data: bytes) -> None:
        try:
            self.sock.send(data) if self.sock.type == socket.SOCK_DGRAM else self.sock.sendall(data)
        except OSError:
            pass  # syslog gone: the line is lost, as with nats-server's syslog writer


def open_log_file(opts: ServerOptions) -> None:
    """`log_file` (`-l`): this process's stderr, and so its children's, appends to that file from now on (it
    wins over the syslog keys, as in nats-server). Raises SyslogError when it cannot be opened."""
    if not opts.log_file:
        return
    try:
        fd = os.open(opts.log_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    except OSError as exc:
        raise SyslogError(f"error opening file: open {opts.log_file}: {(exc.strerror or str(exc)).lower()}") from None
    sys.stderr.flush()
    os.dup2(fd, 2)
    os.close(fd)


def start_syslog(opts: ServerOptions, check_only: bool = False) -> None:
    """Send this process's stderr (and its children's) to the configured syslog; nothing without one, or
    with a `log_file` (`open_log_file`). Raises SyslogError (or OSError for a remote TCP syslog that cannot
    be reached). `check_only`: only that check (a server with workers starts its forwarding in the
    supervisor, after its exec)."""
    if opts.log_file:
        return
    where = destination(opts)
    if where is None:
        return
    family, kind, address, remote = where
    sock = _connect(family, kind, address)
    if check_only:
        sock.close()
        return
    _Forwarder(sock, remote).take_stderr()
