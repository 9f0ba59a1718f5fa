"""The subscription index: a trie over subject tokens with a match cache (off with `disable_sublist_cache`).

`Sublist.match(subject)` returns a `MatchResult` with the plain subscriptions and the queue subscriptions
grouped by queue name. Results are cached per literal subject; any insert or remove bumps `generation` and
drops the cache, so a cached result is never stale. Owned by the event loop: only the server's loop thread
mutates or reads it.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

CACHE_MAX = 4096
# what a node has until its first child or queue subscription: one shared read-only empty mapping, so a leaf
# (one per distinct subject) holds no dicts of its own (2 x 64 B less per literal subscription)
_NONE: Any = MappingProxyType({})


class Subscription:
    """One subscription of a connection (a client's SUB, a route's or gateway's remote interest)."""

    __slots__ = ("conn", "subject", "queue", "sid", "max_msgs", "delivered", "weight", "callback", "batch")

    def __init__(self, conn: Any, subject: bytes, queue: bytes | None, sid: bytes, weight: int = 1) -> None:
        self.conn = conn
        self.subject = subject
        self.queue = queue
        self.sid = sid
        self.max_msgs = 0
        self.delivered = 0
        self.weight = weight
        self.callback = None
        self.batch = None  # an internal subscription's callback for a run of its deliveries (InternalClient)

    def __repr__(self) -> str:
        return f"Subscription({self.subject!r}, queue={self.queue!r}, sid={self.sid!r})"


class MatchResult:
    __slots__ = ("psubs", "qsubs")

    def __init__(self, psubs: list[Subscription], qsubs: list[list[Subscription]]) -> None:
        self.psubs = psubs
        self.qsubs = qsubs  # one list per queue name

    def __bool__(self) -> bool:
        return bool(self.psubs or self.qsubs)


EMPTY = MatchResult([], [])


class _Node:
    __slots__ = ("children", "psubs", "qsubs")

    def __init__(self) -> None:
        self.children: dict[bytes, _Node] = _NONE  # a dict of its own from the first child on
        self.psubs: list[Subscription] = []
        self.qsubs: dict[bytes, list[Subscription]] = _NONE  # likewise, from the first queue subscription

    def empty(self) -> bool:
        return not (self.children or self.psubs or self.qsubs)


class Sublist:
    caching = True  # False: no match cache at all (the server's `disable_sublist_cache`)

    def __init__(self) -> None:
        self._root = _Node()
        self._cache: dict[bytes, MatchResult] = {}
        self._by_prefix: dict[bytes, MatchResult] = {}  # match_reply's results by prefix
        self.generation = 0
        self.count = 0
        self.inserts = 0
        self.removes = 0
        self.matches = 0
        self.cache_hits = 0

    def insert(self, sub: Subscription) -> None:
        node = self._root
        for tok in sub.subject.split(b"."):
            nxt = node.children.get(tok)
            if nxt is None:
                if node.children is _NONE:
                    node.children = {}
                nxt = node.children[tok] = _Node()
            node = nxt
        if sub.queue is None:
            node.psubs.append(sub)
        else:
            if node.qsubs is _NONE:
                node.qsubs = {}
            node.qsubs.setdefault(sub.queue, []).append(sub)
        self.count += 1
        self.inserts += 1
        self._changed()

    def remove(self, sub: Subscription) -> bool:
        path: list[tuple[_Node, bytes]] = []
        node = self._root
        for tok in sub.subject.split(b"."):
            nxt = node.children.get(tok)
            if nxt is None:
                return False
            path.append((node, tok))
            node = nxt
        try:
            if sub.queue is None:
                node.psubs.remove(sub)
            else:
                members = node.qsubs[sub.queue]
                members.remove(sub)
                if not members:
                    del node.qsubs[sub.queue]
        except (ValueError, KeyError):
            return False
        for parent, tok in reversed(path):  # prune empty branches
            child = parent.children[tok]
            if not child.empty():
                break
            del parent.children[tok]
        self.count -= 1
        self.removes += 1
        self._changed()
        return True

    def touch(self) -> None:
        """A subscription changed in a way cached deliveries depend on (e.g. got a max_msgs)."""
        self._changed()

    def _changed(self) -> None:
        self.generation += 1
        if self._cache:
            self._cache = {}
        if self._by_prefix:
            self._by_prefix = {}

    def match(self, subject: bytes) -> MatchResult:
        self.matches += 1
        r = self._cache.get(subject)
        if r is not None:
            self.cache_hits += 1
            return r
        psubs: list[Subscription] = []
        qmap: dict[bytes, list[Subscription]] = {}
        tokens = subject.split(b".")
        if b"" not in tokens:  # a subject with an empty token matches nothing
            _collect(self._root, tokens, 0, psubs, qmap)
        r = MatchResult(psubs, list(qmap.values())) if (psubs or qmap) else EMPTY
        if not self.caching:
            return r
        if len(self._cache) >= CACHE_MAX:
            self._cache = {}
        self._cache[subject] = r
        return r

    def match_reply(self, subject: bytes) -> MatchResult:
        """`match` for a subject seen once, such as the reply inbox of a PubAck (`_INBOX.<id>.<n>`): it does
        not fill the cache (where it would only push the cache to its limit and have it dropped). Instead the
        result is kept per prefix (all but the last token) when no subscription could tell two last tokens
        apart: none of the trie nodes the last token is looked up in has a literal child, only `*` and `>`."""
        self.matches += 1
        r = self._cache.get(subject)
        if r is not None:
            self.cache_hits += 1
            return r
        prefix, _, last = subject.rpartition(b".")
        if not prefix or last in (b"", b"*", b">"):
            return self._match_nocache(subject)
        r = self._by_prefix.get(prefix)
        if r is not None:
            self.cache_hits += 1
            return r
        r = self._match_nocache(subject)
        tokens = prefix.split(b".")
        if b"" not in tokens and self.caching:
            nodes: list[_Node] = []
            _last_nodes(self._root, tokens, 0, nodes)
            if all(k in (b"*", b">") for node in nodes for k in node.children):
                if len(self._by_prefix) >= CACHE_MAX:
                    self._by_prefix = {}
                self._by_prefix[prefix] = r
        return r

    def _match_nocache(self, subject: bytes) -> MatchResult:
        psubs: list[Subscription] = []
        qmap: dict[bytes, list[Subscription]] = {}
        tokens = subject.split(b".")
        if b"" not in tokens:  # a subject with an empty token matches nothing
            _collect(self._root, tokens, 0, psubs, qmap)
        return MatchResult(psubs, list(qmap.values())) if (psubs or qmap) else EMPTY

    def has_interest(self, subject: bytes) -> bool:
        return bool(self.match(subject))

    def all_subscriptions(self) -> list[Subscription]:
        out: list[Subscription] = []
        stack = [self._root]
        while stack:
            node = stack.pop()
            out.extend(node.psubs)
            for members in node.qsubs.values():
                out.extend(members)
            stack.extend(node.children.values())
        return out

    def cache_size(self) -> int:
        return len(self._cache)


def _add(node: _Node, psubs: list[Subscription], qmap: dict[bytes, list[Subscription]]) -> None:
    if node.psubs:
        psubs.extend(node.psubs)
    if node.qsubs is _NONE:
        return
    for q, members in node.qsubs.items():
        acc = qmap.get(q)
        if acc is None:
            qmap[q] = list(members)
        else:
            acc.extend(members)


def _collect(node: _Node, tokens: list[bytes], i: int, psubs: list, qmap: dict) -> None:
    n = len(tokens)
    while True:
        children = node.children
        if children is _NONE or not children:
            return
        fwc = children.get(b">")
        if fwc is not None:
            _add(fwc, psubs, qmap)
        pwc = children.get(b"*")
        tok = tokens[i]
        if i == n - 1:
            if pwc is not None:
                _add(pwc, psubs, qmap)
            if tok != b"*":
                lit = children.get(tok)
                if lit is not None and lit is not fwc:
                    _add(lit, psubs, qmap)
            return
        if pwc is not None:
            _collect(pwc, tokens, i + 1, psubs, qmap)
        if tok == b"*" or tok == b">":
            return
        lit = children.get(tok)
        if lit is None:
            return
        node = lit
        i += 1


def _last_nodes(node: _Node, prefix: list[bytes], i: int, out: list[_Node]) -> None:
    """The nodes in which `_collect` looks up the token after `prefix` (through literal and `*` children)."""
    while True:
        if not node.children:
            return
        if i == len(prefix):
            out.append(node)
            return
        pwc = node.children.get(b"*")
        if pwc is not None:
            _last_nodes(pwc, prefix, i + 1, out)
        tok = prefix[i]
        if tok == b"*" or tok == b">":
            return
        lit = node.children.get(tok)
        if lit is None:
            return
        node = lit
        i += 1
