"""The `accounts {}` block and `system_account`: accounts, their users, exports and imports.

    accounts {
      A: { users: [{user: a, password: a}], exports: [{stream: "pub.>"}, {service: "svc.*"}] }
      B: { users: [{user: b, password: b}],
           imports: [{stream: {account: A, subject: "pub.>"}, prefix: "from_a"},
                     {service: {account: A, subject: "svc.*"}, to: "a.svc.*"}] }
    }

Users of an account are added to the server's users with their account set (`UserOptions.account`), so one
authenticator logs everybody in. Imports are checked against the exporter's exports once every account is
read: an import of nothing exported (or exported to other accounts only) is refused, as nats-server refuses
it. What the accounts do is `zonebus.server.accounts`.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from zonebus.config.authorization import AuthBlock, read_permissions, read_users
from zonebus.config.convert import (
    BadValue,
    expected,
    get_bool,
    get_int,
    get_map,
    get_storage_size,
    get_str,
    get_str_list,
    show,
)
from zonebus.config.mappings import read_mappings
from zonebus.config.parser import Value
from zonebus.config.readers import MAX_PAYLOAD_LIMIT, Errors, Handler, apply_handlers
from zonebus.credentials import is_account_nkey
from zonebus.options import AccountJetStream, AccountOptions, ExportOptions, ImportOptions, ServerOptions
from zonebus.subjects.patterns import is_subset
from zonebus.subjects.validate import is_valid_subject

GLOBAL = "$G"
RESPONSE_TYPES = ("singleton", "stream", "chunked")


def read_accounts(opts: ServerOptions, v: Value, errors: Errors) -> None:
    """`accounts { NAME: {users, exports, imports, default_permissions} }`."""
    seen_users = {u.user or u.nkey for u in opts.users}
    for name, body in get_map(v).items():
        if name == GLOBAL or " " in name or not name:
            errors.add(body, f"accounts: invalid account name {json.dumps(name)}")
            continue
        acc = AccountOptions(name=name)
        if body.kind == "map":
            apply_handlers(body.value, _ACCOUNT_HANDLERS, acc, errors, "account")
        elif body.kind != "string" or body.value:  # `A: {}` or the bare name form
            errors.add(body, f"accounts: {name}: expected map, got {show(body)}")
            continue
        for user in acc.users:
            key = user.user or user.nkey
            if key in seen_users:
                errors.add(body, f"accounts: {name}: duplicate user {json.dumps(key)}")
                continue
            seen_users.add(key)
            user.account = name
            if user.permissions is None:
                user.permissions = acc.default_permissions
            opts.users.append(user)
        opts.accounts.append(acc)
    _check_imports(opts, v, errors)


def _account_users(acc: AccountOptions, v: Value, errors: Errors) -> None:
    auth = AuthBlock()
    read_users(auth, v, errors)
    acc.users = auth.users


def _subject(v: Value, what: str) -> str:
    text = get_str(v).strip()
    if not is_valid_subject(text.encode()):
        raise BadValue(f"{what}: invalid subject {json.dumps(text)}", v)
    return text


def _entries(what: str, read: Callable[[Value], object]) -> Handler:
    """A handler for `exports` / `imports`: an array whose entries `read` turns into options (a bad entry is
    reported with its place, the others are kept)."""
    def handler(acc: AccountOptions, v: Value, errors: Errors) -> None:
        if v.kind != "array":
            raise expected(f"array of {what}", v)
        for item in v.value:
            try:
                getattr(acc, what).append(read(item))
            except BadValue as exc:
                errors.add(exc.at or item, f"{what}: {exc}")

    return handler


def _export(item: Value) -> ExportOptions:
    body = get_map(item)
    keys = {k.lower(): val for k, val in body.items()}
    kinds = [k for k in ("stream", "service") if k in keys]
    if len(kinds) != 1:
        raise BadValue("an export names one stream or one service subject", item)
    exp = ExportOptions(kind=kinds[0], subject=_subject(keys[kinds[0]], kinds[0]))
    for key, val in keys.items():
        if key in ("stream", "service"):
            continue
        if key == "accounts":
            exp.accounts = get_str_list(val)
        elif key in ("response_type", "response") and exp.kind == "service":
            kind = get_str(val).lower()
            if kind not in RESPONSE_TYPES:
                raise BadValue(f"unknown response type {json.dumps(kind)} (singleton, stream or chunked)", val)
            exp.response_type = kind
        else:
            raise BadValue(f"unknown field {json.dumps(key)}", val)
    return exp


def _import(item: Value) -> ImportOptions:
    body = get_map(item)
    keys = {k.lower(): val for k, val in body.items()}
    kinds = [k for k in ("stream", "service") if k in keys]
    if len(kinds) != 1:
        raise BadValue("an import names one stream or one service", item)
    kind = kinds[0]
    source = {k.lower(): val for k, val in get_map(keys[kind]).items()}
    if "account" not in source or "subject" not in source:
        raise BadValue(f"a {kind} import needs {{account, subject}}", keys[kind])
    imp = ImportOptions(kind=kind, account=get_str(source["account"]), subject=_subject(source["subject"], kind))
    for key, val in keys.items():
        if key == kind:
            continue
        if key == "prefix" and kind == "stream":
            imp.prefix = get_str(val).strip().rstrip(".")
            if not imp.prefix or not is_valid_subject(imp.prefix.encode()):
                raise BadValue(f"prefix: invalid subject {json.dumps(imp.prefix)}", val)
        elif key == "to" and kind == "service":
            imp.to = _subject(val, "to")
            if imp.to.count("*") != imp.subject.count("*") or imp.to.count(">") != imp.subject.count(">"):
                raise BadValue(f"to: {json.dumps(imp.to)} must have the wildcards of {json.dumps(imp.subject)}",
                               val)
        else:
            raise BadValue(f"unknown field {json.dumps(key)}", val)
    return imp


def _check_imports(opts: ServerOptions, v: Value, errors: Errors) -> None:
    """Each import must name a known account that exports (to the importer) what it imports."""
    by_name = {a.name: a for a in opts.accounts}
    for acc in opts.accounts:
        for imp in acc.imports:
            src = by_name.get(imp.account)
            where = f"accounts: {acc.name}: {imp.kind} import of {json.dumps(imp.subject)}"
            if src is None:
                errors.add(v, f"{where}: unknown account {json.dumps(imp.account)}")
                continue
            if not any(e.kind == imp.kind and is_subset(imp.subject, e.subject)
                       and (e.accounts is None or acc.name in e.accounts) for e in src.exports):
                errors.add(v, f"{where}: account {json.dumps(imp.account)} does not export it to {acc.name}")


def _jetstream(acc: AccountOptions, v: Value, errors: Errors) -> None:
    """`jetstream: enabled | disabled | true | false` or `{max_mem, max_file, max_streams, max_consumers}`."""
    if v.kind == "string":
        word = v.value.lower()
        if word not in ("enabled", "disabled", "enable", "disable"):
            raise BadValue(f"expected enabled or disabled, got {json.dumps(v.value)}", v)
        acc.jetstream = AccountJetStream() if word.startswith("enable") else None
        return
    if v.kind == "bool":
        acc.jetstream = AccountJetStream() if get_bool(v) else None
        return
    limits = AccountJetStream()
    handlers = {
        "max_mem": lambda t, x, e: setattr(t, "max_memory", get_storage_size(x)),
        "max_memory": lambda t, x, e: setattr(t, "max_memory", get_storage_size(x)),
        "max_file": lambda t, x, e: setattr(t, "max_storage", get_storage_size(x)),
        "max_store": lambda t, x, e: setattr(t, "max_storage", get_storage_size(x)),
        "max_streams": lambda t, x, e: setattr(t, "max_streams", get_int(x, -1)),
        "max_consumers": lambda t, x, e: setattr(t, "max_consumers", get_int(x, -1)),
    }
    apply_handlers(get_map(v), handlers, limits, errors)
    acc.jetstream = limits


_LIMIT_KEYS = {
    "max_connections": "max_connections", "max_conn": "max_connections",
    "max_subscriptions": "max_subscriptions", "max_subs": "max_subscriptions",
    "max_payload": "max_payload", "max_pay": "max_payload",
    "max_leafnodes": "max_leafnodes", "max_leafs": "max_leafnodes",
}


def _limits(acc: AccountOptions, v: Value, errors: Errors) -> None:
    """`limits { max_connections, max_subscriptions, max_payload, max_leafnodes }` (and nats-server's short
    names), with nats-server's messages for a block that is not a map and for an unknown key."""
    if v.kind != "map":
        errors.add(v, f"Expected account limits to be a map/struct, got {show(v)}")
        return
    for key, val in v.value.items():
        attr = _LIMIT_KEYS.get(key.lower())
        if attr is None:
            errors.add(val, f"Unknown field {json.dumps(key)} parsing account limits")
            continue
        try:
            setattr(acc.limits, attr, get_int(val, -1, MAX_PAYLOAD_LIMIT))
        except BadValue as exc:
            errors.add(exc.at or val, f"{key}: {exc}")


def _account_nkey(acc: AccountOptions, v: Value, errors: Errors) -> None:
    key = v.value if v.kind == "string" else None
    if key is None or not is_account_nkey(key):
        shown = json.dumps(key) if key is not None else show(v)
        raise BadValue(f"Not a valid public nkey for an account: {shown}", v)
    acc.nkey = key


_ACCOUNT_HANDLERS = {
    "nkey": _account_nkey,
    "limits": _limits,
    "mappings": lambda a, v, e: setattr(a, "mappings", read_mappings(v, e)),
    "jetstream": _jetstream,
    "users": _account_users,
    "exports": _entries("exports", _export),
    "imports": _entries("imports", _import),
    "default_permissions": lambda a, v, e: setattr(a, "default_permissions", read_permissions(v, e)),
}


def read_system_account(opts: ServerOptions, v: Value, errors: Errors) -> None:
    opts.system_account = get_str(v).strip()
