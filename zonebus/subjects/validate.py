"""Subject syntax: tokens separated by '.', '*' matches one token, '>' one or more trailing tokens.

Subjects stay `bytes` on the data path; these checks run once per SUB and (when pedantic) per PUB.
"""

from __future__ import annotations

_WHITESPACE = (b" ", b"\t", b"\r", b"\n", b"\f")


def is_valid_subject(subject: bytes) -> bool:
    """A subscription subject: non-empty tokens, wildcards only as whole tokens, '>' only last."""
    if not subject:
        return False
    for ws in _WHITESPACE:
        if ws in subject:
            return False
    tokens = subject.split(b".")
    last = len(tokens) - 1
    for i, tok in enumerate(tokens):
        if not tok:
            return False
        if len(tok) > 1 and (b">" in tok or b"*" in tok):
            # nats-server accepts wildcard characters inside a longer token as literals
            continue
        if tok == b">" and i != last:
            return False
    return True


def is_literal(subject: bytes) -> bool:
    """True when the subject has no wildcard token."""
    return all(not (tok == b"*" or tok == b">") for tok in subject.split(b"."))


def is_valid_publish_subject(subject: bytes) -> bool:
    return is_valid_subject(subject) and is_literal(subject)
