"""Maps a parsed configuration tree onto `ServerOptions`, checking every key and type.

Keys are matched case-insensitively, as nats-server does. Problems are collected (not stopped at the first)
and raised together as one `ConfigError`, each line `<file>:<line>:<col>: <message>`:

- an unknown key: `unknown field "<key>"` (nats-server's wording); entries that were referenced as
  `$variables` are variable definitions and are not reported;
- a bad value: `<key>: expected <type>, got <value>`, or nats-server's own message for that check.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from zonebus.config.convert import (
    BadValue,
    expected,
    get_bool,
    get_duration,
    get_host_port,
    get_int,
    get_map,
    get_port,
    get_seconds,
    get_storage_size,
    get_str,
    get_str_list,
    show,
)
from zonebus.config.parser import ConfigError, Value
from zonebus.server.options import (
    GatewayOptions,
    JetStreamOptions,
    LedgerOptions,
    RemoteGatewayOptions,
    RouteOptions,
    ServerOptions,
)

# A handler stores one entry's value on its target, or raises BadValue.
Handler = Callable[[Any, Value, "_Errors"], None]
MAX_PAYLOAD_LIMIT = 2**31 - 1  # nats-server: "max_payload value is too big"


class _Errors(list):
    def add(self, v: Value, message: str) -> None:
        self.append(f"{v.where}: {message}")


def _apply(entries: dict[str, Value], handlers: dict[str, Handler], target: Any, errors: _Errors) -> None:
    for key, v in entries.items():
        handler = handlers.get(key.lower())
        if handler is None:
            if not v.used:
                errors.add(v, f"unknown field {json.dumps(key)}")
            continue
        try:
            handler(target, v, errors)
        except BadValue as exc:
            errors.add(exc.at or v, f"{key}: {exc}")


def _setter(attr: str, read: Callable[[Value], Any]) -> Handler:
    def handler(target: Any, v: Value, errors: _Errors) -> None:
        setattr(target, attr, read(v))

    return handler


def _str(attr: str) -> Handler:
    return _setter(attr, get_str)


def _int(attr: str, minimum: int | None = None, maximum: int | None = None) -> Handler:
    return _setter(attr, lambda v: get_int(v, minimum, maximum))


def _bool(attr: str) -> Handler:
    return _setter(attr, get_bool)


def _name(attr: str, what: str) -> Handler:
    def read(v: Value) -> str:
        name = get_str(v)
        if " " in name:
            raise BadValue(f"{what} name cannot contain spaces", v)
        return name

    return _setter(attr, read)


def _listen(host_attr: str, port_attr: str) -> Handler:
    def handler(target: Any, v: Value, errors: _Errors) -> None:
        host, port = get_host_port(v)
        if host:
            setattr(target, host_attr, host)
        setattr(target, port_attr, port)

    return handler


# ---- authorization blocks -------------------------------------------------------------------------


class _Auth:
    def __init__(self) -> None:
        self.user = self.password = self.token = ""
        self.timeout: float | None = None


_AUTH_HANDLERS: dict[str, Handler] = {
    "user": _str("user"),
    "username": _str("user"),
    "password": _str("password"),
    "pass": _str("password"),
    "token": _str("token"),
    "timeout": _setter("timeout", get_seconds),
}


def _read_auth(v: Value, errors: _Errors, allow_token: bool, block: str) -> _Auth:
    auth = _Auth()
    _apply(get_map(v), _AUTH_HANDLERS, auth, errors)
    if auth.token and not allow_token:
        errors.add(v, f"{block} authorization does not support tokens")
    elif auth.token and (auth.user or auth.password):
        errors.add(v, "Cannot have a user/pass and token")
    return auth


def _top_auth(opts: ServerOptions, v: Value, errors: _Errors) -> None:
    auth = _read_auth(v, errors, allow_token=True, block="")
    opts.auth_user, opts.auth_password, opts.auth_token = auth.user, auth.password, auth.token
    if auth.timeout is not None:
        opts.auth_timeout = auth.timeout


def _block_auth(block: str) -> Handler:
    def handler(target: RouteOptions | GatewayOptions, v: Value, errors: _Errors) -> None:
        auth = _read_auth(v, errors, allow_token=False, block=block)
        target.user, target.password = auth.user, auth.password
        if auth.timeout is not None:
            target.auth_timeout = auth.timeout

    return handler


# ---- cluster and gateway --------------------------------------------------------------------------


def _url(v: Value) -> str:
    url = get_str(v)
    parts = urlsplit(url)
    try:
        ok = bool(parts.scheme and parts.hostname and parts.port is not None)
    except ValueError:
        ok = False
    if not ok:
        raise BadValue(f"error parsing url {show(v)}: expected scheme://host:port", v)
    return url


def _url_list(v: Value) -> list[str]:
    items = v.value if v.kind == "array" else [v]
    if v.kind not in ("array", "string"):
        raise expected("array of URLs", v)
    return [_url(item) for item in items]


_CLUSTER_HANDLERS: dict[str, Handler] = {
    "name": _name("name", "cluster"),
    "listen": _listen("host", "port"),
    "host": _str("host"),
    "net": _str("host"),
    "port": _setter("port", get_port),
    "routes": _setter("routes", _url_list),
    "authorization": _block_auth("Cluster"),
    "prefer_matching_tags": _bool("prefer_matching_tags"),
    "no_advertise": _bool("no_advertise"),
    "connect_retries": _int("connect_retries", 0),
}


def _cluster(opts: ServerOptions, v: Value, errors: _Errors) -> None:
    _apply(get_map(v), _CLUSTER_HANDLERS, opts.cluster, errors)


def _remote_gateway(item: Value, errors: _Errors) -> RemoteGatewayOptions | None:
    if item.kind != "map":
        raise expected("map with name and url(s)", item)
    remote = RemoteGatewayOptions(name="")
    handlers: dict[str, Handler] = {
        "name": _name("name", "gateway"),
        "url": lambda r, u, e: r.urls.append(_url(u)),
        "urls": lambda r, u, e: r.urls.extend(_url_list(u)),
    }
    _apply(item.value, handlers, remote, errors)
    if not remote.name:
        errors.add(item, "gateways: remote gateway has no name")
        return None
    return remote


def _gateways(gw: GatewayOptions, v: Value, errors: _Errors) -> None:
    if v.kind != "array":
        raise expected("array", v)
    for item in v.value:
        try:
            remote = _remote_gateway(item, errors)
        except BadValue as exc:
            errors.add(exc.at or item, f"gateways: {exc}")
            continue
        if remote:
            gw.gateways.append(remote)


_GATEWAY_HANDLERS: dict[str, Handler] = {
    "name": _name("name", "gateway"),
    "listen": _listen("host", "port"),
    "host": _str("host"),
    "net": _str("host"),
    "port": _setter("port", get_port),
    "gateways": _gateways,
    "reject_unknown_cluster": _bool("reject_unknown_cluster"),
    "reject_unknown": _bool("reject_unknown_cluster"),
    "authorization": _block_auth("Gateway"),
    "interest_only_threshold": _int("interest_only_threshold", 0),
}


def _gateway(opts: ServerOptions, v: Value, errors: _Errors) -> None:
    _apply(get_map(v), _GATEWAY_HANDLERS, opts.gateway, errors)


# ---- jetstream and ledger -------------------------------------------------------------------------


def _sync_interval(js: JetStreamOptions, v: Value, errors: _Errors) -> None:
    if v.kind == "string" and v.value.strip().lower() == "always":
        js.sync_always, js.sync_interval = True, 0.0
    else:
        js.sync_always, js.sync_interval = False, get_duration(v)


_JETSTREAM_HANDLERS: dict[str, Handler] = {
    "enabled": _bool("enabled"),
    "enable": _bool("enabled"),
    "store_dir": _str("store_dir"),
    "storedir": _str("store_dir"),
    "max_memory_store": _setter("max_memory_store", get_storage_size),
    "max_mem_store": _setter("max_memory_store", get_storage_size),
    "max_mem": _setter("max_memory_store", get_storage_size),
    "max_file_store": _setter("max_file_store", get_storage_size),
    "max_file": _setter("max_file_store", get_storage_size),
    "sync_interval": _sync_interval,
}


def _jetstream(opts: ServerOptions, v: Value, errors: _Errors) -> None:
    js = opts.jetstream
    if v.kind == "bool":
        js.enabled = v.value
    elif v.kind == "string":
        word = v.value.strip().lower()
        if word not in ("enabled", "disabled"):
            raise BadValue(f"Expected 'enabled' or 'disabled' for string value, got '{v.value}'", v)
        js.enabled = word == "enabled"
    elif v.kind == "map":
        js.enabled = True
        _apply(v.value, _JETSTREAM_HANDLERS, js, errors)
    else:
        raise expected("map, bool or string to define JetStream", v)


def _client_zones(ledger: LedgerOptions, v: Value, errors: _Errors) -> None:
    for zone, blocks in get_map(v).items():
        try:
            cidrs = get_str_list(blocks)
        except BadValue as exc:
            errors.add(exc.at or blocks, f"client_zones: {zone}: {exc}")
            continue
        good = []
        for cidr in cidrs:
            try:
                good.append(str(ipaddress.ip_network(cidr.strip(), strict=False)))
            except ValueError:
                errors.add(blocks, f"client_zones: {zone}: invalid CIDR block {json.dumps(cidr)}")
        ledger.client_zones[zone] = good


_LEDGER_HANDLERS: dict[str, Handler] = {
    "enabled": _bool("enabled"),
    "dir": _str("dir"),
    "interval": _setter("interval", get_duration),
    "subject_tokens": _int("subject_tokens", 0),
    "zone_tag_prefix": _str("zone_tag_prefix"),
    "client_zones": _client_zones,
}


def _ledger(opts: ServerOptions, v: Value, errors: _Errors) -> None:
    if v.kind == "bool":
        opts.ledger.enabled = v.value
        return
    entries = get_map(v)
    opts.ledger.enabled = True
    _apply(entries, _LEDGER_HANDLERS, opts.ledger, errors)
    if opts.ledger.interval <= 0:
        errors.add(v, "ledger: interval must be greater than zero")


# ---- top level ------------------------------------------------------------------------------------


def _max_payload(opts: ServerOptions, v: Value, errors: _Errors) -> None:
    size = get_int(v, 1)
    if size > MAX_PAYLOAD_LIMIT:
        raise BadValue("max_payload value is too big", v)
    opts.max_payload = size


def _server_tags(opts: ServerOptions, v: Value, errors: _Errors) -> None:
    # nats-server stores tags in lower case; a single string is one tag (commas are not split).
    opts.server_tags = [tag.lower() for tag in get_str_list(v)]


def _positive_duration(attr: str) -> Handler:
    def read(v: Value) -> float:
        seconds = get_duration(v)
        if seconds <= 0:
            raise BadValue(f"duration must be greater than zero, got {show(v)}", v)
        return seconds

    return _setter(attr, read)


_TOP_HANDLERS: dict[str, Handler] = {
    "listen": _listen("host", "port"),
    "host": _str("host"),
    "net": _str("host"),
    "addr": _str("host"),
    "port": _setter("port", get_port),
    "server_name": _name("server_name", "server"),
    "name": _name("server_name", "server"),
    "http": _listen("http_host", "http_port"),
    "monitor": _listen("http_host", "http_port"),
    "http_port": _setter("http_port", get_port),
    "monitor_port": _setter("http_port", get_port),
    "server_tags": _server_tags,
    "max_payload": _max_payload,
    "max_control_line": _int("max_control_line", 1),
    "max_connections": _int("max_connections"),
    "max_conn": _int("max_connections"),
    "max_subscriptions": _int("max_subscriptions", 0),
    "max_subs": _int("max_subscriptions", 0),
    "max_pending": _int("max_pending", 1),
    "ping_interval": _positive_duration("ping_interval"),
    "ping_max": _int("ping_max"),
    "write_deadline": _positive_duration("write_deadline"),
    "authorization": _top_auth,
    "debug": _bool("debug"),
    "trace": _bool("trace"),
    "logtime": _bool("logtime"),
    "pid_file": _str("pid_file"),
    "pidfile": _str("pid_file"),
    "log_file": _str("log_file"),
    "logfile": _str("log_file"),
    "cluster": _cluster,
    "gateway": _gateway,
    "jetstream": _jetstream,
    "ledger": _ledger,
}


def apply_config(tree: dict[str, Value], opts: ServerOptions | None = None) -> ServerOptions:
    """Apply a parsed tree to `opts` (fresh defaults when None) and return it; raises `ConfigError`
    listing every problem found."""
    opts = ServerOptions() if opts is None else opts
    errors = _Errors()
    _apply(tree, _TOP_HANDLERS, opts, errors)
    if errors:
        raise ConfigError(list(errors))
    return opts
