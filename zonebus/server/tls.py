"""TLS through the standard library's `ssl`: contexts from `tls {}` blocks, the client upgrade, cert identities.

Loading a block's files (`server_context`, `TLSConfigError`) lives in the leaf `zonebus.credentials`, which the
config reader uses too; the server's modules import them from here.

How each connection kind uses TLS, as nats-server does:
- clients: the server sends INFO in plain text (with `tls_required`, and `tls_verify` when client
  certificates are required), then the client starts the TLS handshake (`InfoFirstListener`). A client
  that sends anything but a TLS handshake is closed without an answer. With `handshake_first` the listener
  itself is TLS (`create_server(ssl=...)`): the handshake comes before INFO;
- routes and gateways: TLS from the first byte on both sides (the listener and the dialler wrap the socket);
- monitoring: `https` / `https_port` serves the monitoring pages with the top-level certificate.

`verify` requires a client certificate signed by `ca_file`; `verify_and_map` also logs the client in as the
user its certificate names (`cert_identities`: e-mail and DNS names, then the subject DN). With TLS off none
of this is imported by the connection code's hot path: a connection only checks one attribute when made.

SIGHUP: `reload_context` points a listener's live context (clients, routes, gateways) at the reloaded
block's files, `reload_links` also switches the block that routes and gateways dial with; connections
made before keep their TLS session.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from typing import TYPE_CHECKING

from zonebus.credentials import TLSConfigError, error_reason, load_cert_files, server_context
from zonebus.options import TLSOptions

if TYPE_CHECKING:
    from zonebus.server.server import Server

# OpenSSL's long attribute names (as `getpeercert()` gives them) -> the short ones of an RFC 4514 DN
_SHORT = {
    "commonName": "CN", "countryName": "C", "localityName": "L", "stateOrProvinceName": "ST",
    "organizationName": "O", "organizationalUnitName": "OU", "streetAddress": "STREET",
    "domainComponent": "DC", "userId": "UID", "serialNumber": "SERIALNUMBER", "postalCode": "POSTALCODE",
}


def reload_context(ctx: ssl.SSLContext, opts: TLSOptions, block: str = "") -> None:
    """SIGHUP: a `tls {}` block's (maybe changed) certificate, key and CA for a live server context (the one
    its listener was made with); handshakes from now on use them, established connections keep theirs (as
    nats-server). A fresh context is made from the block and each new handshake is handed over to it from
    the live context's SNI callback (OpenSSL calls it for every ClientHello, with or without a server
    name), so that a replaced `ca_file` stops trusting the old CA: loading into the live context would only
    add to its trust store. Raises TLSConfigError (and changes nothing) when the files cannot be loaded."""
    fresh = server_context(opts, block)
    ctx.verify_mode = fresh.verify_mode  # a new connection takes its verify mode from the live context

    def hand_over(sslobj: ssl.SSLObject, server_name: str | None, _live: ssl.SSLContext) -> None:
        sslobj.context = fresh

    ctx.sni_callback = hand_over


def client_context(opts: TLSOptions, block: str = "", cert_optional: bool = False) -> ssl.SSLContext:
    """For links this server dials (routes, gateways, leafnode remotes): our certificate as the client
    certificate (`cert_optional`: a leafnode remote may have none), and the peer's certificate checked
    against `ca_file` and the host dialled, unless `insecure`."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    load_cert_files(ctx, opts, block, client=cert_optional)
    if opts.insecure:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    elif not opts.ca_file:
        ctx.load_default_certs(ssl.Purpose.SERVER_AUTH)
    return ctx


def reload_links(server: Server, block: str, listening: ssl.SSLContext | None,
                 old: TLSOptions | None, new: TLSOptions | None) -> TLSOptions | None:
    """SIGHUP for `cluster { tls {} }` (`block` = "cluster") or `gateway { tls {} }`: the links accepted from
    now on (through `listening`, the listener's live context; None without a listener) and those dialled
    from now on use the new block's certificate, key and CA; established links stay up. Returns the block
    to dial with: `new`, or `old` when the reload would switch TLS on or off (a restart: the listener and
    the peers change kind) or its files cannot be loaded (one log line each, as `Server.reload_tls`)."""
    if (old is None) != (new is None):
        server.log(f"reload: adding or removing {block} tls needs a restart; {block} TLS left as it was", "WRN")
        return old
    if new is None:
        return None
    try:
        client_context(new, f"{block} tls: ")  # dialled links: fail now rather than at every dial
        if listening is not None:
            reload_context(listening, new, f"{block} tls: ")
    except TLSConfigError as exc:
        server.log(f"reload: {exc}; the previous {block} certificate stays", "ERR")
        return old
    server.log(f"reload: {block} TLS certificate {new.cert_file}")
    return new


_NOT_TLS = ("WRONG_VERSION_NUMBER", "HTTP_REQUEST", "HTTPS_PROXY_REQUEST", "UNKNOWN_PROTOCOL")


def handshake_error(exc: BaseException) -> str:
    """One line for the log about a failed handshake, in nats-server's words where it has them."""
    if isinstance(exc, TimeoutError):
        return "TLS handshake timeout"
    if isinstance(exc, ssl.SSLError) and exc.reason in _NOT_TLS:
        return "TLS handshake error: first record does not look like a TLS handshake"
    if isinstance(exc, ConnectionError) and not exc.strerror:
        return "TLS handshake error: the client closed the connection"
    return f"TLS handshake error: {error_reason(exc)}"


class InfoFirstListener:
    """The client listener when TLS follows a plain-text INFO (nats-server's default).

    It accepts sockets itself: for each, the INFO is written in the clear, then the socket is handed to
    `loop.connect_accepted_socket` with the TLS context, so that not one byte is read before the handshake
    (a listener from `create_server` starts reading as soon as the connection is made). The connection's
    `connection_made` runs once the handshake is done; a failed handshake is one log line and a close."""

    def __init__(self, server: Server, ctx: ssl.SSLContext, timeout: float) -> None:
        self.server = server
        self.ctx = ctx
        self.timeout = timeout
        self.sock: socket.socket | None = None
        self.port = 0
        self._task: asyncio.Task | None = None
        self._pending: set[asyncio.Task] = set()

    def bind(self, host: str, port: int, reuse_port: bool = False) -> int:
        """Bind host:port (not listening yet: `serve()`); returns the port bound. `reuse_port`: SO_REUSEPORT,
        the port shared with the server's other worker processes, as the plain listener does it
        (zonebus.server.listening)."""
        host = host or "0.0.0.0"
        sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if reuse_port:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.bind((host, port))
        except BaseException:
            sock.close()
            raise
        sock.setblocking(False)
        self.sock = sock
        self.port = sock.getsockname()[1]
        return self.port

    async def serve(self) -> None:
        """Listen and accept (after `bind`)."""
        if self.sock is None or self._task is not None:
            return
        self.sock.listen(1024)
        self._task = self.server.loop.create_task(self._accept_loop())

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        if self.sock is not None:
            self.sock.close()
            self.sock = None

    async def _accept_loop(self) -> None:
        loop = self.server.loop
        while self.sock is not None:
            try:
                sock, addr = await loop.sock_accept(self.sock)
            except OSError as exc:  # e.g. out of file descriptors: back off a little
                if self.sock is None:
                    return
                self.server.log(f"error accepting client connection: {exc}", "ERR")
                await asyncio.sleep(0.05)
                continue
            task = loop.create_task(self._handshake(sock, addr))
            self._pending.add(task)
            task.add_done_callback(self._pending.discard)

    async def _handshake(self, sock: socket.socket, addr: tuple) -> None:
        from zonebus.server.client import ClientConnection

        server = self.server
        loop = server.loop
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn = ClientConnection(server)
        conn.ip, conn.remote_port = addr[0], addr[1]
        conn.info_sent = True
        try:
            await loop.sock_sendall(sock, server.client_info(conn))
            await loop.connect_accepted_socket(lambda: conn, sock, ssl=self.ctx,
                                               ssl_handshake_timeout=self.timeout)
        except (OSError, TimeoutError) as exc:
            server.auth_log(conn, handshake_error(exc))
            sock.close()


def cert_identities(peercert: dict | None) -> tuple[list[str], list[tuple[str, str]]]:
    """What `verify_and_map` matches users against, in nats-server's order: the certificate's e-mail, DNS
    and URI names, then its subject as (short name, value) pairs in RFC 4514 order (last RDN first)."""
    if not peercert:
        return [], []
    sans = peercert.get("subjectAltName", ())
    names = [v for kind, v in sans if kind == "email"]
    names += [v for kind, v in sans if kind == "DNS"]
    names += [v for kind, v in sans if kind == "URI"]
    subject: list[tuple[str, str]] = []
    for rdn in reversed(peercert.get("subject", ())):
        for attr, value in rdn:
            subject.append((_SHORT.get(attr, attr), value))
    return names, subject


def parse_dn(text: str) -> list[tuple[str, str]] | None:
    """`CN=alice,O=Acme` -> [("CN", "alice"), ("O", "Acme")] (escaped commas kept), or None when `text`
    is not a DN."""
    parts: list[str] = []
    cur, esc = "", False
    for ch in text:
        if esc:
            cur += ch
            esc = False
        elif ch == "\\":
            esc = True
        elif ch in ",+":
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    out = []
    for part in parts:
        key, sep, value = part.partition("=")
        if not sep or not key.strip():
            return None
        out.append((key.strip().upper(), value.strip()))
    return out


def match_user(users: list[str], peercert: dict | None) -> str | None:
    """The configured user name a client certificate maps to (`verify_and_map`), or None: an exact name
    among the certificate's e-mail/DNS/URI names, else a user whose name is a DN with the same attributes
    as the certificate's subject (in any order, as nats-server's DN match)."""
    names, subject = cert_identities(peercert)
    known = set(users)
    for name in names:
        if name in known:
            return name
    if not subject:
        return None
    want = sorted((k.upper(), v) for k, v in subject)
    rfc4514 = ",".join(f"{k}={v}" for k, v in subject)
    if rfc4514 in known:
        return rfc4514
    for user in users:
        dn = parse_dn(user)
        if dn is not None and sorted(dn) == want:
            return user
    return None
