"""One `/varz` and one `/connz` for all workers, served by worker 0 (the only one with a monitoring port).

Worker 0 asks every other worker for its own figures on the local links' `wstats` channel (a request frame
`q <token> <page> <json args>`, answered `r <token> <worker> <json>`), waits for the answers (at most `ASK_TIMEOUT`;
a worker that is restarting is left out) and builds the page:
- `/varz`: worker 0's page, with the counters summed over the workers: connections, total connections,
  messages and bytes in and out (clients' and all), subscriptions (each worker's own, not the other workers'
  interest it holds), slow consumers, stale connections, memory and CPU; and a `workers` list with each
  worker's index, pid and figures (zonebus's own section).
- `/connz`: every worker's client connections, by client id (worker i hands out ids from i * 2^32 + 1);
  with the zone router (which runs on worker 0), each worker marks its own clients' zones (`zones`).
- `/subsz` (and `/subscriptionsz`): the sublist counters summed (subscriptions: each worker's own, as in
  `/varz`), and with `subs` every worker's subscriptions but the other workers' interest it holds (so each
  client subscription once, with the messages it was delivered), by client id and sid, then paged.
- `/metrics` (`server.ledger_totals`): the traffic ledger's running totals summed over the workers (each
  worker's ledger counts its own connections: the routes' copies on worker 0, each worker's clients on it).
A worker's answer is built when its frame is read, after everything its clients sent before, so a page asked
for after a flush counts what was flushed.

`ZoneCounts` (zone router only): each other worker tells worker 0 how many of its clients are outside the
server's zone whenever that changes (a client arrived, left, or sent its first PING, after its CONNECT named
it), on the `wzones` channel; such a frame counts as a message of the local link, so the client's PONG
waits until worker 0 has it (`pong_gate`): `/jsz`'s `clients_outside_zone` is the whole server's once a
client's connect returned.
Owned by the event loop thread.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from zonebus.server.connection import WORKER

if TYPE_CHECKING:
    from zonebus.server.client import ClientConnection
    from zonebus.server.ledger_hooks import LedgerTotals
    from zonebus.server.server import Server
    from zonebus.workers.mesh import LocalMesh
    from zonebus.zonerouter.clientzones import ClientZones

CHANNEL = "wstats"
ZONES = "wzones"
ASK_TIMEOUT = 4.0
CID_BLOCK = 1 << 32  # client ids of worker i start above i * CID_BLOCK
SUMMED = ("connections", "total_connections", "in_msgs", "in_bytes", "out_msgs", "out_bytes", "in_client_msgs",
          "in_client_bytes", "out_client_msgs", "out_client_bytes", "slow_consumers", "stale_connections",
          "subscriptions", "mem", "cpu")


class WorkerStats:
    def __init__(self, server: Server, mesh: LocalMesh) -> None:
        self.server = server
        self.mesh = mesh
        self.channel = mesh.channels.register(CHANNEL, self._on_frame)
        self._next = 0
        self._pending: dict[int, tuple[asyncio.Future, dict[str, Any]]] = {}
        self.migrator: Any = None  # zonebus.workers.migrate.Migrator, for its counts
        self.zones: ClientZones | None = None  # the zone router's client zones, marked in `/connz`
        # JetStream on every worker (zonebus.stream.shards): this worker's `/jsz` for a query, and how worker 0
        # adds the others' to its own
        self.jsz_part: Callable[[dict[str, Any]], dict[str, Any]] | None = None
        self.jsz_merge: Callable[[dict[str, Any], list[dict[str, Any]]], dict[str, Any]] | None = None
        self.js_stats: Callable[[], dict[str, Any]] | None = None  # this worker's `/varz` `jetstream.stats`

    def serve_pages(self) -> None:
        """Worker 0: `/varz`, `/connz`, `/subsz` and `/metrics`' ledger totals of the whole server."""
        self.server.pages["/varz"] = self.varz_page
        self.server.pages["/connz"] = self.connz_page
        self.server.pages["/subsz"] = self.server.pages["/subscriptionsz"] = self.subsz_page
        self.server.ledger_totals = self.ledger_totals

    # -- this worker's own figures ---------------------------------------------------------------------
    def own(self, page: str, args: Mapping[str, Any]) -> dict[str, Any]:
        from zonebus.server.monitor import connz, varz

        server = self.server
        if page == "connz":
            built = connz(server, bool(args.get("subs")), bool(args.get("auth")))
            return self.zones.annotate(built) if self.zones is not None else built
        if page == "subsz":
            return self._own_subsz(args)
        if page == "ledger":
            return self._own_ledger()
        if page == "jsz":
            return self.jsz_part(dict(args)) if self.jsz_part is not None else {}
        v = varz(server)
        out = {key: v.get(key, 0) for key in SUMMED}
        out["subscriptions"] -= self.mesh.remote_subscriptions()
        out["slow_consumer_stats"] = v.get("slow_consumer_stats", {})
        out["worker"], out["pid"] = self.mesh.index, os.getpid()
        if self.js_stats is not None:
            out["jetstream_stats"] = self.js_stats()
        if self.migrator is not None:
            out["clients_moved_out"], out["clients_moved_in"] = self.migrator.moved_out, self.migrator.moved_in
            out["clients_moved_early"] = self.migrator.moved_early
        return out

    def _own_subsz(self, args: Mapping[str, Any]) -> dict[str, Any]:
        from zonebus.server.monitor import sub_details, sublist_stats

        stats = sublist_stats(self.server)
        stats["num_subscriptions"] -= sum(len(link.remote_subs) + len(link.account_subs)
                                          for link in self.mesh.links.values())
        out: dict[str, Any] = {"stats": stats}
        if args.get("subs"):
            out["subs"] = sub_details(self.server, str(args.get("test") or ""), skip=(WORKER,))
        return out

    def _own_ledger(self) -> dict[str, Any]:
        hooks = self.server.ledger
        if hooks is None:
            return {}
        totals = hooks.totals
        return {"flows": [[*key, *row] for key, row in totals.flows.items()],
                "decisions": [[*key, n] for key, n in totals.decisions.items()],
                "last_handover": totals.last_handover}

    # -- asking the others -----------------------------------------------------------------------------
    async def gather(self, page: str, args: Mapping[str, Any]) -> dict[int, dict[str, Any]]:
        """Every worker's answer (this one's included), by worker index; silent workers are left out."""
        answers: dict[int, dict[str, Any]] = {self.mesh.index: self.own(page, args)}
        waits = []
        for link in list(self.mesh.links.values()):
            self._next += 1
            fut = self.server.loop.create_future()
            self._pending[self._next] = (fut, answers)
            self.channel.send(link.remote_name, b"q %d %b %b" % (self._next, page.encode(), json.dumps(args).encode()))
            waits.append((self._next, fut))
        if waits:
            await asyncio.wait([f for _, f in waits], timeout=ASK_TIMEOUT)
        for token, _ in waits:
            self._pending.pop(token, None)
        return answers

    def _on_frame(self, peer: str, payload: bytes) -> None:
        parts = payload.split(b" ", 3)
        if len(parts) < 3 or not parts[1].isdigit():
            return
        if parts[0] == b"q" and len(parts) == 4:
            try:
                args = json.loads(parts[3])
            except ValueError:
                args = {}
            try:
                body = self.own(parts[2].decode(errors="replace"), args if isinstance(args, dict) else {})
            except Exception as exc:  # (a query worker 0 took: never left unanswered)
                body = {"error": str(exc)}
            self.channel.send(peer, b"r %b %d %b" % (parts[1], self.mesh.index, json.dumps(body).encode()))
        elif parts[0] == b"r" and len(parts) == 4 and parts[2].isdigit():
            pending = self._pending.pop(int(parts[1]), None)
            if pending is None:
                return
            fut, answers = pending
            try:
                body = json.loads(parts[3])
            except ValueError:
                body = None
            if isinstance(body, dict):
                answers[int(parts[2])] = body
            if not fut.done():
                fut.set_result(None)

    # -- the pages -------------------------------------------------------------------------------------
    async def varz_page(self, query: Mapping[str, str]) -> dict[str, Any]:
        from zonebus.server.monitor import go_float, varz

        page = varz(self.server)
        answers = await self.gather("varz", {})
        for key in SUMMED:
            page[key] = sum(a.get(key, 0) for a in answers.values())
        page["cpu"] = go_float(round(page["cpu"], 2))
        kinds: dict[str, int] = {}
        for a in answers.values():
            for kind, n in (a.get("slow_consumer_stats") or {}).items():
                kinds[kind] = kinds.get(kind, 0) + n
        if kinds:
            page["slow_consumer_stats"] = kinds
        stats = (page.get("jetstream") or {}).get("stats")
        if stats is not None and self.js_stats is not None:  # (each worker serves its share of the streams)
            for i, a in answers.items():
                theirs = a.get("jetstream_stats") or {}
                if i == self.mesh.index or not theirs:
                    continue
                stats["memory"] += theirs.get("memory", 0)
                stats["storage"] += theirs.get("storage", 0)
                for key in ("total", "errors"):
                    stats["api"][key] += theirs.get("api", {}).get(key, 0)
        page["workers"] = [
            {"worker": i, "up": True, **{k: v for k, v in answers[i].items() if k not in ("worker", "jetstream_stats")}}
            if i in answers
            else {"worker": i, "up": False}
            for i in range(self.mesh.spec.count)]
        return page

    async def connz_page(self, query: Mapping[str, str]) -> dict[str, Any]:
        from zonebus.server.monitor import query_flag

        args = {"subs": query_flag(query, "subs"), "auth": query_flag(query, "auth")}
        answers = await self.gather("connz", args)
        page = answers[self.mesh.index]
        conns = sorted((c for a in answers.values() for c in a.get("connections", ())), key=lambda c: c["cid"])
        page["connections"] = conns
        page["num_connections"] = page["total"] = len(conns)
        return page

    async def subsz_page(self, query: Mapping[str, str]) -> dict[str, Any]:
        from zonebus.server.monitor import decode_bool, decode_int, subsz_doc

        subs, offset, limit = decode_bool(query, "subs"), decode_int(query, "offset"), decode_int(query, "limit")
        answers = await self.gather("subsz", {"subs": subs, "test": query.get("test", "")})
        stats: dict[str, int] = {}
        for a in answers.values():
            for key, n in (a.get("stats") or {}).items():
                stats[key] = stats.get(key, 0) + n
        details = None
        if subs:
            details = sorted((d for a in answers.values() for d in a.get("subs", ())),
                             key=lambda d: (d.get("cid", 0), d.get("sid", "")))
        return subsz_doc(self.server, stats, details, offset, limit)

    async def jsz_page(self, query: Mapping[str, str]) -> dict[str, Any]:
        """`/jsz` of the whole server: every worker serves its share of the streams."""
        answers = await self.gather("jsz", dict(query))
        page = answers.pop(self.mesh.index)
        if self.jsz_merge is None:
            return page
        return self.jsz_merge(page, [a for _, a in sorted(answers.items()) if "error" not in a])

    async def ledger_totals(self) -> LedgerTotals | None:
        """The ledger's running totals of every worker, summed (None without a ledger)."""
        from zonebus.server.ledger_hooks import LedgerTotals

        if self.server.ledger is None:
            return None
        answers = await self.gather("ledger", {})
        totals = LedgerTotals()
        for a in answers.values():
            for kind, src, dst, msgs, nbytes in a.get("flows", ()):
                row = totals.flows.setdefault((kind, src, dst), [0, 0])
                row[0] += msgs
                row[1] += nbytes
            for pub_zone, chosen, n in a.get("decisions", ()):
                totals.decisions[(pub_zone, chosen)] = totals.decisions.get((pub_zone, chosen), 0) + n
            totals.last_handover = max(totals.last_handover, a.get("last_handover", 0.0))
        return totals


class ZoneCounts:
    """Clients outside the server's zone on every worker (the zone router's `clients_outside_zone`): the
    other workers count theirs and tell worker 0 (`elsewhere` sums what they told)."""

    def __init__(self, mesh: LocalMesh, zones: ClientZones) -> None:
        self.mesh = mesh
        self.zones = zones
        self.outside: set[int] = set()  # this worker's clients outside the zone, by client id
        self.pinged: set[int] = set()  # clients looked at since their first PING here (their CONNECT is read)
        self.told = -1  # the count worker 0 has
        self.others: dict[str, int] = {}  # worker 0: each other worker's count
        self.channel = mesh.channels.register(ZONES, self._on_frame, self._peer_up, self._peer_down)
        self._gate = mesh.pong_gate

    def elsewhere(self) -> int:
        return sum(self.others.values())

    # -- the other workers: counting their own clients ---------------------------------------------------
    def client_changed(self, cid: int, conn: ClientConnection | None) -> None:
        """A SharedCounts watcher: a client arrived (a moved one has its name already) or left."""
        if conn is None:
            self.pinged.discard(cid)
            self.outside.discard(cid)
        else:
            self._look(conn)
        self._tell()

    def pong_gate(self, conn: ClientConnection) -> bool:
        """The server's `pong_gate`: at a client's first PING (after its CONNECT) its zone is known; a count
        told here goes out before the mesh decides whether the PONG waits for worker 0."""
        if conn.cid not in self.pinged:
            self.pinged.add(conn.cid)
            self._look(conn)
            self._tell()
        return self._gate(conn)

    def _look(self, conn: ClientConnection) -> None:
        if self.zones.outside(conn):
            self.outside.add(conn.cid)
        else:
            self.outside.discard(conn.cid)

    def _tell(self) -> None:
        n = len(self.outside)
        if n != self.told and self.channel.send("w0", b"%d" % n):
            self.told = n

    def _peer_up(self, peer: str) -> None:
        if peer == "w0":
            self.told = -1  # (worker 0 may have restarted)
            self._tell()

    # -- worker 0 ----------------------------------------------------------------------------------------
    def _on_frame(self, peer: str, payload: bytes) -> None:
        if payload.isdigit():
            self.others[peer] = int(payload)

    def _peer_down(self, peer: str) -> None:
        self.others.pop(peer, None)
