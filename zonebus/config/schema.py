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
    get_compression,
    get_duration,
    get_host_port,
    get_int,
    get_map,
    get_port,
    get_seconds,
    get_storage_size,
    get_str,
    get_str_list,
    is_url,
    show,
)
from zonebus.config.parser import ConfigError, Value
from zonebus.config.unsupported import unsupported_message
from zonebus.server.options import (
    GatewayOptions,
    JetStreamOptions,
    LedgerOptions,
    Permissions,
    QueueGroupOptions,
    RemoteGatewayOptions,
    ResponsePermission,
    RouteOptions,
    ServerOptions,
    SubjectPermission,
    TLSOptions,
    UserOptions,
)
from zonebus.subjects.patterns import overlaps
from zonebus.subjects.validate import is_valid_subject

# A handler stores one entry's value on its target, or raises BadValue.
Handler = Callable[[Any, Value, "_Errors"], None]
MAX_PAYLOAD_LIMIT = 2**31 - 1  # nats-server: "max_payload value is too big"
MAX_WORKERS = 256  # `workers`: processes of one server (zonebus.workers)


class _Errors(list):
    def add(self, v: Value, message: str) -> None:
        self.append(f"{v.where}: {message}")


def _apply(entries: dict[str, Value], handlers: dict[str, Handler], target: Any, errors: _Errors,
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
        self.users: list[UserOptions] = []
        self.default_permissions: Permissions | None = None
        self.users_at: Value | None = None


def _subject_list(v: Value, queues: bool) -> list[str]:
    """Permission subjects: a string or a list of them; with `queues`, `"subject queue"` entries."""
    out = []
    items = v.value if v.kind == "array" else [v]
    if v.kind not in ("array", "string"):
        raise expected("string or array of subjects", v)
    for item in items:
        text = get_str(item).strip()
        parts = text.split()
        ok = (len(parts) == 1 or (queues and len(parts) == 2)) and is_valid_subject(parts[0].encode())
        if not ok:
            raise BadValue(f"invalid subject {json.dumps(text)}", item)
        out.append(" ".join(parts))
    return out


def _subject_permission(queues: bool) -> Callable[[Value, _Errors], SubjectPermission]:
    def read(v: Value, errors: _Errors) -> SubjectPermission:
        perm = SubjectPermission()
        if v.kind != "map":
            perm.allow = _subject_list(v, queues)
            return perm
        handlers: dict[str, Handler] = {
            "allow": lambda p, x, e: setattr(p, "allow", _subject_list(x, queues)),
            "deny": lambda p, x, e: setattr(p, "deny", _subject_list(x, queues)),
        }
        _apply(v.value, handlers, perm, errors)
        return perm

    return read


def _allow_responses(perms: Permissions, v: Value, errors: _Errors) -> None:
    if v.kind == "bool":
        perms.response = ResponsePermission() if v.value else None
        return
    resp = ResponsePermission()
    handlers: dict[str, Handler] = {
        "max": _int("max_msgs", 0),
        "max_msgs": _int("max_msgs", 0),
        "expires": _setter("expires", get_duration),
        "ttl": _setter("expires", get_duration),
    }
    _apply(get_map(v), handlers, resp, errors)
    if resp.max_msgs == 0:
        resp.max_msgs = ResponsePermission.max_msgs
    perms.response = resp


_PERMISSION_HANDLERS: dict[str, Handler] = {
    "publish": lambda p, v, e: setattr(p, "publish", _subject_permission(False)(v, e)),
    "pub": lambda p, v, e: setattr(p, "publish", _subject_permission(False)(v, e)),
    "subscribe": lambda p, v, e: setattr(p, "subscribe", _subject_permission(True)(v, e)),
    "sub": lambda p, v, e: setattr(p, "subscribe", _subject_permission(True)(v, e)),
    "allow_responses": _allow_responses,
    "publish_allow_responses": _allow_responses,
}


def _permissions(v: Value, errors: _Errors) -> Permissions:
    perms = Permissions()
    _apply(get_map(v), _PERMISSION_HANDLERS, perms, errors)
    return perms


def _nkey(user: UserOptions, v: Value, errors: _Errors) -> None:
    from zonebus.server.auth import decode_user_nkey

    key = get_str(v).strip()
    if decode_user_nkey(key) is None:
        raise BadValue(f"Not a valid public nkey for a user: {json.dumps(key)}", v)
    user.nkey = key


_USER_HANDLERS: dict[str, Handler] = {
    "user": _str("user"),
    "username": _str("user"),
    "password": _str("password"),
    "pass": _str("password"),
    "nkey": _nkey,
    "permissions": lambda u, v, e: setattr(u, "permissions", _permissions(v, e)),
    "permission": lambda u, v, e: setattr(u, "permissions", _permissions(v, e)),
}


def _users(auth: _Auth, v: Value, errors: _Errors) -> None:
    if v.kind != "array":
        raise expected("array of users", v)
    auth.users_at = v
    seen: set[str] = set()
    for item in v.value:
        if item.kind != "map":
            errors.add(item, f"users: expected map with user or nkey, got {show(item)}")
            continue
        user = UserOptions()
        _apply(item.value, _USER_HANDLERS, user, errors)
        if not user.user and not user.nkey:
            errors.add(item, "users: a user needs a user name or an nkey")
            continue
        if user.user and user.nkey:
            errors.add(item, "users: a user has either a user name or an nkey, not both")
            continue
        name = user.user or user.nkey
        if name in seen:
            errors.add(item, f"users: duplicate user {json.dumps(name)}")
            continue
        seen.add(name)
        auth.users.append(user)


_AUTH_HANDLERS: dict[str, Handler] = {
    "user": _str("user"),
    "username": _str("user"),
    "password": _str("password"),
    "pass": _str("password"),
    "token": _str("token"),
    "timeout": _setter("timeout", get_seconds),
    "users": _users,
    "default_permissions": lambda a, v, e: setattr(a, "default_permissions", _permissions(v, e)),
}


def _read_auth(v: Value, errors: _Errors, allow_token: bool, block: str) -> _Auth:
    auth = _Auth()
    _apply(get_map(v), _AUTH_HANDLERS, auth, errors)
    if auth.token and not allow_token:
        errors.add(v, f"{block} authorization does not support tokens")
    elif auth.token and (auth.user or auth.password):
        errors.add(v, "Cannot have a user/pass and token")
    if auth.users_at is not None and not allow_token:
        errors.add(auth.users_at, f"{block} authorization does not support a users array")
    elif auth.users_at is not None and auth.token:
        errors.add(auth.users_at, "Can not have a token and a users array")
    elif auth.users_at is not None and auth.user:
        errors.add(auth.users_at, "Can not have a single user/pass and a users array")
    return auth


def _top_auth(opts: ServerOptions, v: Value, errors: _Errors) -> None:
    auth = _read_auth(v, errors, allow_token=True, block="")
    opts.auth_user, opts.auth_password, opts.auth_token = auth.user, auth.password, auth.token
    in_accounts = [u for u in opts.users if u.account]  # read before it (zonebus.config.accounts)
    taken = {u.user or u.nkey for u in in_accounts}
    for u in auth.users:
        if (u.user or u.nkey) in taken:
            errors.add(v, f"users: duplicate user {json.dumps(u.user or u.nkey)}")
    opts.users, opts.default_permissions = auth.users + in_accounts, auth.default_permissions
    if auth.timeout is not None:
        opts.auth_timeout = auth.timeout


def _block_auth(block: str) -> Handler:
    def handler(target: RouteOptions | GatewayOptions, v: Value, errors: _Errors) -> None:
        auth = _read_auth(v, errors, allow_token=False, block=block)
        target.user, target.password = auth.user, auth.password
        if auth.timeout is not None:
            target.auth_timeout = auth.timeout

    return handler


# ---- tls blocks (zonebus.server.tls) -------------------------------------------------------------


def _handshake_first(t: TLSOptions, v: Value, errors: _Errors) -> None:
    if v.kind != "bool":
        raise BadValue(f"only true or false are supported (no fallback duration), got {show(v)}", v)
    t.handshake_first = v.value


_TLS_HANDLERS: dict[str, Handler] = {
    "cert_file": _str("cert_file"),
    "key_file": _str("key_file"),
    "ca_file": _str("ca_file"),
    "verify": _bool("verify"),
    "verify_and_map": _bool("verify_and_map"),
    "insecure": _bool("insecure"),
    "timeout": _setter("timeout", get_seconds),
    "handshake_first": _handshake_first,
    "first": _handshake_first,
}


def _read_tls(v: Value, errors: _Errors, block: str) -> TLSOptions:
    """A `tls {}` block; its certificate, key and CA are loaded at once, so a bad file fails the config
    check with the block's position (as nats-server)."""
    from zonebus.server.tls import TLSConfigError, check

    tls = TLSOptions()
    before = len(errors)
    _apply(get_map(v), _TLS_HANDLERS, tls, errors)
    if len(errors) == before:
        try:
            check(tls)
        except TLSConfigError as exc:
            errors.add(v, f"{block}{exc}")
    return tls


def _tls(block: str) -> Handler:
    def handler(target: ServerOptions | RouteOptions | GatewayOptions, v: Value, errors: _Errors) -> None:
        target.tls = _read_tls(v, errors, block)

    return handler


# ---- cluster and gateway --------------------------------------------------------------------------


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
    "tls": _tls("cluster tls: "),
    "compression": _setter("compression", get_compression),
    "pool_size": _int("pool_size"),
}


def _cluster(opts: ServerOptions, v: Value, errors: _Errors) -> None:
    _apply(get_map(v), _CLUSTER_HANDLERS, opts.cluster, errors, "cluster")


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
    "tls": _tls("gateway tls: "),
    "compression": _setter("compression", get_compression),
}


def _gateway(opts: ServerOptions, v: Value, errors: _Errors) -> None:
    _apply(get_map(v), _GATEWAY_HANDLERS, opts.gateway, errors, "gateway")


# ---- jetstream and ledger -------------------------------------------------------------------------


def _sync_interval(js: JetStreamOptions, v: Value, errors: _Errors) -> None:
    if v.kind == "string" and v.value.strip().lower() == "always":
        js.sync_always, js.sync_interval = True, 0.0
    else:
        js.sync_always, js.sync_interval = False, get_duration(v)


def _shared_store(js: JetStreamOptions, v: Value, errors: _Errors) -> None:
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


def _s3_endpoint(js: JetStreamOptions, v: Value, errors: _Errors) -> None:
    text = get_str(v).strip()
    if "://" in text and urlsplit(text).scheme not in ("http", "https"):
        raise BadValue(f"expected an http:// or https:// endpoint, got {show(v)}", v)
    js.s3_endpoint = text


_S3_HANDLERS: dict[str, Handler] = {
    "endpoint": _s3_endpoint,
    "region": _str("s3_region"),
}


def _s3(js: JetStreamOptions, v: Value, errors: _Errors) -> None:
    _apply(get_map(v), _S3_HANDLERS, js, errors)


def _positive_size(attr: str) -> Handler:
    def read(v: Value) -> int:
        n = get_storage_size(v)
        if n <= 0:
            raise BadValue(f"expected a size above 0, got {show(v)}", v)
        return n

    return _setter(attr, read)


def _router_linger(v: Value) -> float:
    seconds = get_duration(v)
    if not 0 <= seconds <= 0.001:
        raise BadValue(f"expected a duration from 0 to 1ms, got {show(v)}", v)
    return seconds


def _router_path(opts: JetStreamOptions, v: Value, errors: _Errors) -> None:
    if v.kind != "string" or v.value not in ("auto", "storage", "link"):
        raise BadValue(f"expected auto, storage or link, got {show(v)}", v)
    opts.zone_router_path = v.value


def _router_ack(opts: JetStreamOptions, v: Value, errors: _Errors) -> None:
    if v.kind != "string" or v.value not in ("replicas", "storage"):
        raise BadValue(f"expected replicas or storage, got {show(v)}", v)
    opts.zone_router_ack = v.value


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
    "shared_store": _shared_store,
    "shared_store_linger": _setter("shared_store_linger", get_duration),
    "shared_store_batch": _positive_size("shared_store_batch"),
    "shared_store_inflight": _int("shared_store_inflight", 1, 1024),
    "shared_store_latency_budget": _setter("shared_store_latency_budget", get_duration),
    "zone_router_latency_budget": _setter("shared_store_latency_budget", get_duration),
    "s3": _s3,
    "failover_timeout": _setter("failover_timeout", get_duration),
    "zone_router": _bool("zone_router"),
    "zone_router_linger": _setter("zone_router_linger", _router_linger),
    "zone_router_batch": _positive_size("zone_router_batch"),
    "zone_router_path": _router_path,
    "zone_router_epoch": _setter("zone_router_epoch", _router_epoch),
    "zone_router_ack": _router_ack,
    "zone_router_tier": _setter("zone_router_tier", _router_tier),
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
        _apply(v.value, _JETSTREAM_HANDLERS, js, errors, "jetstream")
        if js.zone_router and not js.shared_store:
            errors.add(v, "zone_router: the zone router needs a shared store (jetstream { shared_store })")
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


# ---- durable queue groups (zonebus.queue) --------------------------------------------------------


def _queue_duration(attr: str, allow_zero: bool) -> Handler:
    def read(v: Value) -> float:
        seconds = get_duration(v)
        if seconds < 0 or (seconds == 0 and not allow_zero):
            raise BadValue(f"duration must be greater than zero, got {show(v)}", v)
        return seconds

    return _setter(attr, read)


def _queue_ack(group: QueueGroupOptions, v: Value, errors: _Errors) -> None:
    word = get_str(v).strip().lower()
    if word not in ("none", "explicit"):
        raise BadValue(f'expected "none" or "explicit", got {show(v)}', v)
    group.ack = word


def _queue_subjects(group: QueueGroupOptions, v: Value, errors: _Errors) -> None:
    subjects = get_str_list(v)
    for subject in subjects:
        if not is_valid_subject(subject.encode()):
            raise BadValue(f"invalid subject {json.dumps(subject)}", v)
    group.subjects = subjects


_QUEUE_GROUP_HANDLERS: dict[str, Handler] = {
    "subjects": _queue_subjects,
    "durable": _bool("durable"),
    "ack": _queue_ack,
    "ack_policy": _queue_ack,
    "max_deliver": _int("max_deliver", -1),
    "ack_wait": _queue_duration("ack_wait", False),
    "max_age": _queue_duration("max_age", True),
}


def _queue_groups(opts: ServerOptions, v: Value, errors: _Errors) -> None:
    """`queue_groups { name: { subjects, durable, ack, max_deliver, ack_wait, max_age } }`: a group needs
    subjects, a name usable in a subject token, and subjects that overlap no other durable group's."""
    groups: dict[str, QueueGroupOptions] = {}
    seen: list[tuple[str, str, Value]] = []  # (subject, group, where) of the durable groups so far
    for name, entry in get_map(v).items():
        if not name or any(c in name for c in " \t.*>$") or name.startswith("_"):
            errors.add(entry, f"queue_groups: invalid group name {json.dumps(name)}")
            continue
        group = QueueGroupOptions(name=name)
        _apply(get_map(entry), _QUEUE_GROUP_HANDLERS, group, errors)
        if group.max_deliver == 0:
            errors.add(entry, f"queue_groups: {name}: max_deliver must be -1 (unlimited) or at least 1")
        if not group.subjects:
            errors.add(entry, f"queue_groups: {name}: a group needs subjects")
        elif group.durable:
            for subject in group.subjects:
                clash = next(((s, g) for s, g, _ in seen if overlaps(s, subject)), None)
                if clash is not None:
                    errors.add(entry, f"queue_groups: {name}: subject {json.dumps(subject)} overlaps "
                                      f"{json.dumps(clash[0])} of group {json.dumps(clash[1])}")
                seen.append((subject, name, entry))
        groups[name] = group
    opts.queue_groups = groups


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


LAME_DUCK_MIN = 30.0  # seconds; nats-server refuses less


def _lame_duck_duration(v: Value) -> float:
    seconds = get_duration(v)
    if seconds < LAME_DUCK_MIN:
        shown = v.value if v.kind == "string" else show(v)
        raise BadValue(f"invalid lame_duck_duration of {shown}, minimum is 30 seconds", v)
    return seconds


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
    "https": _listen("http_host", "https_port"),
    "https_port": _setter("https_port", get_port),
    "tls": _tls(""),
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
    "lame_duck_duration": _setter("lame_duck_duration", _lame_duck_duration),
    "lame_duck_grace_period": _positive_duration("lame_duck_grace_period"),
    "authorization": _top_auth,
    "no_auth_user": _str("no_auth_user"),
    "debug": _bool("debug"),
    "trace": _bool("trace"),
    "logtime": _bool("logtime"),
    "pid_file": _str("pid_file"),
    "pidfile": _str("pid_file"),
    "log_file": _str("log_file"),
    "logfile": _str("log_file"),
    "syslog": _bool("syslog"),
    "remote_syslog": _str("remote_syslog"),
    "disable_sublist_cache": _bool("disable_sublist_cache"),
    "no_header_support": _bool("no_header_support"),
    "connect_error_reports": _int("connect_error_reports"),
    "reconnect_error_reports": _int("reconnect_error_reports"),
    "cluster": _cluster,
    "gateway": _gateway,
    "jetstream": _jetstream,
    "ledger": _ledger,
    "queue_groups": _queue_groups,
    "workers": _int("workers", 1, MAX_WORKERS),
    "accounts": lambda o, v, e: _accounts_block("read_accounts", o, v, e),
    "system_account": lambda o, v, e: _accounts_block("read_system_account", o, v, e),
    "mappings": lambda o, v, e: _mappings_block(o, v, e),
}


def _mappings_block(target: Any, v: Value, errors: _Errors) -> None:
    from zonebus.config.mappings import read_mappings  # (zonebus.subjects.mapping: what they do)

    target.mappings = read_mappings(v, errors)


def _accounts_block(reader: str, opts: ServerOptions, v: Value, errors: _Errors) -> None:
    from zonebus.config import accounts  # it builds on this module's handlers

    getattr(accounts, reader)(opts, v, errors)


def apply_config(tree: dict[str, Value], opts: ServerOptions | None = None) -> ServerOptions:
    """Apply a parsed tree to `opts` (fresh defaults when None) and return it; raises `ConfigError`
    listing every problem found."""
    opts = ServerOptions() if opts is None else opts
    errors = _Errors()
    _apply(tree, _TOP_HANDLERS, opts, errors, "")
    if opts.no_auth_user and not errors and not any(opts.no_auth_user in (u.user, u.nkey) for u in opts.users):
        where = next((v for k, v in tree.items() if k.lower() == "no_auth_user"), None)
        msg = (f'no_auth_user: "{opts.no_auth_user}" not present as user or nkey in authorization block '
               "or account configuration")
        errors.append(f"{where.where}: {msg}" if where is not None else msg)
    if opts.https_port and opts.tls is None and not errors:
        where = next((v for k, v in tree.items() if k.lower() in ("https", "https_port")), None)
        msg = "https: monitoring over https needs a top-level tls block (the certificate it serves)"
        errors.append(f"{where.where}: {msg}" if where is not None else msg)
    if errors:
        raise ConfigError(list(errors))
    return opts
