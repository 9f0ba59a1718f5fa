"""The `websocket {}` block: the WebSocket client listener, with nats-server's keys, defaults and refusals.

`port: 0` (the default) means no listener, `-1` a random port. nats-server refuses a listener without a `tls {}`
block unless `no_tls: true` ("websocket requires TLS configuration") and an allowed origin that is not an
absolute URL; both are refused here too, with the block's position. The keys of nats-server's block that
zonebus does not implement (cookies, the block's own authorization, custom headers, ...) are refused by name
(`zonebus.config.unsupported`).
"""

from __future__ import annotations

import json

from zonebus.config.convert import BadValue, get_duration, get_map, get_port, get_str_list, show
from zonebus.config.parser import Value
from zonebus.config.readers import Errors, Handler, apply_handlers, bool_field, listen_field, setter, str_field
from zonebus.config.tls import read_tls
from zonebus.options import ServerOptions, WebsocketOptions
from zonebus.protocol.urls import origin_parts


def _allowed_origins(v: Value) -> list[str]:
    origins = get_str_list(v)
    for origin in origins:
        try:
            origin_parts(origin)
        except ValueError as exc:
            raise BadValue(f"unable to parse allowed origin: parse {json.dumps(origin)}: {exc}", v)
    return origins


def _handshake_timeout(v: Value) -> float:
    seconds = get_duration(v)
    if seconds < 0:
        raise BadValue(f"duration must not be negative, got {show(v)}", v)
    return seconds


def _tls(ws: WebsocketOptions, v: Value, errors: Errors) -> None:
    tls = read_tls(v, errors, "websocket tls: ")
    for key in ("verify_and_map", "handshake_first"):
        if getattr(tls, key):
            errors.add(v, f"websocket tls: {key} is not supported for WebSocket clients in zonebus")
    ws.tls = tls


_WEBSOCKET_HANDLERS: dict[str, Handler] = {
    "listen": listen_field("host", "port"),
    "host": str_field("host"),
    "net": str_field("host"),
    "port": setter("port", get_port),
    "no_tls": bool_field("no_tls"),
    "tls": _tls,
    "compression": bool_field("compression"),
    "compress": bool_field("compression"),
    "same_origin": bool_field("same_origin"),
    "allowed_origins": setter("allowed_origins", _allowed_origins),
    "allowed_origin": setter("allowed_origins", _allowed_origins),
    "allow_origins": setter("allowed_origins", _allowed_origins),
    "allow_origin": setter("allowed_origins", _allowed_origins),
    "origins": setter("allowed_origins", _allowed_origins),
    "origin": setter("allowed_origins", _allowed_origins),
    "handshake_timeout": setter("handshake_timeout", _handshake_timeout),
}


def read_websocket(opts: ServerOptions, v: Value, errors: Errors) -> None:
    ws = opts.websocket
    before = len(errors)
    apply_handlers(get_map(v), _WEBSOCKET_HANDLERS, ws, errors, "websocket")
    if len(errors) == before and ws.port != 0 and ws.tls is None and not ws.no_tls:
        errors.add(v, "websocket requires TLS configuration")
