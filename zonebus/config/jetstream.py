"""The `jetstream {}` block: stores, encryption at rest, the shared store and its S3 client, group commit, and the
zone router."""

from __future__ import annotations

import json
from urllib.parse import urlsplit

from zonebus.config.convert import BadValue, expected, get_duration, get_map, get_storage_size, get_str, show
from zonebus.config.parser import Value
from zonebus.config.readers import Errors, Handler, apply_handlers, bool_field, int_field, setter, str_field
from zonebus.options import JetStreamOptions, ServerOptions
from zonebus.protocol.jsdomain import domain_error


def _sync_interval(js: JetStreamOptions, v: Value, errors: Errors) -> None:
    """`always` (zonebus's default): fsync before the PubAck; a duration: nats-server's lazy mode, unsafe on power
    loss. As in nats-server, `always` leaves the interval at its default (what /varz shows)."""
    if v.kind == "string" and v.value.strip().lower() == "always":
        js.sync_always, js.sync_interval = True, JetStreamOptions.sync_interval
        return
    interval = get_duration(v)
    js.sync_always, js.sync_interval = interval == 0, interval


def _shared_store(js: JetStreamOptions, v: Value, errors: Errors) -> None:
    url = get_str(v).strip()
    parts = urlsplit(url)
    if parts.scheme == "s3":
        if not parts.netloc:
            raise BadValue(f"an s3:// URL needs a bucket (s3://bucket/prefix), got {show(v)}", v)
    elif parts.scheme == "file":
        if parts.netloc not in ("", "localhost") or not parts.path.startswith("/"):
            raise BadValue(f"a file:// URL needs an absolute path (file:///path), got {show(v)}", v)
    else:
        raise BadValue(f"expected a file:// or s3:// URL, got {show(v)}", v)
    js.shared_store = url


def _s3_endpoint(js: JetStreamOptions, v: Value, errors: Errors) -> None:
    text = get_str(v).strip()
    if "://" in text and urlsplit(text).scheme not in ("http", "https"):
        raise BadValue(f"expected an http:// or https:// endpoint, got {show(v)}", v)
    js.s3_endpoint = text


_S3_HANDLERS: dict[str, Handler] = {
    "endpoint": _s3_endpoint,
    "region": str_field("s3_region"),
}


def _s3(js: JetStreamOptions, v: Value, errors: Errors) -> None:
    apply_handlers(get_map(v), _S3_HANDLERS, js, errors)


def _positive_size(attr: str) -> Handler:
    def read(v: Value) -> int:
        n = get_storage_size(v)
        if n <= 0:
            raise BadValue(f"expected a size above 0, got {show(v)}", v)
        return n

    return setter(attr, read)


def _domain(js: JetStreamOptions, v: Value, errors: Errors) -> None:
    name = get_str(v)
    why = domain_error(name)
    if why is not None:
        raise BadValue(why, v)
    js.domain = name


def _cipher(js: JetStreamOptions, v: Value, errors: Errors) -> None:
    """nats-server's names, any case: `chachapoly` (or `chacha`, its default) and `aes` (AES-GCM)."""
    word = get_str(v).lower()
    if word in ("chacha", "chachapoly"):
        js.encryption_cipher = "chachapoly"
    elif word == "aes":
        js.encryption_cipher = "aes"
    else:
        raise BadValue(f"Unknown cipher type: {json.dumps(get_str(v))}", v)


def _router_linger(v: Value) -> float:
    seconds = get_duration(v)
    if not 0 <= seconds <= 0.001:
        raise BadValue(f"expected a duration from 0 to 1ms, got {show(v)}", v)
    return seconds


def _router_path(opts: JetStreamOptions, v: Value, errors: Errors) -> None:
    if v.kind != "string" or v.value not in ("auto", "storage", "link"):
        raise BadValue(f"expected auto, storage or link, got {show(v)}", v)
    opts.zone_router_path = v.value


def _router_ack(opts: JetStreamOptions, v: Value, errors: Errors) -> None:
    if v.kind != "string" or v.value not in ("replicas", "storage"):
        raise BadValue(f"expected replicas or storage, got {show(v)}", v)
    opts.zone_router_ack = v.value


def _router_spread(opts: JetStreamOptions, v: Value, errors: Errors) -> None:
    if v.kind != "string" or v.value not in ("auto", "all", "quorum"):
        raise BadValue(f"expected auto, all or quorum, got {show(v)}", v)
    opts.zone_router_spread = v.value


def _router_tier(v: Value) -> float:
    seconds = get_duration(v)
    if not 0.1 <= seconds <= 60:
        raise BadValue(f"expected a duration from 100ms to 60s, got {show(v)}", v)
    return seconds


def _router_epoch(v: Value) -> float:
    seconds = get_duration(v)
    if not 0.1 <= seconds <= 3600:
        raise BadValue(f"expected a duration from 100ms to 1h, got {show(v)}", v)
    return seconds


_BATCH_LIMIT_HANDLERS: dict[str, Handler] = {
    "max_inflight_per_stream": int_field("batch_max_inflight_per_stream", 1),
    "max_inflight_total": int_field("batch_max_inflight_total", 1),
    "max_msgs": int_field("batch_max_msgs", 1),
    "timeout": setter("batch_timeout", get_duration),
}


def _limits(js: JetStreamOptions, v: Value, errors: Errors) -> None:
    """`limits { batch { ... } }` (nats-server's other JetStream limits are not read)."""
    apply_handlers(get_map(v), {"batch": lambda t, b, e: apply_handlers(get_map(b), _BATCH_LIMIT_HANDLERS, t, e)},
                   js, errors)


_JETSTREAM_HANDLERS: dict[str, Handler] = {
    "enabled": bool_field("enabled"),
    "enable": bool_field("enabled"),
    "store_dir": str_field("store_dir"),
    "storedir": str_field("store_dir"),
    "domain": _domain,
    "max_memory_store": setter("max_memory_store", get_storage_size),
    "max_mem_store": setter("max_memory_store", get_storage_size),
    "max_mem": setter("max_memory_store", get_storage_size),
    "max_file_store": setter("max_file_store", get_storage_size),
    "max_file": setter("max_file_store", get_storage_size),
    "sync_interval": _sync_interval,
    "sync": _sync_interval,  # nats-server's other spelling
    "key": str_field("encryption_key"),  # encryption at rest: nats-server's three spellings of each key
    "ek": str_field("encryption_key"),
    "encryption_key": str_field("encryption_key"),
    "prev_key": str_field("prev_encryption_key"),
    "prev_ek": str_field("prev_encryption_key"),
    "prev_encryption_key": str_field("prev_encryption_key"),
    "cipher": _cipher,
    "shared_store": _shared_store,
    "shared_store_linger": setter("shared_store_linger", get_duration),
    "shared_store_batch": _positive_size("shared_store_batch"),
    "shared_store_inflight": int_field("shared_store_inflight", 1, 1024),
    "shared_store_latency_budget": setter("shared_store_latency_budget", get_duration),
    "zone_router_latency_budget": setter("shared_store_latency_budget", get_duration),
    "s3": _s3,
    "limits": _limits,
    "failover_timeout": setter("failover_timeout", get_duration),
    "zone_router": bool_field("zone_router"),
    "zone_router_linger": setter("zone_router_linger", _router_linger),
    "zone_router_batch": _positive_size("zone_router_batch"),
    "zone_router_path": _router_path,
    "zone_router_epoch": setter("zone_router_epoch", _router_epoch),
    "zone_router_ack": _router_ack,
    "zone_router_tier": setter("zone_router_tier", _router_tier),
    "zone_router_spread": _router_spread,
    "zone_router_pack": setter("zone_router_pack", _router_tier),
}


def read_jetstream(opts: ServerOptions, v: Value, errors: Errors) -> None:
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
        apply_handlers(v.value, _JETSTREAM_HANDLERS, js, errors, "jetstream")
        if js.zone_router and not js.shared_store:
            errors.add(v, "zone_router: the zone router needs a shared store (jetstream { shared_store })")
        if js.encryption_key and js.shared_store:
            errors.add(v, "key: encryption at rest covers the local file store only, not the shared store "
                          "(jetstream { shared_store }): its batches, documents and the zone router's channel "
                          "objects would be written in clear; remove one of them")
    else:
        raise expected("map, bool or string to define JetStream", v)
