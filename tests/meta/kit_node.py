"""Test-only meta-group node: one `MetaGroup`, a tiny TCP mesh in place of the link layer, a control port.

The mesh calls exactly what the link layer will call: `peer_up`, `deliver`, `peer_down`, and gives the group
`send_bytes`. Frames are 4-byte big-endian lengths + payload; the dialling side (the smaller name) first sends
its name. The control port speaks JSON lines: {"cmd": "status" | "propose" | "stepdown" | "changes", ...}.

    python tests/meta/kit_node.py --name a --peers a=127.0.0.1:7001,b=...,c=... --control 7101 --store DIR
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import struct
import sys
import time
from typing import Any

from zonebus.meta import Change, MetaError, MetaGroup, MetaTiming, NotLeader
from zonebus.meta.membership import Membership

HEADER = struct.Struct(">I")


class Mesh:
    """Full mesh on loopback; one connection per pair of nodes."""

    def __init__(self, name: str, addrs: dict[str, tuple[str, int]]) -> None:
        self.name = name
        self.addrs = addrs
        self.links: dict[str, asyncio.StreamWriter] = {}
        self.meta: MetaGroup | None = None

    def send_bytes(self, peer: str, payload: bytes) -> bool:
        writer = self.links.get(peer)
        if writer is None or writer.is_closing():
            return False
        writer.write(HEADER.pack(len(payload)) + payload)
        return True

    async def start(self) -> None:
        host, port = self.addrs[self.name]
        await asyncio.start_server(self._accept, host, port)
        for peer in self.addrs:
            if self.name < peer:
                asyncio.get_running_loop().create_task(self._dial(peer))

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            peer = (await _read_frame(reader)).decode()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()
            return
        await self._serve(peer, reader, writer)

    async def _dial(self, peer: str) -> None:
        while True:
            if peer not in self.links:
                try:
                    reader, writer = await asyncio.open_connection(*self.addrs[peer])
                except OSError:
                    await asyncio.sleep(0.1)
                    continue
                writer.write(HEADER.pack(len(self.name)) + self.name.encode())
                asyncio.get_running_loop().create_task(self._serve(peer, reader, writer))
            await asyncio.sleep(0.1)

    async def _serve(self, peer: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        old = self.links.get(peer)
        if old is not None:
            old.close()
        self.links[peer] = writer
        assert self.meta is not None
        self.meta.peer_up(peer)
        try:
            while True:
                self.meta.deliver(peer, await _read_frame(reader))
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            if self.links.get(peer) is writer:
                del self.links[peer]
                self.meta.peer_down(peer)
            writer.close()


async def _read_frame(reader: asyncio.StreamReader) -> bytes:
    (size,) = HEADER.unpack(await reader.readexactly(HEADER.size))
    return await reader.readexactly(size)


def _holder(record: Any) -> str | None:
    for attr in ("leader", "owner", "server"):
        if hasattr(record, attr):
            return getattr(record, attr)
    return None


class Control:
    def __init__(self, meta: MetaGroup) -> None:
        self.meta = meta
        self.changes: list[dict[str, Any]] = []
        meta.on_change(self._record)

    def _record(self, change: Change) -> None:
        self.changes.append({"kind": change.kind, "key": change.key, "before": _holder(change.before),
                             "after": _holder(change.after), "epoch": getattr(change.after, "epoch", None)})

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            while line := await reader.readline():
                reply = await self.answer(json.loads(line))
                writer.write(json.dumps(reply).encode() + b"\n")
                await writer.drain()
        writer.close()

    async def answer(self, req: dict[str, Any]) -> dict[str, Any]:
        meta = self.meta
        cmd = req.get("cmd")
        try:
            if cmd == "status":
                return {"name": meta.name, "leader": meta.leader, "is_leader": meta.is_leader,
                        "has_quorum": meta.has_quorum, "ready": meta.ready, "digest": meta.state.digest(),
                        "state": meta.state.to_dict(), "info": meta.info(), "peers": meta.peers(),
                        "cpu": time.process_time()}
            if cmd == "propose":
                return {"result": await meta.propose(req["op"], timeout=req.get("timeout"))}
            if cmd == "stepdown":
                return {"leader": await meta.stepdown(timeout=req.get("timeout"))}
            if cmd == "changes":
                return {"changes": self.changes}
            return {"error": {"type": "BadCommand", "description": f"unknown command {cmd!r}"}}
        except MetaError as exc:
            err = {"type": type(exc).__name__, "name": exc.name, "code": exc.code, "err_code": exc.err_code,
                   "description": exc.description}
            if isinstance(exc, NotLeader):
                err["outcome_unknown"] = exc.outcome_unknown
            return {"error": err}


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--name", required=True)
    parser.add_argument("--peers", required=True, help="name=host:port,... for every mesh node, self included")
    parser.add_argument("--members", help="meta group members (default: every --peers name)")
    parser.add_argument("--control", type=int, required=True)
    parser.add_argument("--store", required=True)
    parser.add_argument("--cluster", default="c1")
    parser.add_argument("--tags", default="")
    parser.add_argument("--zone", default="")
    parser.add_argument("--timing", default="{}", help="MetaTiming overrides as JSON")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format=f"%(asctime)s {args.name} %(levelname)s %(name)s: %(message)s")
    addrs = {}
    for item in args.peers.split(","):
        name, _, addr = item.partition("=")
        host, _, port = addr.rpartition(":")
        addrs[name] = (host, int(port))
    members = Membership.of(args.members.split(",") if args.members else addrs)
    mesh = Mesh(args.name, addrs)
    meta = MetaGroup(server_name=args.name, cluster_name=args.cluster, membership=members, store_dir=args.store,
                     send_bytes=mesh.send_bytes, tags=[t for t in args.tags.split(",") if t], zone=args.zone,
                     timing=MetaTiming(**json.loads(args.timing)))
    mesh.meta = meta
    control = Control(meta)
    meta.start()
    await mesh.start()
    await asyncio.start_server(control.handle, "127.0.0.1", args.control)
    print(f"ready pid={os.getpid()}", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main())
