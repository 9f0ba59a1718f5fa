"""Accounts: subject spaces that never meet, except through exports and imports (nats-server's accounts).

Every connection belongs to one account (`Connection.account`); each account has its own sublist, so a
message published in one account reaches subscribers of that account only. Clients belong to the account of
the user they log in as; with no `accounts {}` block everything is in the global account `$G`, as before.
Links to other servers carry the account in every `RS+`/`RS-`/`RMSG` line.

Imports join two accounts, always on the importer's side and on the server the importer is connected to:
- **stream import** (`{stream: {account: A, subject: "pub.>"}, prefix: "p"}` in B): for each subscription of
  a B client that can see imported messages, a *shadow* subscription is put in A's sublist (nats-server's
  shadow subscriptions). It is an ordinary local subscription of A (told to routes like any other), whose
  connection (`ShadowTarget`) hands each message to the B client under `p.<subject>`;
- **service import** (`{service: {account: A, subject: "svc.*"}, to: "a.svc.*"}` in B): a request a B
  client publishes on `a.svc.x` is published in A on `svc.x` with a reply subject `_R_.<id>.<n>` of A's; the
  response to it, wherever it is published, comes back through A's subscription to `_R_.<id>.>` and is
  published in B on the requester's reply subject (once for `singleton` services, until expiry for `stream`
  and `chunked`).
The system account (`system_account`, default `$SYS`) always exists; users may log in to it.
Owned by the event loop thread.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from zonebus.server.account_limits import NO_LIMITS
from zonebus.server.connection import INTERNAL, Connection
from zonebus.subjects.mapping import Mappings
from zonebus.subjects.patterns import is_subset, matches, overlaps
from zonebus.subjects.sublist import Sublist, Subscription

if TYPE_CHECKING:
    from zonebus.options import ImportOptions, ServerOptions
    from zonebus.server.server import Server

GLOBAL = b"$G"
RESPONSE_TTL = 120.0  # seconds a service response mapping lives (nats-server's response threshold: 2 min)
RESPONSES_MAX = 100_000  # mappings kept per account; the oldest are dropped beyond it


def ledger_key(account: bytes, subject: bytes) -> bytes:
    """The ledger's count key of a link message in an account other than `$G` (plain subjects are `$G`'s):
    no subject holds a NUL or a space, so the key splits back unambiguously (`split_ledger_keys`)."""
    return b"\x00" + account + b" " + subject


def split_ledger_keys(counts: dict[bytes, list[int]], default: str) -> dict[str, dict[bytes, list[int]]]:
    """Counts by account name: `ledger_key` entries under their account, the others under `default`."""
    if not any(key[:1] == b"\x00" for key in counts):
        return {default: counts}
    out: dict[str, dict[bytes, list[int]]] = {}
    for key, c in counts.items():
        if key[:1] == b"\x00":
            name, _, subject = key[1:].partition(b" ")
            out.setdefault(name.decode(errors="replace"), {})[subject] = c
        else:
            out.setdefault(default, {})[key] = c
    return out


class Account:
    __slots__ = ("name", "sublist", "stream_imports", "service_imports", "shadows", "conn", "response_prefix",
                 "responses", "_response_sub", "_next_response", "limits", "mappings")

    def __init__(self, name: bytes, sublist: Sublist | None = None) -> None:
        self.name = name
        self.sublist = sublist if sublist is not None else Sublist()
        self.stream_imports: list[StreamImport] = []
        self.service_imports: Sublist | None = None  # import entries as subscriptions (callback: the import)
        self.shadows: dict[Subscription, list[Subscription]] = {}  # a client's sub -> its shadow subs
        self.conn: ImportConnection | None = None  # publishes imports into this account (set by Accounts)
        self.response_prefix = b""  # `_R_.<id>.`: reply subjects of requests that came in by service import
        self.responses: dict[bytes, tuple[Account, bytes, bool, float]] = {}
        self._response_sub: Subscription | None = None
        self._next_response = 0
        self.limits = NO_LIMITS  # `limits {}` (zonebus.server.account_limits)
        self.mappings: Mappings | None = None  # `mappings {}` (zonebus.subjects.mapping)

    def __repr__(self) -> str:
        return f"Account({self.name.decode()})"

    @property
    def display(self) -> str:
        return self.name.decode()


class StreamImport:
    __slots__ = ("exporter", "subject", "prefix")

    def __init__(self, exporter: Account, subject: str, prefix: str) -> None:
        self.exporter = exporter
        self.subject = subject
        self.prefix = prefix

    def shadow_subject(self, subject: str) -> tuple[str, bool] | None:
        """The subject in the exporter's space that feeds a subscription to `subject` here, and whether
        deliveries must still be checked against it (partial overlap); None when none can."""
        rest = subject.split(".")
        if self.prefix:
            for tok in self.prefix.split("."):
                if not rest:
                    return None
                head = rest[0]
                if head == ">":
                    rest = [">"]
                    break
                if head != "*" and head != tok:
                    return None
                rest = rest[1:]
            if not rest:
                return None
        inner = ".".join(rest)
        if is_subset(inner, self.subject):
            return inner, False
        if is_subset(self.subject, inner):
            return self.subject, False
        if overlaps(inner, self.subject):
            return self.subject, True
        return None


class ServiceImport:
    __slots__ = ("exporter", "to", "subject", "singleton", "mapped")

    def __init__(self, exporter: Account, imp: ImportOptions, response_type: str) -> None:
        self.exporter = exporter
        self.to = (imp.to or imp.subject).split(".")
        self.subject = imp.subject.split(".")
        self.singleton = response_type == "singleton"
        self.mapped = self.to != self.subject

    def map(self, subject: bytes) -> bytes:
        """The exporter's subject of a request published here on `subject`: the export's literal tokens,
        and for its wildcards, in order, what the request had at the import's (`to`) wildcards."""
        if not self.mapped:
            return subject
        toks = subject.split(b".")
        values: list[list[bytes]] = []
        for i, tok in enumerate(self.to):
            if tok == "*":
                values.append([toks[i]])
            elif tok == ">":
                values.append(toks[i:])
        out: list[bytes] = []
        filled = iter(values)
        for tok in self.subject:
            out.extend(next(filled) if tok in ("*", ">") else [tok.encode()])
        return b".".join(out)


class ImportConnection(Connection):
    """The connection imports publish with in one account: service requests mapped into the exporter, and
    service responses mapped back. It also receives the responses (its `_R_` subscription)."""

    kind = INTERNAL
    echo = True
    no_responders = False
    headers = True

    def __init__(self, server: Server, account: Account) -> None:
        super().__init__(server)
        self.account = account
        self.name = f"imports of {account.display}"
        self.subs: dict[bytes, Subscription] = {}

    def deliver(self, sub: Subscription, subject: bytes, reply: bytes | None, hdr_len: int, data: bytes) -> None:
        """A response on one of this account's `_R_` subjects: publish it to the requester."""
        acc = self.account
        entry = acc.responses.get(subject)
        if entry is None:
            return
        importer, reply_to, singleton, expires = entry
        if singleton or expires < time.monotonic():
            del acc.responses[subject]
            if not singleton:
                return
        self.in_msgs += 1
        self.server.process_msg(importer.conn, reply_to, None, hdr_len, data)  # type: ignore[arg-type]

    def subscription_done(self, sub: Subscription) -> None:
        pass


class ShadowTarget:
    """The `conn` of a shadow subscription: delivers the exporter's messages to an importing client, under the
    import's prefix. Not a connection of its own (no id, no buffer): it stands in the exporter's sublist as an
    internal subscriber, which is all the routing code asks of it."""

    kind = INTERNAL
    echo = True
    cid = 0
    closed = False
    spoke = False  # (not a leaf connection: see `connection.link_allows`)
    __slots__ = ("account", "origin", "prefix", "check")

    def __init__(self, exporter: Account, origin: Subscription, prefix: bytes, check: str) -> None:
        self.account = exporter
        self.origin = origin
        self.prefix = prefix
        self.check = check  # the subscription's subject in the exporter's space, when only part overlaps

    def deliver(self, sub: Subscription, subject: bytes, reply: bytes | None, hdr_len: int, data: bytes) -> None:
        if self.check and not matches(self.check, subject.decode(errors="replace")):
            return
        origin = self.origin
        client = origin.conn
        if client.closed or (origin.max_msgs and origin.delivered >= origin.max_msgs):
            return
        origin.delivered += 1
        client.deliver(origin, self.prefix + subject if self.prefix else subject, reply, hdr_len, data)
        if origin.max_msgs and origin.delivered >= origin.max_msgs:
            client.subscription_done(origin)

    def subscription_done(self, sub: Subscription) -> None:
        pass


class Accounts:
    """The server's accounts by name, built from the options; `$G` always, the system account always."""

    def __init__(self, server: Server, opts: ServerOptions) -> None:
        self.server = server
        self.global_account = Account(GLOBAL)
        self.by_name: dict[bytes, Account] = {GLOBAL: self.global_account}
        self._configure(opts)

    def _configure(self, opts: ServerOptions) -> None:
        for name in [a.name for a in opts.accounts] + [opts.system_account or "$SYS"]:
            self.by_name.setdefault(name.encode(), Account(name.encode()))
        exports = {a.name: a.exports for a in opts.accounts}
        for acc in self.by_name.values():
            acc.limits, acc.mappings = NO_LIMITS, None
        cluster = opts.cluster.name
        if opts.mappings:
            self.global_account.mappings = Mappings(opts.mappings, cluster)
        for a in opts.accounts:
            acc = self.by_name[a.name.encode()]
            if a.limits.any:
                acc.limits = a.limits
            if a.mappings:
                acc.mappings = Mappings(a.mappings, cluster)
            for imp in a.imports:
                exporter = self.by_name[imp.account.encode()]
                if imp.kind == "stream":
                    acc.stream_imports.append(StreamImport(exporter, imp.subject, imp.prefix))
                    continue
                response_type = next((e.response_type for e in exports.get(imp.account, ())
                                      if e.kind == "service" and is_subset(imp.subject, e.subject)), "singleton")
                if acc.service_imports is None:
                    acc.service_imports = Sublist()
                entry = Subscription(None, (imp.to or imp.subject).encode(), None, b"")
                entry.callback = ServiceImport(exporter, imp, response_type)  # type: ignore[assignment]
                acc.service_imports.insert(entry)

    def get(self, name: bytes) -> Account | None:
        return self.by_name.get(name)

    def lookup(self, name: str) -> Account:
        """The account a user logs in to ("" = the global account)."""
        return self.by_name[name.encode()] if name else self.global_account

    def start(self) -> None:
        """Connections of the import machinery, and the `_R_` subscription of every account that may be
        asked for services (so its interest is on the routes before the first request)."""
        for acc in self.by_name.values():
            if acc.conn is None:
                acc.conn = ImportConnection(self.server, acc)
        for acc in self.by_name.values():
            if acc.service_imports is None:
                continue
            for entry in acc.service_imports.all_subscriptions():
                self.response_subscription(entry.callback.exporter)  # type: ignore[attr-defined]

    def reload(self, opts: ServerOptions) -> None:
        """SIGHUP: new accounts are added and every import is built again from `opts`, shadow subscriptions
        of the clients' subscriptions included. An account no longer configured stays, empty: its users are
        gone, so the re-login that follows (`Server.reload_auth`) closes its clients."""
        server = self.server
        for acc in self.by_name.values():
            for shadows in acc.shadows.values():
                for shadow in shadows:
                    server.remove_subscription(shadow, shadow.conn.account)
            acc.shadows.clear()
            acc.stream_imports = []
            acc.service_imports = None
        self._configure(opts)
        self.start()
        for conn in list(server.clients.values()):
            if conn.account.stream_imports:
                for sub in list(conn.subs.values()):
                    self.subscription_added(sub)
        for acc in self.by_name.values():
            acc.sublist.touch()

    def response_subscription(self, exporter: Account) -> None:
        if exporter._response_sub is not None:
            return
        import secrets  # (on demand: only service exports with replies need it)

        exporter.response_prefix = b"_R_." + secrets.token_hex(3).encode() + b"."
        sub = Subscription(exporter.conn, exporter.response_prefix + b">", None, b"r")
        exporter._response_sub = sub
        self.server.add_subscription(sub)

    # -- stream imports (shadow subscriptions) -------------------------------------------------------
    def subscription_added(self, sub: Subscription) -> None:
        acc: Account = sub.conn.account
        if not acc.stream_imports:
            return
        shadows = []
        subject = sub.subject.decode()
        for imp in acc.stream_imports:
            found = imp.shadow_subject(subject)
            if found is None:
                continue
            inner, partial = found
            target = ShadowTarget(imp.exporter, sub,
                                  (imp.prefix + ".").encode() if imp.prefix else b"", inner if partial else "")
            shadow = Subscription(target, inner.encode(), sub.queue, sub.sid, sub.weight)
            shadows.append(shadow)
            self.server.add_subscription(shadow, imp.exporter)
        if shadows:
            acc.shadows[sub] = shadows

    def subscription_removed(self, sub: Subscription) -> None:
        shadows = sub.conn.account.shadows.pop(sub, None)
        for shadow in shadows or ():
            self.server.remove_subscription(shadow, shadow.conn.account)

    # -- service imports -----------------------------------------------------------------------------
    def service_request(self, src: Connection, acc: Account, subject: bytes, reply: bytes | None, hdr_len: int,
                        data: bytes) -> bool | None:
        """A client's publish in `acc` that matches a service import: publish it in the exporter. Returns
        whether anything there received it, or None when no import matched."""
        r = acc.service_imports.match(subject)  # type: ignore[union-attr]
        if not r.psubs:
            return None
        imp: ServiceImport = r.psubs[0].callback  # type: ignore[assignment]
        exporter = imp.exporter
        mapped_reply = None
        if reply:
            import secrets

            exporter._next_response += 1
            mapped_reply = exporter.response_prefix + secrets.token_urlsafe(6).encode() + b"%d" % (
                exporter._next_response)
            responses = exporter.responses
            if len(responses) >= RESPONSES_MAX:
                for key in list(responses)[:RESPONSES_MAX // 10]:
                    del responses[key]
            responses[mapped_reply] = (acc, reply, imp.singleton, time.monotonic() + RESPONSE_TTL)
        return self.server.process_msg(exporter.conn, imp.map(subject), mapped_reply, hdr_len, data)  # type: ignore[arg-type]
