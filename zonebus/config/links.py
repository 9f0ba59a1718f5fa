"""The `cluster {}` and `gateway {}` blocks: the server's links to other servers (routes, gateways)."""

from __future__ import annotations

from zonebus.config.authorization import block_auth
from zonebus.config.convert import (
    BadValue,
    expected,
    get_compression,
    get_map,
    get_port,
    get_str,
    get_str_list,
    is_url,
    show,
)
from zonebus.config.parser import Value
from zonebus.config.readers import (
    Errors,
    Handler,
    apply_handlers,
    bool_field,
    int_field,
    listen_field,
    name_field,
    setter,
    str_field,
)
from zonebus.config.tls import tls_block
from zonebus.options import GatewayOptions, RemoteGatewayOptions, ServerOptions
from zonebus.protocol.urls import advertised_address


def _url(v: Value) -> str:
    url = get_str(v)
    if not is_url(url):
        raise BadValue(f"error parsing url {show(v)}: expected scheme://host:port", v)
    return url


def _url_list(v: Value) -> list[str]:
    items = v.value if v.kind == "array" else [v]
    if v.kind not in ("array", "string"):
        raise expected("array of URLs", v)
    return [_url(item) for item in items]


_CLUSTER_HANDLERS: dict[str, Handler] = {
    "name": name_field("name", "cluster"),
    "listen": listen_field("host", "port"),
    "host": str_field("host"),
    "net": str_field("host"),
    "port": setter("port", get_port),
    "routes": setter("routes", _url_list),
    "authorization": block_auth("Cluster"),
    "prefer_matching_tags": bool_field("prefer_matching_tags"),
    "no_advertise": bool_field("no_advertise"),
    "connect_retries": int_field("connect_retries", 0),
    "tls": tls_block("cluster tls: "),
    "compression": setter("compression", get_compression),
    "pool_size": int_field("pool_size"),
    "accounts": setter("accounts", get_str_list),
    "zone_relay": bool_field("zone_relay"),
}


def read_cluster(opts: ServerOptions, v: Value, errors: Errors) -> None:
    apply_handlers(get_map(v), _CLUSTER_HANDLERS, opts.cluster, errors, "cluster")
    if opts.cluster.accounts and opts.cluster.pool_size < 0:  # nats-server's check, word for word
        errors.add(get_map(v).get("pool_size", v), "pool_size cannot be negative if pinned accounts are specified")


def _remote_gateway(item: Value, errors: Errors) -> RemoteGatewayOptions | None:
    if item.kind != "map":
        raise expected("map with name and url(s)", item)
    remote = RemoteGatewayOptions(name="")
    handlers: dict[str, Handler] = {
        "name": name_field("name", "gateway"),
        "url": lambda r, u, e: r.urls.append(_url(u)),
        "urls": lambda r, u, e: r.urls.extend(_url_list(u)),
    }
    apply_handlers(item.value, handlers, remote, errors)
    if not remote.name:
        errors.add(item, "gateways: remote gateway has no name")
        return None
    return remote


def _gateways(gw: GatewayOptions, v: Value, errors: Errors) -> None:
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


def _gateway_advertise(gw: GatewayOptions, v: Value, errors: Errors) -> None:
    """`gateway { advertise: host[:port] }`: the gateway URL this server gives out (a port-less one takes the
    listener's, known at start); checked here, as nats-server stops at start on a bad one."""
    text = get_str(v)
    try:
        advertised_address(text, 1)
    except ValueError as exc:
        raise BadValue(f"gateway advertise {text!r}: {exc}", v) from None
    gw.advertise = text


_GATEWAY_HANDLERS: dict[str, Handler] = {
    "name": name_field("name", "gateway"),
    "listen": listen_field("host", "port"),
    "host": str_field("host"),
    "net": str_field("host"),
    "port": setter("port", get_port),
    "gateways": _gateways,
    "reject_unknown_cluster": bool_field("reject_unknown_cluster"),
    "reject_unknown": bool_field("reject_unknown_cluster"),
    "authorization": block_auth("Gateway"),
    "interest_only_threshold": int_field("interest_only_threshold", 0),
    "tls": tls_block("gateway tls: "),
    "compression": setter("compression", get_compression),
    "advertise": _gateway_advertise,
}


def read_gateway(opts: ServerOptions, v: Value, errors: Errors) -> None:
    apply_handlers(get_map(v), _GATEWAY_HANDLERS, opts.gateway, errors, "gateway")


