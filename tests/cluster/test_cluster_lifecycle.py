"""Clusters that change while running: a peer restarts, a config reload, route authorization.

Each test starts its own cluster (it disturbs it). Restart and authorization run against nats-server too.
"""

from __future__ import annotations

import asyncio
import signal
import time

import pytest

from tests.cluster.kit import Tally, binomial_bounds, connect, name_of, started_cluster, wait_interest
from zonebus.testing.polling import until
from zonebus.testing.processes import (
    ServerProcess,
    cluster_config,
    free_port,
    is_own_process,
    route_peers,
    start_parallel,
    stop_all,
    wait_for_mesh,
)


async def _poll(check, what: str, timeout: float = 10.0) -> None:
    """Until `check()` (run in a thread) is true; fail with `what` after `timeout` seconds."""
    await until(lambda: asyncio.to_thread(check), what, timeout=timeout, interval=0.02)


async def _restart_and_check(s: list[ServerProcess], v: int) -> None:
    """Stop server v, start it again on the same ports; interest flows both ways again."""
    others = [x for i, x in enumerate(s) if i != v]
    keeper = await connect(others[0])  # interest that exists before the restart and must reach the new server
    live = await connect(others[1])  # a queue member that must get everything once s{v}'s member is gone
    old = await connect(s[v])
    back = Tally(f"rs.back.{v}")
    gone = Tally(f"rs.gone.{v}")
    try:
        await back.member(keeper, "keeper", queue=None)
        await gone.member(live, "live")
        await old.subscribe(f"rs.gone.{v}")
        await old.subscribe(f"rs.gone.{v}", queue="q")
        await old.flush()
        for x in others:
            await wait_interest(x, f"rs.gone.{v}", "q", peers=[s[v]])

        await asyncio.to_thread(s[v].stop)
        await old.close()
        for x in others:
            await _poll(lambda x=x: name_of(s[v]) not in route_peers(x), f"{name_of(x)} to drop its route to s{v}")
            await wait_interest(x, f"rs.gone.{v}", "q", peers=[s[v]], present=False)
            await wait_interest(x, f"rs.gone.{v}", peers=[s[v]], present=False)
        # the stopped server's queue member must be forgotten, not picked (its share would be lost)
        await wait_interest(others[0], gone.barrier_subject, peers=[others[1]])
        await gone.publish(keeper, range(100))
        await gone.settle(keeper)
        gone.check_exactly_once(range(100))

        await asyncio.to_thread(s[v].start)
        await asyncio.to_thread(wait_for_mesh, s, time.monotonic() + 15)

        new = await connect(s[v])
        pubs = [await connect(x) for x in others]
        after = Tally(f"rs.after.{v}")
        try:
            await after.member(new, "plain", queue=None)
            await after.member(new, "queue")
            for x in others:
                await wait_interest(x, after.subject, "q", peers=[s[v]])
                await wait_interest(x, after.subject, peers=[s[v]])
                await wait_interest(x, after.barrier_subject, peers=[s[v]])
            for k, p in enumerate(pubs):
                await after.publish(p, range(k * 50, (k + 1) * 50))
                await after.settle(p)
            n = 50 * len(pubs)
            after.each_got_all(range(n), {"plain"})
            after.check_exactly_once(range(n), {"queue"})

            await wait_interest(s[v], back.subject, peers=[others[0]])
            await wait_interest(s[v], back.barrier_subject, peers=[others[0]])
            await back.publish(new, range(20))
            await back.settle(new)
            back.each_got_all(range(20), {"keeper"})
        finally:
            for nc in [new, *pubs]:
                await nc.close()
    finally:
        await keeper.close()
        await live.close()
        if not old.is_closed:
            await old.close()


@pytest.mark.timeout(90)
async def test_interest_after_peer_restart(impl):
    """Restart a gossiped peer (s2), then the seed itself (s0); each time its subscribers' interest reaches the
    others again, theirs reaches it, and messages flow both ways."""
    s = await asyncio.to_thread(started_cluster, impl, [["az:az1"], ["az:az1"], ["az:az2"]])
    try:
        await _restart_and_check(s, 2)
        await _restart_and_check(s, 0)
    finally:
        await asyncio.to_thread(stop_all, s)


def _rewrite(server: ServerProcess, config: str) -> None:
    server.config = config
    assert server.workdir is not None
    (server.workdir / "server.conf").write_text(config)


def _route_ids(servers: list[ServerProcess]) -> dict[str, set[tuple[str, int, str]]]:
    return {name_of(x): {(r["remote_id"], r["rid"], r["start"]) for r in x.http_get("/routez")["routes"]}
            for x in servers}


async def _reload(server: ServerProcess, config: str, prefer: bool, tags: list[str]) -> None:
    _rewrite(server, config)
    server.signal(signal.SIGHUP)

    def applied() -> bool:
        varz = server.http_get("/varz")
        return varz["cluster"].get("prefer_matching_tags") is prefer and varz.get("tags") == tags

    await _poll(applied, f"reload to prefer_matching_tags={prefer} tags={tags}")


@pytest.mark.timeout(60)
async def test_sighup_turns_option_on_without_dropping_routes():
    """s0 (az1) publishes; members on s1 (az1) and s2 (az2). Reloading s0's config with the option turns
    cross-zone delivery off, a tag change flips the preferred zone, and no route is re-established."""
    s = await asyncio.to_thread(started_cluster, "zonebus", [["az:az1"], ["az:az1"], ["az:az2"]])
    conns = {1: await connect(s[1]), 2: await connect(s[2])}
    pub = await connect(s[0])
    try:
        tally = Tally("reload")
        await tally.member(conns[1], "az1")
        await tally.member(conns[2], "az2")
        await wait_interest(s[0], tally.subject, "q", peers=[s[1], s[2]])
        await wait_interest(s[0], tally.barrier_subject, peers=[s[1], s[2]])
        routes_before = _route_ids(s)
        base = s[0].config
        assert "prefer_matching_tags" not in base

        n = 400
        lo, hi = binomial_bounds(n, 0.5)  # [150, 250]
        await tally.publish(pub, range(0, n))
        await tally.settle(pub)
        off = tally.counts(range(0, n))
        assert lo <= off["az1"] <= hi, f"default off: both zones share, got {off}"

        on = base.replace("cluster {\n", "cluster {\n  prefer_matching_tags: true\n")
        await _reload(s[0], on, True, ["az:az1"])
        await tally.publish(pub, range(n, n + 200))
        await tally.settle(pub)
        assert tally.counts(range(n, n + 200)) == {"az1": 200}

        await _reload(s[0], on.replace('["az:az1"]', '["az:az2"]'), True, ["az:az2"])
        await tally.publish(pub, range(n + 200, n + 400))
        await tally.settle(pub)
        assert tally.counts(range(n + 200, n + 400)) == {"az2": 200}, "server_tags reload flips the zone"

        await _reload(s[0], base, False, ["az:az1"])
        await tally.publish(pub, range(n + 400, 2 * n + 400))
        await tally.settle(pub)
        back = tally.counts(range(n + 400, 2 * n + 400))
        assert lo <= back["az1"] <= hi, f"option off again: both zones share, got {back}"

        tally.check_exactly_once(range(2 * n + 400))
        assert _route_ids(s) == routes_before, "a reload dropped or re-established a route"
    finally:
        for nc in [*conns.values(), pub]:
            await nc.close()
        await asyncio.to_thread(stop_all, s)


AUTH = "authorization { user: ruser, password: rpass }"


def _auth_cluster(impl: str, dialers: dict[str, tuple[str, str]]) -> list[ServerProcess]:
    """Seed A requires route credentials; each dialler name -> (URL userinfo, cluster block extra).
    Ports are picked before they are bound: if another process took one meanwhile, start again on new ones."""
    for attempt in range(3):
        ports = [free_port() for _ in range(len(dialers) + 1)]
        confs = [cluster_config("A", ports[0], cluster_extra=AUTH)]
        for k, (name, (userinfo, extra)) in enumerate(dialers.items(), start=1):
            confs.append(cluster_config(name, ports[k], cluster_extra=extra,
                                        route_urls=[f"nats-route://{userinfo}127.0.0.1:{ports[0]}"]))
        servers = [ServerProcess(impl=impl, config=c, http_port=free_port()) for c in confs]
        try:
            start_parallel(servers)
        except RuntimeError:
            if attempt == 2 or not any("in use" in x.log() for x in servers):
                raise
            continue
        if all(is_own_process(x, n) for x, n in zip(servers, ["A", *dialers], strict=True)):
            return servers
        stop_all(servers)
    raise RuntimeError("could not start the servers on free ports")


@pytest.mark.timeout(60)
async def test_route_authorization(impl):
    """Every server has `cluster { authorization { user, password } }`: B and F dial the seed A with the right
    credentials in the route URL (as nats-server requires) and form a full mesh (B-F via gossip, using the
    block's credentials); C (wrong password) and G (no credentials) are refused."""
    s = await asyncio.to_thread(_auth_cluster, impl, {
        "B": ("ruser:rpass@", AUTH), "F": ("ruser:rpass@", AUTH), "C": ("ruser:wrong@", ""), "G": ("", ""),
    })
    a, b, f, c, g = s
    sub = await connect(f)
    pub = await connect(b)
    try:
        await asyncio.to_thread(wait_for_mesh, [a, b, f], time.monotonic() + 10)
        for refused in (c, g):
            await _poll(lambda r=refused: "Authorization Violation" in r.log(), f"{name_of(refused)} to be refused")
        for _ in range(10):  # while C and G keep retrying, A never lists them
            assert route_peers(a) == {"B", "F"}
            assert route_peers(b) == {"A", "F"} and route_peers(f) == {"A", "B"}
            await asyncio.sleep(0.02)

        tally = Tally("auth")
        await tally.member(sub, "F", queue=None)
        await wait_interest(b, tally.subject, peers=[f])
        await wait_interest(b, tally.barrier_subject, peers=[f])
        await tally.publish(pub, range(20))
        await tally.settle(pub)
        tally.each_got_all(range(20), {"F"})
    finally:
        for nc in (sub, pub):
            await nc.close()
        await asyncio.to_thread(stop_all, s)


@pytest.mark.timeout(30)
async def test_route_url_credentials_are_used(impl):
    """D has no authorization block of its own and the right credentials in its route URL: nats-server sends
    the URL's credentials and the route forms."""
    s = await asyncio.to_thread(_auth_cluster, impl, {"D": ("ruser:rpass@", "")})
    try:
        a, d = s
        await _poll(lambda: route_peers(a) == {"D"} and route_peers(d) == {"A"} or "Violation" in d.log(),
                    "a route between A and D (or a refusal)")
        assert "Authorization Violation" not in d.log(), "A refused D's route"
        assert route_peers(a) == {"D"} and route_peers(d) == {"A"}
    finally:
        await asyncio.to_thread(stop_all, s)
