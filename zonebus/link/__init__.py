"""The link layer: every connection between two servers (routes, gateways, and what later rides on them).

`LinkConnection` owns what every inter-server connection shares: the INFO/CONNECT handshake skeleton, the
framing of the inter-server protocol (`zonebus.protocol.route_parser`), PING/PONG with RTT and stale-link
detection, the fast path for repeated message lines (on `zonebus.server.fastpath`), counters and the
logging of link errors. Its kinds are small subclasses: `zonebus.cluster.route.RouteConnection` (RS+/RS-,
RMSG, gossip) and `zonebus.gateway.connection.GatewayConnection` (interest modes, `_GR_.` replies, gateway
gossip).

Traffic between extensions of two servers (meta-group messages, link records) travels on *channels*:
`LMSG <channel> <size>` frames on the routes, registered with `LinkChannels` (see `channels.py`).
`Backoff` is the one reconnect schedule both dialers use.
"""

from zonebus.link.backoff import Backoff
from zonebus.link.channels import LinkChannels
from zonebus.link.connection import LinkConnection, json_line

__all__ = ["Backoff", "LinkChannels", "LinkConnection", "json_line"]
