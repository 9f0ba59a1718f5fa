"""Who is in the meta group: decided once from the configured routes, then persisted; checked on every link.

The decision: the meta group is this server plus every
JetStream server reached through the URLs listed in `cluster { routes: [...] }`. The group is not started
until every listed URL has answered (the link layer resolves each URL to a server name; a URL that points at
this server resolves to its own name), so two servers can only start with the same member list when their
route lists name the same servers, which is how nats-server's JetStream cluster examples are written (every
server lists every route). The first decision is written to `<store_dir>/meta/members.json`; later starts
use that file, so a restarted server rejoins with the same group even while some peers are down.

Every link starts with a hello carrying the sender's member list and its fingerprint; a peer whose list
differs, or a server not in ours, is logged as a membership mismatch and its Raft traffic is dropped: two
different lists never vote together, so they can never form two groups that both think they have quorum
over the same servers.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from zonebus.store.durability import make_dirs, replace_file

log = logging.getLogger(__name__)

MEMBERS_FILE = "members.json"
_DIGITS = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"


def server_hash(name: str, size: int = 8) -> str:
    """nats-server's `getHash`: the node id it shows as `peer` in /jsz (sha256, 62 digits, 8 characters)."""
    digest = hashlib.sha256(name.encode()).digest()
    return "".join(_DIGITS[b % 62] for b in digest[:size])


@dataclass(frozen=True)
class Membership:
    members: tuple[str, ...]

    @classmethod
    def of(cls, names: Iterable[str]) -> Membership:
        members = tuple(sorted(set(names)))
        if not members or any(not n for n in members):
            raise ValueError(f"invalid meta group members {members!r}")
        return cls(members)

    @property
    def fingerprint(self) -> str:
        return hashlib.sha256("\n".join(self.members).encode()).hexdigest()[:16]

    def others(self, self_name: str) -> list[str]:
        return [m for m in self.members if m != self_name]


@dataclass(frozen=True)
class RoutePeer:
    """What the link layer learned behind one configured route URL."""

    name: str
    jetstream: bool = True


@dataclass(frozen=True)
class MembershipDecision:
    membership: Membership | None  # None: not decided yet (some route has not answered)
    reason: str
    warning: str = ""


def members_path(store_dir: str | os.PathLike[str]) -> Path:
    return Path(store_dir) / "meta" / MEMBERS_FILE


def load_members(store_dir: str | os.PathLike[str]) -> Membership | None:
    path = members_path(store_dir)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    return Membership.of(data["members"])


def save_members(store_dir: str | os.PathLike[str], membership: Membership) -> None:
    path = members_path(store_dir)
    make_dirs(path.parent)  # (the meta directory's entry too: a power loss must not take the group's files)
    replace_file(path, json.dumps({"version": 1, "members": list(membership.members)}).encode())


def decide_members(self_name: str, routes: Mapping[str, RoutePeer | None],
                   store_dir: str | os.PathLike[str] | None = None) -> MembershipDecision:
    """The meta group's members, from the persisted list or from the configured routes.

    `routes` maps each configured route URL to the peer found there (its own name for a URL pointing at this
    server), or None while that URL has not answered. With a `store_dir`, a new decision is persisted and a
    persisted one wins over the routes (a difference is returned as a warning, to be logged)."""
    persisted = load_members(store_dir) if store_dir is not None else None
    resolved = {url: peer for url, peer in routes.items() if peer is not None}
    configured = None
    if len(resolved) == len(routes):
        configured = Membership.of([self_name, *(p.name for p in resolved.values() if p.jetstream)])
    if persisted is not None:
        if self_name not in persisted.members:
            return MembershipDecision(None, f"{self_name} is not in the persisted meta group {persisted.members}")
        warning = ""
        if configured is not None and configured != persisted:
            warning = (f"meta group members from routes {list(configured.members)} differ from the persisted "
                       f"{list(persisted.members)}; keeping the persisted list (remove "
                       f"{members_path(store_dir or '.')} on every server to form a new group)")
        return MembershipDecision(persisted, "persisted", warning)
    if configured is None:
        waiting = sorted(url for url, peer in routes.items() if peer is None)
        return MembershipDecision(None, f"waiting for routes {waiting}")
    if store_dir is not None:
        save_members(store_dir, configured)
    return MembershipDecision(configured, "routes")
