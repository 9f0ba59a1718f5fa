"""Leaf node interest isolation (nats-server 2.12's), differential: the same scenario on zonebus and
nats-server, in every mix of implementations.

An isolated leaf connection is not told the interest that came over the server's other leaf connections (the
flag belongs to the connection that would be told): with `leafnodes { isolate_leafnode_interest }` (`isolate`)
on the hub, a leaf's publish does not reach another leaf's subscriber, while the hub's clients still reach
both leafs and get what they publish; a remote's own `isolate_leafnode_interest` (`isolate`) isolates that
remote's connection (its hub is not told this server's other leafs' interest); a remote's `request_isolation`
asks its hub (CONNECT `isolate`) to isolate the hub's side of it. Isolation is of interest only: a message a
leaf sends for the hub's own subscriber still reaches another leaf's subscriber of the same subject at the hub.
Interest that comes over a route still goes to every leaf. Absence is shown by order: a marker published after
the message that must not arrive, on a path that works, arrives alone. `/leafz` shows `is_isolated`.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

import nats
import pytest

from tests.leaf import kit
from zonebus.localservers import free_port
from zonebus.testing.polling import until, wait_until
from zonebus.testing.processes import ServerProcess, check_config_both, cluster_config, start_parallel, stop_all
from zonebus.testing.tally import settled, until_received

pytestmark = pytest.mark.timeout(120)

PAIRS = [("zonebus", "zonebus"), ("nats", "zonebus"), ("zonebus", "nats"), ("nats", "nats")]
OTHER = {"zonebus": "nats", "nats": "zonebus"}


# -- /leafz -------------------------------------------------------------------------------------------------
def _links(server: ServerProcess) -> dict[str, dict]:
    """The server's leaf connections by remote server name."""
    return {link["name"]: link for link in server.http_get("/leafz?subs=1")["leafs"]}


def _told(server: ServerProcess, name: str) -> list[str]:
    """The subjects the peer `name` declared to `server` (its LS+), loop-detection subjects included."""
    link = _links(server).get(name)
    return list(link.get("subscriptions_list") or []) if link else []


def _isolated(server: ServerProcess) -> dict[str, bool]:
    return {name: bool(link.get("is_isolated")) for name, link in _links(server).items()}


def _connected(server: ServerProcess, names: set[str]) -> Callable[[], bool]:
    return lambda: set(_links(server)) == names


# -- the east-west scenario ------------------------------------------------------------------------------------
async def _until_marker(sub, marker: bytes) -> list:
    """Every message on `sub` up to the one carrying `marker` (which is last)."""
    got = []
    while True:
        msg = await sub.next_msg(timeout=10)
        got.append(msg)
        if msg.data == marker:
            return got


def _from(msgs: list, origin: bytes) -> list[str]:
    return [m.subject for m in msgs if m.data.startswith(origin)]


async def _one_then_marker(nc, subject: str, origin: bytes, marker_sub, watched, told: bool) -> None:  # noqa: ANN001
    """`nc` publishes `subject`, then the marker `<its first token>.mark` (payloads `<origin>one`,
    `<origin>mark`): `marker_sub` gets the marker; `watched` gets `subject` exactly when `told`, then the marker."""
    mark = subject.split(".")[0] + ".mark"
    await nc.publish(subject, origin + b"one")
    await nc.publish(mark, origin + b"mark")
    await nc.flush()
    assert (await marker_sub.next_msg(timeout=10)).data == origin + b"mark"
    assert _from(await _until_marker(watched, origin + b"mark"), origin) == [subject] * told + [mark]


async def _east_west(hub: ServerProcess, a: ServerProcess, b: ServerProcess, a_told_b: bool,
                     b_told_a: bool) -> None:
    """Leafs `a` and `b` of `hub`. `a_told_b`: the hub tells `a` the interest of `b` (and so `a` sends `b`'s
    subscriber what its clients publish); `b_told_a` likewise."""
    nh = await nats.connect(hub.url, allow_reconnect=False, connect_timeout=3)
    na = await nats.connect(a.url, allow_reconnect=False, connect_timeout=3)
    nb = await nats.connect(b.url, allow_reconnect=False, connect_timeout=3)
    try:
        on_a = await na.subscribe("ew.>")
        on_b = await nb.subscribe("ew.>")
        await settled(na)
        await settled(nb)
        await until(lambda: "ew.>" in _told(hub, "a") and "ew.>" in _told(hub, "b"), "both leafs' interest at the hub")
        # the hub's own subscriber, after the leafs' interest reached the hub: once a leaf knows it, it has been
        # told (or not) the other leaf's interest, which the hub had before
        on_hub = await nh.subscribe("ew.mark")
        await settled(nh)
        await until(lambda: "ew.mark" in _told(a, "hub") and "ew.mark" in _told(b, "hub"),
                    "the hub's interest at both leafs")
        assert ("ew.>" in _told(a, "hub")) == a_told_b, _told(a, "hub")
        assert ("ew.>" in _told(b, "hub")) == b_told_a, _told(b, "hub")
        # loop detection subjects: the hub's own, and the other leaf's only when told it
        lds = {name: {s for s in _told(hub, name) if s.startswith("$LDS.")} for name in ("a", "b")}
        assert all(len(own) == 1 for own in lds.values()), lds
        for leaf, other, told in ((a, "b", a_told_b), (b, "a", b_told_a)):
            seen = [s for s in _told(leaf, "hub") if s.startswith("$LDS.")]
            assert bool(lds[other] & set(seen)) == told and len(seen) >= 1, (lds, seen)

        # north-south: the hub's clients reach both leafs, and get what each publishes
        await until_received(lambda: nh.publish("ew.h", b"h:probe"), on_a, "hub -> leaf a")
        await until_received(lambda: nh.publish("ew.h", b"h:probe"), on_b, "hub -> leaf b")
        await na.publish("ew.mark", b"a:mark")
        await nb.publish("ew.mark", b"b:mark")
        await na.flush()
        await nb.flush()
        got = {(await on_hub.next_msg(timeout=10)).data for _ in range(2)}
        assert got == {b"a:mark", b"b:mark"}, got

        # east-west: b's publish reaches a only when b was told a's interest; the marker (for the hub's
        # subscriber, so b sends it either way) reaches a over the hub, behind what came before it
        await nb.publish("ew.b", b"b:one")
        await nb.publish("ew.mark", b"b:mark2")
        await nb.flush()
        assert _from(await _until_marker(on_a, b"b:mark2"), b"b:") == ["ew.mark"] + ["ew.b"] * b_told_a + ["ew.mark"]
        await na.publish("ew.a", b"a:one")
        await na.publish("ew.mark", b"a:mark2")
        await na.flush()
        assert _from(await _until_marker(on_b, b"a:mark2"), b"a:") == ["ew.mark"] + ["ew.a"] * a_told_b + ["ew.mark"]
    finally:
        await nh.close()
        await na.close()
        await nb.close()


def _run(hub: ServerProcess, a: ServerProcess, b: ServerProcess, a_told_b: bool, b_told_a: bool,
         hub_isolated: dict[str, bool]) -> None:
    start_parallel([hub, a, b])
    try:
        wait_until(_connected(hub, {"a", "b"}), "both leafs connected", show=lambda: _links(hub))
        for label, leaf in (("a", a), ("b", b)):  # (the hub lists a leaf before the leaf lists it: nats-server too)
            wait_until(_connected(leaf, {"hub"}), f"leaf {label} lists the hub", show=lambda leaf=leaf: _links(leaf))
        assert _isolated(hub) == hub_isolated
        assert _isolated(a) == {"hub": False} and _isolated(b) == {"hub": False}  # (not the leafs' side)
        asyncio.run(_east_west(hub, a, b, a_told_b, b_told_a))
    finally:
        stop_all([a, b, hub])


@pytest.mark.parametrize("isolated", [True, False], ids=["isolated", "open"])
@pytest.mark.parametrize("hub_impl, leaf_impl", PAIRS)
def test_hub_isolates_its_leafs(hub_impl: str, leaf_impl: str, isolated: bool) -> None:
    """`leafnodes { isolate_leafnode_interest }` on the hub: no leaf is told another's interest."""
    port = free_port()
    keys = f"isolate_leafnode_interest: {'true' if isolated else 'false'}"
    hub = kit.hub(hub_impl, port, keys)
    a, b = kit.spoke(leaf_impl, port, name="a"), kit.spoke(leaf_impl, port, name="b")
    _run(hub, a, b, not isolated, not isolated, {"a": isolated, "b": isolated})


@pytest.mark.parametrize("hub_impl, leaf_impl", PAIRS)
def test_request_isolation_isolates_the_hubs_side(hub_impl: str, leaf_impl: str) -> None:
    """Leaf `a`'s remote has `request_isolation`, `b`'s not: the hub does not tell `a` what `b` wants (`b`'s
    clients' messages do not reach `a`), but tells `b` what `a` wants."""
    port = free_port()
    hub = kit.hub(hub_impl, port)
    a = kit.spoke(leaf_impl, port, "request_isolation: true", name="a")
    b = kit.spoke(leaf_impl, port, "request_isolation: false", name="b")
    _run(hub, a, b, False, True, {"a": True, "b": False})


def test_hub_alias_isolate(impl: str) -> None:
    """`isolate` is the block's other spelling."""
    port = free_port()
    hub = kit.hub(impl, port, "isolate: true")
    a, b = kit.spoke(OTHER[impl], port, name="a"), kit.spoke(OTHER[impl], port, name="b")
    _run(hub, a, b, False, False, {"a": True, "b": True})


# -- a remote's own isolation, and a middle server's ----------------------------------------------------------
@pytest.mark.parametrize("remote_key, block_key", [
    ("isolate_leafnode_interest: true", ""), ("isolate: true", ""), ("", ""), ("", "isolate: true"),
], ids=["remote-isolate_leafnode_interest", "remote-isolate", "open", "block"])
def test_middle_server(impl: str, remote_key: str, block_key: str) -> None:
    """A middle server (`impl`; the others are the other implementation) with a leaf of its own and a remote
    to a top hub. The remote's own isolation isolates the link to the top only: the top is not told the leaf's
    interest (its clients' messages do not reach the leaf's subscriber; the middle's own clients' interest it
    still is), the leaf is still told the top's. The block's isolates both links, the dialled one too."""
    top_port, mid_port = free_port(), free_port()
    top = kit.hub(OTHER[impl], top_port, name="top")
    remote = ", ".join(["url: " + json.dumps(f"nats-leaf://127.0.0.1:{top_port}")] + [remote_key] * bool(remote_key))
    keys = ", ".join([block_key] * bool(block_key) + [f"remotes: [{{ {remote} }}]"])
    middle = kit.hub(impl, mid_port, keys, name="middle")
    leaf = kit.spoke(OTHER[impl], mid_port, name="leaf")
    top_isolated, leaf_isolated = bool(remote_key or block_key), bool(block_key)
    start_parallel([top, middle, leaf])
    try:
        wait_until(_connected(middle, {"top", "leaf"}), "the middle's links", show=lambda: _links(middle))
        assert _isolated(middle) == {"top": top_isolated, "leaf": leaf_isolated}
        assert _isolated(top) == {"middle": False} and _isolated(leaf) == {"middle": False}
        asyncio.run(_through_the_middle(top, middle, leaf, not top_isolated, not leaf_isolated))
    finally:
        stop_all([leaf, middle, top])


async def _through_the_middle(top: ServerProcess, middle: ServerProcess, leaf: ServerProcess, top_told: bool,
                              leaf_told: bool) -> None:
    """`top_told`: the middle tells the top its leaf's interest; `leaf_told`: it tells the leaf the top's."""
    nt = await nats.connect(top.url, allow_reconnect=False, connect_timeout=3)
    nm = await nats.connect(middle.url, allow_reconnect=False, connect_timeout=3)
    nl = await nats.connect(leaf.url, allow_reconnect=False, connect_timeout=3)
    try:
        on_leaf = await nl.subscribe("up.>")
        on_top = await nt.subscribe("down.>")
        await settled(nl)
        await settled(nt)
        await until(lambda: "up.>" in _told(middle, "leaf") and "down.>" in _told(middle, "top"),
                    "the leaf's and the top's interest at the middle")
        # the middle's own clients' interest, after theirs: told to both, behind what each link is told of it
        on_mid = await nm.subscribe("*.mark")
        await settled(nm)
        await until(lambda: "*.mark" in _told(top, "middle") and "*.mark" in _told(leaf, "middle"),
                    "the middle's client's interest at the top and at the leaf")
        assert ("up.>" in _told(top, "middle")) == top_told, _told(top, "middle")
        assert ("down.>" in _told(leaf, "middle")) == leaf_told, _told(leaf, "middle")
        # the top's publishes: the middle's subscriber gets them, the leaf's only for what the top knows
        await _one_then_marker(nt, "up.x", b"t:", on_mid, on_leaf, top_told)
        # and the other way
        await _one_then_marker(nl, "down.x", b"l:", on_mid, on_top, leaf_told)
    finally:
        await nt.close()
        await nm.close()
        await nl.close()


# -- interest over a route --------------------------------------------------------------------------------------
def test_leaf_interest_over_a_route(impl: str) -> None:
    """An isolated hub cluster of two (h1, h2), leaf `a` on h1 and `b` on h2. zonebus: what comes over a route is
    a route's interest, told to every leaf, so `b`'s clients reach `a`'s subscriber. nats-server 2.15 tells
    its route peers which interest came from a leaf (`LS+` with an origin, route capability `ln`) and isolates
    that too: `b` is not told `a`'s interest (a difference: zonebus's routes carry no such origin)."""
    pa, pb, r1, r2 = free_port(), free_port(), free_port(), free_port()
    h1 = ServerProcess(impl, http_port=free_port(), config=cluster_config(
        "h1", r1, [r2], cluster="hub", extra=f'leafnodes {{ listen: "127.0.0.1:{pa}", isolate: true }}'))
    h2 = ServerProcess(impl, http_port=free_port(), config=cluster_config(
        "h2", r2, [r1], cluster="hub", extra=f'leafnodes {{ listen: "127.0.0.1:{pb}", isolate: true }}'))
    a, b = kit.spoke(impl, pa, name="a"), kit.spoke(impl, pb, name="b")
    start_parallel([h1, h2, a, b])
    try:
        wait_until(lambda: _isolated(h1) == {"a": True} and _isolated(h2) == {"b": True}, "the leafs connected")
        asyncio.run(_across(h1, a, b, told=impl == "zonebus"))
    finally:
        stop_all([a, b, h1, h2])


async def _across(h1: ServerProcess, a: ServerProcess, b: ServerProcess, told: bool) -> None:
    n1 = await nats.connect(h1.url, allow_reconnect=False, connect_timeout=3)
    na = await nats.connect(a.url, allow_reconnect=False, connect_timeout=3)
    nb = await nats.connect(b.url, allow_reconnect=False, connect_timeout=3)
    try:
        on_a = await na.subscribe("across.>")
        await settled(na)
        await until(lambda: "across.>" in _told(h1, "a"), "a's interest at h1")
        # h1's own client's interest, after a's: over the same route, then to b, behind a's (when told)
        on_h1 = await n1.subscribe("across.mark")
        await settled(n1)
        await until(lambda: "across.mark" in _told(b, "h2"), "h1's client's interest at b", timeout=30)
        assert ("across.>" in _told(b, "h2")) == told, _told(b, "h2")
        await _one_then_marker(nb, "across.b", b"b:", on_h1, on_a, told)
    finally:
        await n1.close()
        await na.close()
        await nb.close()


# -- the hub's side, raw -------------------------------------------------------------------------------------
def test_hub_honours_a_leafs_isolate(impl: str) -> None:
    """Raw leafs: `x` asks for isolation in its CONNECT, `y` does not. The hub tells `y` what `x` wants, and
    `x` nothing of `y` (not even `y`'s `$LDS.` subject), but both its own client's interest."""
    port = free_port()
    hub = kit.hub(impl, port)
    hub.start()
    try:
        asyncio.run(_raw_leafs(hub, port))
    finally:
        hub.stop()


async def _raw_leafs(hub: ServerProcess, port: int) -> None:
    x, y = kit.RawLeaf(port, name="x", isolate=True), kit.RawLeaf(port, name="y")
    nh = await nats.connect(hub.url, allow_reconnect=False, connect_timeout=3)
    try:
        x.subscribe("$LDS.rawx")
        x.subscribe("x.sub")
        y.subscribe("$LDS.rawy")
        y.subscribe("y.sub")
        await until(lambda: "x.sub" in _told(hub, "x") and "y.sub" in _told(hub, "y"), "the raw leafs' interest")
        assert _isolated(hub) == {"x": True, "y": False}
        await nh.subscribe("h.sub")  # (after both leafs' interest: told behind what each leaf is told of it)
        await settled(nh)
        await until(lambda: "h.sub" in x.told() and "h.sub" in y.told(), "the hub's client's interest at x and y")
        told_x, told_y = x.told(), y.told()
        assert "y.sub" not in told_x and "$LDS.rawy" not in told_x, told_x
        assert "x.sub" in told_y and "$LDS.rawx" in told_y, told_y
        assert sum(s.startswith("$LDS.") for s in told_x) == 1, told_x  # (the hub's own)
    finally:
        await nh.close()
        x.close()
        y.close()


# -- config ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("conf", [
    "leafnodes { port: 7422, isolate_leafnode_interest: true }",
    "leafnodes { port: 7422, isolate: false }",
    'leafnodes { remotes: [{ url: "nats-leaf://h:7422", isolate_leafnode_interest: true, request_isolation: true }] }',
    'leafnodes { remotes: [{ url: "nats-leaf://h:7422", isolate: true }] }',
])
def test_isolation_keys_pass_the_check(tmp_path, conf: str) -> None:
    ours, theirs = check_config_both(tmp_path / "server.conf", conf + "\n")
    assert ours.returncode == 0 and theirs.returncode == 0, (ours.stderr, theirs.stdout + theirs.stderr)


@pytest.mark.parametrize("conf", [
    'leafnodes { port: 7422, isolate: "yes" }',
    'leafnodes { remotes: [{ url: "nats-leaf://h:7422", request_isolation: 1 }] }',
])
def test_isolation_keys_are_booleans(tmp_path, conf: str) -> None:
    """nats-server refuses another kind with its Go type error (`interface {} is string, not bool`)."""
    ours, theirs = check_config_both(tmp_path / "server.conf", conf + "\n")
    assert ours.returncode != 0 and theirs.returncode != 0, (ours.stderr, theirs.stdout + theirs.stderr)
    assert "expected boolean" in ours.stderr, ours.stderr
