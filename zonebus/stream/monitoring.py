"""`/jsz` and the `jetstream` section of `/varz`, with nats-server's field names (data builders only).

`JetStreamMonitor` reads the JetStream service this server runs (its streams, consumers and API counters)
and answers as nats-server does: `/jsz` with the server totals, `?accounts=1` (the one account `$G`),
`?streams=1` (implies accounts), `?consumers=1` (implies streams), `?config=1`, `?acc=`, `?offset=`/`?limit=`
(over accounts), `?leader-only=1`, `?raft=1`; without JetStream, `disabled: true` with zeroed totals. A
query parameter nats-server could not parse is a 400 (`MonitorQueryError`).

The clustered case plugs in two providers, read on every request:
- `meta_cluster() -> {name, leader, peer, replicas: [...], cluster_size} | None`: the meta group as this
  server sees it (None while it is not formed). It becomes `/jsz`'s `meta_cluster` and `/varz`'s
  `jetstream.meta`, decides `?leader-only=1` (this server answers only if it is the meta leader) and labels
  the Prometheus series;
- `stream_cluster(stream) -> {name, leader, replicas: [...]} | None`: a stream's `cluster` block (else the
  stream's own StreamInfo `cluster`, on a lone server `{leader: <this server>}`). `?raft=1` counts the streams
  whose leader is this server.
Runs on the event loop thread, like the service it reads.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from zonebus.server.monitor import MonitorQueryError, decode_bool, decode_int, rfc3339

if TYPE_CHECKING:
    from zonebus.server.server import Server
    from zonebus.stream.service import JetStreamService
    from zonebus.stream.stream import Stream

ACCOUNT = "$G"
UINT64_MAX = 2**64 - 1  # nats-server's reserved_memory/_storage of an account without a reservation
DEFAULT_LIMIT = 1024

MetaClusterProvider = Callable[[], "dict[str, Any] | None"]
StreamClusterProvider = Callable[["Stream"], "dict[str, Any] | None"]


def default_max_memory() -> int:
    """nats-server's default `max_memory`: three quarters of the machine's memory."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") * 3 // 4
    except (ValueError, OSError, AttributeError):
        return 0


def default_max_storage(store_dir: str) -> int:
    """nats-server's default `max_storage`: three quarters of the disk space free where the store lives."""
    try:
        return shutil.disk_usage(store_dir or ".").free * 3 // 4
    except OSError:
        return 0


class JetStreamMonitor:
    def __init__(self, server: Server, service: Callable[[], JetStreamService | None] | None,
                 meta_cluster: MetaClusterProvider | None = None,
                 stream_cluster: StreamClusterProvider | None = None) -> None:
        self.server = server
        self.service = service
        self.meta_cluster = meta_cluster
        self.stream_cluster = stream_cluster
        self._defaults: tuple[int, int] | None = None  # max_memory, max_storage when not configured

    # -- pieces ----------------------------------------------------------------------------------------
    def _svc(self) -> JetStreamService | None:
        svc = self.service() if self.service is not None else None
        return svc if svc is not None and getattr(svc, "started", True) else None

    def _meta(self) -> dict[str, Any] | None:
        return self.meta_cluster() if self.meta_cluster is not None else None

    def config(self, svc: JetStreamService) -> dict[str, Any]:
        opts = svc.opts
        if self._defaults is None:
            self._defaults = (default_max_memory(), default_max_storage(opts.store_dir))
        out: dict[str, Any] = {
            "max_memory": opts.max_memory_store if opts.max_memory_store > 0 else self._defaults[0],
            "max_storage": opts.max_file_store if opts.max_file_store > 0 else self._defaults[1],
            "store_dir": os.path.join(opts.store_dir, "jetstream"),
            "sync_interval": int(opts.sync_interval * 1e9),
        }
        if opts.domain:
            out["domain"] = opts.domain
        if opts.sync_always:
            out["sync_always"] = True
        out["strict"] = True
        return out

    @staticmethod
    def _usage(svc: JetStreamService) -> tuple[int, int]:
        memory = storage = 0
        for stream in svc.streams.values():
            size = stream.store.state().bytes
            if stream.cfg.get("storage") == "memory":
                memory += size
            else:
                storage += size
        return memory, storage

    def stats(self, svc: JetStreamService, ha_assets: int = 0) -> dict[str, Any]:
        """nats-server's JetStreamStats of the server: usage, the one account, API counters."""
        memory, storage = self._usage(svc)
        api = svc.api
        level = int(api.account_info(b"").get("api", {}).get("level", 0))
        return {"memory": memory, "storage": storage, "reserved_memory": 0, "reserved_storage": 0,
                "accounts": 1, "ha_assets": ha_assets,
                "api": {"level": level, "total": api.total, "errors": api.errors}}

    def _cluster_of(self, stream: Stream, info: Mapping[str, Any]) -> dict[str, Any]:
        cluster = self.stream_cluster(stream) if self.stream_cluster is not None else None
        return cluster or info.get("cluster") or {"leader": self.server.name}

    def stream_detail(self, stream: Stream, consumers: bool, config: bool) -> dict[str, Any]:
        info = stream.info()
        detail: dict[str, Any] = {"name": stream.name, "created": info["created"],
                                  "cluster": self._cluster_of(stream, info)}
        if config:
            detail["config"] = info["config"]
        detail["state"] = info["state"]
        if consumers and stream.consumers:
            cdetail = []
            for name in sorted(stream.consumers):
                cinfo = stream.consumers[name].info()
                if not config:
                    cinfo.pop("config", None)
                cdetail.append(cinfo)
            detail["consumer_detail"] = cdetail
        return detail

    def account_detail(self, svc: JetStreamService, streams: bool, consumers: bool, config: bool) -> dict[str, Any]:
        memory, storage = self._usage(svc)
        opts = svc.opts
        out: dict[str, Any] = {
            "name": ACCOUNT, "id": ACCOUNT, "memory": memory, "storage": storage,
            "reserved_memory": opts.max_memory_store if opts.max_memory_store > 0 else UINT64_MAX,
            "reserved_storage": opts.max_file_store if opts.max_file_store > 0 else UINT64_MAX,
            "accounts": 0, "ha_assets": 0,
            "api": {"level": 0, "total": svc.api.total, "errors": svc.api.errors},
        }
        if streams and svc.streams:
            out["stream_detail"] = [self.stream_detail(svc.streams[n], consumers, config) for n in sorted(svc.streams)]
        return out

    def _leads(self, stream: Stream) -> bool:
        return self._cluster_of(stream, stream.info()).get("leader", self.server.name) == self.server.name

    # -- /jsz ------------------------------------------------------------------------------------------
    def jsz(self, accounts: bool = False, streams: bool = False, consumers: bool = False, config: bool = False,
            acc: str = "", offset: int = 0, limit: int = 0, leader_only: bool = False,
            raft: bool = False) -> dict[str, Any]:
        server = self.server
        streams = streams or consumers
        accounts = accounts or streams
        limit = limit or DEFAULT_LIMIT
        svc = self._svc()
        if svc is None:
            if leader_only:
                raise MonitorQueryError("JetStream: not leader")
            return {"memory": 0, "storage": 0, "reserved_memory": 0, "reserved_storage": 0, "accounts": 0,
                    "ha_assets": 0, "api": {"level": 0, "total": 0, "errors": 0}, "server_id": server.server_id,
                    "now": rfc3339(time.time()), "disabled": True, "config": {"max_memory": 0, "max_storage": 0},
                    "streams": 0, "consumers": 0, "messages": 0, "bytes": 0, "total": 0}
        meta = self._meta()
        if leader_only and meta is not None and meta.get("leader") != server.name:
            raise MonitorQueryError("JetStream: not leader")
        all_streams = list(svc.streams.values())
        states = [s.store.state() for s in all_streams]
        out: dict[str, Any] = self.stats(svc)
        out["server_id"] = server.server_id
        out["now"] = rfc3339(time.time())
        out["config"] = self.config(svc)
        out["limits"] = {}
        out["streams"] = len(all_streams)
        if raft:
            out["streams_leader"] = sum(1 for s in all_streams if self._leads(s))
        out["consumers"] = sum(len(s.consumers) for s in all_streams)
        if raft:
            out["consumers_leader"] = sum(len(s.consumers) for s in all_streams if self._leads(s))
        out["messages"] = sum(st.msgs for st in states)
        out["bytes"] = sum(st.bytes for st in states)
        if meta is not None:
            out["meta_cluster"] = meta
        names = [ACCOUNT]  # the accounts with JetStream: zonebus serves one
        shown = names if acc == ACCOUNT else [] if acc else names[offset:offset + limit] if accounts else []
        if shown:
            out["account_details"] = [self.account_detail(svc, streams, consumers, config) for _ in shown]
        out["total"] = len(names)
        return out

    def page(self, query: Mapping[str, str]) -> dict[str, Any]:
        """`/jsz`, from its query parameters (nats-server's names and parsing)."""
        return self.jsz(accounts=decode_bool(query, "accounts"), streams=decode_bool(query, "streams"),
                        consumers=decode_bool(query, "consumers"), config=decode_bool(query, "config"),
                        acc=query.get("acc", ""), offset=max(decode_int(query, "offset"), 0),
                        limit=decode_int(query, "limit"), leader_only=decode_bool(query, "leader-only"),
                        raft=decode_bool(query, "raft"))

    # -- /varz -----------------------------------------------------------------------------------------
    def varz(self) -> dict[str, Any]:
        """The `jetstream` section of `/varz`: `{}` without JetStream, as nats-server."""
        svc = self._svc()
        if svc is None:
            return {}
        out: dict[str, Any] = {"config": self.config(svc), "stats": self.stats(svc), "limits": {}}
        meta = self._meta()
        if meta is not None:
            out["meta"] = meta
        return out


def merge_jsz(page: dict[str, Any], parts: list[dict[str, Any]]) -> dict[str, Any]:
    """`/jsz` of a server of several workers, each serving its share of the streams (zonebus.stream.shards):
    worker 0's page with the other workers' usage, counts and stream details added."""
    for part in parts:
        for key in ("memory", "storage", "streams", "consumers", "messages", "bytes", "streams_leader",
                    "consumers_leader"):
            if key in page:
                page[key] += part.get(key, 0)
        for key in ("total", "errors"):
            if "api" in page:
                page["api"][key] = page["api"].get(key, 0) + part.get("api", {}).get(key, 0)
        mine = {a["name"]: a for a in page.get("account_details", ())}
        for detail in part.get("account_details", ()):
            acc = mine.get(detail["name"])
            if acc is None:
                continue
            acc["memory"] += detail.get("memory", 0)
            acc["storage"] += detail.get("storage", 0)
            if detail.get("stream_detail"):
                acc["stream_detail"] = sorted([*acc.get("stream_detail", ()), *detail["stream_detail"]],
                                              key=lambda d: d["name"])
    return page

