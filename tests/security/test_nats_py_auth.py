"""nats-py against both servers with users, bcrypt, an nkey user (`nkeys_seed`), permission violations
(reported to the error callback, the connection stays up) and `/connz?auth=true`'s `authorized_user`."""

from __future__ import annotations

import asyncio
import os
import tempfile

import nats
import pytest

from tests.security.kit import NKEY_PUB, SEED, USERS
from zonebus.testing.polling import until


async def connect(url: str, **kw: object):
    return await nats.connect(url, allow_reconnect=False, connect_timeout=3, max_reconnect_attempts=0, **kw)


@pytest.fixture
def seed_file():
    fd, path = tempfile.mkstemp(suffix=".nk")
    os.write(fd, SEED)
    os.close(fd)
    yield path
    os.unlink(path)


async def test_nkey_user(impl: str, server_pool, seed_file: str) -> None:
    server = server_pool.get(impl, USERS)
    nc = await connect(server.url, nkeys_seed=seed_file)
    try:
        sub = await nc.subscribe("nk.x")
        await nc.publish("nk.x", b"signed")
        msg = await sub.next_msg(timeout=3)
        assert msg.data == b"signed"
    finally:
        await nc.close()


async def test_bcrypt_user_and_bad_password(impl: str, server_pool) -> None:
    server = server_pool.get(impl, USERS)
    nc = await connect(server.url, user="bob", password="bobpw")
    try:
        sub = await nc.subscribe("sub.x")
        other = await connect(server.url, user="full", password="pw")
        await other.publish("sub.x", b"hi")
        await other.flush()
        assert (await sub.next_msg(timeout=3)).data == b"hi"
        await other.close()
    finally:
        await nc.close()
    with pytest.raises(Exception) as info:
        await connect(server.url, user="bob", password="wrong")
    assert "authorization violation" in str(info.value).lower()


async def test_permission_violation_reported_connection_stays(impl: str, server_pool) -> None:
    server = server_pool.get(impl, USERS)
    errors: list[Exception] = []

    async def on_error(e: Exception) -> None:
        errors.append(e)

    nc = await connect(server.url, user="alice", password="pw", error_cb=on_error)
    try:
        await nc.publish("b.forbidden", b"x")
        sub = await nc.subscribe("a.ok")
        await nc.publish("a.ok", b"fine")
        assert (await sub.next_msg(timeout=3)).data == b"fine"
        await until(lambda: errors, "an error callback", timeout=1.5)
        assert any('permissions violation for publish to "b.forbidden"' in str(e).lower() for e in errors), errors
        assert nc.is_connected
    finally:
        await nc.close()


async def test_connz_authorized_user(impl: str, server_factory, seed_file: str) -> None:
    server = server_factory(USERS, http=True)
    a = await connect(server.url, user="alice", password="pw", name="A")
    k = await connect(server.url, nkeys_seed=seed_file, name="K")
    try:
        await a.flush()
        await k.flush()
        conns = await asyncio.to_thread(server.http_get, "/connz?auth=true")
        users = {c["name"]: c.get("authorized_user") for c in conns["connections"]}
        assert users == {"A": "alice", "K": NKEY_PUB}
        plain = await asyncio.to_thread(server.http_get, "/connz")
        assert all("authorized_user" not in c for c in plain["connections"])
    finally:
        await a.close()
        await k.close()
