"""What the leaf-node tests share: a hub listening for leaf nodes and a server dialling it (`spoke`), either
implementation, with the `leafnodes {}` keys of the test."""

from __future__ import annotations

from zonebus.localservers import free_port
from zonebus.testing.processes import ServerProcess


def hub(impl: str, port: int, keys: str = "", top: str = "", name: str = "hub") -> ServerProcess:
    """A server named `name` listening for leaf nodes on `port`, with `keys` in its `leafnodes {}` block and
    `top` (lines) before it."""
    more = f", {keys}" if keys else ""
    return ServerProcess(impl, http_port=free_port(), config=(
        f'server_name: {name}\n{top}leafnodes {{ listen: "127.0.0.1:{port}"{more} }}\n'))


def spoke(impl: str, port: int, remote_keys: str = "", name: str = "spoke") -> ServerProcess:
    """A server with one leaf remote, the hub on `port`, with `remote_keys` in the remote."""
    more = f", {remote_keys}" if remote_keys else ""
    return ServerProcess(impl, http_port=free_port(), config=(
        f'server_name: {name}\nleafnodes {{ remotes: [{{ url: "nats-leaf://127.0.0.1:{port}"{more} }}] }}\n'))
