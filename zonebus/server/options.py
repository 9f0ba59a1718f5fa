"""Server options: every setting a zonebus server runs with, with nats-server's defaults.

Filled from a config file (`zonebus.config`) and command-line flags (`zonebus.server.flags`); the server
only reads this object. Durations are seconds (float), sizes are bytes (int).
"""

from __future__ import annotations

from dataclasses import dataclass, field

DEFAULT_PORT = 4222
MAX_PAYLOAD = 1024 * 1024
MAX_CONTROL_LINE = 4096
MAX_PENDING = 64 * 1024 * 1024
MAX_CONNECTIONS = 64 * 1024
PING_INTERVAL = 120.0
PING_MAX = 2
AUTH_TIMEOUT = 2.0
WRITE_DEADLINE = 10.0


def advertised_host(host: str) -> str:
    """The host other servers and clients should dial for a listener bound to `host` (a wildcard address
    is advertised as loopback: zonebus's deployments here are on one machine)."""
    return "127.0.0.1" if host in ("", "0.0.0.0", "::") else host


@dataclass
class RouteOptions:
    """`cluster { ... }` block."""

    name: str = ""
    host: str = "0.0.0.0"
    port: int = 0  # 0 = no cluster listener
    routes: list[str] = field(default_factory=list)  # seed URLs, nats-route://host:port
    user: str = ""
    password: str = ""
    prefer_matching_tags: bool = False
    no_advertise: bool = False
    connect_retries: int = 0
    auth_timeout: float = AUTH_TIMEOUT  # cluster { authorization { timeout } }


@dataclass
class RemoteGatewayOptions:
    name: str
    urls: list[str] = field(default_factory=list)


@dataclass
class GatewayOptions:
    """`gateway { ... }` block."""

    name: str = ""
    host: str = "0.0.0.0"
    port: int = 0
    gateways: list[RemoteGatewayOptions] = field(default_factory=list)
    reject_unknown_cluster: bool = False
    user: str = ""
    password: str = ""
    interest_only_threshold: int = 1000
    auth_timeout: float = AUTH_TIMEOUT  # gateway { authorization { timeout } }


@dataclass
class JetStreamOptions:
    """`jetstream { ... }` block (or `-js -sd DIR`)."""

    enabled: bool = False
    store_dir: str = ""
    max_memory_store: int = -1
    max_file_store: int = -1
    sync_interval: float = 120.0  # seconds; 0 = sync always
    sync_always: bool = False


@dataclass
class LedgerOptions:
    """`ledger { ... }` block: per-connection traffic counts written as Parquet."""

    enabled: bool = False
    dir: str = ""
    interval: float = 10.0
    subject_tokens: int = 2
    zone_tag_prefix: str = "az"
    client_zones: dict[str, list[str]] = field(default_factory=dict)  # zone -> CIDR blocks


@dataclass
class ServerOptions:
    server_name: str = ""
    host: str = "0.0.0.0"
    port: int = DEFAULT_PORT
    http_host: str = ""  # defaults to host
    http_port: int = 0  # 0 = no monitoring
    server_tags: list[str] = field(default_factory=list)
    max_payload: int = MAX_PAYLOAD
    max_control_line: int = MAX_CONTROL_LINE
    max_connections: int = MAX_CONNECTIONS
    max_subscriptions: int = 0  # 0 = unlimited
    max_pending: int = MAX_PENDING
    ping_interval: float = PING_INTERVAL
    ping_max: int = PING_MAX
    write_deadline: float = WRITE_DEADLINE
    # top-level authorization { user, password, token, timeout }
    auth_user: str = ""
    auth_password: str = ""
    auth_token: str = ""
    auth_timeout: float = AUTH_TIMEOUT
    debug: bool = False
    trace: bool = False
    logtime: bool = True
    pid_file: str = ""
    log_file: str = ""  # `log_file`/`logfile` key, `-l/--log` flag
    signal: str = ""  # `--signal reload[=pid]`: send this signal to a running server instead of serving
    config_file: str = ""
    cluster: RouteOptions = field(default_factory=RouteOptions)
    gateway: GatewayOptions = field(default_factory=GatewayOptions)
    jetstream: JetStreamOptions = field(default_factory=JetStreamOptions)
    ledger: LedgerOptions = field(default_factory=LedgerOptions)

    @property
    def auth_required(self) -> bool:
        return bool(self.auth_user or self.auth_token)
