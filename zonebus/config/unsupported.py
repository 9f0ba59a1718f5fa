"""nats-server configuration keys that zonebus knows but does not implement, and what it says about them.

A config written for nats-server that uses one of these is refused at start (and by `-t`) with
`unsupported field "<key>": zonebus does not have nats-server's <what it is>`, instead of the bare
`unknown field` a typo gets, so that the user knows the key is right and the feature is missing. The README's
"nats-server features zonebus does not have" table lists the same keys (a test keeps them in step).
"""

from __future__ import annotations

# block ("" = top level) -> key -> what the feature is
UNSUPPORTED: dict[str, dict[str, str]] = {
    "": {
        "mqtt": "MQTT clients",
        "operator": "operator JWT (decentralised) authentication",
        "resolver": "the account JWT resolver",
        "resolver_preload": "the account JWT resolver",
        "trusted_keys": "operator JWT (decentralised) authentication",
        "trusted": "operator JWT (decentralised) authentication",
        "ocsp": "OCSP stapling",
    },
}


def unsupported_message(block: str, key: str) -> str | None:
    """The refusal for a nats-server key zonebus does not implement, or None for a key nobody knows."""
    what = UNSUPPORTED.get(block, {}).get(key.lower())
    if what is None:
        return None
    return f'unsupported field "{key}": zonebus does not have nats-server\'s {what}'
