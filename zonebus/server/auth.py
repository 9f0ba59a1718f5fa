"""Client authentication and permissions, as nats-server configures them.

- `Authenticator` is built from the options (`authorization { user/password | token | users: [...] }`,
  `no_auth_user`) and checks a CONNECT: single user, token (clear or bcrypt), users by name and password
  (clear or bcrypt `$2a$...`) or by public nkey (an Ed25519 signature of the INFO `nonce`). It returns a
  `Login`: who logged in and with which permissions (None: everything allowed).
- `ClientPermissions` is one connection's view of its permissions: publish decisions are cached per
  subject (a dict), subscribe checks happen once per SUB, `allow_responses` tracks the reply subjects of
  requests the client received. A connection without permissions has none of this: its hot path is unchanged.

Subjects are matched with `zonebus.subjects.patterns` (a permission pattern against the literal subject of a
PUB, or against the subject of a SUB, whose wildcards then count as plain tokens, as nats-server does).
"""

from __future__ import annotations

import base64
import binascii
import re
import time
from dataclasses import dataclass
from typing import Any

from zonebus.credentials import decode_user_nkey
from zonebus.options import Permissions, ResponsePermission, ServerOptions, UserOptions
from zonebus.subjects.patterns import is_subset, matches

_BCRYPT = re.compile(r"^\$2[abxy]\$\d{2}\$.*")
PERM_CACHE_MAX = 1024  # publish decisions kept per connection; the cache starts over beyond this


def pub_violation(subject: bytes) -> bytes:
    return b"-ERR 'Permissions Violation for Publish to \"%b\"'\r\n" % subject


def sub_violation(subject: bytes, queue: bytes | None) -> bytes:
    if queue is None:
        return b"-ERR 'Permissions Violation for Subscription to \"%b\"'\r\n" % subject
    return b"-ERR 'Permissions Violation for Subscription to \"%b\" using queue \"%b\"'\r\n" % (subject, queue)


def is_bcrypt(secret: str) -> bool:
    return bool(_BCRYPT.match(secret))


def _b64(text: str) -> bytes | None:
    """nats-py sends the signature base64 (raw URL alphabet); nats-server also takes the standard one."""
    for decode in (base64.urlsafe_b64decode, base64.standard_b64decode):
        try:
            return decode(text + "=" * (-len(text) % 4))
        except (binascii.Error, ValueError):
            continue
    return None


class _SecretCheck:
    """Compares a presented secret with a configured one, clear or bcrypt. Successful bcrypt checks are
    remembered (by a SHA-256 of the pair) so that a reconnect storm does not cost one bcrypt round each."""

    def __init__(self) -> None:
        self._ok: set[bytes] = set()

    def __call__(self, configured: str, presented: Any) -> bool:
        if not isinstance(presented, str):
            return False
        import hashlib  # (on demand: a server without passwords never loads OpenSSL's hashes)
        import hmac

        if not is_bcrypt(configured):
            return hmac.compare_digest(configured.encode(), presented.encode())
        key = hashlib.sha256(configured.encode() + b"\0" + presented.encode()).digest()
        if key in self._ok:
            return True
        import bcrypt

        try:
            ok = bcrypt.checkpw(presented.encode(), configured.encode())
        except ValueError:
            return False
        if ok:
            if len(self._ok) > 4096:
                self._ok.clear()
            self._ok.add(key)
        return ok


@dataclass
class PermissionSet:
    """Compiled permissions of one user. Subscribe entries are (subject, queue or None)."""

    pub_allow: tuple[str, ...] | None
    pub_deny: tuple[str, ...]
    sub_allow: tuple[tuple[str, str | None], ...] | None
    sub_deny: tuple[tuple[str, str | None], ...]
    response: ResponsePermission | None

    @classmethod
    def compile(cls, perms: Permissions) -> PermissionSet:
        pub, sub = perms.publish, perms.subscribe
        pub_allow = tuple(pub.allow) if pub is not None and pub.allow is not None else None
        if pub_allow is None and perms.response is not None:
            pub_allow = ()  # allow_responses without publish permissions: responses only (nats-server)
        return cls(
            pub_allow=pub_allow,
            pub_deny=tuple(pub.deny or ()) if pub is not None else (),
            sub_allow=_queue_entries(sub.allow) if sub is not None and sub.allow is not None else None,
            sub_deny=_queue_entries(sub.deny or ()) if sub is not None else (),
            response=perms.response,
        )

    def can_publish(self, subject: str) -> bool:
        if self.pub_allow is not None and not any(matches(p, subject) for p in self.pub_allow):
            return False
        return not any(matches(p, subject) for p in self.pub_deny)

    def can_subscribe(self, subject: str, queue: str | None) -> bool:
        if self.sub_allow is not None and not _entry_match(self.sub_allow, subject, queue):
            return False
        return not _entry_match(self.sub_deny, subject, queue)


def _queue_entries(items: list[str] | tuple[str, ...]) -> tuple[tuple[str, str | None], ...]:
    out = []
    for item in items:
        subject, _, queue = item.partition(" ")
        out.append((subject, queue or None))
    return tuple(out)


def _entry_match(entries: tuple[tuple[str, str | None], ...], subject: str, queue: str | None) -> bool:
    """A plain entry matches any SUB on its subjects; a queue entry only a SUB in a matching queue."""
    for pattern, qpattern in entries:
        if not matches(pattern, subject):
            continue
        if qpattern is None or (queue is not None and matches(qpattern, queue)):
            return True
    return False


class ClientPermissions:
    """One connection's permissions and their caches."""

    __slots__ = ("perms", "pub_cache", "replies", "deliver_deny")

    def __init__(self, perms: PermissionSet) -> None:
        self.perms = perms
        self.pub_cache: dict[bytes, bool] = {}
        self.replies: dict[bytes, list[float]] | None = {} if perms.response is not None else None
        # deny patterns inside a wildcard subscription: checked on each delivery (set by the first such SUB)
        self.deliver_deny: tuple[str, ...] | None = None

    def can_publish(self, subject: bytes) -> bool:
        ok = self.pub_cache.get(subject)
        if ok is None:
            ok = self.perms.can_publish(subject.decode(errors="replace"))
            if len(self.pub_cache) >= PERM_CACHE_MAX:
                self.pub_cache.clear()
            self.pub_cache[subject] = ok
        if not ok and self.replies:
            return self._response_allowed(subject)
        return ok

    def _response_allowed(self, subject: bytes) -> bool:
        entry = self.replies.get(subject)  # type: ignore[union-attr]
        if entry is None:
            return False
        resp = self.perms.response
        assert resp is not None
        entry[1] += 1
        expired = resp.expires > 0 and time.monotonic() - entry[0] > resp.expires
        if expired or entry[1] > resp.max_msgs:
            del self.replies[subject]  # type: ignore[union-attr]
            return False
        if entry[1] >= resp.max_msgs:
            del self.replies[subject]  # type: ignore[union-attr]
        return True

    def request_received(self, reply: bytes) -> None:
        """A message with a reply subject was delivered to this client: it may answer it."""
        replies = self.replies
        if replies is None:
            return
        if reply not in replies:
            if len(replies) >= PERM_CACHE_MAX:
                self._prune()
            replies[reply] = [time.monotonic(), 0]

    def _prune(self) -> None:
        replies = self.replies
        assert replies is not None and self.perms.response is not None
        ttl = self.perms.response.expires
        now = time.monotonic()
        stale = [k for k, v in replies.items() if ttl > 0 and now - v[0] > ttl]
        for key in stale or list(replies)[: len(replies) // 2]:
            del replies[key]

    def can_subscribe(self, subject: bytes, queue: bytes | None) -> bool:
        text = subject.decode(errors="replace")
        if not self.perms.can_subscribe(text, queue.decode(errors="replace") if queue is not None else None):
            return False
        deny = self.perms.sub_deny
        if (deny and self.deliver_deny is None and any(t in ("*", ">") for t in text.split("."))
                and any(q is None and is_subset(p, text) for p, q in deny)):
            self.deliver_deny = tuple(p for p, q in self.perms.sub_deny if q is None)
        return True

    def delivery_denied(self, subject: bytes) -> bool:
        text = subject.decode(errors="replace")
        return any(matches(p, text) for p in self.deliver_deny or ())


@dataclass
class Login:
    """Who a connection logged in as: `user` (a name, an nkey or "" for a token or no auth) and its
    permissions (None: everything allowed)."""

    user: str
    perms: PermissionSet | None
    method: str  # "user", "nkey", "token", "none"
    account: str = ""  # the account logged in to ("" = the global account)


class Authenticator:
    """Checks CONNECTs against the configured users, token or single user."""

    def __init__(self, opts: ServerOptions) -> None:
        self.required = opts.auth_required
        self.token = opts.auth_token
        self.single = (opts.auth_user, opts.auth_password) if opts.auth_user else None
        self.users: dict[str, UserOptions] = {u.user: u for u in opts.users if u.user}
        self.nkey_users: dict[str, UserOptions] = {u.nkey: u for u in opts.users if u.nkey}
        self.no_auth_user = opts.no_auth_user
        self.needs_nonce = bool(self.nkey_users)
        # tls { verify_and_map }: a client logs in as the user its certificate names (zonebus.server.tls)
        self.tls_map = bool(opts.tls is not None and opts.tls.verify_and_map and (self.users or self.nkey_users))
        default = PermissionSet.compile(opts.default_permissions) if opts.default_permissions else None
        self.perms: dict[str, PermissionSet | None] = {
            u.user or u.nkey: (PermissionSet.compile(u.permissions) if u.permissions is not None else default)
            for u in opts.users
        }
        self.account_of: dict[str, str] = {u.user or u.nkey: u.account for u in opts.users}
        self._check = _SecretCheck()

    @staticmethod
    def new_nonce() -> str:
        import secrets

        return secrets.token_urlsafe(11)

    def authenticate(self, connect: dict[str, Any], nonce: str,
                     peercert: dict | None = None) -> tuple[Login | None, str]:
        """(the login, or None when refused; what to log about a refusal). `peercert`: the client's TLS
        certificate (`getpeercert()`), used with `verify_and_map` only."""
        if self.tls_map:
            return self._cert_login(peercert)
        nkey = connect.get("nkey")
        user = connect.get("user")
        if self.nkey_users and nkey:
            return self._nkey_login(nkey, connect.get("sig"), nonce)
        if self.users or self.nkey_users:
            has_creds = any(connect.get(k) for k in ("user", "pass", "auth_token", "nkey", "jwt"))
            password = connect.get("pass")
            if not has_creds and self.no_auth_user in self.users:
                # nats-server logs such a client in with the user's stored password, which a bcrypt
                # hash then fails to match: no_auth_user works with clear passwords only (as there)
                user = self.no_auth_user
                password = self.users[user].password
            entry = self.users.get(user) if isinstance(user, str) else None
            if entry is None or not self._check(entry.password, password):
                return None, f' - User "{user}"' if isinstance(user, str) and user else ""
            return Login(entry.user, self.perms.get(entry.user), "user", entry.account), ""
        if self.token:
            if not self._check(self.token, connect.get("auth_token")):
                return None, ""
            return Login("", None, "token"), ""
        if self.single is not None:
            name, password = self.single
            if user != name or not self._check(password, connect.get("pass")):
                return None, f' - User "{user}"' if isinstance(user, str) and user else ""
            return Login(name, None, "user"), ""
        return Login("", None, "none"), ""

    def _cert_login(self, peercert: dict | None) -> tuple[Login | None, str]:
        from zonebus.server.tls import cert_identities, match_user

        user = match_user([*self.users, *self.nkey_users], peercert)
        if user is None:
            names, subject = cert_identities(peercert)
            shown = ",".join(f"{k}={v}" for k, v in subject) or ", ".join(names)
            return None, f' - no user for client certificate "{shown}"'
        return Login(user, self.perms.get(user), "tls", self.account_of.get(user, "")), ""

    def _nkey_login(self, nkey: Any, sig: Any, nonce: str) -> tuple[Login | None, str]:
        where = f' - Nkey "{nkey}"'
        entry = self.nkey_users.get(nkey) if isinstance(nkey, str) else None
        if entry is None or not isinstance(sig, str) or not nonce:
            return None, where
        key = decode_user_nkey(entry.nkey)
        raw = _b64(sig)
        if key is None or raw is None:
            return None, where
        from nacl.exceptions import BadSignatureError

        try:
            key.verify(nonce.encode(), raw)
        except (BadSignatureError, ValueError):
            return None, where
        return Login(entry.nkey, self.perms.get(entry.nkey), "nkey", entry.account), ""
