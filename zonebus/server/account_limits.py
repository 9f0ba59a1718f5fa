"""An account's `limits {}` applied to its clients, as nats-server applies them.

    accounts { A: { users: [...], limits { max_connections: 10, max_subscriptions: 100, max_payload: 4KB } } }

At a client's login (its CONNECT, once the user is known and with it the account):

- `max_connections`: when the account already has that many logged-in clients on this server, the client
  gets `-ERR 'maximum account active connections exceeded'` and is closed (0 refuses everybody);
- `max_payload`: the client's limit is the smaller of the server's and the account's; a larger PUB/HPUB gets
  `-ERR 'Maximum Payload Violation'` and a close, as with the server's own `max_payload`;
- `max_subscriptions`: the smaller of the server's and the account's, per connection (nats-server counts
  them per connection too); a SUB over it gets `-ERR 'maximum subscriptions exceeded'` and the connection
  stays; a limit of 0 refuses the client right after its login with that error and a close.

A client that takes asynchronous INFO (`protocol: 1`) then gets an INFO with its own `max_payload`,
`connect_info: true` and `remote_account`, after its first PONG, as nats-server sends it. -1 (the default)
is no limit. `max_leafnodes` is accepted and limits nothing: zonebus does not count an account's leaf node
connections against it (nats-server does).

Connections are counted across the cluster (zonebus.server.account_conns). Differences from nats-server
(docs/configuration.md): a server with `workers` > 1 counts them per worker, and a reload applies changed
limits to the clients that log in after it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from zonebus.options import AccountLimits
from zonebus.protocol import errors

if TYPE_CHECKING:
    from zonebus.server.accounts import Account
    from zonebus.server.client import ClientConnection

ACCOUNT_CONNECTIONS = "maximum account active connections exceeded"
NO_LIMITS = AccountLimits()


def smaller(server_limit: int, account_limit: int) -> int:
    """The stricter of two limits, each -1 for none."""
    if account_limit < 0:
        return server_limit
    if server_limit < 0:
        return account_limit
    return min(server_limit, account_limit)


def subscription_limit(server_limit: int, account: Account) -> int:
    """A client's subscription limit (-1: none); the server's `max_subscriptions` is 0 for none."""
    return smaller(server_limit or -1, account.limits.max_subscriptions)


def login(conn: ClientConnection) -> bool:
    """Apply `conn`'s account limits after its login: False when it was refused (and is being closed)."""
    server = conn.server
    account = conn.account
    limits = account.limits
    if limits is NO_LIMITS:
        return True
    if limits.max_connections >= 0:
        others = sum(1 for c in server.clients.values()
                     if c is not conn and c.account is account and c.connected and not c.closed)
        if server.system is not None:  # the account's clients on the other servers of the cluster
            others += server.system.conns.others(account)
        if others >= limits.max_connections:
            server.auth_log(conn, ACCOUNT_CONNECTIONS)
            conn.send(errors.err(ACCOUNT_CONNECTIONS))
            conn.close()
            return False
    conn.parser.max_payload = smaller(server.opts.max_payload, limits.max_payload)
    subs = subscription_limit(server.opts.max_subscriptions, account)
    if 0 <= subs <= len(conn.subs):  # (nats-server: after the answers to what came with the CONNECT)
        server.loop.call_soon(_at_subscription_limit, conn)
    if conn.protocol >= 1:
        conn.info_changed()
    return True


def _at_subscription_limit(conn: ClientConnection, waits: int = 0) -> None:
    if conn.closed:
        return
    if not conn.pong_sent and conn.server.pong_gate is not None and waits < 100:
        # with workers the first PONG is held until worker 0 knows the login (hooks.py `pong_gate`): let the
        # answer to the CONNECT's PING go out first, as nats-server's does (at most a second)
        conn.server.loop.call_later(0.01, _at_subscription_limit, conn, waits + 1)
        return
    conn.server.auth_log(conn, errors.MAX_SUBSCRIPTIONS)
    conn.send(errors.err(errors.MAX_SUBSCRIPTIONS))
    conn.close()


def info_fields(conn: ClientConnection) -> dict:
    """What an INFO to a logged-in client of an account with limits adds: its own limit and account."""
    if conn.account.limits is NO_LIMITS:
        return {}
    return {"max_payload": conn.parser.max_payload, "connect_info": True, "remote_account": conn.account.display}
