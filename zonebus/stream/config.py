"""Decoding JSON API requests the way nats-server's Go decoder does, with its error texts.

A schema maps each known field to a Go type; `decode` walks a parsed JSON document in order and raises
`JSError("invalid_json", ...)` for malformed JSON, unknown fields and wrong types, with the same wording as
Go's `encoding/json` (e.g. `json: cannot unmarshal string into Go struct field StreamConfigRequest.max_msgs
of type int64`). `null` is accepted for any field (Go leaves the zero value).
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from typing import Any

from zonebus.protocol.jserrors import invalid_json

I64 = (-(1 << 63), (1 << 63) - 1)
RANGES = {
    "int": I64,
    "int64": I64,
    "time.Duration": I64,
    "int32": (-(1 << 31), (1 << 31) - 1),
    "uint64": (0, (1 << 64) - 1),
}

ENUMS = {
    "retention": ("limits", "interest", "workqueue"),
    "discard": ("old", "new"),
    "storage": ("file", "memory"),
    "compression": ("none", "s2"),
    "deliver_policy": ("all", "last", "new", "by_start_sequence", "by_start_time", "last_per_subject"),
    "ack_policy": ("none", "all", "explicit"),
    "replay_policy": ("instant", "original"),
    "priority_policy": ("none", "overflow", "pinned_client", "prioritized"),
    "persist_mode": ("default", "async"),
}

STREAM_FIELDS: dict[str, str] = {
    "name": "string",
    "description": "string",
    "subjects": "[]string",
    "retention": "enum",
    "max_consumers": "int",
    "max_msgs": "int64",
    "max_bytes": "int64",
    "max_age": "time.Duration",
    "max_msgs_per_subject": "int64",
    "max_msg_size": "int32",
    "discard": "enum",
    "storage": "enum",
    "num_replicas": "int",
    "no_ack": "bool",
    "template_owner": "string",
    "duplicate_window": "time.Duration",
    "placement": "*server.Placement",
    "mirror": "*server.StreamSource",
    "sources": "[]*server.StreamSource",
    "sealed": "bool",
    "deny_delete": "bool",
    "deny_purge": "bool",
    "allow_rollup_hdrs": "bool",
    "allow_direct": "bool",
    "mirror_direct": "bool",
    "republish": "*server.RePublish",
    "discard_new_per_subject": "bool",
    "metadata": "map[string]string",
    "compression": "enum",
    "first_seq": "uint64",
    "subject_transform": "*server.SubjectTransformConfig",
    "consumer_limits": "server.StreamConsumerLimits",
    "allow_msg_ttl": "bool",
    "subject_delete_marker_ttl": "time.Duration",
    "allow_msg_counter": "bool",
    "allow_atomic": "bool",
    "allow_msg_schedules": "bool",
    "allow_batched": "bool",
    "persist_mode": "enum",
    "pedantic": "bool",
}

CONSUMER_FIELDS: dict[str, str] = {
    "durable_name": "string",
    "name": "string",
    "description": "string",
    "deliver_policy": "enum",
    "opt_start_seq": "uint64",
    "opt_start_time": "time",
    "ack_policy": "enum",
    "ack_wait": "time.Duration",
    "max_deliver": "int",
    "backoff": "[]time.Duration",
    "filter_subject": "string",
    "filter_subjects": "[]string",
    "replay_policy": "enum",
    "rate_limit_bps": "uint64",
    "sample_freq": "string",
    "max_waiting": "int",
    "max_ack_pending": "int",
    "flow_control": "bool",
    "idle_heartbeat": "time.Duration",
    "headers_only": "bool",
    "max_batch": "int",
    "max_expires": "time.Duration",
    "max_bytes": "int",
    "deliver_subject": "string",
    "deliver_group": "string",
    "inactive_threshold": "time.Duration",
    "num_replicas": "int",
    "mem_storage": "bool",
    "metadata": "map[string]string",
    "pause_until": "time",
    "priority_groups": "[]string",
    "priority_policy": "enum",
    "priority_timeout": "time.Duration",
    "direct": "bool",
}

CONSUMER_REQUEST_FIELDS: dict[str, str] = {
    "stream_name": "string",
    "config": "server.ConsumerConfig",
    "action": "action",
    "pedantic": "bool",
}

PURGE_FIELDS = {"filter": "string", "seq": "uint64", "keep": "uint64"}
MSG_GET_FIELDS = {
    "seq": "uint64",
    "last_by_subj": "string",
    "next_by_subj": "string",
    "batch": "int",
    "max_bytes": "int",
    "start_time": "time",
    "multi_last": "[]string",
    "up_to_seq": "uint64",
    "up_to_time": "time",
    "no_hdr": "bool",
}
MSG_DELETE_FIELDS = {"seq": "uint64", "no_erase": "bool"}
PAUSE_FIELDS = {"pause_until": "time"}
UNPIN_FIELDS = {"group": "string"}
LIST_FIELDS = {"offset": "int", "subject": "string"}
INFO_FIELDS = {"deleted_details": "bool", "subjects_filter": "string", "offset": "int"}

_JSON_KIND = {str: "string", bool: "bool", int: "number", float: "number", list: "array", dict: "object"}
_TIME_RE = re.compile(r"^(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})(\.\d+)?(Z|[+-]\d{2}:\d{2})$")


def parse_json(body: bytes, go_type: str) -> Any:
    """Parse a request body; an empty body is `None`."""
    if not body.strip():
        return None
    try:
        return json.loads(body)
    except json.JSONDecodeError as exc:
        if exc.pos >= len(body.rstrip()):
            raise invalid_json("unexpected EOF")
        raise invalid_json(f"invalid character {body[exc.pos:exc.pos + 1].decode(errors='replace')!r} "
                           f"at offset {exc.pos + 1}")
    except UnicodeDecodeError:
        raise invalid_json("invalid character in string literal")
    except RecursionError:
        raise invalid_json("exceeded max depth")


def _kind(value: Any) -> str:
    return _JSON_KIND.get(type(value), "value")


def parse_time(value: str) -> int:
    """RFC 3339 -> unix nanoseconds."""
    m = _TIME_RE.match(value)
    if not m:
        raise ValueError(f'parsing time "{value}" as "2006-01-02T15:04:05Z07:00": cannot parse')
    frac = m.group(7) or ""
    base = value[: m.start(7)] if frac else value[: m.start(8)]
    tz = m.group(8)
    dt = datetime.fromisoformat(base + ("+00:00" if tz == "Z" else tz))
    ns = int((frac[1:] + "000000000")[:9]) if frac else 0
    return int(dt.timestamp()) * 1_000_000_000 + ns


def format_time(ns: int) -> str:
    """Unix nanoseconds -> RFC 3339 UTC with nanoseconds, as Go prints it ("0001-01-01T00:00:00Z" for 0)."""
    if ns <= 0:
        return "0001-01-01T00:00:00Z"
    secs, rem = divmod(ns, 1_000_000_000)
    base = datetime.fromtimestamp(secs, UTC).strftime("%Y-%m-%dT%H:%M:%S")
    if rem:
        return f"{base}.{rem:09d}".rstrip("0") + "Z"
    return base + "Z"


def _check(path: str, field: str, go: str, value: Any, struct: str) -> None:
    where = f"Go struct field {struct}.{path}"
    if value is None:
        return
    if go == "string":
        if not isinstance(value, str):
            raise invalid_json(f"json: cannot unmarshal {_kind(value)} into {where} of type string")
    elif go == "bool":
        if not isinstance(value, bool):
            raise invalid_json(f"json: cannot unmarshal {_kind(value)} into {where} of type bool")
    elif go in RANGES:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise invalid_json(f"json: cannot unmarshal {_kind(value)} into {where} of type {go}")
        lo, hi = RANGES[go]
        if isinstance(value, float) or not lo <= value <= hi:
            raise invalid_json(f"json: cannot unmarshal number {_num(value)} into {where} of type {go}")
    elif go == "enum" or go == "action":
        allowed = ENUMS.get(field, ()) if go == "enum" else ("", "create", "update")
        if go == "action" and value not in allowed:
            raise invalid_json(f"unknown consumer action: {json.dumps(value)}")
        if field == "priority_policy" and value not in allowed:  # its own UnmarshalJSON words it so
            raise invalid_json(f"unknown priority policy: {json.dumps(value)}")
        if value not in allowed or not isinstance(value, str):
            raise invalid_json(f"can not unmarshal {json.dumps(json.dumps(value))}")
    elif go == "time":
        if not isinstance(value, str):
            raise invalid_json(f"json: cannot unmarshal {_kind(value)} into {where} of type time.Time")
        try:
            parse_time(value)
        except ValueError:
            raise invalid_json(
                f'parsing time {json.dumps(value)} as "2006-01-02T15:04:05Z07:00": cannot parse '
                f'{json.dumps(value)} as "2006"'
            )
    elif go.startswith("[]"):
        if not isinstance(value, list):
            raise invalid_json(f"json: cannot unmarshal {_kind(value)} into {where} of type {go}")
        elem = go[2:]
        for i, v in enumerate(value):
            if elem.startswith(("*server.", "server.")):
                if v is not None and not isinstance(v, dict):
                    raise invalid_json(f"json: cannot unmarshal {_kind(v)} into {struct}.{path}.{i} of type {elem}")
                continue
            _check_elem(f"{struct}.{path}.{i}", elem, v)
    elif go.startswith("map["):
        if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
            kind = _kind(value) if not isinstance(value, dict) else "value"
            raise invalid_json(f"json: cannot unmarshal {kind} into {where} of type {go}")
    elif go.startswith(("*server.", "server.")) and not isinstance(value, dict):
        raise invalid_json(f"json: cannot unmarshal {_kind(value)} into {where} of type {go.lstrip('*')}")


def _check_elem(where: str, go: str, v: Any) -> None:
    if v is None:
        return
    if go == "string":
        if not isinstance(v, str):
            raise invalid_json(f"json: cannot unmarshal {_kind(v)} into {where} of type string")
        return
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise invalid_json(f"json: cannot unmarshal {_kind(v)} into {where} of type {go}")
    lo, hi = RANGES.get(go, I64)
    if isinstance(v, float) or not lo <= v <= hi:
        raise invalid_json(f"json: cannot unmarshal number {_num(v)} into {where} of type {go}")


def _num(value: int | float) -> str:
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e21:
        return str(int(value)) if "e" not in repr(value) else repr(value)
    return repr(value) if isinstance(value, float) else str(value)


def decode(doc: Any, fields: dict[str, str], struct: str, prefix: str = "") -> dict[str, Any]:
    """Check a parsed JSON object against a schema; returns the object with nulls dropped."""
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        where = f"Go value of type server.{struct}" if not prefix else f"Go struct field {struct}.{prefix[:-1]}"
        go = f"server.{struct}" if not prefix else "server.ConsumerConfig"
        if prefix:
            raise invalid_json(f"json: cannot unmarshal {_kind(doc)} into {where} of type {go}")
        raise invalid_json(f"json: cannot unmarshal {_kind(doc)} into {where}")
    for key, value in doc.items():
        go = fields.get(key)
        if go is None:
            raise invalid_json(f'json: unknown field "{key}"')
        _check(prefix + key, key, go, value, struct)
    return {k: v for k, v in doc.items() if v is not None}


def decode_consumer_request(doc: Any) -> dict[str, Any]:
    req = decode(doc, CONSUMER_REQUEST_FIELDS, "CreateConsumerRequest")
    cfg = doc.get("config") if isinstance(doc, dict) else None
    req["config"] = decode(cfg, CONSUMER_FIELDS, "CreateConsumerRequest", "config.") if cfg is not None else {}
    return req
