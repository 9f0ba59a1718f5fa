"""JetStream on every worker: a server of several worker processes (`zonebus.workers`) spreads its streams.

Each worker runs its own `JetStreamService` (one per account with JetStream), and each stream lives on one of
them, its *owner*: its store, its consumers, its subscriptions (the stream's subjects, its acks, flow control,
pull requests and direct gets), so a stream's publishes and deliveries take only its owner's core, and K
streams take every core. The owner is chosen when the stream is created: the live worker with the fewest
streams, ties broken by a hash of the name (so one server's first streams alternate over the workers); it is
written beside the stream (`<stream dir>/worker`), and a restart (of the server, or of one worker) brings the
stream back on the same worker (on the name's hash when that worker no longer exists, or for a stream written
before).

Worker 0 is the API's front: it alone subscribes the API (`FRONT_SUBJECTS`: all of `$JS.API.` but pull requests
and direct gets, which each owner subscribes per stream, so that a pull request reaches one worker and its client
can move there, zonebus.workers.migrate). A request about a stream another worker owns is passed to the owner on
this module's local link channel (`jss.<account>`), and the owner answers the client directly; a request for a
stream of a worker that is down gets JetStream's 503 "temporarily unavailable" (never "not found": creating it
again would overwrite what the owner keeps). `$JS.API.INFO` and `STREAM.LIST` gather every worker's part;
`STREAM.NAMES`, the subject overlap check, `max_streams` and the reserved bytes read the catalog: every worker
tells the others its streams (name, owner, config) when one is created, updated or deleted, before it answers
the request that changed it, and all of them when a link comes up (`s`, answered `S`); the front holds API
requests until every live worker's have come.

A worker that dies (kill -9) leaves its file streams to the live ones: the lowest live worker shares them out,
and the new owner takes the directory's lock (`flock`, which the dead process no longer holds) and serves the
stream from its files; memory streams die with their worker, as with nats-server. The supervisor's restart of
the dead worker finds them owned and locked elsewhere. While worker 0 (the front) is down, the API does not
answer (its streams are served on, by another worker, from the moment it died).

Streams that source (`mirror`, `sources`) read their origins in process (`zonebus.stream.sources`): they live on
worker 0, and so do their origins. Before worker 0 creates one, an origin that another worker owns moves to
worker 0 (the owner closes it and hands over its directory); a memory stream cannot move (its messages are in
the owner's memory) and stays unreachable to the sourcing stream. Streams that allow atomic batches live on
worker 0 too: the server's in-flight batch limit is counted there.
Owned by the event loop thread.
"""

from __future__ import annotations

import asyncio
import fcntl
import hashlib
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from zonebus.protocol.jserrors import JSError

if TYPE_CHECKING:
    from zonebus.link.channels import Channel, LinkChannels
    from zonebus.stream.service import JetStreamService
    from zonebus.stream.stream import Stream

log = logging.getLogger(__name__)

FRONT = 0  # the worker that subscribes the API and passes requests on
OWNER_FILE = "worker"  # in a stream's directory: the index of the worker that owns it
LOCK_FILE = "lock"  # in a stream's directory: its owner holds an exclusive flock on it while it serves it
ASK_TIMEOUT = 2.0  # seconds the front waits for a worker's part of INFO or STREAM.LIST
API = "$JS.API."
_NAME_AT = {  # API subject (after `$JS.API.`) -> the token that names the stream
    ("STREAM", "CREATE"): 2, ("STREAM", "UPDATE"): 2, ("STREAM", "INFO"): 2, ("STREAM", "DELETE"): 2,
    ("STREAM", "PURGE"): 2, ("STREAM", "MSG"): 3, ("STREAM", "SNAPSHOT"): 2, ("STREAM", "RESTORE"): 2,
    ("STREAM", "LEADER"): 3, ("CONSUMER", "CREATE"): 2, ("CONSUMER", "DURABLE"): 3, ("CONSUMER", "NAMES"): 2,
    ("CONSUMER", "LIST"): 2, ("CONSUMER", "INFO"): 2, ("CONSUMER", "DELETE"): 2, ("CONSUMER", "PAUSE"): 2,
    ("CONSUMER", "UNPIN"): 2, ("CONSUMER", "MSG"): 3, ("CONSUMER", "LEADER"): 3, ("DIRECT", "GET"): 2,
}
# The front's API subscriptions: every API subject but pull requests and direct gets, which each stream's owner
# subscribes itself (a pull request then goes to one worker only, and its client can move there)
FRONT_SUBJECTS = (API + "INFO", API + "STREAM.>", API + "ACCOUNT.>", API + "META.>", API + "SERVER.>",
                  *(f"{API}CONSUMER.{op}.>" for op in ("CREATE", "DURABLE", "NAMES", "LIST", "INFO", "DELETE",
                                                       "PAUSE", "UNPIN", "LEADER")))
UNAVAILABLE = {"code": 503, "err_code": 10008, "description": "JetStream system temporarily unavailable"}


@dataclass(frozen=True)
class WorkerShards:
    """What JetStream is told of the worker processes (`zonebus.workers` sets it before the node starts)."""

    channels: LinkChannels  # the local links' channels
    index: int  # this worker
    count: int  # of how many


def stream_of(subject: str) -> tuple[str | None, tuple[str, str]]:
    """The stream an API subject is about (None: none, e.g. `$JS.API.INFO`), and its first two tokens."""
    toks = subject[len(API):].split(".")
    head = (toks[0], toks[1]) if len(toks) > 1 else (toks[0], "")
    at = _NAME_AT.get(head)
    if at is None or len(toks) <= at or not toks[at]:
        return None, head
    return toks[at], head


def rank(name: str, worker: int) -> bytes:
    """Rendezvous hash of a stream name on a worker: the highest among candidates wins a tie."""
    return hashlib.blake2b(f"{worker}/{name}".encode(), digest_size=8).digest()


def origins(cfg: dict[str, Any]) -> list[str]:
    """The streams a config sources from (its mirror's and its sources' names)."""
    names = [cfg["mirror"]["name"]] if isinstance(cfg.get("mirror"), dict) and cfg["mirror"].get("name") else []
    names += [s["name"] for s in cfg.get("sources") or () if isinstance(s, dict) and s.get("name")]
    return names


class StreamShards:
    """One account's JetStream spread over `count` workers; this is worker `index`'s part."""

    def __init__(self, svc: JetStreamService, channels: LinkChannels, index: int, count: int) -> None:
        self.svc = svc
        self.index = index
        self.count = count
        self.front = index == FRONT
        self.catalog: dict[str, tuple[int, dict[str, Any]]] = {}  # another worker's stream -> (owner, config)
        self.live: set[int] = set()  # the other workers whose link is up
        self.leaving: set[int] = set()  # workers that said they stop (their streams are not taken over)
        self._asks: dict[int, tuple[asyncio.Future, list[Any]]] = {}
        self._next = 0
        self.forwarded = 0  # API requests passed to another worker
        self.moved_in = self.moved_out = 0
        self.taken_over = 0  # streams taken over from a worker that died
        self._heard: set[int] = set()  # the live workers whose streams came since their link came up
        self._held: list[tuple[str, str | None, bytes]] = []  # API requests that wait for those
        self._hold_timer: asyncio.TimerHandle | None = None
        self._arrivals: dict[str, asyncio.Future] = {}  # origins on their way to the front
        self._locks: dict[str, int] = {}  # stream -> the descriptor of its directory's lock, held while served
        self.channel: Channel = None  # type: ignore[assignment]  # (set below; links already up are told at once)
        self.channel = channels.register(f"jss.{svc.account or '$G'}", self._frame, self._peer_up,
                                                  self._peer_down)
        for worker in self.live:  # (links that were up before: their `s` may have come before the channel was)
            self.channel.send(f"w{worker}", self._snapshot())

    # -- placement -----------------------------------------------------------------------------------
    def owner_of_dir(self, d: Path) -> int:
        """The worker that takes a stream directory at start: the one written beside it, else the name's hash."""
        try:
            owner = int((d / OWNER_FILE).read_text().strip())
        except (OSError, ValueError):
            owner = -1
        if 0 <= owner < self.count:
            return owner
        return max(range(self.count), key=lambda w: rank(d.name, w))

    def claim(self, d: Path) -> bool:
        """Lock a stream directory for this worker (an exclusive flock, released when the process dies): False
        when another worker serves it. Two processes never write one stream, whatever the timing of a restart."""
        if d.name in self._locks:
            return True
        try:
            fd = os.open(d / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return False
        self._locks[d.name] = fd
        return True

    def unclaim(self, name: str) -> None:
        fd = self._locks.pop(name, None)
        if fd is not None:
            os.close(fd)

    def _place(self, name: str, cfg: dict[str, Any] | None) -> int:
        """The worker a new stream goes to (decided by the front)."""
        if cfg is not None and (origins(cfg) or cfg.get("allow_atomic")):
            return FRONT  # (a stream that sources reads its origins in process; atomic batches count per server)
        if any(name in origins(c) for c in self._configs(local=True)):
            return FRONT  # the origin of a stream that sources: beside it
        return _least_loaded(name, self._loads())

    def _loads(self) -> dict[int, int]:
        """The streams of each live worker (this one's included)."""
        load = {w: 0 for w in (self.index, *self.live)}
        for owner, _ in self.catalog.values():
            if owner in load:
                load[owner] += 1
        load[self.index] = len(self.svc.streams)
        return load

    def _configs(self, local: bool) -> list[dict[str, Any]]:
        out = [c for _, c in self.catalog.values()]
        if local:
            out += [s.cfg for s in self.svc.streams.values()]
        return out

    # -- the catalog ---------------------------------------------------------------------------------
    def foreign_configs(self) -> dict[str, dict[str, Any]]:
        """The streams other workers own: name -> config."""
        return {name: cfg for name, (_, cfg) in self.catalog.items()}

    def created(self, stream: Stream) -> None:
        """A stream this worker now owns (created, recovered, updated or moved in): written beside it, told."""
        if stream.dir is not None:
            self.claim(stream.dir)
            try:
                (stream.dir / OWNER_FILE).write_text(str(self.index))
            except OSError as exc:
                log.warning("JetStream: could not write the owner of stream %s: %s", stream.name, exc)
        self.channel.broadcast(b"a " + json.dumps([stream.name, stream.cfg]).encode())

    def stopping(self) -> None:
        """This worker stops (the server shuts down): the others must not take its streams over."""
        self.channel.broadcast(b"x")

    def gone(self, name: str) -> None:
        """A stream this worker no longer serves (deleted, or moved away)."""
        self.unclaim(name)
        self.channel.broadcast(b"g " + name.encode())

    def _snapshot(self, op: bytes = b"s") -> bytes:
        """Every stream of this worker (`s`: and the peer answers with its own, `S`)."""
        return op + b" " + json.dumps([[s.name, s.cfg] for s in self.svc.streams.values()]).encode()

    # -- the front -----------------------------------------------------------------------------------
    def route(self, subject: str, reply: str | None, payload: bytes) -> bool:
        """The front's look at an API request: True when it was passed on (or answered) here, False when the
        local service answers it."""
        if not self.front:
            return False
        if self.live - self._heard:  # a worker's streams are not known yet (it, or this one, just started)
            if not self._held:
                self._hold_timer = self.svc.loop.call_later(ASK_TIMEOUT, self._release_held, True)
            self._held.append((subject, reply, payload))
            return True
        name, head = stream_of(subject)
        if name is None:
            if subject in (API + "INFO", API + "STREAM.LIST") and self.live and reply:
                self.svc.loop.create_task(self._gathered(subject, reply, payload))
                return True
            return False
        entry = self.catalog.get(name)
        if name in self.svc.streams or entry is None:
            if head not in (("STREAM", "CREATE"), ("STREAM", "UPDATE")) or not self.live:
                return False
            cfg = _config_of(payload)
            placed = self._place(name, cfg) if name not in self.svc.streams else self.index
            if placed != self.index:
                owner = placed
            else:  # a stream that sources, here: its origins come first, then the answer
                away = [o for o in origins(cfg or {}) if o in self.catalog and self.catalog[o][0] in self.live]
                if not away:
                    return False
                self.svc.loop.create_task(self._with_origins(away, subject, reply, payload))
                return True
        else:
            owner = entry[0]
            cfg = _config_of(payload) if head == ("STREAM", "UPDATE") and owner in self.live else None
            if cfg is not None and (origins(cfg) or cfg.get("allow_atomic")):  # it comes here, with its origins
                away = [name, *(o for o in origins(cfg) if o in self.catalog and self.catalog[o][0] in self.live)]
                self.svc.loop.create_task(self._with_origins(away, subject, reply, payload))
                return True
        if owner not in self.live:
            if reply:
                self.svc.send(reply, json.dumps({"error": UNAVAILABLE}).encode())
            return True
        self.forwarded += 1
        self.channel.send(f"w{owner}", b"f %b %b\n%b" % (subject.encode(), (reply or "-").encode(), payload))
        return True

    def _release_held(self, timed_out: bool = False) -> None:
        if self._hold_timer is not None:
            self._hold_timer.cancel()
            self._hold_timer = None
        if timed_out:
            self._heard |= self.live  # (a worker that never told its streams: answered without them)
        held, self._held = self._held, []
        for subject, reply, payload in held:
            self.svc.api_request(subject, reply, payload)

    async def _gathered(self, subject: str, reply: str, payload: bytes) -> None:
        kind = "info" if subject.endswith(".INFO") else "list"
        parts = await self._ask(kind, payload)
        api = self.svc.api
        if kind == "info":
            resp = api.handle(subject, payload) or {}
            if "error" not in resp:
                for part in parts:
                    for key in ("memory", "storage", "reserved_memory", "reserved_storage", "streams", "consumers"):
                        resp[key] = resp.get(key, 0) + int(part.get(key, 0))
        else:
            resp = api.stream_list_of(payload, [info for part in parts for info in part])
        self.svc.send(reply, json.dumps(resp, separators=(",", ":")).encode())

    async def _ask(self, kind: str, payload: bytes) -> list[Any]:
        answers: list[Any] = []
        waits = []
        for worker in sorted(self.live):
            self._next += 1
            fut = self.svc.loop.create_future()
            self._asks[self._next] = (fut, answers)
            if self.channel.send(f"w{worker}", b"q %d %b %b" % (self._next, kind.encode(), payload)):
                waits.append(fut)
            else:
                self._asks.pop(self._next, None)
        if waits:
            await asyncio.wait(waits, timeout=ASK_TIMEOUT)
        for token in [t for t, (f, _) in self._asks.items() if f in waits]:
            self._asks.pop(token, None)
        return answers

    def _part(self, kind: str, payload: bytes) -> Any:
        """This worker's part of a gathered answer."""
        api = self.svc.api
        if kind == "info":
            return api.account_info(b"")
        try:
            return api.local_stream_infos(payload)
        except JSError:
            return []

    # -- moves: an origin of a sourcing stream goes to the front ---------------------------------------
    async def _with_origins(self, away: list[str], subject: str, reply: str | None, payload: bytes) -> None:
        """A stream that sources is created (or updated) here once the origins other workers own are here too
        (a publish the client sends after the answer then finds its origin where the stream reads it)."""
        waits = []
        for name in away:
            fut = self._arrivals.get(name)
            if fut is None:
                fut = self._arrivals[name] = self.svc.loop.create_future()
                self.channel.send(f"w{self.catalog[name][0]}", b"m " + name.encode())
            waits.append(fut)
        await asyncio.wait(waits, timeout=ASK_TIMEOUT)
        for name in away:
            self._arrivals.pop(name, None)
        self.svc.serve_api(subject, reply, payload)

    def _arrived(self, name: str) -> None:
        fut = self._arrivals.pop(name, None)
        if fut is not None and not fut.done():
            fut.set_result(None)

    def _move_out(self, name: str) -> None:
        stream = self.svc.streams.get(name)
        if stream is None or stream.dir is None:
            if stream is not None:
                log.warning("JetStream: memory stream %s cannot move to worker %d (a stream there sources it)",
                            name, FRONT)
            self.channel.send(f"w{FRONT}", b"n " + name.encode())  # (not coming: the front stops waiting)
            return
        d = stream.dir
        self.svc.release(name)
        try:
            (d / OWNER_FILE).write_text(str(FRONT))
        except OSError:
            pass
        self.moved_out += 1
        self.gone(name)
        self.channel.send(f"w{FRONT}", b"t " + name.encode())

    def _move_in(self, name: str) -> bool:
        """Serve a file stream another worker handed over (or left behind when it died)."""
        if name in self.svc.streams or not self.claim(self.svc.root / name):
            self._arrived(name)
            return False
        stream = self.svc.adopt_dir(name)
        if stream is None:
            self.unclaim(name)
            self._arrived(name)
            return False
        self.moved_in += 1
        self.catalog.pop(name, None)
        self.created(stream)
        self._arrived(name)
        return True

    # -- a worker died: its file streams go to the live ones -------------------------------------------
    def _take_over(self, dead: int) -> None:
        """The lowest live worker shares a dead worker's file streams out over the live ones (the least loaded
        first; the front's, which may source from each other, all to one worker); its memory streams died with
        it. The restarted worker finds them locked and owned elsewhere, and leaves them."""
        theirs = sorted(n for n, (w, _) in self.catalog.items() if w == dead)
        for name in [n for n in theirs if self.catalog[n][1].get("storage") == "memory"]:
            del self.catalog[name]
        if min((self.index, *self.live)) != self.index:
            return  # another worker decides
        load = self._loads()
        together = None
        for name in theirs:
            if name not in self.catalog:
                continue
            to = together if together is not None else _least_loaded(name, load)
            if dead == FRONT:
                together = to
            load[to] += 1
            if to == self.index:
                if self._move_in(name):
                    self.taken_over += 1
            else:
                self.catalog[name] = (to, self.catalog[name][1])
                self.channel.send(f"w{to}", b"t " + name.encode())

    # -- the channel ---------------------------------------------------------------------------------
    def _peer_up(self, peer: str) -> None:
        worker = _index(peer)
        if worker is None:
            return
        self.live.add(worker)
        self.leaving.discard(worker)
        self._heard.discard(worker)
        if self.channel is not None:
            self.channel.send(peer, self._snapshot())

    def _peer_down(self, peer: str) -> None:
        worker = _index(peer)
        if worker is not None:
            self.live.discard(worker)
            self._heard.discard(worker)
            if worker not in self.leaving and self.svc.started:  # (a worker that died, not one that stopped)
                self._take_over(worker)
            self.leaving.discard(worker)

    def _frame(self, peer: str, payload: bytes) -> None:
        worker = _index(peer)
        if worker is None:
            return
        op, _, body = payload.partition(b" ")
        try:
            if op == b"f":
                line, _, data = body.partition(b"\n")
                subject, reply = line.decode().split(" ", 1)
                self.svc.serve_api(subject, None if reply == "-" else reply, data)
            elif op == b"a":
                name, cfg = json.loads(body)
                self.catalog[name] = (worker, cfg)
            elif op == b"g":
                name = body.decode()
                if self.catalog.get(name, (None,))[0] == worker:
                    del self.catalog[name]
            elif op in (b"s", b"S"):
                for name in [n for n, (w, _) in self.catalog.items() if w == worker]:
                    del self.catalog[name]
                for name, cfg in json.loads(body):
                    self.catalog[name] = (worker, cfg)
                if op == b"s":  # (its own may have come before this channel was registered here)
                    self.channel.send(peer, self._snapshot(b"S"))
                self._heard.add(worker)
                if self._held and not self.live - self._heard:
                    self._release_held()
            elif op == b"q":
                token, kind, data = body.split(b" ", 2)
                part = self._part(kind.decode(), data)
                self.channel.send(peer, b"r %b %b" % (token, json.dumps(part).encode()))
            elif op == b"r":
                token, data = body.split(b" ", 1)
                pending = self._asks.pop(int(token), None)
                if pending is not None:
                    fut, answers = pending
                    answers.append(json.loads(data))
                    if not fut.done():
                        fut.set_result(None)
            elif op == b"m":
                self._move_out(body.decode())
            elif op == b"t":
                self._move_in(body.decode())
            elif op == b"n":
                self._arrived(body.decode())
            elif op == b"x":
                self.leaving.add(worker)
        except (ValueError, TypeError, UnicodeDecodeError):
            log.warning("JetStream: a bad %r frame from worker %d", op, worker)


def _least_loaded(name: str, load: dict[int, int]) -> int:
    """The worker with the fewest streams; a tie goes to the highest rank of the name."""
    return min(load, key=lambda w: (load[w], [-b for b in rank(name, w)]))


def _index(peer: str) -> int | None:
    return int(peer[1:]) if peer[:1] == "w" and peer[1:].isdigit() else None


def _config_of(payload: bytes) -> dict[str, Any] | None:
    try:
        cfg = json.loads(payload)
    except ValueError:
        return None
    return cfg if isinstance(cfg, dict) else None
