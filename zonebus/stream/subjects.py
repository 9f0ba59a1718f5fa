"""Subject and name rules JetStream checks: valid filter and publish subjects, valid stream/consumer names.
Matching, subset and overlap tests are in `zonebus.subjects.patterns`.

Tokens are separated by `.`; `*` matches one token and `>` one or more trailing tokens. A token that only
contains `*` or `>` among other characters is a literal, as in nats-server.
"""

from __future__ import annotations

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


def valid_name(name: object) -> bool:
    """Stream and consumer names: non-empty, no `.`, `*`, `>`, path separators or whitespace."""
    return (
        isinstance(name, str)
        and bool(name)
        and not any(c in ".*>/\\" or c in _BAD_CHARS for c in name)
    )
