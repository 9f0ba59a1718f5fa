"""A remote's `hub: true`, differential: the server that dials takes the hub role on that link (its CONNECT says
`is_hub: true`; the accepting side becomes the spoke), as nats-server. The accepting server B1 is one of a cluster
of two (B1, B2); the dialling server A has a client each side of the test:
- `/leafz`: A's link shows `is_spoke: false` with `hub: true` (true without), B1's the opposite;
- across the link itself, messages flow both ways in either role (A <-> B1);
- beyond it the spoke's one-hop rules hold on the side that is the spoke: without `hub`, B1 (the hub) tells A
  its route's interest and passes A's interest on to B2, so A's publisher reaches B2's subscriber and B2's
  publisher A's subscriber; with `hub: true`, B1 is the spoke, which tells its hub (A) only its own clients'
  interest and keeps what its hub told it from its routes: neither message crosses.
Every pair of implementations, over TCP, and one over WebSocket (the role does not depend on the transport).
"""

from __future__ import annotations

import asyncio

import nats
import pytest

from zonebus.localservers import free_port
from zonebus.testing.polling import wait_until
from zonebus.testing.processes import ServerProcess, cluster_config, start_parallel, stop_all, wait_for_mesh
from zonebus.testing.tally import settled, until_received

pytestmark = pytest.mark.timeout(60)

QUIET = 1.0  # seconds a message that must not arrive is waited for (after the positive ones arrived)


def _servers(a_impl: str, b_impl: str, hub: bool, websocket: bool) -> list[ServerProcess]:
    leaf_port, ws_port, routes = free_port(), free_port(), [free_port(), free_port()]
    ws = f'websocket {{ listen: "127.0.0.1:{ws_port}", no_tls: true }}\n' if websocket else ""
    b1 = ServerProcess(b_impl, http_port=free_port(), config=cluster_config(
        "b1", routes[0], [routes[1]], extra=f'leafnodes {{ listen: "127.0.0.1:{leaf_port}" }}\n{ws}'))
    b2 = ServerProcess(b_impl, http_port=free_port(), config=cluster_config("b2", routes[1], [routes[0]]))
    url = f"ws://127.0.0.1:{ws_port}" if websocket else f"nats-leaf://127.0.0.1:{leaf_port}"
    a = ServerProcess(a_impl, http_port=free_port(), config=(
        f'server_name: a\nleafnodes {{ remotes: [{{ url: "{url}", hub: {str(hub).lower()} }}] }}\n'))
    return start_parallel([b1, b2, a])


async def _flows(a: ServerProcess, b1: ServerProcess, b2: ServerProcess) -> dict[str, bool]:
    """Which of A -> B2 and B2 -> A deliver, once A <-> B1 does both ways."""
    na, n1, n2 = [await nats.connect(s.url, allow_reconnect=False, connect_timeout=3) for s in (a, b1, b2)]
    try:
        on_a, on_b1, on_b2 = await na.subscribe("to.a"), await n1.subscribe("to.b1"), await n2.subscribe("to.b2")
        for nc in (na, n1, n2):
            await settled(nc)
        await until_received(lambda: n1.publish("to.a", b"1"), on_a, "B1 -> A")
        await until_received(lambda: na.publish("to.b1", b"2"), on_b1, "A -> B1")
        await until_received(lambda: n2.publish("to.b1", b"3"), on_b1, "B2 -> B1 (the route)")
        await asyncio.sleep(QUIET / 2)  # (interest that may still be on its way over the route)
        await na.publish("to.b2", b"4")
        await n2.publish("to.a", b"5")
        await na.flush()
        await n2.flush()
        out = {}
        for name, sub in (("a_to_b2", on_b2), ("b2_to_a", on_a)):
            try:
                while (await sub.next_msg(timeout=QUIET)).data == b"1":
                    pass  # (B1 -> A's repeats)
                out[name] = True
            except nats.errors.TimeoutError:
                out[name] = False
        return out
    finally:
        for nc in (na, n1, n2):
            await nc.close()


def _is_spoke(server: ServerProcess) -> bool:
    return wait_until(lambda: (leafs := server.http_get("/leafz")["leafs"]) and leafs[0], server.impl)["is_spoke"]


@pytest.mark.parametrize("a_impl, b_impl, websocket", [
    ("nats", "nats", False), ("zonebus", "zonebus", False), ("zonebus", "nats", False), ("nats", "zonebus", False),
    ("zonebus", "zonebus", True),
])
@pytest.mark.parametrize("hub", [False, True])
def test_hub_role(a_impl: str, b_impl: str, websocket: bool, hub: bool) -> None:
    b1, b2, a = servers = _servers(a_impl, b_impl, hub, websocket)
    try:
        wait_for_mesh([b1, b2])
        assert (_is_spoke(a), _is_spoke(b1)) == (not hub, hub)
        flows = asyncio.run(_flows(a, b1, b2))
        assert flows == {"a_to_b2": not hub, "b2_to_a": not hub}, flows
    finally:
        stop_all(servers)
