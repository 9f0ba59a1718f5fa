"""`authorization {}` blocks: users (by name or nkey), their permissions, tokens, and the blocks of
`cluster {}` and `gateway {}` (one user and password). `zonebus.config.accounts` reads the users of each
account with `read_users` and `read_permissions` too; what the server does with them is `zonebus.server.auth`."""

from __future__ import annotations

import json
from collections.abc import Callable

from zonebus.config.convert import BadValue, expected, get_duration, get_map, get_seconds, get_str, show
from zonebus.config.parser import Value
from zonebus.config.readers import Errors, Handler, apply_handlers, int_field, setter, str_field
from zonebus.credentials import decode_user_nkey
from zonebus.options import (
    GatewayOptions,
    Permissions,
    ResponsePermission,
    RouteOptions,
    ServerOptions,
    SubjectPermission,
    UserOptions,
)
from zonebus.subjects.validate import is_valid_subject


class AuthBlock:
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


def _subject_permission(queues: bool) -> Callable[[Value, Errors], SubjectPermission]:
    def read(v: Value, errors: Errors) -> SubjectPermission:
        perm = SubjectPermission()
        if v.kind != "map":
            perm.allow = _subject_list(v, queues)
            return perm
        handlers: dict[str, Handler] = {
            "allow": lambda p, x, e: setattr(p, "allow", _subject_list(x, queues)),
            "deny": lambda p, x, e: setattr(p, "deny", _subject_list(x, queues)),
        }
        apply_handlers(v.value, handlers, perm, errors)
        return perm

    return read


def _allow_responses(perms: Permissions, v: Value, errors: Errors) -> None:
    if v.kind == "bool":
        perms.response = ResponsePermission() if v.value else None
        return
    resp = ResponsePermission()
    handlers: dict[str, Handler] = {
        "max": int_field("max_msgs", 0),
        "max_msgs": int_field("max_msgs", 0),
        "expires": setter("expires", get_duration),
        "ttl": setter("expires", get_duration),
    }
    apply_handlers(get_map(v), handlers, resp, errors)
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


def read_permissions(v: Value, errors: Errors) -> Permissions:
    perms = Permissions()
    apply_handlers(get_map(v), _PERMISSION_HANDLERS, perms, errors)
    return perms


def _nkey(user: UserOptions, v: Value, errors: Errors) -> None:
    key = get_str(v).strip()
    if decode_user_nkey(key) is None:
        raise BadValue(f"Not a valid public nkey for a user: {json.dumps(key)}", v)
    user.nkey = key


_USER_HANDLERS: dict[str, Handler] = {
    "user": str_field("user"),
    "username": str_field("user"),
    "password": str_field("password"),
    "pass": str_field("password"),
    "nkey": _nkey,
    "permissions": lambda u, v, e: setattr(u, "permissions", read_permissions(v, e)),
    "permission": lambda u, v, e: setattr(u, "permissions", read_permissions(v, e)),
}


def read_users(auth: AuthBlock, v: Value, errors: Errors) -> None:
    if v.kind != "array":
        raise expected("array of users", v)
    auth.users_at = v
    seen: set[str] = set()
    for item in v.value:
        if item.kind != "map":
            errors.add(item, f"users: expected map with user or nkey, got {show(item)}")
            continue
        user = UserOptions()
        apply_handlers(item.value, _USER_HANDLERS, user, errors)
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
    "user": str_field("user"),
    "username": str_field("user"),
    "password": str_field("password"),
    "pass": str_field("password"),
    "token": str_field("token"),
    "timeout": setter("timeout", get_seconds),
    "users": read_users,
    "default_permissions": lambda a, v, e: setattr(a, "default_permissions", read_permissions(v, e)),
}


def read_auth(v: Value, errors: Errors, allow_token: bool, block: str) -> AuthBlock:
    auth = AuthBlock()
    apply_handlers(get_map(v), _AUTH_HANDLERS, auth, errors)
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


def top_auth(opts: ServerOptions, v: Value, errors: Errors) -> None:
    auth = read_auth(v, errors, allow_token=True, block="")
    opts.auth_user, opts.auth_password, opts.auth_token = auth.user, auth.password, auth.token
    in_accounts = [u for u in opts.users if u.account]  # read before it (zonebus.config.accounts)
    taken = {u.user or u.nkey for u in in_accounts}
    for u in auth.users:
        if (u.user or u.nkey) in taken:
            errors.add(v, f"users: duplicate user {json.dumps(u.user or u.nkey)}")
    opts.users, opts.default_permissions = auth.users + in_accounts, auth.default_permissions
    if auth.timeout is not None:
        opts.auth_timeout = auth.timeout


def block_auth(block: str) -> Handler:
    def handler(target: RouteOptions | GatewayOptions, v: Value, errors: Errors) -> None:
        auth = read_auth(v, errors, allow_token=False, block=block)
        target.user, target.password = auth.user, auth.password
        if auth.timeout is not None:
            target.auth_timeout = auth.timeout

    return handler


# ---- tls blocks (zonebus.server.tls) -------------------------------------------------------------
