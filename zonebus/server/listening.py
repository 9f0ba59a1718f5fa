"""Errors at start that name what could not listen: `zonebus server: cannot listen for clients on
0.0.0.0:4222: address already in use` rather than the socket module's bare `[Errno 98]`.

Every listener (clients, monitoring, cluster routes, gateways) opens its socket inside `naming(what, host,
port)`; the command line prints the message and exits with status 1, as nats-server does.

`reuse_port(workers)`: whether the client listener shares its port with the other worker processes of the same
server (`workers` above 1, zonebus.workers): SO_REUSEPORT, where the kernel spreads new connections over them.
Every kind of client listener (plain, TLS after a plain INFO, `handshake_first`, WebSocket with or without TLS)
shares its port the same way (`open_listener`).

`open_clients(server)`: the client listener in two steps, `ClientListener`: its port is bound at once (a port
in use fails there, a random one is known), but it listens (and accepts) only from `serve()`, which the
server calls once its extensions (JetStream's API, ...) have started, or a worker once the other workers'
interest has reached it (zonebus.workers). A socket bound but not listening gets no connections: the kernel
gives them to the listening workers (SO_REUSEPORT) or refuses them.
"""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from zonebus.server.server import Server


class ListenError(OSError):
    """A listener could not be opened; the message names which one, where, and why."""


@contextmanager
def naming(what: str, host: str, port: int) -> Iterator[None]:
    try:
        yield
    except ListenError:
        raise
    except OSError as exc:
        reason = os.strerror(exc.errno).lower() if exc.errno else str(exc)
        raise ListenError(f"cannot listen for {what} on {host or '0.0.0.0'}:{port}: {reason}") from None


def reuse_port(workers: int) -> bool:
    """The client listener binds with SO_REUSEPORT: this process is one of `workers` processes of one server."""
    return workers > 1 and hasattr(socket, "SO_REUSEPORT")


class ClientListener(Protocol):
    """The client port, bound; `serve()` starts listening and accepting, `close()` stops both."""

    port: int

    async def serve(self) -> None: ...

    def close(self) -> None: ...


class _PlainListener:
    """Plain TCP, or TLS from the first byte (`handshake_first`): an asyncio server started later."""

    def __init__(self, srv: asyncio.base_events.Server) -> None:
        self.srv = srv
        self.port = srv.sockets[0].getsockname()[1]

    async def serve(self) -> None:
        await self.srv.start_serving()
        for sock in self.srv.sockets:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def close(self) -> None:
        self.srv.close()


async def open_listener(server: Server, what: str, host: str, port: int, factory: Callable[[], asyncio.Protocol],
                        ssl: Any = None, ssl_timeout: float = 0.0) -> ClientListener:
    """A client listener bound (not yet accepting) on host:port, with SO_REUSEPORT when the server is one of
    several workers; TLS from the first byte with the `ssl` context. `what` names it in a failure."""
    tls_kw: dict[str, Any] = {"ssl": ssl, "ssl_handshake_timeout": ssl_timeout} if ssl is not None else {}
    with naming(what, host, port):
        srv = await server.loop.create_server(factory, host, port, reuse_address=True, backlog=1024,
                                              reuse_port=reuse_port(server.opts.workers), start_serving=False,
                                              **tls_kw)
    return _PlainListener(srv)


async def open_clients(server: Server) -> ClientListener:
    """Bind the client port of `server.opts` (host, port; port 0 picks one), with SO_REUSEPORT when the server
    is one of several workers; TLS as its `tls {}` block says (`server.client_tls` / `client_tls_context`)."""
    from zonebus.server.client import ClientConnection

    opts = server.opts
    if server.client_tls is not None:  # INFO in the clear, then TLS (zonebus.server.tls)
        from zonebus.server.tls import InfoFirstListener

        with naming("clients", opts.host, opts.port):
            listener = InfoFirstListener(server, server.client_tls, opts.tls.timeout)  # type: ignore[union-attr]
            listener.bind(opts.host, opts.port, reuse_port(opts.workers))
        return listener
    # handshake_first: the listener itself is TLS
    timeout = opts.tls.timeout if opts.tls is not None else 0.0
    return await open_listener(server, "clients", opts.host, opts.port, lambda: ClientConnection(server),
                               server.client_tls_context, timeout)
