"""A cluster with one server per zone (or `per_zone` servers) and every route through a byte-counting proxy, for
the benchmarks and tests that compare nats-server and zonebus across zones (`bench/zone_router.py`,
`bench/whole_bill.py`, `bench/crosszone_mix.py`, `tests/cluster/test_zone_relay.py`).

`ZoneCluster(label, impl, jetstream)` starts servers s1..sN tagged `az:z1..zN` (`jetstream(i, tmp)` gives
server i's `jetstream {}` block), each route through a `zonebus.testing.byteproxy.ProxyProcess`, so that
`cross_zone()` is every byte that went between servers of different zones (any protocol, heartbeats
included); with `per_zone=2` servers s1, s2 are in z1, s3, s4 in z2 and so on, `impls` gives each server's
implementation (a mixed cluster), and `bytes_into(zone)` counts what entered a zone's servers from others.
For nats-server the gossiped route URLs point at proxies too (`advertise`), so that no route bypasses them.
`server_env(i)` adds environment variables of server i's own (`zonebus.testing.clockshift`). `prefix`, `cluster`,
`proxy` and `js` let several of them form a supercluster (`zonebus.testing.zonesuper`):
server names (`a1`..), the cluster name, a proxy shared with the others (then `cross_zone()` counts only this
cluster's routes), and nats-server without `-js`.
`stream_led_in(...)` creates a stream and moves its leader to a given server (stepdowns, for replicated
nats-server streams); `wait_router_mapping()` waits until every zonebus server's zone router sees all zones.
"""

from __future__ import annotations

import asyncio
import re
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import nats

from zonebus.testing.byteproxy import ProxyProcess
from zonebus.testing.jsapi import api, create_stream_retrying
from zonebus.testing.polling import wait_until
from zonebus.testing.processes import ServerProcess, cluster_config, free_port, start_parallel


class ZoneCluster:
    def __init__(self, label: str, impl: str, jetstream: Callable[[int, Path], str], zones: int = 3,
                 cluster_extra: str = "", env: dict[str, str] | None = None, per_zone: int = 1,
                 impls: list[str] | None = None, prefix: str = "s", cluster: str = "bench",
                 proxy: ProxyProcess | None = None, js: bool = True,
                 server_env: Callable[[int], dict[str, str]] | None = None) -> None:
        self.label, self.impl, self.jetstream, self.zones = label, impl, jetstream, zones
        self.cluster_extra, self.env, self.per_zone = cluster_extra, env, per_zone
        self.server_env = server_env  # server i -> environment of its own, over `env` (a clock shift)
        self.impls = impls or [impl] * (zones * per_zone)
        self.servers: list[ServerProcess] = []
        self.prefix, self.cluster, self.js = prefix, cluster, js
        self.proxy: ProxyProcess | None = proxy
        self.own_proxy = proxy is None  # (a proxy given by the caller is the caller's to stop)
        self.gossip_ports: dict[int, str] = {}  # a nats-server's advertised route port (a proxy) -> that server
        self._gossip_base: dict[tuple[int, int], tuple[int, int]] = {}

    @property
    def names(self) -> list[str]:
        return [f"{self.prefix}{i + 1}" for i in range(self.zones * self.per_zone)]

    def zone_of(self, name: str) -> str:
        """`z<k>` of server `name` (s1..); "" for the proxy's gossip side."""
        return f"z{self.names.index(name) // self.per_zone + 1}" if name in self.names else ""

    def start(self, tmp: Path, timeout: float = 60) -> None:
        if self.proxy is None:
            self.proxy = ProxyProcess()
        ports = [free_port() for _ in self.names]
        for i, name in enumerate(self.names):
            urls = [f"nats-route://127.0.0.1:{self.proxy.add(name, other, ports[j])}"
                    for j, other in enumerate(self.names) if j != i]
            impl = self.impls[i]
            extra = "no_advertise: true"
            if self.cluster_extra and (impl != "nats" or "zone_relay" not in self.cluster_extra):
                extra += f"\n  {self.cluster_extra}"
            if impl == "nats":
                gossip_port = self.proxy.add("gossip", name, ports[i])
                self.gossip_ports[gossip_port] = name
                extra += f'\n  advertise: "127.0.0.1:{gossip_port}"'
            conf = cluster_config(name, ports[i], tags=[f"az:{self.zone_of(name)}"], cluster=self.cluster,
                                  route_urls=urls, cluster_extra=extra, extra=self.jetstream(i, tmp))
            workdir = tmp / (f"w{i + 1}" if self.prefix == "s" else name)
            workdir.mkdir(parents=True, exist_ok=True)
            self.servers.append(ServerProcess(impl, conf, http_port=free_port(), workdir=workdir,
                                              extra_args=["-js"] if impl == "nats" and self.js else [],
                                              env={**(self.env or {}), **self.server_env(i)}
                                              if self.server_env else self.env))
        start_parallel(self.servers, timeout=timeout)

    def stop(self) -> None:
        for s in self.servers:
            s.stop()
        if self.proxy is not None and self.own_proxy:
            self.proxy.stop()

    def cross_zone(self) -> int:
        """Bytes between two servers of different zones since the last reset. Links a nats-server dialled
        through another's advertised address (the proxy counts them under ("gossip", server): it cannot tell
        who dialled) count too: with one server per zone all of them, else as the kernel counted them on the
        dialler's socket (`ss`), attributed to the two servers."""
        assert self.proxy is not None
        counts = self.proxy.counts()
        if self.per_zone == 1:  # every link crosses zones, those dialled through an advertised address too
            mine = set(self.names)
            return sum(n for (a, b), n in counts.items() if a != b and {a, b} - {"gossip"} <= mine)
        mine = set(self.names)  # (a proxy shared with other clusters counts their links too)
        named = sum(n for (a, b), n in counts.items() if a in mine and b in mine and self.zone_of(a) != self.zone_of(b))
        return named + sum(n for (a, b), n in self._gossip_flows().items() if self.zone_of(a) != self.zone_of(b))

    def _gossip_sockets(self) -> dict[tuple[int, int], tuple[str, str, int, int]]:
        """The kernel's counts (`ss -tinp`) of the sockets a nats-server dialled through another's advertised
        address: (local port, proxy port) -> (dialler, dialled, bytes sent, bytes received)."""
        pids = {s.proc.pid: name for name, s in zip(self.names, self.servers, strict=True) if s.proc is not None}
        out = subprocess.run(["ss", "-tinpH", "state", "established"], capture_output=True, text=True,
                             check=False).stdout
        found: dict[tuple[int, int], tuple[str, str, int, int]] = {}
        head: list[str] = []
        for line in out.splitlines():
            if not line[:1].isspace():
                head = line.split()
                continue
            if len(head) < 5:
                continue
            peer_port = int(head[3].rsplit(":", 1)[1])
            pid = re.search(r"pid=(\d+)", head[4])
            if peer_port not in self.gossip_ports or pid is None or int(pid.group(1)) not in pids:
                continue
            sent = re.search(r"bytes_sent:(\d+)", line)
            got = re.search(r"bytes_received:(\d+)", line)
            found[(int(head[2].rsplit(":", 1)[1]), peer_port)] = (
                pids[int(pid.group(1))], self.gossip_ports[peer_port], int(sent.group(1)) if sent else 0,
                int(got.group(1)) if got else 0)
        return found

    def _gossip_flows(self) -> dict[tuple[str, str], int]:
        """Bytes per (from, to) server on links dialled through advertised addresses since the last reset."""
        flows: dict[tuple[str, str], int] = {}
        for key, (a, b, sent, got) in self._gossip_sockets().items():
            sent0, got0 = self._gossip_base.get(key, (0, 0))
            flows[(a, b)] = flows.get((a, b), 0) + sent - sent0
            flows[(b, a)] = flows.get((b, a), 0) + got - got0
        return flows

    def gossip_bytes(self) -> int:
        """Bytes on links dialled through a nats-server's advertised address (other side unknown)."""
        assert self.proxy is not None
        return sum(n for (a, b), n in self.proxy.counts().items() if "gossip" in (a, b))

    def bytes_into(self, zone: str, only: set[str] | None = None) -> int:
        """Bytes that servers of other zones sent to the servers of `zone` (of those named in `only`), on the
        links the proxy can name both ends of (not those dialled through a nats-server's advertised address)."""
        assert self.proxy is not None
        return sum(n for (a, b), n in self.proxy.counts().items()
                   if self.zone_of(b) == zone and self.zone_of(a) not in ("", zone) and (only is None or b in only))

    def reset_bytes(self) -> None:
        assert self.proxy is not None
        self.proxy.reset()
        if self.gossip_ports and self.per_zone > 1:
            self._gossip_base = {k: (v[2], v[3]) for k, v in self._gossip_sockets().items()}

    def wait_router_mapping(self, timeout: float = 60) -> None:
        """Until every server's zone router shows one live server per zone (blocking: run it in a thread)."""
        want = {f"z{i + 1}": [name] for i, name in enumerate(self.names)}
        wait_until(lambda: all(s.http_get("/jsz").get("zone_router", {}).get("zones") == want
                               for s in self.servers), f"{self.label}: the full zone-router mapping", timeout)


async def stream_led_in(url: str, cfg: dict, leader: str, what: str, timeout: float = 60) -> str:
    """Create `cfg`'s stream and step its leader down until it is `leader` (at most 15 tries); returns the
    leader it ended with."""
    nc = await nats.connect(url)
    name = cfg["name"]
    try:
        await create_stream_retrying(nc, cfg, time.monotonic() + timeout, what)
        return await step_leader_to(nc, f"$JS.API.STREAM.INFO.{name}", f"$JS.API.STREAM.LEADER.STEPDOWN.{name}",
                                    leader)
    finally:
        await nc.close()


async def step_leader_to(nc: nats.NATS, info: str, stepdown: str, leader: str, body: dict | None = None,
                         tries: int = 15, pause: float = 1.0) -> str:
    """Step a stream's or a consumer's leader down (`stepdown`, with `body`) until its `info` names `leader`, at
    most `tries` times; returns the leader it ended with."""
    current = ""
    for _ in range(tries):
        try:
            current = (await api(nc, info, timeout=2))["cluster"]["leader"]
        except (nats.errors.Error, TimeoutError, KeyError):
            await asyncio.sleep(0.5)
            continue
        if current == leader:
            break
        try:
            await api(nc, stepdown, body, timeout=5)
        except (nats.errors.Error, TimeoutError):
            pass
        await asyncio.sleep(pause)
    return current


def pct(xs: list[float], p: float) -> str:
    """The p-quantile of `xs` (seconds) in milliseconds, one decimal; `-` when empty."""
    if not xs:
        return "-"
    xs = sorted(xs)
    return f"{xs[min(len(xs) - 1, int(p * len(xs)))] * 1000:.1f}"
