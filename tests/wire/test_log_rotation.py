"""`log_file` rotation (`logfile_size_limit`, `logfile_max_num`), against nats-server.

What nats-server 2.15 does (logger/log.go), and zonebus must do too, with a 1 KB limit and 3 files:
- a log file already past the limit at start is rotated at once (`Rotating logfile...`);
- past the limit the file is renamed `<log_file>.YYYY.MM.DD.hh.mm.ss.nnnnnnnnn` and a new one starts with
  `Rotated log, backup saved as "<that backup>"`;
- at most 3 files stay (the live one and 2 backups), the removed ones noted as `Purged log file "<name>"`;
- each backup holds about the limit (past it by one line at most).
The log lines come from failed logins (`authentication error`), which both servers log.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.wire.kit import RawClient
from zonebus.testing.polling import wait_until
from zonebus.testing.processes import ServerProcess

LIMIT = 1024
MAX_FILES = 3
BACKUP = re.compile(r"^s\.log\.\d{4}\.\d{2}\.\d{2}\.\d{2}\.\d{2}\.\d{2}\.\d{9}$")


def _files(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def _text(path: Path) -> str:
    """A log file's text, "" once it was purged."""
    try:
        return path.read_text(errors="replace")
    except FileNotFoundError:
        return ""


def _purged(directory: Path) -> bool:
    return any("Purged log file" in _text(directory / name) for name in _files(directory))


@pytest.mark.timeout(120)
def test_log_file_rotates_and_keeps_max_num(tmp_path: Path, impl: str) -> None:
    directory = tmp_path / "logs"
    directory.mkdir()
    log = directory / "s.log"
    log.write_text("old line\n" * 200)  # past the limit before the start
    conf = (f'log_file: "{log}"\nlogfile_size_limit: 1KB\nlogfile_max_num: {MAX_FILES}\n'
            "authorization { user: x, password: y }\n")
    server = ServerProcess(impl, conf, workers=1).start()
    try:
        backups = [n for n in _files(directory) if BACKUP.match(n)]
        assert backups, (impl, _files(directory))  # rotated at start: the old lines, then the notice
        first_backup = _text(directory / backups[0])
        assert first_backup.startswith("old line\n") and "Rotating logfile..." in first_backup, impl
        for _ in range(200):
            with RawClient(server.port) as c:
                assert c.connect(user="x", **{"pass": "wrong"})[0] == "-ERR 'Authorization Violation'"
            if _purged(directory):
                break
        wait_until(lambda: _purged(directory), f"{impl} purges old log files", timeout=10)
    finally:
        server.stop()
    names = _files(directory)
    backups = [n for n in names if BACKUP.match(n)]
    assert len(names) <= MAX_FILES and names == sorted(backups + ["s.log"]), (impl, names)
    assert len(backups) == MAX_FILES - 1, (impl, names)
    first = log.read_text().splitlines()[0]
    saved = re.search(r'\[INF\] Rotated log, backup saved as "(.*)"$', first)
    assert saved and Path(saved[1]).name == backups[-1], (impl, first)
    for name in backups:
        text = (directory / name).read_text()
        assert "authentication error" in text, (impl, name)
        assert LIMIT < len(text.encode()) < LIMIT + 300, (impl, name, len(text))
    purged = re.findall(r'Purged log file "(.*)"', "".join((directory / n).read_text() for n in names))
    assert purged and all(BACKUP.match(n) and n not in names for n in purged), (impl, purged)
