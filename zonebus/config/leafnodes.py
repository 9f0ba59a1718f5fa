"""The `leafnodes {}` block (also spelt `leaf`): the leaf node listener and the remotes (hubs) to dial.

Read onto `LeafNodeOptions` (zonebus.leaf builds the connections). nats-server's keys that zonebus does not
build yet (TLS on leaf links, credentials files, deny lists, compression, ...) are refused by name through
`zonebus.config.unsupported` (blocks `leafnodes` and `leafnode_remote`), never ignored.
"""

from __future__ import annotations

from zonebus.config.authorization import block_auth
from zonebus.config.convert import BadValue, expected, get_map, get_port, get_str, show
from zonebus.config.parser import Value
from zonebus.config.readers import Errors, Handler, apply_handlers, str_field
from zonebus.options import LEAF_PORT, RemoteLeafOptions, ServerOptions
from zonebus.protocol.urls import leaf_url


def _url(v: Value) -> str:
    url = get_str(v)
    try:
        leaf_url(url)
    except ValueError as exc:  # (an out-of-range port too)
        raise BadValue(f"error parsing leafnode remote url {show(v)}: {exc}", v) from None
    return url


def _urls(v: Value) -> list[str]:
    if v.kind not in ("array", "string"):
        raise expected("array of URLs", v)
    return [_url(item) for item in (v.value if v.kind == "array" else [v])]


_LEAFNODE_REMOTE_HANDLERS: dict[str, Handler] = {
    "url": lambda r, v, e: r.urls.append(_url(v)),
    "urls": lambda r, v, e: r.urls.extend(_urls(v)),
    "account": str_field("account"),
    "local": str_field("account"),
}


def _remotes(opts: ServerOptions, v: Value, errors: Errors) -> None:
    if v.kind != "array":
        raise expected("array", v)
    for item in v.value:
        if item.kind != "map":
            errors.add(item, f"remotes: expected map with url(s), got {show(item)}")
            continue
        remote = RemoteLeafOptions()
        apply_handlers(item.value, _LEAFNODE_REMOTE_HANDLERS, remote, errors, "leafnode_remote")
        if not remote.urls:
            errors.add(item, "remotes: a leafnode remote needs url or urls")
            continue
        opts.leafnodes.remotes.append(remote)


def _listen(target: ServerOptions, v: Value, errors: Errors) -> None:
    """`listen: host:port`, a port alone, or a host alone (nats-server's port 7422)."""
    text = str(v.value) if v.kind in ("string", "int") else ""
    if not text:
        raise expected("host:port", v)
    host, sep, port = text.rpartition(":")
    if not sep:
        host, port = ("", text) if text.isdigit() else (text, str(LEAF_PORT))
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise BadValue(f"could not parse port {show(v)}", v)
    if host:
        target.leafnodes.host = host
    target.leafnodes.port = int(port)


_AUTH = block_auth("Leafnode")

_LEAFNODES_HANDLERS: dict[str, Handler] = {
    "listen": _listen,
    "host": lambda o, v, e: setattr(o.leafnodes, "host", get_str(v)),
    "net": lambda o, v, e: setattr(o.leafnodes, "host", get_str(v)),
    "port": lambda o, v, e: setattr(o.leafnodes, "port", get_port(v)),
    "remotes": _remotes,
    "authorization": lambda o, v, e: _AUTH(o.leafnodes, v, e),
}


def read_leafnodes(opts: ServerOptions, v: Value, errors: Errors) -> None:
    apply_handlers(get_map(v), _LEAFNODES_HANDLERS, opts, errors, "leafnodes")
