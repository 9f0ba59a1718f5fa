"""URLs as nats-server reads them, for both the config reader and the runtime: a leafnode remote's URL (its
host and port, nats-server's leafnode port when it names none), an advertised `host:port` (`leafnodes {
advertise }`, the listener's port when it names none) and a WebSocket client's `Origin` (scheme, host and
port, the port defaulting by scheme). No I/O. The config reader checks the configured values with them
(`zonebus.config.leafnodes`, `zonebus.config.websocket`); the leaf manager dials with the first and tells
leaf nodes the second, the WebSocket listener checks a client's origin with the third.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from zonebus.options import LEAF_PORT


def is_ws_url(url: str) -> bool:
    """A leafnode remote's URL dialled over WebSocket (`ws://`, `wss://`), as nats-server's isWSURL."""
    return url.lower().startswith(("ws://", "wss://"))


def leaf_url(url: str) -> tuple[str, int]:
    """(host, port) of a remote's URL; nats-server's default leafnode port when it names none (80 and 443
    for `ws://` and `wss://`, as an HTTP client)."""
    parts = urlsplit(url if "://" in url else f"nats-leaf://{url}")
    host = parts.hostname
    if not host:
        raise ValueError(f"error parsing url {url!r}: no host")
    default = {"ws": 80, "wss": 443}.get(parts.scheme.lower(), LEAF_PORT)
    return host, parts.port or default


def leaf_ws_path(url: str) -> str:
    """The request path a leaf dials a WebSocket hub with: the URL's path joined with `/leafnode`, which tells
    the hub's WebSocket listener that a leaf node connects (nats-server's leafNodeSolicitWSConnection)."""
    path = urlsplit(url).path.strip("/")
    return f"/{path}/leafnode" if path else "/leafnode"


def advertised_address(text: str, default_port: int) -> str:
    """The `host:port` an `advertise` value stands for, as nats-server's parseHostPort reads it: Go's
    SplitHostPort (`host:port`, `[v6]:port`), a text without a port taking `default_port`, as does port 0 or
    -1; an IPv6 host comes back in brackets (Go's JoinHostPort). ValueError for anything else."""
    text = text.strip()
    if not text:
        raise ValueError("no hostport specified")
    if text.startswith("["):
        end = text.find("]")
        if end < 0:
            raise ValueError(f"address {text}: missing ']' in address")
        host, rest = text[1:end], text[end + 1:]
        if rest and not rest.startswith(":"):
            raise ValueError(f"address {text}: unexpected characters after ']'")
        port_text = rest[1:] if rest else str(default_port)
    elif text.count(":") > 1:
        raise ValueError(f"address {text}: too many colons in address")
    else:
        host, _, port_text = text.partition(":") if ":" in text else (text, "", str(default_port))
    port_text = port_text.strip()
    if not port_text.lstrip("-").isdigit() or not -1 <= int(port_text) <= 65535:
        raise ValueError(f"invalid port {port_text!r}")
    port = int(port_text)
    if port in (0, -1):
        port = default_port
    host = host.strip()
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def origin_parts(origin: str) -> tuple[str, str, str]:
    """(scheme, host, port) of an origin URL, the port defaulting by scheme (443 for https, else 80) as
    nats-server does; raises ValueError for a text that is not an absolute URL."""
    parts = urlsplit(origin)
    if not parts.scheme or not parts.netloc:
        raise ValueError("invalid URI for request")
    try:
        port = parts.port
    except ValueError:
        raise ValueError(f"invalid port after host in {origin}") from None
    default = "443" if parts.scheme.lower() == "https" else "80"
    return parts.scheme.lower(), (parts.hostname or "").lower(), str(port) if port is not None else default
