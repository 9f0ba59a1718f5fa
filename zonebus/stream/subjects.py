"""Subject rules JetStream needs: validity, matching a filter, subset and overlap tests.

Tokens are separated by `.`; `*` matches one token and `>` one or more trailing tokens. A token that only
contains `*` or `>` among other characters is a literal, as in nats-server.
"""

from __future__ import annotations

from functools import lru_cache

_BAD_CHARS = frozenset(" \t\r\n\f\v")


def valid_subject(subject: str, wildcards: bool = True) -> bool:
    """A syntactically valid subject (filter when `wildcards`, publish subject otherwise)."""
    if not isinstance(subject, str) or not subject or any(c in _BAD_CHARS for c in subject):
        return False
    tokens = subject.split(".")
    for i, tok in enumerate(tokens):
        if not tok:
            return False
        if tok in ("*", ">"):
            if not wildcards:
                return False
            if tok == ">" and i != len(tokens) - 1:
                return False
    return True


def has_wildcards(subject: str) -> bool:
    return any(tok in ("*", ">") for tok in subject.split("."))


@lru_cache(maxsize=4096)
def _tokens(subject: str) -> tuple[str, ...]:
    return tuple(subject.split("."))


def matches(filt: str, subject: str) -> bool:
    """Does the literal `subject` match the filter `filt`?"""
    if filt == subject or filt == ">":
        return True
    ft = _tokens(filt)
    st = subject.split(".")
    n = len(ft)
    for i, tok in enumerate(ft):
        if tok == ">":
            return len(st) > i
        if i >= len(st):
            return False
        if tok != "*" and tok != st[i]:
            return False
    return len(st) == n


def matches_any(filters: tuple[str, ...] | list[str], subject: str) -> bool:
    return any(matches(f, subject) for f in filters)


def is_subset(a: str, b: str) -> bool:
    """Is every subject matched by `a` also matched by `b`?"""
    at, bt = _tokens(a), _tokens(b)
    for i, btok in enumerate(bt):
        if btok == ">":
            return len(at) > i
        if i >= len(at):
            return False
        atok = at[i]
        if atok == ">":
            return False
        if btok == "*":
            continue
        if atok == "*" or atok != btok:
            return False
    return len(at) == len(bt)


def overlaps(a: str, b: str) -> bool:
    """Is there a subject that both `a` and `b` match?"""
    at, bt = _tokens(a), _tokens(b)
    for i in range(max(len(at), len(bt))):
        x = at[i] if i < len(at) else None
        y = bt[i] if i < len(bt) else None
        if x == ">" or y == ">":
            return x is not None and y is not None
        if x is None or y is None:
            return False
        if x != "*" and y != "*" and x != y:
            return False
    return True


def valid_name(name: object) -> bool:
    """Stream and consumer names: non-empty, no `.`, `*`, `>`, path separators or whitespace."""
    return (
        isinstance(name, str)
        and bool(name)
        and not any(c in ".*>/\\" or c in _BAD_CHARS for c in name)
    )
