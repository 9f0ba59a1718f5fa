"""The machinery of the configuration blocks: a handler per key, the run over a block's entries, and the
handler makers every block uses (a string, an int in a range, a bool, a name, a `host:port` listen address,
a positive duration).

A handler stores one entry's value on its target (an options object) or raises `BadValue`; `apply_handlers`
runs the handlers of a block's entries and collects every problem in `Errors`, one `<file>:<line>:<col>:
<message>` line each, so that a config check reports them all at once.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from zonebus.config.convert import BadValue, get_bool, get_duration, get_host_port, get_int, get_str, show
from zonebus.config.parser import Value
from zonebus.config.unsupported import unsupported_message

# A handler stores one entry's value on its target, or raises BadValue.
Handler = Callable[[Any, Value, "Errors"], None]


MAX_PAYLOAD_LIMIT = 2**31 - 1  # nats-server: "max_payload value is too big" (server and account limits)

class Errors(list):
    """The problems found so far, each `<where>: <message>`."""

    def add(self, v: Value, message: str) -> None:
        self.append(f"{v.where}: {message}")


def apply_handlers(entries: dict[str, Value], handlers: dict[str, Handler], target: Any, errors: Errors,
                   block: str | None = None) -> None:
    """Run each key's handler; `block` names a block whose nats-server-only keys get their own refusal."""
    for key, v in entries.items():
        handler = handlers.get(key.lower())
        if handler is None:
            if not v.used:
                known = unsupported_message(block, key) if block is not None else None
                errors.add(v, known or f"unknown field {json.dumps(key)}")
            continue
        try:
            handler(target, v, errors)
        except BadValue as exc:
            errors.add(exc.at or v, f"{key}: {exc}")


def setter(attr: str, read: Callable[[Value], Any]) -> Handler:
    """A handler that sets `attr` to what `read` makes of the value."""

    def handler(target: Any, v: Value, errors: Errors) -> None:
        setattr(target, attr, read(v))

    return handler


def str_field(attr: str) -> Handler:
    return setter(attr, get_str)


def int_field(attr: str, minimum: int | None = None, maximum: int | None = None) -> Handler:
    return setter(attr, lambda v: get_int(v, minimum, maximum))


def bool_field(attr: str) -> Handler:
    return setter(attr, get_bool)


def name_field(attr: str, what: str) -> Handler:
    """A server, cluster or gateway name: no spaces."""

    def read(v: Value) -> str:
        name = get_str(v)
        if " " in name:
            raise BadValue(f"{what} name cannot contain spaces", v)
        return name

    return setter(attr, read)


def listen_field(host_attr: str, port_attr: str) -> Handler:
    """`listen: host:port` (or a port alone, which keeps the host)."""

    def handler(target: Any, v: Value, errors: Errors) -> None:
        host, port = get_host_port(v)
        if host:
            setattr(target, host_attr, host)
        setattr(target, port_attr, port)

    return handler


def positive_duration(attr: str) -> Handler:
    def read(v: Value) -> float:
        seconds = get_duration(v)
        if seconds <= 0:
            raise BadValue(f"duration must be greater than zero, got {show(v)}", v)
        return seconds

    return setter(attr, read)

