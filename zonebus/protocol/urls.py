"""URLs as nats-server reads them, for both the config reader and the runtime: a leafnode remote's URL (its
host and port, nats-server's leafnode port when it names none) and a WebSocket client's `Origin` (scheme,
host and port, the port defaulting by scheme). No I/O. The config reader checks the configured values with
them (`zonebus.config.leafnodes`, `zonebus.config.websocket`); the leaf manager dials with the first, the
WebSocket listener checks a client's origin with the second.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from zonebus.options import LEAF_PORT


def leaf_url(url: str) -> tuple[str, int]:
    """(host, port) of a remote's URL; nats-server's default leafnode port when it names none."""
    parts = urlsplit(url if "://" in url else f"nats-leaf://{url}")
    host = parts.hostname
    if not host:
        raise ValueError(f"error parsing url {url!r}: no host")
    return host, parts.port or LEAF_PORT


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
