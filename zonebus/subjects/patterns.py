"""Subject patterns as text: does a literal subject match a pattern, is one pattern inside another, do two
overlap. `*` matches one token and `>` one or more trailing tokens. Used off the data path (streams,
gateway interest, tests); the data path matches through the `sublist` trie.
"""

from __future__ import annotations

from functools import lru_cache


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
