"""`log_file` with nats-server's rotation: `logfile_size_limit` (alias `log_size_limit`) and `logfile_max_num`.

    log_file: "/var/log/zonebus.log"
    logfile_size_limit: 10MB     # rotate once the file has grown past this many bytes
    logfile_max_num: 5           # keep at most 5 files: the live one and the 4 newest backups

What nats-server's file logger (logger/log.go) does, and so this does:
- the size counted is the file's size at start plus every log line written since; once a line takes it
  past the limit, the file is closed and renamed to `<log_file>.YYYY.MM.DD.hh.mm.ss.nnnnnnnnn` (local time,
  nanoseconds), a new `<log_file>` is opened, and its first line is `[INF] Rotated log, backup saved as
  "<backup>"` (the new file's count starts there);
- a file already past the limit at start rotates with the first line (nats-server logs
  `Rotating logfile...` to make one);
- with `logfile_max_num` N > 0, after each rotation the backups (files named `<log_file>.<such a stamp>` in
  the same directory, oldest first by name) beyond N-1 are removed, each noted by `[INF] Purged log file
  "<name>"`; without a size limit `logfile_max_num` does nothing.

How: the process's stderr (file descriptor 2, which worker processes inherit) becomes a pipe, and a thread
(`_Rotator`) copies whole lines from it to the file, rotating between lines. A server with workers starts the
thread in its supervisor (`zonebus.workers.supervisor`), after its exec; a single process in `zonebus server`.
"""

from __future__ import annotations

import os
import sys
import time
from datetime import datetime
from pathlib import Path

from zonebus.options import ServerOptions
from zonebus.server.syslogging import StderrLines

LOG_PERMS = 0o644


def backup_name(path: str, now_ns: int) -> str:
    """nats-server's backup name: the log file's name, then `.YYYY.MM.DD.hh.mm.ss.nnnnnnnnn` (local time)."""
    seconds, nanos = divmod(now_ns, 1_000_000_000)
    return f"{path}.{datetime.fromtimestamp(seconds):%Y.%m.%d.%H.%M.%S}.{nanos:09d}"


def is_backup_of(base: str, name: str) -> bool:
    """Whether `name` (a file in the log's directory) is a backup of the log file named `base`."""
    stamp = name.removeprefix(base + ".")
    if stamp == name:
        return False
    parts = stamp.split(".")
    if len(parts) != 7 or not all(p.isdigit() for p in parts):
        return False
    try:
        datetime.strptime(".".join(parts[:6]), "%Y.%m.%d.%H.%M.%S")
    except ValueError:
        return False
    return True


def _line(level: str, msg: str) -> bytes:
    stamp = time.strftime("%Y/%m/%d %H:%M:%S")
    return f"[{os.getpid()}] {stamp} [{level}] {msg}\n".encode()


class _Rotator(StderrLines):
    """Copies lines from the stderr pipe to the log file, rotating it past `limit` bytes."""

    def __init__(self, path: str, limit: int, max_files: int) -> None:
        super().__init__("logrotation")
        self.path, self.limit, self.max_files = path, limit, max_files
        self.file_fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, LOG_PERMS)
        self.written = os.fstat(self.file_fd).st_size

    def line(self, raw: bytes) -> None:
        self._write(raw + b"\n")

    def partial(self, raw: bytes) -> None:
        self._write(raw)

    def _write(self, data: bytes) -> None:
        try:
            os.write(self.file_fd, data)
        except OSError:
            return
        self.written += len(data)
        if self.written > self.limit:
            self._rotate()

    def _rotate(self) -> None:
        backup = backup_name(self.path, time.time_ns())
        try:
            os.close(self.file_fd)
            os.rename(self.path, backup)
            self.file_fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, LOG_PERMS)
        except OSError as exc:  # nats-server panics when it cannot reopen; keep the line going to the old name
            self.file_fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, LOG_PERMS)
            self.written = 0
            os.write(self.file_fd, _line("ERR", f"Unable to rotate logfile ({exc})"))
            return
        first = _line("INF", f'Rotated log, backup saved as "{backup}"')
        os.write(self.file_fd, first)
        self.written = len(first)
        if self.max_files > 0:
            self._purge()

    def _purge(self) -> None:
        directory = Path(self.path).parent
        base = Path(self.path).name
        try:
            backups = sorted(e.name for e in os.scandir(directory) if e.is_file() and is_backup_of(base, e.name))
        except OSError as exc:
            os.write(self.file_fd, _line("ERR", f'Unable to read directory "{directory}" for log purge ({exc}), '
                                                "will attempt next rotation"))
            return
        for name in backups[:max(0, len(backups) - (self.max_files - 1))]:
            try:
                os.remove(directory / name)
            except OSError as exc:
                os.write(self.file_fd, _line("ERR", f'Unable to remove backup log file "{name}" ({exc}), '
                                                    "will attempt next rotation"))
                return
            data = _line("INF", f'Purged log file "{name}"')
            os.write(self.file_fd, data)
            self.written += len(data)



def rotates(opts: ServerOptions) -> bool:
    """Whether the options ask for a rotated log file."""
    return bool(opts.log_file) and opts.log_size_limit > 0


def start_log_rotation(opts: ServerOptions) -> None:
    """With `log_file` and a size limit: stderr (this process's and its children's) goes through a pipe to a
    thread writing the file and rotating it; nothing otherwise. A file already past the limit rotates at
    the first line, written here."""
    if not rotates(opts):
        return
    rotator = _Rotator(opts.log_file, opts.log_size_limit, opts.log_max_files)
    past_limit = rotator.written > opts.log_size_limit
    rotator.take_stderr()
    if past_limit:
        print(_line("INF", "Rotating logfile...").decode(), end="", file=sys.stderr, flush=True)
