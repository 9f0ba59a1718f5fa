"""The `ledger {}` block: the traffic ledger (`zonebus.ledger`) and the client zones by CIDR block."""

from __future__ import annotations

import ipaddress
import json

from zonebus.config.convert import BadValue, get_duration, get_map, get_str_list
from zonebus.config.parser import Value
from zonebus.config.readers import Errors, Handler, apply_handlers, bool_field, int_field, setter, str_field
from zonebus.options import LedgerOptions, ServerOptions


def _client_zones(ledger: LedgerOptions, v: Value, errors: Errors) -> None:
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
    "enabled": bool_field("enabled"),
    "dir": str_field("dir"),
    "interval": setter("interval", get_duration),
    "subject_tokens": int_field("subject_tokens", 0),
    "zone_tag_prefix": str_field("zone_tag_prefix"),
    "client_zones": _client_zones,
}


def read_ledger(opts: ServerOptions, v: Value, errors: Errors) -> None:
    if v.kind == "bool":
        opts.ledger.enabled = v.value
        return
    entries = get_map(v)
    opts.ledger.enabled = True
    apply_handlers(entries, _LEDGER_HANDLERS, opts.ledger, errors)
    if opts.ledger.interval <= 0:
        errors.add(v, "ledger: interval must be greater than zero")


