"""A server's id, shaped like nats-server's; small on purpose: the workers' supervisor makes one without
importing the server core."""

from __future__ import annotations

import random

_B32 = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"


def new_server_id() -> str:
    """A 56-character id shaped like nats-server's (an nkey public key starting with N)."""
    return "N" + "".join(random.choice(_B32) for _ in range(55))
