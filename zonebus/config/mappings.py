"""The `mappings {}` block (top level, and in an account of `accounts {}`), with nats-server's messages.

    mappings {
      foo: bar
      "orders.*": "new.orders.{{wildcard(1)}}"
      canary: [{destination: v2, weight: 10%}, {destination: v1, weight: 90%, cluster: east}]
    }

Each entry becomes a checked `zonebus.subjects.mapping.Mapping`; what mappings do is described there. An
empty destination, which nats-server accepts and then fails on at the first message, is refused.
"""

from __future__ import annotations

import json
import re

from zonebus.config.convert import BadValue, get_map
from zonebus.config.parser import Value
from zonebus.subjects.mapping import Destination, Mapping, MappingError, valid_source

_PERCENT = re.compile(r"^\s*(-?\d+)\s*%?\s*$")


class _Errors(list):
    def add(self, v: Value, message: str) -> None:
        self.append(f"{v.where}: {message}")


def read_mappings(v: Value, errors: list[str]) -> list[Mapping]:
    """The block's mappings, in their order; problems are added to `errors` (`file:line:col: message`)."""
    out: list[Mapping] = []
    errs = _Errors()
    try:
        entries = get_map(v)
    except BadValue as exc:
        errs.add(v, f"mappings: {exc}")
        entries = {}
    for src, body in entries.items():
        if not valid_source(src):
            errs.add(body, f"Subject {json.dumps(src)} is not a valid subject")
            continue
        if body.kind == "string":
            try:
                out.append(Mapping.build(src, [Destination(body.value)]))
            except MappingError as exc:
                errs.add(body, f"Error adding mapping for {json.dumps(src)} to {json.dumps(body.value)} : {exc}")
            continue
        items = [body] if body.kind == "map" else body.value if body.kind == "array" else None
        if items is None:
            errs.add(body, "Expected an entry for the mapping destination")
            continue
        dests = [d for d in (_destination(item, errs) for item in items) if d is not None]
        if len(dests) != len(items):
            continue
        try:
            out.append(Mapping.build(src, dests))
        except MappingError as exc:
            errs.add(body, f"Error adding mapping for {json.dumps(src)} : {exc}")
    errors.extend(errs)
    return out


def _destination(item: Value, errs: _Errors) -> Destination | None:
    if item.kind != "map":
        errs.add(item, "Expected an entry for the mapping destination")
        return None
    dest = Destination("", weight=-1)
    ok = True
    for key, val in item.value.items():
        k = key.lower()
        if k in ("destination", "dest", "cluster"):
            if val.kind != "string":
                errs.add(val, f"{key}: expected string, got {val.value!r}")
                ok = False
            elif k == "cluster":
                dest.cluster = val.value
            else:
                dest.subject = val.value
        elif k == "weight":
            weight = _weight(val)
            if weight is None:
                shown = json.dumps(val.value) if val.kind == "string" else val.value
                if val.kind in ("string", "integer"):
                    errs.add(val, f"Invalid weight {shown} for mapping destination")
                else:
                    errs.add(val, f"Unknown entry type for weight of {shown}")
                ok = False
            else:
                dest.weight = weight
        else:
            errs.add(val, f"Unknown field {json.dumps(key)} for mapping destination")
            ok = False
    if ok and dest.weight < 0:
        errs.add(item, f"Missing weight for mapping destination {json.dumps(dest.subject)}")
        ok = False
    return dest if ok else None


def _weight(v: Value) -> int | None:
    if v.kind == "integer":
        n = v.value
    elif v.kind == "string" and (m := _PERCENT.match(v.value)):
        n = int(m.group(1))
    else:
        return None
    return n if 0 <= n <= 100 else None
