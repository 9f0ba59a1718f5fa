"""The system account's events and requests, as nats-server serves them (`system_account`, default `$SYS`).

Events, published in the system account only while somebody there listens:
- `$SYS.ACCOUNT.<account>.CONNECT` / `.DISCONNECT`: `io.nats.server.advisory.v1.client_connect` /
  `client_disconnect`, with the server and the client (and for a disconnect its counts and the reason).
Requests a system-account user can make (each answered `{"server": {...}, "data": {...}}`):
- `$SYS.REQ.SERVER.PING.VARZ|CONNZ|SUBSZ` (every server answers) and `$SYS.REQ.SERVER.<id>.VARZ|...` (one);
- `$SYS.REQ.SERVER.PING` (`statsz`: connections, subscriptions, messages and bytes).
Owned by the event loop thread.
"""

from __future__ import annotations

import inspect
import json
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from zonebus import SERVER_VERSION
from zonebus.server.account_conns import AccountConns

if TYPE_CHECKING:
    from zonebus.server.client import ClientConnection
    from zonebus.server.server import Server

ADVISORY = "io.nats.server.advisory.v1."
PAGES = ("VARZ", "CONNZ", "SUBSZ")


def rfc3339(ts: float) -> str:
    """The nanosecond RFC 3339 time nats-server's events carry (monitor.rfc3339 is the pages' microsecond
    form, and importing it would load aiohttp on servers without monitoring)."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ts)) + f".{int(ts % 1 * 1e9):09d}Z"


class SystemAccount:
    def __init__(self, server: Server) -> None:
        from zonebus.server.internal import InternalClient

        self.server = server
        self.account = server.accounts.lookup(server.opts.system_account or "$SYS")
        self.client = InternalClient(server, "$SYS", self.account)
        self.seq = 0
        self.conns = AccountConns(self)  # account max_connections across the cluster

    def start(self) -> None:
        self.conns.start()
        if not self.server.system_requests:  # e.g. worker processes other than the first (zonebus.workers)
            return
        sid = self.server.server_id
        for page in PAGES:
            self.client.subscribe(f"$SYS.REQ.SERVER.PING.{page}", self._page_request)
            self.client.subscribe(f"$SYS.REQ.SERVER.{sid}.{page}", self._page_request)
        self.client.subscribe("$SYS.REQ.SERVER.PING", self._statsz_request)
        self.client.subscribe("$SYS.REQ.SERVER.PING.STATSZ", self._statsz_request)

    # -- events --------------------------------------------------------------------------------------
    def client_connected(self, conn: ClientConnection) -> None:
        self.conns.changed(conn.account)
        subject = f"$SYS.ACCOUNT.{conn.account.display}.CONNECT"
        if self._listened(subject):
            self._publish(subject, {"type": ADVISORY + "client_connect", **self._event(), "client": _client(conn)})

    def client_closed(self, conn: ClientConnection, reason: str = "Client Closed") -> None:
        self.conns.changed(conn.account)
        subject = f"$SYS.ACCOUNT.{conn.account.display}.DISCONNECT"
        if not self._listened(subject):
            return
        body = {"type": ADVISORY + "client_disconnect", **self._event(), "client": {**_client(conn), "stop":
                rfc3339(time.time())}, "sent": {"msgs": conn.out_msgs, "bytes": conn.out_bytes},
                "received": {"msgs": conn.in_msgs, "bytes": conn.in_bytes}, "reason": reason}
        self._publish(subject, body)

    def _listened(self, subject: str) -> bool:
        return bool(self.account.sublist.match(subject.encode()))

    def event_fields(self) -> dict[str, Any]:
        """`id`, `timestamp` and `server` of an event (zonebus.server.account_conns)."""
        return self._event()

    def _event(self) -> dict[str, Any]:
        import secrets  # (on demand: a server that never sends a system event needs no OpenSSL hashes)

        return {"id": secrets.token_urlsafe(16), "timestamp": rfc3339(time.time()), "server": self._server()}

    def _server(self) -> dict[str, Any]:
        server = self.server
        self.seq += 1
        return {"name": server.name, "host": server.opts.host, "id": server.server_id, "ver": SERVER_VERSION,
                "jetstream": bool(server.info_extras.get("jetstream")), "flags": 0, "seq": self.seq,
                "time": rfc3339(time.time())}

    def _publish(self, subject: str, body: dict[str, Any]) -> None:
        self.client.publish(subject, json.dumps(body, separators=(",", ":")).encode())

    # -- requests ------------------------------------------------------------------------------------
    def _page_request(self, subject: str, reply: str | None, headers: bytes | None, payload: bytes) -> None:
        if reply:
            page = subject.rsplit(".", 1)[1].lower()
            self._answer(reply, "data", page, lambda data: data)

    def _statsz_request(self, subject: str, reply: str | None, headers: bytes | None, payload: bytes) -> None:
        if reply:
            self._answer(reply, "statsz", "varz", self._statsz)

    def _answer(self, reply: str, key: str, page: str, shape: Callable[[Any], Any]) -> None:
        """Reply `{"server": ..., key: shape(<page>)}`: the page from an extension's builder when there is one
        (zonebus.workers: every worker's, summed; it may be awaitable), else this process's own."""
        server = self.server
        build = server.pages.get("/" + page)
        if build is not None:
            data = build({})
        else:
            from zonebus.server import monitor

            data = getattr(monitor, page)(server)
        if inspect.isawaitable(data):
            server.loop.create_task(self._answer_later(reply, key, data, shape))
        else:
            self._publish(reply, {"server": self._server(), key: shape(data)})

    async def _answer_later(self, reply: str, key: str, pending: Any, shape: Callable[[Any], Any]) -> None:
        self._publish(reply, {"server": self._server(), key: shape(await pending)})

    def _statsz(self, varz: dict[str, Any]) -> dict[str, Any]:
        """nats-server's `statsz`, from a /varz document."""
        server = self.server
        return {
            "start": rfc3339(server.start_time), "connections": varz.get("connections", 0),
            "total_connections": varz.get("total_connections", 0),
            "active_accounts": len({c.account.name for c in server.clients.values()}),
            "subscriptions": varz.get("subscriptions", 0),
            "sent": {"msgs": varz.get("out_msgs", 0), "bytes": varz.get("out_bytes", 0)},
            "received": {"msgs": varz.get("in_msgs", 0), "bytes": varz.get("in_bytes", 0)},
            "slow_consumers": varz.get("slow_consumers", 0),
        }


def _client(conn: ClientConnection) -> dict[str, Any]:
    out: dict[str, Any] = {"start": rfc3339(conn.start), "host": conn.ip, "id": conn.cid, "acc": conn.account.display}
    if conn.auth_user:
        out["user"] = conn.auth_user
    for key, value in (("name", conn.name), ("lang", conn.lang), ("ver", conn.version)):
        if value:
            out[key] = value
    out.update({"name_tag": conn.account.display, "kind": "Client", "client_type": "nats"})
    return out
