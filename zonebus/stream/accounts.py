"""JetStream per account (zonebus.server.accounts), on a lone server and in a cluster.

When accounts enable JetStream (`accounts { A: { jetstream: enabled } }`, or with limits), each of them gets a
`JetStreamService` of its own (in a cluster a `ClusteredJetStream`, with a meta group of its own on the routes'
`meta.<account>` channel and its shared streams under `<shared_store>/accounts/<account>`): an internal client
in that account subscribes its `$JS.API.>`, its streams capture that account's subjects only, and its store
is `<store_dir>/jetstream/<account>/streams`, as nats-server lays it out. A stream of A is invisible to B.
The global account keeps JetStream (and its `<store_dir>/jetstream/streams`) only while no account enables
it, as in nats-server. Accounts without JetStream get nats-server's answer to every API request: error
10039, "JetStream not enabled for account".
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from zonebus.stream.api import PREFIX, JSApi

if TYPE_CHECKING:
    from zonebus.options import AccountJetStream, ServerOptions
    from zonebus.server.accounts import Account
    from zonebus.server.server import Server

NOT_ENABLED = {"code": 503, "err_code": 10039, "description": "JetStream not enabled for account"}


def jetstream_accounts(opts: ServerOptions) -> dict[str, AccountJetStream | None]:
    """account name ("" = the global account) -> its limits (None = unlimited), for every account that has
    JetStream."""
    enabled = {a.name: a.jetstream for a in opts.accounts if a.jetstream is not None}
    return enabled or {"": None}


def start_not_enabled(server: Server, enabled: set[str]) -> None:
    """The "not enabled" answer for every account of `server` whose name is not in `enabled` ("" = $G)."""
    for acc in server.accounts.by_name.values():
        if ("" if acc is server.global_account else acc.display) not in enabled:
            NotEnabled(server, acc).start()  # kept by its subscription


class NotEnabledAnswers:
    """An extension (`zonebus.server.hooks`): the "not enabled" answer for every account not in `enabled`
    (names, "" = the global account), next to clustered JetStream."""

    def __init__(self, server: Server, enabled: set[str]) -> None:
        self.server = server
        self.enabled = enabled

    async def start(self) -> None:
        start_not_enabled(self.server, self.enabled)

    async def stop(self) -> None:
        pass


class NotEnabled:
    """Answers the `$JS.API.` requests of one account without JetStream."""

    def __init__(self, server: Server, account: Account) -> None:
        from zonebus.server.internal import InternalClient

        self.client = InternalClient(server, f"$JS-off-{account.display}", account)
        self._kinds = JSApi(None)  # type: ignore[arg-type]  # only its routing table is used

    def start(self) -> None:
        self.client.subscribe("$JS.API.>", self._on_api)

    def _on_api(self, subject: str, reply: str | None, headers: bytes | None, payload: bytes) -> None:
        route = self._kinds._route(subject.split(".")[2:])
        if route is None or not reply:
            return
        body = {"type": PREFIX + route[0], "error": NOT_ENABLED}
        self.client.publish(reply, json.dumps(body, separators=(",", ":")).encode())
