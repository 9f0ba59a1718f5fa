"""What a client is told and how it logs in: the INFO it gets, the check of its CONNECT credentials, and the
SIGHUP reloads of users, permissions, accounts and the client TLS certificate.

A base class of `zonebus.server.server.Server`, whose attributes (options, authenticator, clients) it uses.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from zonebus import SERVER_VERSION
from zonebus.options import ServerOptions, advertised_host
from zonebus.protocol.urls import advertised_address
from zonebus.server import account_limits
from zonebus.server.auth import Authenticator, ClientPermissions

if TYPE_CHECKING:
    from zonebus.server.accounts import Accounts
    from zonebus.server.client import ClientConnection


class ClientLogins:
    """`Server`'s INFO and login methods (see the module's docstring)."""

    opts: ServerOptions
    server_id: str
    name: str
    accounts: Accounts
    authenticator: Authenticator
    websocket_authenticator: Authenticator | None  # the websocket {} block's own login (auth override)
    clients: dict[int, ClientConnection]
    connect_urls: Callable[[], list[str]] | None
    ws_connect_urls: Callable[[], list[str]] | None
    ws_urls_told: bool  # a peer's WebSocket URL was known once: from then on the list has at least this server's
    url_watchers: list[Callable[[], None]]
    info_extras: dict[str, Any]
    client_tls_context: Any
    websocket_listener: Any  # zonebus.server.websocket's listener, or None
    _info_base: dict[str, Any]

    def client_info(self, conn: ClientConnection) -> bytes:
        info = dict(self._info_base)
        if conn.transport_type != "nats":
            self._websocket_info(info)
        info["client_id"] = conn.cid
        info["client_ip"] = conn.ip
        if self.authenticator.needs_nonce:
            conn.nonce = info["nonce"] = self.authenticator.new_nonce()
        if self.connect_urls is not None and conn.transport_type == "nats":  # (they are not WebSocket URLs)
            urls = self.connect_urls()
            if urls:
                info["connect_urls"] = urls
        elif conn.transport_type == "websocket":
            urls = self.websocket_connect_urls()
            if urls:
                info["connect_urls"] = urls
        info.update(account_limits.info_fields(conn))
        return b"INFO " + _json(info) + b"\r\n"

    def _websocket_info(self, info: dict[str, Any]) -> None:
        """What a WebSocket client's INFO says instead, as nats-server's: the WebSocket listener's host, port
        and TLS (the top-level tls block is not this listener's)."""
        wso = self.opts.websocket
        info["host"] = wso.host
        info["port"] = getattr(self.websocket_listener, "port", wso.port)
        info.pop("tls_required", None)
        info.pop("tls_verify", None)
        if wso.auth_override:
            info["auth_required"] = True
        if wso.tls is not None:
            info["tls_required"] = info["tls_available"] = True
            if wso.tls.verify:
                info["tls_verify"] = True

    def websocket_url(self) -> str:
        """The `host:port` this server tells WebSocket clients and its routes for its WebSocket listener:
        `websocket { advertise }` (its port defaulting to the listener's, as nats-server), else the
        listener's host (a wildcard one as loopback) and port; "" without a listener."""
        wso = self.opts.websocket
        port = getattr(self.websocket_listener, "port", 0) or max(wso.port, 0)
        if not port:
            return ""
        if wso.advertise:
            return advertised_address(wso.advertise, port)
        return f"{advertised_host(wso.host)}:{port}"

    def websocket_connect_urls(self) -> list[str]:
        """A WebSocket client's INFO `connect_urls` (and /varz `ws_connect_urls`), as nats-server's: this
        server's WebSocket URL and then its peers', once a peer told one (and still this server's after the
        peers left); before that none."""
        peers = self.ws_connect_urls() if self.ws_connect_urls is not None else []
        if peers:
            self.ws_urls_told = True
        elif not self.ws_urls_told:
            return []
        own = self.websocket_url()
        return [own, *(u for u in peers if u != own)] if own else list(peers)

    def client_urls_changed(self) -> None:
        """The cluster's client URLs changed: tell the clients that take asynchronous INFO, as nats-server
        does, so that they can fail over to any server of the cluster."""
        for conn in self.clients.values():
            if conn.connected and conn.protocol >= 1 and not conn.closed:
                conn.info_changed()  # (after the client's first PONG, as nats-server)
        for watcher in self.url_watchers:
            watcher()

    def _build_info(self) -> dict[str, Any]:
        opts = self.opts
        info: dict[str, Any] = {
            "server_id": self.server_id,
            "server_name": self.name,
            "version": SERVER_VERSION,
            "proto": 1,
            "go": f"python{sys.version_info.major}.{sys.version_info.minor}",
            "host": opts.host,
            "port": opts.port,
            "headers": not opts.no_header_support,
            "max_payload": opts.max_payload,
        }
        if opts.auth_required:
            info["auth_required"] = True
        if opts.tls is not None:
            info["tls_required"] = True
            if opts.tls.verify or opts.tls.verify_and_map:
                info["tls_verify"] = True
        if opts.cluster.name:
            info["cluster"] = opts.cluster.name
        info.update(self.info_extras)
        return info

    def authenticator_for(self, conn: ClientConnection) -> Authenticator:
        """The websocket {} block's own login for its clients when it has one (nats-server's auth override:
        its user, password, token or no_auth_user replace the top level's), else the server's."""
        if self.websocket_authenticator is not None and conn.transport_type == "websocket":
            return self.websocket_authenticator
        return self.authenticator

    def check_auth(self, conn: ClientConnection, connect: dict[str, Any]) -> bool:
        """Log `conn` in with its CONNECT fields: sets its user and permissions, or logs the refusal."""
        login, why = self.authenticator_for(conn).authenticate(connect, conn.nonce, conn.peercert)
        if login is None:
            self.auth_log(conn, "authentication error" + why)
            return False
        conn.connect_opts = connect
        conn.auth_user = login.user
        conn.account = self.accounts.lookup(login.account)
        conn.perms = ClientPermissions(login.perms) if login.perms is not None else None
        return True

    def reload_tls(self, new: ServerOptions) -> None:
        """SIGHUP: a changed certificate, key, CA or `verify` of the top-level tls block applies to the
        handshakes that follow. Turning TLS on or off needs a restart (the listener changes kind)."""
        if self.client_tls_context is None or new.tls is None:
            if (self.client_tls_context is None) != (new.tls is None):
                self.log("reload: adding or removing the tls block needs a restart; TLS left as it was", "WRN")
            return
        from zonebus.server.tls import TLSConfigError, reload_context

        try:
            reload_context(self.client_tls_context, new.tls, "tls: ")
        except TLSConfigError as exc:
            self.log(f"reload: {exc}; the previous certificate stays", "ERR")
            return
        self.opts.tls = new.tls
        self.log(f"reload: client TLS certificate {new.tls.cert_file}")

    def reload_auth(self, new: ServerOptions) -> None:
        """Apply changed users, permissions, token and `no_auth_user` (SIGHUP): each logged-in client is
        checked again with the CONNECT it sent; refused ones are closed, the others get their (maybe new)
        permissions, and subscriptions these no longer allow are removed with a Permissions Violation."""
        opts = self.opts
        if new.accounts or opts.accounts or new.mappings or opts.mappings:
            opts.accounts, opts.system_account, opts.mappings = new.accounts, new.system_account, new.mappings
            self.accounts.reload(new)
            if self.system is not None:
                self.system.conns.start()
        opts.auth_user, opts.auth_password, opts.auth_token = new.auth_user, new.auth_password, new.auth_token
        opts.users, opts.default_permissions = new.users, new.default_permissions
        opts.no_auth_user, opts.auth_timeout = new.no_auth_user, new.auth_timeout
        self.authenticator = Authenticator(opts)
        self.websocket_authenticator = websocket_authenticator(opts)
        self._info_base = self._build_info()
        for conn in list(self.clients.values()):
            if not conn.connected or conn.closed:
                continue
            if not conn.login_required():
                conn.perms, conn.auth_user = None, ""
                continue
            login, _ = self.authenticator_for(conn).authenticate(conn.connect_opts, conn.nonce, conn.peercert)
            if login is None:
                self.auth_log(conn, "authorization removed on reload")  # closed without -ERR, as nats-server
                conn.close()
                continue
            if self.accounts.lookup(login.account) is not conn.account:
                self.auth_log(conn, "account changed on reload")
                conn.close()
                continue
            conn.auth_user = login.user
            conn.perms = perms = ClientPermissions(login.perms) if login.perms is not None else None
            if perms is None:
                continue
            for sub in list(conn.subs.values()):
                if not perms.can_subscribe(sub.subject, sub.queue):
                    conn.send(b"-ERR 'Permissions Violation for Subscription to \"%b\" (sid \"%b\")'\r\n"
                              % (sub.subject, sub.sid))
                    del conn.subs[sub.sid]
                    self.remove_subscription(sub)
        for acc in self.accounts.by_name.values():
            acc.sublist.touch()  # cached fast-path deliveries were built under the old permissions


def websocket_authenticator(opts: ServerOptions) -> Authenticator | None:
    """The login of WebSocket clients when the websocket {} block overrides the top level's (its user,
    password, token and no_auth_user instead of the top level's; the users of `authorization {}` and the
    accounts stay), else None."""
    wso = opts.websocket
    if not wso.auth_override:
        return None
    return Authenticator(replace(opts, auth_user=wso.auth_user, auth_password=wso.auth_password,
                                 auth_token=wso.auth_token, no_auth_user=wso.no_auth_user))


def _json(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()
