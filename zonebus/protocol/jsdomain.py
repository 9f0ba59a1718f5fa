"""JetStream domain names and the leaf-node rules they imply (no I/O): shared by the config reader, the leaf
links (`zonebus.leaf`) and the domain's API mapping (`zonebus.stream.domain`, which says what nats-server does).
"""

from __future__ import annotations

# nats-server's denyAllClientJs: what a leaf link with a domain on either side keeps from crossing, both ways
LEAF_JS_DENY: tuple[str, ...] = ("$JS.API.>", "$KV.>", "$OBJ.>")


def domain_error(domain: str) -> str | None:
    """nats-server's refusal of a domain name (validateJetStreamOptions), or None for a good one."""
    if any(c in domain for c in ".*>"):
        return "invalid domain name: may not contain ., * or >"
    if not domain or any(c.isspace() for c in domain):
        return f'invalid domain name: derived "$JS.{domain}.API.>" is not a valid subject'
    return None


def api_prefix(domain: str) -> str:
    return f"$JS.{domain}.API."


def leaf_deny(local_domain: str, local_jetstream: bool, remote_domain: str) -> tuple[list[str], list[str]]:
    """The (publish deny, subscribe deny) a leaf link gets from the JetStream domains of its two sides."""
    if not local_domain and not remote_domain:
        return [], []
    pub = list(LEAF_JS_DENY)
    if local_domain and local_jetstream:
        pub.append(api_prefix(local_domain) + ">")
    return pub, list(LEAF_JS_DENY)
