"""Topology and workload files of `cost simulate`, routing policies, and their closed-form expectation.

Topology (JSON):

    {
      "zones": ["az1", "az2"],                          optional: checked against the servers' zones
      "servers": [
        {"name": "s1", "zone": "az1"},
        {"name": "b{i}", "zone": "az2", "count": 50,    `count` expands {i} = 1..count
         "queue_members": {"workers": 1},               members of queue groups on each of these servers
         "publish_rate": 10.0}                          messages/s published on each of these servers
      ],
      "queue_groups": [{"name": "workers", "members": {"s2": 1}, "share": 1.0}],   share of the subjects
      "publishers": [{"server": "s1", "rate": 10.0}]
    }

Workload (JSON):

    {
      "messages_per_month": 1e8,                        default: sum of publisher rates * 30 days
      "subjects": {"count": 10000, "popularity": "uniform" | "zipf", "zipf_exponent": 1.0},
      "message_size": {"distribution": "fixed", "bytes": 512}
                    | {"distribution": "uniform", "min": 100, "max": 2000}
                    | {"distribution": "exponential", "mean": 1024}
                    | {"distribution": "lognormal", "mean": 1024, "sigma": 1.0},
      "samples": 1000000, "seed": 1
    }

Subjects are split among queue groups by `share`, interleaved over popularity ranks (see `subject_groups`);
every message goes to one subject, picked by popularity, and is delivered to one member of that subject's
queue group. A policy
maps (publishing server, queue group) to the candidate member servers and their weights:

    random                 every server with members, weighted by member count (stock NATS)
    prefer_matching_tags   members on the publishing server; else on servers in its zone; else random

Publishers and members are assumed to sit in their server's zone, so a message crosses zones exactly when
the chosen member's server is in another zone than the publishing server.
"""

from __future__ import annotations

import bisect
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from zonebus.pipeline.errors import PipelineInputError, PipelineOptionError

SECONDS_PER_MONTH = 30 * 86400
DEFAULT_SAMPLES = 1_000_000


@dataclass
class Server:
    name: str
    zone: str
    members: dict[str, int] = field(default_factory=dict)  # queue group -> member count
    rate: float = 0.0


@dataclass
class Topology:
    zones: list[str]
    servers: list[Server]
    groups: dict[str, float]  # queue group -> share of subjects

    def index(self) -> dict[str, int]:
        return {s.name: i for i, s in enumerate(self.servers)}


@dataclass
class SizeDistribution:
    kind: str
    params: dict[str, float]

    @property
    def mean(self) -> float:
        p = self.params
        if self.kind == "fixed":
            return p["bytes"]
        if self.kind == "uniform":
            return (p["min"] + p["max"]) / 2
        return p["mean"]


@dataclass
class Workload:
    messages_per_month: float | None
    subjects: int
    popularity: str
    zipf_exponent: float
    size: SizeDistribution
    samples: int
    seed: int


class _Checker:
    """Validates a parsed JSON file, naming the file and the key in every message."""

    def __init__(self, kind: str, source: str) -> None:
        self.kind, self.source = kind, source

    def fail(self, where: str, msg: str) -> PipelineInputError:
        return PipelineInputError(f"{self.kind} file {self.source!r}: {where}{': ' if where else ''}{msg}")

    def obj(self, value: Any, where: str, known: set[str], required: set[str] = frozenset()) -> dict:
        if not isinstance(value, dict):
            raise self.fail(where, "expected a JSON object")
        for key in sorted(value):
            if key not in known:
                raise self.fail(where, f"unknown key {key!r} (known: {', '.join(sorted(known))})")
        for key in sorted(required):
            if key not in value:
                raise self.fail(where, f"missing key {key!r}")
        return value

    def mapping(self, value: Any, where: str) -> dict:
        if not isinstance(value, dict):
            raise self.fail(where, "expected a JSON object")
        return value

    def num(self, value: Any, where: str, minimum: float = 0.0, integer: bool = False) -> float:
        ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
        if not ok or value < minimum or (integer and value != int(value)):
            kind = "a whole number" if integer else "a number"
            raise self.fail(where, f"expected {kind} >= {minimum:g}, got {value!r}")
        return value

    def text(self, value: Any, where: str) -> str:
        if not isinstance(value, str) or not value:
            raise self.fail(where, f"expected a non-empty string, got {value!r}")
        return value


def _load_json(path: str, kind: str, option: str) -> Any:
    p = Path(path)
    if not p.is_file():
        raise PipelineOptionError(f"{option}: {kind} file {path!r} not found")
    try:
        return json.loads(p.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise PipelineInputError(f"{kind} file {path!r}: not valid JSON: {exc}")


def load_topology(path: str, option: str = "--topology") -> Topology:
    return parse_topology(_load_json(path, "topology", option), path)


def parse_topology(data: Any, source: str = "<topology>") -> Topology:
    c = _Checker("topology", source)
    c.obj(data, "", {"zones", "servers", "queue_groups", "publishers", "description"}, {"servers"})
    servers: list[Server] = []
    groups: dict[str, float] = {}
    if not isinstance(data["servers"], list) or not data["servers"]:
        raise c.fail("servers", "expected a non-empty list")
    for i, entry in enumerate(data["servers"]):
        where = f"servers[{i}]"
        c.obj(entry, where, {"name", "zone", "count", "queue_members", "publish_rate"}, {"name", "zone"})
        name, zone = c.text(entry["name"], where + ".name"), c.text(entry["zone"], where + ".zone")
        count = int(c.num(entry.get("count", 1), where + ".count", 1, integer=True))
        members = c.mapping(entry.get("queue_members", {}), where + ".queue_members")
        for group, n in members.items():
            c.num(n, f"{where}.queue_members.{group}", 0, integer=True)
            groups.setdefault(group, 1.0)
        rate = c.num(entry.get("publish_rate", 0.0), where + ".publish_rate")
        for k in range(1, count + 1):
            sname = name.replace("{i}", str(k)) if "{i}" in name else (name if count == 1 else f"{name}{k}")
            servers.append(Server(sname, zone, {g: int(n) for g, n in members.items()}, float(rate)))
    by_name: dict[str, Server] = {}
    for s in servers:
        if s.name in by_name:
            raise c.fail("servers", f"server name {s.name!r} is defined twice")
        by_name[s.name] = s
    for i, entry in enumerate(_list(c, data, "queue_groups")):
        where = f"queue_groups[{i}]"
        c.obj(entry, where, {"name", "members", "share"}, {"name"})
        group = c.text(entry["name"], where + ".name")
        groups[group] = c.num(entry.get("share", 1.0), where + ".share")
        for sname, n in c.mapping(entry.get("members", {}), where + ".members").items():
            if sname not in by_name:
                raise c.fail(f"{where}.members", f"server {sname!r} is not defined in servers")
            members = by_name[sname].members
            members[group] = members.get(group, 0) + int(c.num(n, f"{where}.members.{sname}", 0, integer=True))
    for i, entry in enumerate(_list(c, data, "publishers")):
        where = f"publishers[{i}]"
        c.obj(entry, where, {"server", "rate"}, {"server"})
        sname = c.text(entry["server"], where + ".server")
        if sname not in by_name:
            raise c.fail(where + ".server", f"server {sname!r} is not defined in servers")
        by_name[sname].rate += c.num(entry.get("rate", 1.0), where + ".rate")
    zones = sorted({s.zone for s in servers})
    if "zones" in data:
        declared = data["zones"]
        if not isinstance(declared, list) or not all(isinstance(z, str) for z in declared):
            raise c.fail("zones", "expected a list of zone names")
        extra = sorted(set(zones) - set(declared))
        if extra:
            raise c.fail("servers", f"zone {extra[0]!r} is not listed in zones")
        zones = list(declared)
    if not groups:
        raise c.fail("", "no queue groups: give servers queue_members or add queue_groups")
    if sum(groups.values()) <= 0:
        raise c.fail("queue_groups", "all shares are 0")
    if sum(s.rate for s in servers) <= 0:
        raise c.fail("", "no publishers: give servers a publish_rate or add publishers with a rate > 0")
    return Topology(zones, servers, groups)


def _list(c: _Checker, data: dict, key: str) -> list:
    value = data.get(key, [])
    if not isinstance(value, list):
        raise c.fail(key, "expected a list")
    return value


def load_workload(path: str, option: str = "--workload") -> Workload:
    return parse_workload(_load_json(path, "workload", option), path)


def parse_workload(data: Any, source: str = "<workload>") -> Workload:
    c = _Checker("workload", source)
    c.obj(data, "", {"messages_per_month", "subjects", "message_size", "samples", "seed", "description"})
    monthly = data.get("messages_per_month")
    if monthly is not None:
        monthly = c.num(monthly, "messages_per_month", 1)
    subj = c.obj(data.get("subjects", {}), "subjects", {"count", "popularity", "zipf_exponent"})
    count = int(c.num(subj.get("count", 1), "subjects.count", 1, integer=True))
    popularity = subj.get("popularity", "uniform")
    if popularity not in ("uniform", "zipf"):
        raise c.fail("subjects.popularity", f"expected 'uniform' or 'zipf', got {popularity!r}")
    exponent = c.num(subj.get("zipf_exponent", 1.0), "subjects.zipf_exponent")
    size = data.get("message_size", {"distribution": "fixed", "bytes": 512})
    kinds = {"fixed": {"bytes"}, "uniform": {"min", "max"}, "exponential": {"mean"}, "lognormal": {"mean", "sigma"}}
    c.obj(size, "message_size", {"distribution"} | set().union(*kinds.values()), {"distribution"})
    kind = size["distribution"]
    if kind not in kinds:
        raise c.fail("message_size.distribution", f"expected one of {', '.join(kinds)}, got {kind!r}")
    c.obj(size, "message_size", {"distribution"} | kinds[kind], {"distribution"} | kinds[kind])
    params = {k: float(c.num(size[k], f"message_size.{k}")) for k in kinds[kind]}
    if kind == "uniform" and params["max"] < params["min"]:
        raise c.fail("message_size", "max < min")
    samples = int(c.num(data.get("samples", DEFAULT_SAMPLES), "samples", 1, integer=True))
    seed = int(c.num(data.get("seed", 1), "seed", 0, integer=True))
    return Workload(monthly, count, popularity, float(exponent), SizeDistribution(kind, params), samples, seed)


# -- policies -----------------------------------------------------------------------------------------

Candidates = tuple[tuple[int, int], ...]  # ((server index, weight), ...), sorted
Policy = Callable[[Topology, int, str], Candidates]


def _members(topo: Topology, group: str, keep: Callable[[int, Server], bool]) -> Candidates:
    return tuple((i, s.members[group]) for i, s in enumerate(topo.servers)
                 if s.members.get(group, 0) > 0 and keep(i, s))


def policy_random(topo: Topology, pub: int, group: str) -> Candidates:
    return _members(topo, group, lambda i, s: True)


def policy_prefer_matching_tags(topo: Topology, pub: int, group: str) -> Candidates:
    zone = topo.servers[pub].zone
    for keep in (lambda i, s: i == pub, lambda i, s: s.zone == zone, lambda i, s: True):
        found = _members(topo, group, keep)
        if found:
            return found
    return ()


POLICIES: dict[str, Policy] = {"random": policy_random, "prefer_matching_tags": policy_prefer_matching_tags}


# -- the shared discrete distributions, and the closed form -------------------------------------------

def publisher_weights(topo: Topology) -> list[tuple[int, float]]:
    total = sum(s.rate for s in topo.servers)
    return [(i, s.rate / total) for i, s in enumerate(topo.servers) if s.rate > 0]


GOLDEN = 0.6180339887498949


def subject_groups(topo: Topology, wl: Workload) -> tuple[list[str], list[float]]:
    """Per subject id: its queue group and its probability of being published to.

    Subject k goes to the group whose share interval holds frac((k + 1/2) * golden ratio): a low-discrepancy
    sequence, so each group gets its share of the subjects at every popularity rank, and so (up to the
    weight of the most popular subjects) its share of the traffic too.
    """
    names = sorted(topo.groups)
    total = sum(topo.groups[g] for g in names)
    bounds, acc = [], 0.0
    for g in names:
        acc += topo.groups[g] / total
        bounds.append(acc)
    bounds[-1] = 1.0
    groups = []
    for k in range(wl.subjects):
        point = ((k + 0.5) * GOLDEN) % 1.0
        groups.append(names[min(bisect.bisect_right(bounds, point), len(names) - 1)])
    if wl.popularity == "zipf":
        raw = [1.0 / (k + 1) ** wl.zipf_exponent for k in range(wl.subjects)]
    else:
        raw = [1.0] * wl.subjects
    total_raw = sum(raw)
    return groups, [r / total_raw for r in raw]


def group_traffic_shares(topo: Topology, wl: Workload) -> dict[str, float]:
    groups, probs = subject_groups(topo, wl)
    shares: dict[str, float] = {}
    for g, p in zip(groups, probs, strict=True):
        shares[g] = shares.get(g, 0.0) + p
    return shares


def monthly_messages(topo: Topology, wl: Workload) -> float:
    if wl.messages_per_month is not None:
        return wl.messages_per_month
    return sum(s.rate for s in topo.servers) * SECONDS_PER_MONTH


def closed_form(topo: Topology, wl: Workload, policy: str) -> dict[str, float]:
    """Exact expectation: P(cross), P(delivered), and expected cross-zone bytes per message."""
    rule = POLICIES[policy]
    shares = group_traffic_shares(topo, wl)
    p_cross = p_delivered = 0.0
    for pub, w_pub in publisher_weights(topo):
        zone = topo.servers[pub].zone
        for group, w_group in shares.items():
            cands = rule(topo, pub, group)
            total = sum(w for _, w in cands)
            if total == 0:
                continue
            outside = sum(w for i, w in cands if topo.servers[i].zone != zone)
            p_delivered += w_pub * w_group
            p_cross += w_pub * w_group * outside / total
    return {
        "cross_zone_fraction": p_cross,
        "delivered_fraction": p_delivered,
        "cross_zone_bytes_per_message": p_cross * wl.size.mean,
    }
