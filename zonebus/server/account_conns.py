"""An account's `max_connections` across a cluster: the servers tell each other their count, as nats-server.

Each server publishes, in the system account, `$SYS.ACCOUNT.<account>.SERVER.CONNS` and the older
`$SYS.SERVER.ACCOUNT.<account>.CONNS` (nats-server's `io.nats.server.advisory.v1.account_connections`:
`{server, acc, conns, ...}`; nats-server peers read them too) when the number of its clients
of an account with a `max_connections` limit changes, and again every `REFRESH` seconds (so that a server
that joins later learns it). Every server keeps the latest count of each other server, from zonebus and
nats-server peers alike, and a login is refused once the account's clients here plus those counts reach the
limit (zonebus.server.account_limits). A server's counts are forgotten when the route or gateway to it
closes. Worker processes of one server share its id: each says which worker it is (`zb_worker`, a field
nats-server ignores) and counts its siblings like other servers, so the limit holds for the whole server.

Two logins at the same moment on two servers may both be let in (each saw the other's count too late);
nats-server then closes the newest, zonebus keeps both.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from zonebus.server.accounts import Account
    from zonebus.server.system import SystemAccount

SUBJECT = "$SYS.ACCOUNT.{}.SERVER.CONNS"
OLD_SUBJECT = "$SYS.SERVER.ACCOUNT.{}.CONNS"  # (nats-server publishes and reads both)
REFRESH = 10.0  # seconds between two unprompted publications of a server's counts
ADVISORY = "io.nats.server.advisory.v1.account_connections"


class AccountConns:
    def __init__(self, system: SystemAccount) -> None:
        self.system = system
        self.server = system.server
        self.remote: dict[str, dict[tuple[str, int], int]] = {}  # account -> (server id, worker) -> its clients
        self._due: set[str] = set()
        self._subscribed = False
        self._timer: Any = None

    def limited(self) -> list[Account]:
        return [a for a in self.server.accounts.by_name.values() if a.limits.max_connections >= 0]

    def start(self) -> None:
        """(Again after a reload: accounts may have got a limit.)"""
        if self._subscribed or not self.limited():
            return
        self._subscribed = True
        self.system.client.subscribe(SUBJECT.format("*"), self._update)
        self._timer = self.server.loop.call_later(REFRESH, self._refresh)

    def others(self, account: Account) -> int:
        """The account's clients on the other servers, as they last said."""
        return sum(self.remote.get(account.display, {}).values())

    def changed(self, account: Account) -> None:
        """A client of `account` logged in or left here: tell the others (once per loop turn)."""
        if account.limits.max_connections < 0 or not self._subscribed:
            return
        if not self._due:
            self.server.loop.call_soon(self._publish_due)
        self._due.add(account.display)

    def peer_gone(self, server_id: str) -> None:
        for counts in self.remote.values():
            for key in [k for k in counts if k[0] == server_id]:
                del counts[key]

    def _publish_due(self) -> None:
        due, self._due = self._due, set()
        for name in sorted(due):
            self._publish(name)

    def _refresh(self) -> None:
        for account in self.limited():
            self._publish(account.display)
        self._timer = self.server.loop.call_later(REFRESH, self._refresh)

    def _publish(self, name: str) -> None:
        server = self.server
        conns = sum(1 for c in server.clients.values()
                    if c.account.display == name and c.connected and not c.closed)
        body = {"type": ADVISORY, **self.system.event_fields(), "acc": name, "name": name, "conns": conns,
                "leafnodes": 0, "total_conns": conns, "zb_worker": server.worker_index}
        data = json.dumps(body, separators=(",", ":")).encode()
        self.system.client.publish(SUBJECT.format(name), data)
        self.system.client.publish(OLD_SUBJECT.format(name), data)

    def _update(self, subject: str, reply: str | None, headers: bytes | None, payload: bytes) -> None:
        try:
            body = json.loads(payload)
            sid, name, conns = body["server"]["id"], body["acc"], int(body["conns"])
            key = (sid, int(body.get("zb_worker", 0)))
        except (ValueError, KeyError, TypeError):
            return
        if key == (self.server.server_id, self.server.worker_index):
            return  # our own
        if conns > 0:
            self.remote.setdefault(name, {})[key] = conns
        else:
            self.remote.get(name, {}).pop(key, None)
