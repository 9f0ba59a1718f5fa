"""The power-loss file system (`zonebus.testing.powerloss`) keeps exactly what was fsynced: file data since the
file's last fsync and directory entries since their directory's last fsync are gone after a power loss, while
reads before it see every write (pending changes read over the backing file)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from zonebus.testing.powerloss import PendingData, PowerLossMount, PowerLossUnavailable

pytestmark = pytest.mark.timeout(60)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if path.is_dir() else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _mounted(root: Path) -> PowerLossMount:
    try:
        return PowerLossMount(root).start()
    except PowerLossUnavailable as exc:
        pytest.skip(f"power loss simulation unavailable: {exc}")


def test_pending_changes_read_over_the_backing_bytes() -> None:
    p = PendingData(size=10)
    p.write(10, b"abc")
    p.write(13, b"def")  # an append grows the previous write
    assert len(p.ops) == 1 and p.size == 16
    p.write(2, b"XY")
    assert p.overlay(b"0123456789", 0, 100) == b"01XY456789abcdef"
    p.truncate(4)
    p.write(6, b"Z")  # a hole after the truncation reads as zeros
    assert p.overlay(b"0123456789", 0, 100) == b"01XY\x00\x00Z"
    assert p.overlay(b"3456789", 3, 2) == b"Y\x00"


def test_power_loss_drops_what_was_not_fsynced(tmp_path: Path) -> None:
    fs = _mounted(tmp_path)
    mnt = fs.mountpoint
    try:
        (mnt / "kept").mkdir()
        fd = os.open(mnt / "kept" / "log", os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        os.write(fd, b"synced;")
        os.fsync(fd)
        _fsync(mnt / "kept")
        _fsync(mnt)
        os.write(fd, b"not synced")
        os.close(fd)
        (mnt / "lost").mkdir()  # its entry in the root is never fsynced
        (mnt / "lost" / "f").write_bytes(b"x")  # nor its data
        _fsync(mnt / "lost")
        (mnt / "kept" / "new").write_bytes(b"y")  # a file fsynced, but not its directory entry
        _fsync(mnt / "kept" / "new")
        os.rename(mnt / "kept" / "log", mnt / "kept" / "renamed")
        assert (mnt / "kept" / "renamed").read_bytes() == b"synced;not synced"
        assert sorted(os.listdir(mnt)) == ["kept", "lost"]
        dropped = fs.power_loss()
        assert dropped == {"files": 2, "bytes": len(b"not synced") + 1, "entries": 3}, dropped
        fs.start()
        assert sorted(os.listdir(mnt)) == ["kept"]
        assert sorted(os.listdir(mnt / "kept")) == ["log"]
        assert (mnt / "kept" / "log").read_bytes() == b"synced;"
    finally:
        fs.stop()
    assert not os.path.ismount(mnt)


def test_file_locks_work_on_the_mount(tmp_path: Path) -> None:
    """nats-server locks its store directory: POSIX and BSD locks on the mount are taken and released (by the
    kernel: the file system leaves locking to it), and the file system stays up to serve the next request."""
    import fcntl

    fs = _mounted(tmp_path)
    try:
        path = fs.mountpoint / "lock"
        for _ in range(200):  # (a file system that reported each lock as an error filled its log pipe and hung)
            with open(path, "a+b") as f:
                fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                fcntl.lockf(f, fcntl.LOCK_UN)
                fcntl.flock(f, fcntl.LOCK_UN)
        (fs.mountpoint / "after").write_bytes(b"ok")
        assert (fs.mountpoint / "after").read_bytes() == b"ok"
        assert "Uncaught exception" not in fs.log_path.read_text(errors="replace")
    finally:
        fs.stop()


def test_hard_links_follow_their_directory_fsync(tmp_path: Path) -> None:
    """A hard link (how a create-only put lands) is a directory entry: kept once its directory is fsynced,
    gone after a power loss otherwise; a link onto an existing name fails."""
    fs = _mounted(tmp_path)
    mnt = fs.mountpoint
    try:
        (mnt / "src").write_bytes(b"data")
        _fsync(mnt / "src")
        _fsync(mnt)
        os.link(mnt / "src", mnt / "kept")
        _fsync(mnt)
        os.link(mnt / "src", mnt / "lost")
        with pytest.raises(FileExistsError):
            os.link(mnt / "src", mnt / "kept")
        assert (mnt / "lost").read_bytes() == b"data"
        fs.power_loss()
        fs.start()
        assert sorted(os.listdir(mnt)) == ["kept", "src"]
        assert (mnt / "kept").read_bytes() == b"data"
    finally:
        fs.stop()
