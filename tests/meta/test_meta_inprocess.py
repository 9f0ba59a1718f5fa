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

    def start_groups(self, tmp_path: Path, failover: float, seen: dict[str, list[Change]] | None = None) -> None:
        """Three groups `NAMES`, their links reported up before they start (they must still count), started."""
        membership = Membership.of(NAMES)
        for name in NAMES:
            group = MetaGroup(server_name=name, cluster_name="c1", membership=membership, store_dir=tmp_path / name,
                              send_bytes=self.sender(name), tags=[f"az:{name}"], timing=MetaTiming(failover=failover))
            if seen is not None:
                group.on_change(seen[name].append)
            self.groups[name] = group
        for name in NAMES:
            for other in NAMES:
                if other != name:
                    self.groups[name].peer_up(other)
        for group in self.groups.values():
            group.start()

    def heal(self, name: str) -> None:
        self.cut.discard(name)
        for other in self.groups:
            if other != name:
                self.groups[other].peer_up(name)
                self.groups[name].peer_up(other)

    def isolate(self, name: str) -> None:
        self.cut.add(name)
        for other in self.groups:
            if other != name:
                self.groups[other].peer_down(name)
                self.groups[name].peer_down(other)


@pytest.mark.timeout(30)
async def test_link_layer_contract_in_one_loop(tmp_path: Path) -> None:
    links = Links()
    seen: dict[str, list[Change]] = {n: [] for n in NAMES}
    links.start_groups(tmp_path, 1.0, seen)
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


@pytest.mark.timeout(60)
async def test_a_server_catching_up_holds_no_lease_until_it_applied_the_leaders_commits(tmp_path: Path) -> None:
    """A follower cut off while the meta group committed ~1 MB of changes hears a majority as soon as it is back,
    but needs several heartbeats to catch up (the leader sends its log in 256 KiB batches): until it applied all
    that the leader committed, `lease` is False (it could still believe it leads streams that moved meanwhile)."""
    links = Links()
    links.start_groups(tmp_path, 4.0)
    try:
        leader_name = await until(lambda: {g.leader for g in links.groups.values()} == {links.groups["a"].leader}
                                  and links.groups["a"].leader, "a leader", timeout=10, interval=0.02)
        leader = links.groups[leader_name]
        behind = links.groups[next(n for n in NAMES if n != leader_name)]
        await until(behind.lease, "the follower's lease before the cut", timeout=10, interval=0.02)
        links.isolate(behind.name)
        await until(lambda: not behind.lease(), "the cut-off follower losing its lease", timeout=10, interval=0.02)
        n = 240
        for i in range(n):
            await leader.propose({"op": "stream_create", "name": f"S{i}",
                                  "config": {"num_replicas": 1, "description": f"{i:05d}" * 800}})
        links.heal(behind.name)
        early: list[int] = []  # streams the follower had applied whenever it held the lease while catching up
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 20
        while len(behind.state.streams) < n and loop.time() < deadline:
            if behind.lease():
                early.append(len(behind.state.streams))
            await asyncio.sleep(0.002)
        assert len(behind.state.streams) == n, f"the follower did not catch up: {len(behind.state.streams)} of {n}"
        assert not early, f"lease held while {min(early)} of {n} changes were applied ({len(early)} looks)"
        await until(behind.lease, "the lease once caught up", timeout=10, interval=0.02)
    finally:
        for group in links.groups.values():
            await group.stop()
