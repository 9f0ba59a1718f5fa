"""Durable queue group servers for the tests: a lone server, or a 3-zone cluster with clustered JetStream on
one shared file store (the group's log lives there, so a new primary continues after a kill -9). The tests poll
with `zonebus.testing.polling` (`wait_until`, and `until` in async tests)."""

from __future__ import annotations

from pathlib import Path

import nats

from zonebus.testing.processes import ServerProcess, cluster_config, free_port, start_parallel

GROUP = 'workers: {{ subjects: ["orders.>"], ack: {ack}, ack_wait: "{ack_wait}", max_deliver: 5 }}'


def groups_block(ack: str = "none", ack_wait: str = "1s", extra: str = "") -> str:
    return "queue_groups {\n  " + GROUP.format(ack=ack, ack_wait=ack_wait) + ("\n  " + extra if extra else "") \
        + "\n}\n"


def lone_server(tmp: Path, ack: str = "none", ack_wait: str = "1s") -> ServerProcess:
    conf = f'jetstream {{ store_dir: "{tmp}/store" }}\n' + groups_block(ack, ack_wait)
    return ServerProcess("zonebus", conf, http_port=free_port()).start()


def cluster(tmp: Path, zones: list[str], ack: str = "none", ack_wait: str = "1s",
            failover: str = "1s", shared: bool = True) -> list[ServerProcess]:
    """Without `shared`, no shared store: each server keeps the logs of the groups it leads on its own disk."""
    route_ports = [free_port() for _ in zones]
    servers = []
    for i, zone in enumerate(zones):
        store = f', shared_store: "file://{tmp}/shared"' if shared else ""
        js = (f'jetstream {{ store_dir: "{tmp}/local{i}"{store}, '
              f'failover_timeout: "{failover}" }}\n' + groups_block(ack, ack_wait))
        conf = cluster_config(f"s{i}", route_ports[i], route_ports, tags=[f"az:{zone}"], extra=js)
        servers.append(ServerProcess("zonebus", conf, http_port=free_port()))
    return start_parallel(servers)


def group_info(server: ServerProcess, name: str = "workers") -> dict:
    page = server.http_get("/queuez")
    return next(g for g in page["queue_groups"] if g["name"] == name)


def primary_of(servers: list[ServerProcess], name: str = "workers") -> ServerProcess | None:
    """The group's primary once it is settled: every live server names the same one and that one runs the
    group (right after start the first claim may still be replaced through the meta group)."""
    live = [s for s in servers if s.proc is not None and s.proc.poll() is None]
    infos = {s.info["server_name"]: group_info(s, name) for s in live}
    named = {i["primary"] for i in infos.values()}
    if len(named) != 1:
        return None
    for s in live:
        if infos[s.info["server_name"]]["is_primary"] and s.info["server_name"] in named:
            return s
    return None


def members_seen(server: ServerProcess, expected: int, name: str = "workers") -> bool:
    return sum(m["members"] for m in group_info(server, name)["members"]) >= expected


async def acking_members(servers: list[ServerProcess], got: list[bytes], conns: list) -> None:
    """A member of `workers` on `orders.>` on every server, acking each message after noting its data in
    `got`; the connections go into `conns` (closed by the caller)."""
    for s in servers:
        nc = await nats.connect(s.url)
        conns.append(nc)

        async def on_msg(m: nats.aio.msg.Msg) -> None:
            got.append(m.data)
            await m.ack()

        await nc.subscribe("orders.>", "workers", cb=on_msg)
        await nc.flush()
