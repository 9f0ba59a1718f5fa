"""Three MetaGroups in one event loop, linked by direct calls: the link-layer contract without sockets."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest

from zonebus.meta import Change, MembershipError, MetaGroup, MetaTiming, NoQuorum
from zonebus.meta.membership import Membership
from zonebus.testing.polling import until

NAMES = ["a", "b", "c"]


class Links:
    """A loopback 'link layer': send_bytes schedules the peer's deliver; links can be cut."""

    def __init__(self) -> None:
        self.groups: dict[str, MetaGroup] = {}
        self.cut: set[str] = set()

    def sender(self, src: str) -> Callable[[str, bytes], bool]:
        def send(dst: str, payload: bytes) -> bool:
            group = self.groups.get(dst)
            if group is None or src in self.cut or dst in self.cut:
                return False
            asyncio.get_running_loop().call_soon(group.deliver, src, payload)
            return True

        return send

    def isolate(self, name: str) -> None:
        self.cut.add(name)
        for other in self.groups:
            if other != name:
                self.groups[other].peer_down(name)
                self.groups[name].peer_down(other)


@pytest.mark.timeout(30)
async def test_link_layer_contract_in_one_loop(tmp_path: Path) -> None:
    links = Links()
    membership = Membership.of(NAMES)
    seen: dict[str, list[Change]] = {n: [] for n in NAMES}
    for name in NAMES:
        group = MetaGroup(server_name=name, cluster_name="c1", membership=membership, store_dir=tmp_path / name,
                          send_bytes=links.sender(name), tags=[f"az:{name}"], timing=MetaTiming(failover=1.0))
        group.on_change(seen[name].append)
        links.groups[name] = group
    # The link layer may report links before the group starts: they must still count.
    for name in NAMES:
        for other in NAMES:
            if other != name:
                links.groups[name].peer_up(other)
    for group in links.groups.values():
        group.start()
    try:
        leader = await until(lambda: {g.leader for g in links.groups.values()} == {links.groups["a"].leader}
                             and links.groups["a"].leader, "a leader", timeout=10, interval=0.02)
        await until(lambda: len(links.groups[leader].state.peers) == 3, "registrations", timeout=10, interval=0.02)
        follower = links.groups[next(n for n in NAMES if n != leader)]
        created = await follower.propose({"op": "stream_create", "name": "S",
                                          "config": {"num_replicas": 1, "placement": {"tags": ["az:c"]}}})
        assert created["stream"]["leader"] == "c"
        await until(lambda: any(ch.key == "S" and ch.gained_leader("c") for ch in seen["c"]), "c's callback",
                    timeout=5, interval=0.02)

        links.isolate("c")  # c leads S; after failover=1 s it moves (any live server, flagged)
        survivors = [links.groups[n] for n in NAMES if n != "c"]
        moved = await until(lambda: (s := survivors[0].state.streams.get("S")) and s.leader != "c" and s,
                            "S to move off the isolated server", timeout=10, interval=0.02)
        assert moved.epoch == 2 and moved.honoured is False
        with pytest.raises(NoQuorum) as info:
            await links.groups["c"].propose({"op": "stream_delete", "name": "S"}, timeout=2)
        assert info.value.err_code == 10008
    finally:
        for group in links.groups.values():
            await group.stop()


@pytest.mark.timeout(30)
async def test_a_lone_server_leads_itself_and_replays_its_journal_on_restart(tmp_path: Path) -> None:
    def lone() -> MetaGroup:
        return MetaGroup(server_name="solo", cluster_name="c1", membership=Membership.of(["solo"]),
                         store_dir=tmp_path, send_bytes=lambda _peer, _payload: False, tags=["az:z1"])

    group = lone()
    group.start()
    try:
        await until(lambda: group.is_leader and group.state.peers.get("solo"), "self-registration", timeout=10,
                    interval=0.02)
        made = await group.propose({"op": "stream_create", "name": "S", "config": {"num_replicas": 1}})
        assert made["stream"]["leader"] == "solo" and group.info()["cluster_size"] == 1
        digest = group.state.digest()
    finally:
        await group.stop()

    again = lone()
    replayed: list[Change] = []
    again.on_change(replayed.append)
    again.start()
    try:
        # Replayed from the journal (entries past the lazily persisted commit index once it leads again).
        await until(lambda: again.state.digest() == digest, "the journal's state", timeout=10, interval=0.02)
        assert [(c.kind, c.key) for c in replayed] == [("peer", "solo"), ("stream", "S")]
    finally:
        await again.stop()
    with pytest.raises(MembershipError):
        MetaGroup(server_name="solo", cluster_name="c1", membership=Membership.of(["solo", "other"]),
                  store_dir=tmp_path, send_bytes=lambda _peer, _payload: False).start()
