"""The `websocket {}` block: the WebSocket client listener, with nats-server's keys, defaults and refusals.

`port: 0` (the default) means no listener, `-1` a random port. nats-server refuses a listener without a `tls {}`
block unless `no_tls: true` ("websocket requires TLS configuration") and an allowed origin that is not an
absolute URL; both are refused here too, with the block's position.

The block's own login (`authorization {user, password, token, timeout}`, `no_auth_user`), the credential
cookies, `headers` and `ping_interval` are checked as nats-server's `validateWebsocketOptions` checks them,
once the whole file is read (`websocket_problems`, which needs the users of `authorization {}` and `accounts {}`),
and only with a listener (port not 0), as there.
"""

from __future__ import annotations

import json

from zonebus.config.convert import BadValue, get_duration, get_map, get_port, get_str, get_str_list, show
from zonebus.config.parser import Value
from zonebus.config.readers import (
    Errors,
    Handler,
    apply_handlers,
    bool_field,
    listen_field,
    positive_duration,
    setter,
    str_field,
)
from zonebus.config.tls import read_tls
from zonebus.options import ServerOptions, WebsocketOptions
from zonebus.protocol.urls import advertised_address, origin_parts


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


def _advertise(v: Value) -> str:
    text = get_str(v)
    try:
        advertised_address(text, 1)
    except ValueError as exc:
        raise BadValue(f"unable to get websocket connect URLs: {exc}", v) from None
    return text


def _auth_timeout(v: Value) -> float:
    if v.kind == "integer" or v.kind == "float":
        return float(v.value)
    return 1.0  # nats-server's parseSimpleAuth: another type means 1 second


_AUTH_HANDLERS: dict[str, Handler] = {
    "user": str_field("auth_user"),
    "username": str_field("auth_user"),
    "pass": str_field("auth_password"),
    "password": str_field("auth_password"),
    "token": str_field("auth_token"),
    "timeout": setter("auth_timeout", _auth_timeout),
}


def _authorization(ws: WebsocketOptions, v: Value, errors: Errors) -> None:
    """`authorization {}` / `authentication {}`: nats-server's simple form only (no users list)."""
    apply_handlers(get_map(v), _AUTH_HANDLERS, ws, errors)


def _headers(ws: WebsocketOptions, v: Value, errors: Errors) -> None:
    if v.kind != "map":
        raise BadValue(f"error parsing headers: unsupported type {show(v)}", v)
    headers = {}
    for name, value in v.value.items():
        if value.kind != "string":
            errors.add(value, f"error parsing header key {name}: unsupported type {show(value)}")
            continue
        headers[name] = get_str(value)
    ws.headers = headers


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
    "advertise": setter("advertise", _advertise),
    "no_auth_user": str_field("no_auth_user"),
    "authorization": _authorization,
    "authentication": _authorization,
    "jwt_cookie": str_field("jwt_cookie"),
    "user_cookie": str_field("user_cookie"),
    "pass_cookie": str_field("pass_cookie"),
    "token_cookie": str_field("token_cookie"),
    "headers": _headers,
    "ping_interval": positive_duration("ping_interval"),
}

_RESERVED_HEADERS = ("host", "content-length", "connection", "upgrade", "nats-no-masking")


def read_websocket(opts: ServerOptions, v: Value, errors: Errors) -> None:
    ws = opts.websocket
    before = len(errors)
    apply_handlers(get_map(v), _WEBSOCKET_HANDLERS, ws, errors, "websocket")
    if len(errors) == before and ws.port != 0 and ws.tls is None and not ws.no_tls:
        errors.add(v, "websocket requires TLS configuration")


def websocket_problems(opts: ServerOptions) -> list[str]:
    """What nats-server's `validateWebsocketOptions` refuses in a read configuration (its messages); nothing
    without a listener."""
    ws = opts.websocket
    if ws.port == 0:
        return []
    problems = []
    if ws.no_auth_user:
        if not opts.users:
            problems.append(f'no_auth_user: "{ws.no_auth_user}" present, but users/nkeys are not defined')
        elif not any(ws.no_auth_user in (u.user, u.nkey) for u in opts.users):
            problems.append(f'no_auth_user: "{ws.no_auth_user}" not present as user or nkey in authorization '
                            "block or account configuration")
    if opts.users:
        if ws.auth_user:
            problems.append("websocket authentication username not compatible with presence of users/nkeys")
        if ws.auth_token:
            problems.append("websocket authentication token not compatible with presence of users/nkeys")
    if ws.jwt_cookie:  # (zonebus has no operator JWTs: nats-server's refusal without trusted keys)
        problems.append("trusted operators or trusted keys configuration is required for JWT authentication "
                        f"via cookie {json.dumps(ws.jwt_cookie)}")
    for name in ws.headers:
        lower = name.lower()
        if lower in _RESERVED_HEADERS:
            problems.append(f"websocket: invalid header {json.dumps(name)} not allowed")
        elif lower.startswith("sec-websocket-"):
            problems.append(f'websocket: invalid header {json.dumps(name)}, "Sec-WebSocket-" prefix not allowed')
    return problems
