"""SIGHUP reload of users and permissions, differential: the same conversation on nats-server and zonebus,
with the config rewritten and reloaded in the middle, must give the same transcript. Checked: a removed
user's connection is closed, a user whose permissions changed is held to the new ones at once (publish
and subscribe; subscriptions they no longer allow are dropped), new logins follow the new rules.
"""

from __future__ import annotations

import signal
import time

from tests.wire.kit import RawClient, connect_line

BEFORE = """
authorization { users: [
  {user: alice, password: pw, permissions: {publish: "a.>", subscribe: ["a.>", "keep.>"]}}
  {user: carol, password: pw}
  {user: full, password: pw}
] }
"""
AFTER = """
authorization { users: [
  {user: alice, password: pw, permissions: {publish: "b.>", subscribe: ["b.>", "keep.>"]}}
  {user: full, password: pw}
  {user: dave, password: pw}
] }
"""


def login(port: int, user: str) -> RawClient:
    c = RawClient(port)
    c.send(connect_line(user=user, **{"pass": "pw"}))
    return c


def conversation(server) -> list[str]:
    port = server.port
    out: list[str] = []
    alice, carol, full = login(port, "alice"), login(port, "carol"), login(port, "full")
    alice.send(b"SUB a.x 1\r\nSUB keep.x 2\r\n")
    out.append("alice: " + " | ".join(alice.sync()))
    out.append("carol: " + " | ".join(carol.sync()))
    out.append("full: " + " | ".join(full.sync()))
    assert server.workdir is not None
    (server.workdir / "server.conf").write_text(AFTER)
    server.signal(signal.SIGHUP)
    time.sleep(1.0)
    out.append("carol after: " + " | ".join(carol.until_closed(2.0)))
    out.append("alice after: " + " | ".join(alice.sync()))
    full.send(b"PUB a.x 1\r\n1\r\nPUB keep.x 1\r\n2\r\n")
    full.sync()
    alice.send(b"PUB a.y 0\r\n\r\nPUB b.y 0\r\n\r\nSUB a.z 3\r\nSUB b.z 4\r\n")
    out.append("alice msgs: " + " | ".join(alice.sync()))
    with login(port, "dave") as dave:
        out.append("dave: " + " | ".join(dave.sync()))
    with login(port, "carol") as again:
        out.append("carol again: " + " | ".join(again.until_closed(2.0)))
    for c in (alice, carol, full):
        c.close()
    return out


def test_reload_users_and_permissions(impl: str, server_factory, server_pool) -> None:
    got = conversation(server_factory(BEFORE))
    if impl == "nats":
        return
    reference = server_pool.start("nats", BEFORE)  # (not the pool's: the caller stops it)
    try:
        ref = conversation(reference)
    finally:
        reference.stop()
    report = "\n".join(f"{'  ' if a == b else '!!'} nats: {a}\n   zonebus: {b}" for a, b in zip(ref, got, strict=False))
    assert got == ref, report
