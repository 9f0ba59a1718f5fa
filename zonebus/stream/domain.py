"""JetStream domains (`jetstream { domain: <name> }`): the `$JS.<domain>.API.` prefix and its leaf-node rules.

As nats-server (server/jetstream_api.go `generateJSMappingTable`, server/jetstream.go, server/leafnode.go
`addLeafNodeConnection`):
- A server whose JetStream has a domain answers the API under `$JS.<domain>.API.` as under `$JS.API.`: each
  JetStream account maps `$JS.<d>.API.INFO`, `.STREAM.>`, `.CONSUMER.>`, `.DIRECT.>`, `.META.>`, `.SERVER.>`,
  `.ACCOUNT.>` to the same subjects under `$JS.API.`, and `$JS.<d>.API.$KV.>` / `.$OBJ.>` to `$KV.>` / `$OBJ.>`.
  Here the JetStream account's internal client subscribes `$JS.<d>.API.>` and publishes what matches the table
  again on the mapped subject, reply and headers kept (a subject outside the table is dropped: nats-server maps
  nothing else, so nobody would hear it). The subscription is a plain one, so leaf nodes hear of it
  (nats-server's leaf offers the mapping sources likewise); a clustered server's joins a queue group, so that
  one server of the cluster takes a request (any of them answers the API, as each does its own clients'
  `$JS.API.` requests: the one that took it republishes it to its own JetStream, which forwards to a stream's
  leader as it does for `$JS.API.`).
- Leaf nodes: when this server or the peer has a domain, the link keeps each side's JetStream to itself:
  `$JS.API.>`, `$KV.>` and `$OBJ.>` are denied both ways (no interest offered or taken, no message sent), and
  a server with JetStream and a domain sends nothing on `$JS.<its domain>.API.>` to the peer (a guard against
  a hub and a leaf with one domain). `$JS.<other domain>.API.>` crosses: the peer offers interest in its own.
  nats-server denies the same subjects also when neither side has a domain; zonebus leaves such a link as it
  was (no domain, no change).
- The domain shows in `$JS.API.INFO` (`domain`), `/jsz` and `/varz` (`config.domain`), the client INFO
  (`domain`) and the leaf INFO and CONNECT (`domain`, what each side reads as the peer's).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from zonebus.protocol.jsdomain import api_prefix

if TYPE_CHECKING:
    from zonebus.server.internal import InternalClient

# the mapped suffixes under `$JS.<domain>.API.`: (suffix, is a prefix, destination)
_TABLE: tuple[tuple[str, bool, str], ...] = (
    ("INFO", False, "$JS.API.INFO"),
    ("STREAM.", True, "$JS.API.STREAM."),
    ("CONSUMER.", True, "$JS.API.CONSUMER."),
    ("DIRECT.", True, "$JS.API.DIRECT."),
    ("META.", True, "$JS.API.META."),
    ("SERVER.", True, "$JS.API.SERVER."),
    ("ACCOUNT.", True, "$JS.API.ACCOUNT."),
    ("$KV.", True, "$KV."),
    ("$OBJ.", True, "$OBJ."),
)

# the queue group of a clustered server's `$JS.<domain>.API.>` subscription
DOMAIN_QUEUE = "$JSDOMAIN"




def map_domain_subject(domain: str, subject: str) -> str | None:
    """`$JS.<domain>.API.<rest>` -> the subject nats-server's mapping table gives it, or None (not mapped)."""
    prefix = api_prefix(domain)
    if not subject.startswith(prefix):
        return None
    rest = subject[len(prefix):]
    for suffix, is_prefix, dest in _TABLE:
        if is_prefix:
            if rest.startswith(suffix) and len(rest) > len(suffix):
                return dest + rest[len(suffix):]
        elif rest == suffix:
            return dest
    return None


class DomainAPI:
    """One JetStream account's `$JS.<domain>.API.>` subscription, republishing on the mapped subject."""

    def __init__(self, client: InternalClient, domain: str) -> None:
        self.client = client
        self.domain = domain

    def subscribe(self, clustered: bool = False) -> int:
        """Subscribe `$JS.<domain>.API.>`; returns the subscription's id (the caller unsubscribes it). A
        clustered server's joins the queue group `DOMAIN_QUEUE`, so that one server of the cluster answers."""
        queue = DOMAIN_QUEUE if clustered else None
        return self.client.subscribe(api_prefix(self.domain) + ">", self._on_request, queue=queue)

    def _on_request(self, subject: str, reply: str | None, headers: bytes | None, payload: bytes) -> None:
        mapped = map_domain_subject(self.domain, subject)
        if mapped is not None:
            self.client.publish(mapped, payload, reply, headers)
