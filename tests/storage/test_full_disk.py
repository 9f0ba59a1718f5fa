"""A file store on a full disk (a real tmpfs of 256 KiB, mounted for the test): with the group commit (the default
`sync_always`) a batch's records are written just before its fsync, so a write that fails there must fail that
batch's PubAcks with the error (never leave them waiting, never raise in the event loop), refuse what comes
after, and keep every message acknowledged before it readable after a reopen.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from zonebus.store.filestore import FileStore

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    mount = tmp_path / "disk"
    mount.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("needs root to mount a tmpfs")
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


async def test_a_full_disk_fails_the_waiting_acks_and_keeps_what_was_acknowledged(small_disk: Path) -> None:
    store = FileStore(small_disk / "S" / "msgs", sync_always=True)
    body = os.urandom(1000)
    acked: list[int] = []
    failed: list[tuple[int, str]] = []
    loop = asyncio.get_running_loop()
    for _batch in range(400):  # 64 messages of 1 KB a batch, far more than the 256 KiB disk holds
        if store.write_error() is not None:
            break
        seqs = [store.store("orders.x", None, body)[0] for _ in range(64)]
        done = loop.create_future()
        last = seqs[-1]

        def answered(err: str | None, seqs: list[int] = seqs, done: asyncio.Future = done) -> None:
            if err is None:
                acked.extend(seqs)
            else:
                failed.extend((s, err) for s in seqs)
            done.set_result(None)

        if not store.ack_when_durable(last, answered):
            answered(None)
        await asyncio.wait_for(done, 5)  # answered either way: never left waiting
    error = store.write_error()
    assert error is not None and "No space left" in error, error
    assert failed and all("No space left" in e for _, e in failed)
    assert acked and max(acked) < min(s for s, _ in failed)
    assert store.ack_when_durable(store.index.last_seq + 1, lambda err: failed.append((0, str(err))))
    assert failed[-1] == (0, error)  # a later publish is refused at once with the same error
    try:
        store.close()
    except OSError:
        pass  # (closing writes what is buffered: the disk is still full)
    reopened = FileStore(small_disk / "S" / "msgs", sync_always=True)
    try:
        for seq in acked:  # every acknowledged message is there, whole
            msg = reopened.load(seq)
            assert msg is not None and msg.data == body, seq
    finally:
        reopened.close()
