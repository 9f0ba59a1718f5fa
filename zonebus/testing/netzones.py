"""Zones as Linux network namespaces, for tests that cut zones apart (root only; created and removed here).

`NetZones(["z1", "z2", "z3"])` (a context manager) makes one network namespace per zone, each with one address
on a bridge in the host's namespace (`ip(zone)`), and delays every packet into a zone by `delay_ms` (tc netem
on the bridge side of its veth, where the kernel has netem: `delayed` says whether it did; this machine's kernel
has no sch_netem). The host keeps the bridge's
first address (`host_ip`): shared storage listens there (S3 is regional: every zone reaches it, always).
Servers run in their zone's namespace (`ServerProcess(netns=ns(zone), host=ip(zone))`); the test's clients
connect to those addresses.

Faults: `isolate(zone)` drops every packet between that zone and the other zones (blackhole routes in both
namespaces: no kernel module needed) while the zone still reaches the bridge's address (storage) and the
test's clients; `cut(a, b)` drops just a <-> b; `heal()` removes them all. `unavailable()` says why the
machine cannot do this (not root, no `ip`), for a skip.
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess

PREFIX_LEN = 24


def _run(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(list(argv), capture_output=True, text=True, check=check, timeout=20)


def unavailable() -> str | None:
    """Why network namespaces cannot be made here, or None."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "`ip` is not installed (apt-get install iproute2)"
    probe = f"zbprobe{random.getrandbits(24):06x}"
    res = _run("ip", "netns", "add", probe, check=False)
    if res.returncode != 0:
        return f"cannot create a network namespace: {res.stderr.strip()}"
    _run("ip", "netns", "del", probe, check=False)
    return None


class NetZones:
    def __init__(self, zones: list[str], delay_ms: float = 1.0) -> None:
        self.zones = list(zones)
        self.delay_ms = delay_ms
        self.tag = f"{random.getrandbits(20):05x}"
        net = f"10.{random.randint(64, 250)}.{random.randint(0, 255)}"
        self.host_ip = f"{net}.1"
        self._ips = {z: f"{net}.{10 + i}" for i, z in enumerate(self.zones)}
        self.bridge = f"zbbr{self.tag}"
        self._made: list[str] = []  # namespaces created
        self._cuts: set[frozenset[str]] = set()
        self.delayed = False  # netem delays packets into each zone

    def ns(self, zone: str) -> str:
        return f"zb{self.tag}-{zone}"

    def ip(self, zone: str) -> str:
        return self._ips[zone]

    def _veth(self, zone: str) -> str:
        return f"zbv{self.tag}{self.zones.index(zone)}"

    def __enter__(self) -> NetZones:
        try:
            _run("ip", "link", "add", self.bridge, "type", "bridge")
            _run("ip", "addr", "add", f"{self.host_ip}/{PREFIX_LEN}", "dev", self.bridge)
            _run("ip", "link", "set", self.bridge, "up")
            for z in self.zones:
                ns, veth = self.ns(z), self._veth(z)
                _run("ip", "netns", "add", ns)
                self._made.append(ns)
                _run("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
                _run("ip", "link", "set", veth, "master", self.bridge)
                _run("ip", "link", "set", veth, "up")
                _run("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
                _run("ip", "netns", "exec", ns, "ip", "addr", "add", f"{self.ip(z)}/{PREFIX_LEN}", "dev", "eth0")
                _run("ip", "netns", "exec", ns, "ip", "link", "set", "eth0", "up")
                if self.delay_ms > 0 and shutil.which("tc"):  # packets into the zone (the bridge side sends them)
                    res = _run("tc", "qdisc", "add", "dev", veth, "root", "netem", "delay", f"{self.delay_ms}ms",
                               check=False)
                    self.delayed = res.returncode == 0
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for ns in self._made:
            _run("ip", "netns", "del", ns, check=False)
        self._made = []
        _run("ip", "link", "del", self.bridge, check=False)

    # -- faults --------------------------------------------------------------------------------------
    def _filters(self) -> None:
        for z in self.zones:
            ns = self.ns(z)
            for other in self.zones:
                if other == z:
                    continue
                cut = frozenset((z, other)) in self._cuts
                verb = "replace" if cut else "del"
                _run("ip", "netns", "exec", ns, "ip", "route", verb, "blackhole", f"{self.ip(other)}/32",
                     check=cut)

    def cut(self, a: str, b: str) -> None:
        """Drop every packet between zones `a` and `b` (both ways)."""
        self._cuts.add(frozenset((a, b)))
        self._filters()

    def isolate(self, zone: str) -> None:
        """Cut `zone` from every other zone (storage and the test's clients still reach it)."""
        for other in self.zones:
            if other != zone:
                self._cuts.add(frozenset((zone, other)))
        self._filters()

    def heal(self) -> None:
        self._cuts.clear()
        self._filters()
