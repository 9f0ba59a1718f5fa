"""The `leafnodes {}` block (also spelt `leaf`): the leaf node listener and the remotes (hubs) to dial.

Read onto `LeafNodeOptions` (zonebus.leaf builds the connections). nats-server's keys that zonebus does not
build yet are refused by name through `zonebus.config.unsupported` (blocks `leafnodes` and
`leafnode_remote`), never ignored. Checked here where
nats-server checks at start: an `advertise` that is no `host[:port]`, a `min_version` that is no semantic
version of 2.8.0 or later. Interest isolation (nats-server 2.12): `isolate_leafnode_interest` (`isolate`) in
the block or in a remote, a remote's `request_isolation` (booleans; see `zonebus.leaf.manager`).
"""

from __future__ import annotations

import json
import os

from zonebus.config.authorization import block_auth
from zonebus.config.convert import (
    BadValue,
    expected,
    get_bool,
    get_compression,
    get_duration,
    get_map,
    get_port,
    get_str,
    show,
)
from zonebus.config.parser import Value
from zonebus.config.readers import Errors, Handler, apply_handlers, bool_field, positive_duration, str_field
from zonebus.config.tls import read_tls
from zonebus.credentials import CredentialsError, check_seed, decode_user_nkey, read_creds
from zonebus.options import LEAF_PORT, CompressionOptions, RemoteLeafOptions, ServerOptions, TLSOptions
from zonebus.protocol.urls import advertised_address, leaf_url
from zonebus.protocol.versions import version_components
from zonebus.subjects.validate import is_valid_subject

MIN_LEAF_VERSION = (2, 8, 0)  # the lowest `min_version` nats-server takes


def _url(v: Value) -> str:
    url = get_str(v)
    try:
        leaf_url(url)
    except ValueError as exc:  # (an out-of-range port too)
        raise BadValue(f"error parsing leafnode remote url {show(v)}: {exc}", v) from None
    return url


def _urls(v: Value) -> list[str]:
    if v.kind not in ("array", "string"):
        raise expected("array of URLs", v)
    return [_url(item) for item in (v.value if v.kind == "array" else [v])]


def _deny_subjects(v: Value) -> list[str]:
    """`deny_imports` / `deny_exports`: a subject or an array of subjects (wildcards allowed, no queues)."""
    if v.kind not in ("array", "string"):
        raise BadValue(f"Expected subject permissions to be a subject, or array of subjects, got {show(v)}", v)
    out = []
    for item in v.value if v.kind == "array" else [v]:
        if item.kind != "string":
            raise BadValue("Subject in permissions array cannot be cast to string", item)
        if not is_valid_subject(item.value.encode()):
            raise BadValue(f"subject {json.dumps(item.value)} is not a valid subject", item)
        out.append(item.value)
    return out


def _nkey(r: RemoteLeafOptions, v: Value, errors: Errors) -> None:
    seed = get_str(v)
    try:
        check_seed(seed)
    except CredentialsError as exc:
        raise BadValue(str(exc), v) from None
    if r.credentials:
        raise BadValue("Remote leafnode can not have both creds and nkey defined", v)
    r.nkey = seed


def _credentials(r: RemoteLeafOptions, v: Value, errors: Errors) -> None:
    path = get_str(v)
    try:
        read_creds(path)  # (read again at every connect, as nats-server: the file may be rotated)
    except CredentialsError as exc:
        raise BadValue(str(exc), v) from None
    if r.nkey:
        raise BadValue("Remote leafnode can not have both creds and nkey defined", v)
    r.credentials = os.path.expanduser(path)


def _leaf_tls(tls: TLSOptions, v: Value, errors: Errors) -> TLSOptions:
    """What leaf links do not have of a `tls {}` block is refused, not ignored: the handshake before the INFO
    (`handshake_first`) and logins by certificate (`verify_and_map`)."""
    for key in ("handshake_first", "verify_and_map"):
        if getattr(tls, key):
            errors.add(v, f"leafnode tls: {key} is not supported on leaf node connections by zonebus")
    return tls


def _remote_tls(r: RemoteLeafOptions, v: Value, errors: Errors) -> None:
    r.tls = _leaf_tls(read_tls(v, errors, "leafnode remote tls: ", client=True), v, errors)


_LEAFNODE_REMOTE_HANDLERS: dict[str, Handler] = {
    "url": lambda r, v, e: r.urls.append(_url(v)),
    "urls": lambda r, v, e: r.urls.extend(_urls(v)),
    "account": str_field("account"),
    "local": str_field("account"),
    "deny_imports": lambda r, v, e: setattr(r, "deny_imports", _deny_subjects(v)),
    "deny_import": lambda r, v, e: setattr(r, "deny_imports", _deny_subjects(v)),
    "deny_exports": lambda r, v, e: setattr(r, "deny_exports", _deny_subjects(v)),
    "deny_export": lambda r, v, e: setattr(r, "deny_exports", _deny_subjects(v)),
    "tls": _remote_tls,
    "no_randomize": bool_field("no_randomize"),
    "dont_randomize": bool_field("no_randomize"),
    "first_info_timeout": positive_duration("first_info_timeout"),
    "disabled": bool_field("disabled"),
    "nkey": _nkey,
    "seed": _nkey,
    "credentials": _credentials,
    "creds": _credentials,
    "compression": lambda r, v, e: setattr(r, "compression", _compression(v)),
    "isolate_leafnode_interest": bool_field("isolate"),
    "isolate": bool_field("isolate"),
    "request_isolation": bool_field("request_isolation"),
    "hub": bool_field("hub"),
    "ws_compress": bool_field("ws_compression"),
    "ws_compression": bool_field("ws_compression"),
    "websocket_compress": bool_field("ws_compression"),
    "websocket_compression": bool_field("ws_compression"),
    "ws_no_masking": bool_field("ws_no_masking"),
    "websocket_no_masking": bool_field("ws_no_masking"),
    "jetstream_cluster_migrate": lambda r, v, e: _js_migrate(r, v),
    "js_cluster_migrate": lambda r, v, e: _js_migrate(r, v),
}


_GO_TYPES = {"string": "string", "integer": "int64", "float": "float64", "array": "[]interface {}"}


def _js_migrate(r: RemoteLeafOptions, v: Value) -> None:
    """nats-server's `jetstream_cluster_migrate`: a boolean, or a map (on) whose `leader_migrate_delay` is a
    duration (its other keys are not read, as nats-server)."""
    if v.kind == "bool":
        r.js_cluster_migrate = bool(v.value)
    elif v.kind == "map":
        r.js_cluster_migrate = True
        for key, x in v.value.items():
            if key == "leader_migrate_delay":
                r.js_cluster_migrate_delay = get_duration(x)
    else:
        raise BadValue(f"Expected boolean or map for jetstream_cluster_migrate, got {_GO_TYPES.get(v.kind, v.kind)}",
                       v)


def _remotes(opts: ServerOptions, v: Value, errors: Errors) -> None:
    if v.kind != "array":
        raise expected("array", v)
    for item in v.value:
        if item.kind != "map":
            errors.add(item, f"remotes: expected map with url(s), got {show(item)}")
            continue
        remote = RemoteLeafOptions()
        apply_handlers(item.value, _LEAFNODE_REMOTE_HANDLERS, remote, errors, "leafnode_remote")
        if not remote.urls:
            errors.add(item, "remotes: a leafnode remote needs url or urls")
            continue
        opts.leafnodes.remotes.append(remote)


def _listen(target: ServerOptions, v: Value, errors: Errors) -> None:
    """`listen: host:port`, a port alone, or a host alone (nats-server's port 7422)."""
    text = str(v.value) if v.kind in ("string", "int") else ""
    if not text:
        raise expected("host:port", v)
    host, sep, port = text.rpartition(":")
    if not sep:
        host, port = ("", text) if text.isdigit() else (text, str(LEAF_PORT))
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise BadValue(f"could not parse port {show(v)}", v)
    if host:
        target.leafnodes.host = host
    target.leafnodes.port = int(port)


_AUTH = block_auth("Leafnode")


def _authorization(opts: ServerOptions, v: Value, errors: Errors) -> None:
    """nats-server's leafnode `authorization {}`: the user and password of `block_auth`, or an `nkey` that
    leaf nodes must sign the nonce with."""
    entries = get_map(v)
    rest = {k: x for k, x in entries.items() if k.lower() != "nkey"}
    for key, x in entries.items():
        if key.lower() == "nkey":
            nkey = get_str(x).strip()
            if decode_user_nkey(nkey) is None:
                errors.add(x, "Not a valid public nkey for leafnode authorization")
                continue
            opts.leafnodes.nkey = nkey
    _AUTH(opts.leafnodes, Value(rest, "map", v.file, v.line, v.col, v.raw), errors)

_LEAFNODES_HANDLERS: dict[str, Handler] = {
    "listen": _listen,
    "host": lambda o, v, e: setattr(o.leafnodes, "host", get_str(v)),
    "net": lambda o, v, e: setattr(o.leafnodes, "host", get_str(v)),
    "port": lambda o, v, e: setattr(o.leafnodes, "port", get_port(v)),
    "remotes": _remotes,
    "authorization": _authorization,
    "tls": lambda o, v, e: setattr(o.leafnodes, "tls", _leaf_tls(read_tls(v, e, "leafnodes tls: "), v, e)),
    "reconnect": lambda o, v, e: setattr(o.leafnodes, "reconnect_interval", _reconnect(v)),
    "reconnect_interval": lambda o, v, e: setattr(o.leafnodes, "reconnect_interval", _reconnect(v)),
    "reconnect_delay": lambda o, v, e: setattr(o.leafnodes, "reconnect_interval", _reconnect(v)),
    "compression": lambda o, v, e: setattr(o.leafnodes, "compression", _compression(v)),
    "advertise": lambda o, v, e: setattr(o.leafnodes, "advertise", _advertise(v)),
    "leafnode_advertise": lambda o, v, e: setattr(o.leafnodes, "advertise", _advertise(v)),
    "no_advertise": lambda o, v, e: setattr(o.leafnodes, "no_advertise", get_bool(v)),
    "min_version": lambda o, v, e: setattr(o.leafnodes, "min_version", _min_version(v)),
    "minimum_version": lambda o, v, e: setattr(o.leafnodes, "min_version", _min_version(v)),
    "write_deadline": lambda o, v, e: setattr(o.leafnodes, "write_deadline", get_duration(v)),
    "isolate_leafnode_interest": lambda o, v, e: setattr(o.leafnodes, "isolate_leafnode_interest", get_bool(v)),
    "isolate": lambda o, v, e: setattr(o.leafnodes, "isolate_leafnode_interest", get_bool(v)),
}


def _advertise(v: Value) -> str:
    """`advertise: host[:port]`: checked here (nats-server stops at start on a bad one); the port, when it
    names none, is the listener's, known at start."""
    text = get_str(v)
    try:
        advertised_address(text, LEAF_PORT)
    except ValueError as exc:
        raise BadValue(f"Error setting leafnode INFO with LeafNode.Advertise value of {text}, err={exc}", v) from None
    return text


def _min_version(v: Value) -> str:
    """nats-server's checkLeafMinVersionConfig: a semantic version, 2.8.0 or later."""
    text = get_str(v)
    try:
        ok = version_components(text) >= MIN_LEAF_VERSION
    except ValueError as exc:
        raise BadValue(f"invalid leafnode's minimum version: {exc}", v) from None
    if not ok:
        raise BadValue("the minimum version should be at least 2.8.0", v)
    return text


def _compression(v: Value) -> CompressionOptions:
    """nats-server's leafnode `compression`: as on routes, but `true` (and the default) is `s2_auto`."""
    return get_compression(v, on_mode="s2_auto", default="s2_auto")


def _reconnect(v: Value) -> float:
    seconds = get_duration(v)
    if seconds <= 0:
        raise BadValue(f"duration must be greater than zero, got {show(v)}", v)
    return seconds


def read_leafnodes(opts: ServerOptions, v: Value, errors: Errors) -> None:
    apply_handlers(get_map(v), _LEAFNODES_HANDLERS, opts, errors, "leafnodes")
