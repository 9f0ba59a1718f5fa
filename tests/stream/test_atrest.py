"""Encryption at rest (`jetstream { key, cipher, prev_key }`), differentially: nats-server and zonebus run the same
scenarios from the same config text (the `impl` fixture of tests/conftest.py runs each on both).

A stream's acknowledged messages come back whole after a restart, and their payload and subject appear in no file
under the store directory; a wrong key, or no key, leaves the stream unloaded and its files untouched (the right
key brings it back). Creating it again there is refused by zonebus with nats-server's error (10049) and changes
nothing; nats-server 2.15 loses the old stream then (a wrong key: it answers 10049 and removes the directory; no
key: it creates the stream anew), so that step is zonebus's alone; a key added to a plain store encrypts what is there;
`prev_key` opens a store written with the old key.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import nats
import pytest
from nats.js.api import AckPolicy, ConsumerConfig, StorageType
from nats.js.errors import APIError, NotFoundError

from zonebus.testing.polling import until
from zonebus.testing.processes import ServerProcess, check_config, check_config_both

PAYLOAD = "RECOGNISABLE-PAYLOAD"
SUBJECT = "atr.unmistakable"
COUNT = 40


def _config(store: str, key: str = "", cipher: str = "", prev_key: str = "") -> str:
    lines = [f'store_dir: "{store}"']
    if cipher:
        lines.append(f"cipher: {cipher}")
    if key:
        lines.append(f'key: "{key}"')
    if prev_key:
        lines.append(f'prev_key: "{prev_key}"')
    return "jetstream {\n  " + "\n  ".join(lines) + "\n}\n"


def _start(impl: str, config: str) -> ServerProcess:
    """A server to run in a `with` block (which starts it, and stops it cleanly at the end)."""
    return ServerProcess(impl=impl, config=config)


async def _publish(url: str) -> None:
    nc = await nats.connect(url, allow_reconnect=False, connect_timeout=2)
    try:
        js = nc.jetstream(timeout=2)
        await js.add_stream(name="ATR", subjects=["atr.>"])
        await js.add_consumer("ATR", ConsumerConfig(durable_name="reader", ack_policy=AckPolicy.EXPLICIT))
        for i in range(COUNT):
            ack = await js.publish(SUBJECT, f"{PAYLOAD}-{i}".encode())
            assert ack.seq == i + 1
    finally:
        await nc.close()


async def _read_back(url: str, durable: bool = True) -> list[str]:
    """The stream's messages, through the durable consumer (or, `durable=False`, by sequence)."""
    nc = await nats.connect(url, allow_reconnect=False, connect_timeout=2)
    try:
        js = nc.jetstream(timeout=2)
        info = await js.stream_info("ATR")
        assert info.state.messages == COUNT
        if not durable:
            msgs = [await js.get_msg("ATR", seq) for seq in range(1, COUNT + 1)]
            assert {m.subject for m in msgs} == {SUBJECT}
            return [m.data.decode() for m in msgs]
        sub = await js.pull_subscribe_bind(durable="reader", stream="ATR")
        got: list[str] = []
        while len(got) < COUNT:
            for m in await sub.fetch(COUNT - len(got), timeout=2):
                assert m.subject == SUBJECT
                got.append(m.data.decode())
        return got
    finally:
        await nc.close()


async def _stream_missing(url: str) -> bool:
    nc = await nats.connect(url, allow_reconnect=False, connect_timeout=2)
    try:
        try:
            await nc.jetstream(timeout=2).stream_info("ATR")
        except NotFoundError:
            return True
        return False
    finally:
        await nc.close()


def _files_with(store: str, *needles: str) -> list[str]:
    hits = []
    for p in Path(store).rglob("*"):
        if p.is_file():
            raw = p.read_bytes()
            hits += [f"{p.relative_to(store)}: {n}" for n in needles if n.encode() in raw]
    return hits


EXPECTED = [f"{PAYLOAD}-{i}" for i in range(COUNT)]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("cipher", ["chachapoly", "aes", ""])
async def test_encrypted_store_restarts_whole_and_holds_no_plaintext(impl: str, cipher: str) -> None:
    store = tempfile.mkdtemp(prefix=f"zb-atrest-{impl}-")
    config = _config(store, key="s3cr3t-one", cipher=cipher)
    with _start(impl, config) as server:
        await _publish(server.url)
    assert _files_with(store, PAYLOAD, SUBJECT) == []
    with _start(impl, config) as server:
        assert await _read_back(server.url) == EXPECTED
    assert _files_with(store, PAYLOAD, SUBJECT) == []


async def _create_refused(url: str, storage: StorageType = StorageType.FILE) -> int | None:
    """The err_code of creating the stream again (None: it was created)."""
    nc = await nats.connect(url, allow_reconnect=False, connect_timeout=2)
    try:
        try:
            await nc.jetstream(timeout=2).add_stream(name="ATR", subjects=["atr.>"], storage=storage)
        except APIError as exc:
            return exc.err_code
        return None
    finally:
        await nc.close()


def _snapshot(store: str) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in Path(store).rglob("*") if p.is_file()}


@pytest.mark.timeout(60)
async def test_wrong_key_leaves_the_stream_unloaded_and_whole(impl: str) -> None:
    store = tempfile.mkdtemp(prefix=f"zb-atrest-{impl}-")
    with _start(impl, _config(store, key="right-key")) as server:
        await _publish(server.url)
    before = _snapshot(store)
    with _start(impl, _config(store, key="wrong-key")) as server:  # the server starts; the stream is not there
        assert await _stream_missing(server.url)
        if impl == "zonebus":  # and is not created over the old one (nats-server 2.15 answers 10049 too, but
            assert await _create_refused(server.url) == 10049  # removes the stream's directory: all is lost)
            assert await _create_refused(server.url, StorageType.MEMORY) == 10049  # (it would replace the dir)
    assert _snapshot(store) == before
    with _start(impl, _config(store, key="right-key")) as server:
        assert await _read_back(server.url) == EXPECTED


@pytest.mark.timeout(60)
async def test_no_key_leaves_an_encrypted_stream_unloaded(impl: str) -> None:
    store = tempfile.mkdtemp(prefix=f"zb-atrest-{impl}-")
    with _start(impl, _config(store, key="right-key")) as server:
        await _publish(server.url)
    before = _snapshot(store)
    with _start(impl, _config(store)) as server:
        assert await _stream_missing(server.url)
        if impl == "zonebus":  # (nats-server 2.15 creates the stream anew there: the encrypted one is lost)
            assert await _create_refused(server.url) == 10049
    if impl == "zonebus":
        assert _snapshot(store) == before
        with _start(impl, _config(store, key="right-key")) as server:
            assert await _read_back(server.url) == EXPECTED


@pytest.mark.timeout(60)
async def test_key_added_to_a_plain_store_encrypts_it(impl: str) -> None:
    store = tempfile.mkdtemp(prefix=f"zb-atrest-{impl}-")
    with _start(impl, _config(store)) as server:
        await _publish(server.url)
    assert _files_with(store, PAYLOAD)  # (plaintext before)
    with _start(impl, _config(store, key="added-later", cipher="aes")) as server:
        assert await _read_back(server.url, durable=False) == EXPECTED
    assert _files_with(store, PAYLOAD) == []
    if impl == "zonebus":  # (nats-server 2.15 leaves the subjects in its old plaintext msgs/index.db)
        assert _files_with(store, SUBJECT) == []
    with _start(impl, _config(store, key="added-later", cipher="aes")) as server:
        assert await _read_back(server.url, durable=False) == EXPECTED
        if impl == "zonebus":  # (nats-server 2.15's converted durable consumer delivers nothing: a fetch times out)
            assert await _read_back(server.url) == EXPECTED


@pytest.mark.timeout(60)
async def test_prev_key_opens_a_store_written_with_the_old_key(impl: str) -> None:
    store = tempfile.mkdtemp(prefix=f"zb-atrest-{impl}-")
    with _start(impl, _config(store, key="old-key")) as server:
        await _publish(server.url)
    with _start(impl, _config(store, key="new-key", prev_key="old-key")) as server:
        assert await _read_back(server.url, durable=False) == EXPECTED
    with _start(impl, _config(store, key="new-key")) as server:  # re-keyed: the old key is no longer needed
        assert await _read_back(server.url, durable=False) == EXPECTED
        if impl == "zonebus":  # (nats-server 2.15 drops the durable consumer: `message authentication failed`)
            assert await _read_back(server.url) == EXPECTED


@pytest.mark.timeout(30)
@pytest.mark.parametrize("block, ok", [
    ('key: "k", cipher: AES', True),
    ('ek: "k", cipher: chacha', True),
    ('encryption_key: "k", prev_encryption_key: "j", cipher: ChaChaPoly', True),
    ('key: "k", prev_ek: "j"', True),
    ('key: "k", prev_key: "j"', True),
    ('key: "k", cipher: rot13', False),
    ('encryption: true', False),  # (not a key of nats-server's either)
])
def test_keys_accepted_and_refused_as_nats_server_does(tmp_path: Path, block: str, ok: bool) -> None:
    ours, theirs = check_config_both(tmp_path / "server.conf", f'jetstream {{ store_dir: "{tmp_path}", {block} }}\n')
    assert (theirs.returncode == 0) == ok, theirs.stderr
    assert (ours.returncode == 0) == ok, ours.stderr
    if "rot13" in block:
        assert 'Unknown cipher type: "rot13"' in ours.stderr and 'Unknown cipher type: "rot13"' in theirs.stderr


@pytest.mark.timeout(30)
def test_key_with_a_shared_store_is_refused(tmp_path: Path) -> None:
    done = check_config(tmp_path / "server.conf", f'jetstream {{ key: "k", shared_store: "file://{tmp_path}/s" }}\n')
    assert done.returncode != 0
    assert "encryption at rest covers the local file store only, not the shared store" in done.stderr


@pytest.mark.timeout(60)
async def test_durable_queue_group_log_is_encrypted(tmp_path: Path) -> None:
    """zonebus's own durable queue groups (no nats-server counterpart): their log is sealed like a stream."""
    store = tmp_path / "store"
    conf = (f'jetstream {{ store_dir: "{store}", key: "queue-key" }}\n'
            'queue_groups { workers: { subjects: ["orders.>"], ack: explicit, ack_wait: "5s" } }\n')
    with ServerProcess("zonebus", conf) as server:  # stored first: nobody listens yet
        nc = await nats.connect(server.url, allow_reconnect=False, connect_timeout=2)
        js = nc.jetstream(timeout=5)
        for i in range(20):
            await js.publish("orders.new", f"{PAYLOAD}-{i}".encode())
        await nc.close()
    assert list(store.rglob("*.blk")) and _files_with(str(store), PAYLOAD, "orders.new") == []
    with ServerProcess("zonebus", conf) as server:
        nc = await nats.connect(server.url, allow_reconnect=False, connect_timeout=2)
        got: list[str] = []

        async def on_msg(m: nats.aio.msg.Msg) -> None:
            got.append(m.data.decode())
            await m.ack()

        await nc.subscribe("orders.>", "workers", cb=on_msg)
        await until(lambda: len(got) >= 20, "the member gets every stored message", timeout=15)
        await nc.close()
    assert sorted(got) == sorted(f"{PAYLOAD}-{i}" for i in range(20))
