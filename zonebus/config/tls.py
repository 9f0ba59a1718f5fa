"""`tls {}` blocks (top level: clients and https monitoring; `cluster {}`: routes; `gateway {}`: gateways).

The certificate, key and CA of a block are loaded while the configuration is read (`zonebus.credentials.check`),
so that a bad file fails the config check with the position of its block, as nats-server does."""

from __future__ import annotations

from zonebus.config.convert import BadValue, get_map, get_seconds, show
from zonebus.config.parser import Value
from zonebus.config.readers import Errors, Handler, apply_handlers, bool_field, setter, str_field
from zonebus.credentials import TLSConfigError, check
from zonebus.options import GatewayOptions, RouteOptions, ServerOptions, TLSOptions


def _handshake_first(t: TLSOptions, v: Value, errors: Errors) -> None:
    if v.kind != "bool":
        raise BadValue(f"only true or false are supported (no fallback duration), got {show(v)}", v)
    t.handshake_first = v.value


_TLS_HANDLERS: dict[str, Handler] = {
    "cert_file": str_field("cert_file"),
    "key_file": str_field("key_file"),
    "ca_file": str_field("ca_file"),
    "verify": bool_field("verify"),
    "verify_and_map": bool_field("verify_and_map"),
    "insecure": bool_field("insecure"),
    "timeout": setter("timeout", get_seconds),
    "handshake_first": _handshake_first,
    "first": _handshake_first,
}


def read_tls(v: Value, errors: Errors, block: str, client: bool = False) -> TLSOptions:
    """A `tls {}` block; its certificate, key and CA are loaded at once, so a bad file fails the config
    check with the block's position (as nats-server). `client`: a block for links this server dials only
    (a leafnode remote), where the certificate is optional."""
    tls = TLSOptions()
    before = len(errors)
    apply_handlers(get_map(v), _TLS_HANDLERS, tls, errors)
    if len(errors) == before:
        try:
            check(tls, client=client)
        except TLSConfigError as exc:
            errors.add(v, f"{block}{exc}")
    return tls


def tls_block(block: str) -> Handler:
    def handler(target: ServerOptions | RouteOptions | GatewayOptions, v: Value, errors: Errors) -> None:
        target.tls = read_tls(v, errors, block)

    return handler


