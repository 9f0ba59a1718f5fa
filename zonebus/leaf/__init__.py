"""Leaf node connections (`leafnodes {}`): nats-server's leaf protocol on the link layer (`zonebus.link`).

`LeafManager` (manager.py) listens for leaf nodes (this server is their hub), dials the configured remotes
(this server is their leaf), tells each connection the interest of its account and finds loops;
`LeafConnection` (connection.py) is one link; websocket.py runs links in WebSocket frames (`ws://` remotes, and
leaf nodes on the `websocket {}` listener); jsmigrate.py keeps a remote's `jetstream_cluster_migrate` clock;
monitoring.py builds `/leafz`.
"""

from zonebus.leaf.manager import LeafManager

__all__ = ["LeafManager"]
