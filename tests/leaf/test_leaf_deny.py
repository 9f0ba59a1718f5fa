"""A leafnode remote's `deny_exports` / `deny_imports`, differential (every hub/leaf mix of zonebus and
nats-server): what the leaf may not export never reaches the hub, and the hub's interest in such a literal
subject is not taken; what it may not import is not asked for and not delivered (a wildcard subscription that
covers it gets the rest). The hub's side on its own (a raw leaf whose CONNECT carries `deny_pub`): nothing on
those subjects is sent to it, and its interest in one of them is a permissions violation that closes it."""

from __future__ import annotations

import asyncio

import nats
import pytest

from tests.leaf import kit
from zonebus.localservers import free_port
from zonebus.testing.polling import until, wait_until
from zonebus.testing.processes import ServerProcess, check_config_both, start_parallel, stop_all
from zonebus.testing.tally import settled, until_received

pytestmark = pytest.mark.timeout(60)

PAIRS = [("zonebus", "zonebus"), ("nats", "zonebus"), ("zonebus", "nats"), ("nats", "nats")]


def _subs(server: ServerProcess) -> set[str]:
    leafs = server.http_get("/leafz?subs=1")["leafs"]
    return set(leafs[0].get("subscriptions_list") or []) if leafs else set()


async def _until_marker(sub, marker: bytes) -> list:
    """Every message on `sub` up to the one carrying `marker` (which is last)."""
    got = []
    while True:
        msg = await sub.next_msg(timeout=5)
        got.append(msg)
        if msg.data == marker:
            return got


@pytest.mark.parametrize("hub_impl, leaf_impl", PAIRS)
def test_remote_deny_lists(hub_impl: str, leaf_impl: str) -> None:
    port = free_port()
    hub = kit.hub(hub_impl, port)
    leaf = ServerProcess(leaf_impl, http_port=free_port(), config=(
        "server_name: spoke\n"
        f'leafnodes {{ remotes: [{{ url: "nats-leaf://127.0.0.1:{port}", deny_exports: ["secret.>"],\n'
        '  deny_imports: "private.>" }] }\n'))
    start_parallel([hub, leaf])
    try:
        wait_until(lambda: hub.http_get("/leafz")["leafnodes"] == 1, "the leaf connected")
        asyncio.run(_deny_scenario(hub, leaf))
    finally:
        stop_all([leaf, hub])


async def _deny_scenario(hub: ServerProcess, leaf: ServerProcess) -> None:
    nh = await nats.connect(hub.url, allow_reconnect=False, connect_timeout=3)
    nl = await nats.connect(leaf.url, allow_reconnect=False, connect_timeout=3)
    try:
        # deny_exports: the hub's interest in a literal denied subject is not taken; the leaf does not send it
        on_hub = await nh.subscribe("*.x")
        await nh.subscribe("secret.y")
        await nh.subscribe("open.y")
        await settled(nh)
        await until(lambda: {"*.x", "open.y"} <= _subs(leaf), "the hub's interest known at the leaf")
        assert "secret.y" not in _subs(leaf)
        await until_received(lambda: nl.publish("open.x", b"probe"), on_hub, "leaf -> hub")
        await nl.publish("secret.x", b"secret")
        await nl.publish("open.x", b"marker")
        await nl.flush()
        got = await _until_marker(on_hub, b"marker")
        assert all(m.subject == "open.x" for m in got), [m.subject for m in got]

        # deny_imports: the leaf's interest in denied subjects is not offered, the hub does not send them
        wide = await nl.subscribe("*.z")
        narrow = await nl.subscribe("private.z")
        await nl.subscribe("open.w")
        await settled(nl)
        await until(lambda: {"*.z", "open.w"} <= _subs(hub), "the leaf's interest known at the hub")
        assert "private.z" not in _subs(hub)
        await until_received(lambda: nh.publish("open.z", b"probe"), wide, "hub -> leaf")
        await nh.publish("private.z", b"private")
        await nh.publish("open.z", b"marker")
        await nh.flush()
        got = await _until_marker(wide, b"marker")
        assert all(m.subject == "open.z" for m in got), [m.subject for m in got]
        with pytest.raises(nats.errors.TimeoutError):
            await narrow.next_msg(timeout=0.3)
    finally:
        await nh.close()
        await nl.close()


def test_hub_honours_a_leafs_deny_pub(impl: str) -> None:
    """A raw leaf whose CONNECT says `deny_pub: ["private.>"]`: the hub sends it `open.w` but not
    `private.w` (its interest `*.w` covers both), and its `LS+ private.q` is refused and closes the link."""
    port = free_port()
    hub = kit.hub(impl, port)
    hub.start()
    try:
        asyncio.run(_raw_leaf(hub, port))
    finally:
        hub.stop()


async def _raw_leaf(hub: ServerProcess, port: int) -> None:
    nh = await nats.connect(hub.url, allow_reconnect=False, connect_timeout=3)
    raw = kit.RawLeaf(port, subjects=("*.w",), name="raw", deny_pub=["private.>"])
    try:
        await until(lambda: "*.w" in _subs(hub), "the raw leaf's interest")
        await nh.publish("private.w", b"no")
        await nh.publish("open.w", b"yes")
        await nh.flush()
        msgs = await until(lambda: [x for x in raw.lines if x.startswith((b"LMSG", b"HMSG"))],
                           "a message at the raw leaf", show=lambda: raw.lines)
        assert msgs[0].split()[1] == b"open.w", msgs[0]
        raw.subscribe("private.q")
        await until(lambda: raw.eof, "the hub closed the raw leaf", show=lambda: raw.lines)
        rest = b"".join(raw.lines)
        assert b"-ERR 'Permissions Violation for Subscription to \"private.q\"'" in rest, rest
    finally:
        raw.close()
        await nh.close()


@pytest.mark.parametrize("conf, words", [
    ('leafnodes { remotes: [{ url: "nats-leaf://h:7422", deny_imports: ["a..b"] }] }',
     'subject "a..b" is not a valid subject'),
    ('leafnodes { remotes: [{ url: "nats-leaf://h:7422", deny_exports: ["c d"] }] }',
     'subject "c d" is not a valid subject'),
    ('leafnodes { port: 7422, deny_imports: ["a"] }', 'unknown field "deny_imports"'),
])
def test_bad_deny_lists_are_refused_as_nats_server_refuses_them(tmp_path, conf: str, words: str) -> None:
    ours, theirs = check_config_both(tmp_path / "server.conf", conf + "\n")
    assert ours.returncode != 0 and theirs.returncode != 0
    assert words in ours.stderr and words in theirs.stdout + theirs.stderr, (ours.stderr, theirs.stdout)


def test_good_deny_lists_pass_the_check(tmp_path) -> None:
    conf = ('leafnodes { remotes: [{ url: "nats-leaf://h:7422", deny_import: "a.>", '
            'deny_export: ["b.*", "c"] }] }\n')
    ours, theirs = check_config_both(tmp_path / "server.conf", conf)
    assert ours.returncode == 0 and theirs.returncode == 0, (ours.stderr, theirs.stderr)
