"""Server options: every setting a zonebus server runs with, with nats-server's defaults.

A leaf: it imports nothing of zonebus, so that every layer can read it (`config` and `ledger` below the
server, the server and its extensions above). Filled from a config file (`zonebus.config`) and command-line
flags (`zonebus.cli.flags`); the server only reads this object.
Durations are seconds (float), sizes are bytes (int).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from zonebus.subjects.mapping import Mapping

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
class TLSOptions:
    """A `tls { ... }` block (top level: clients and https monitoring; `cluster`: routes; `gateway`:
    gateways). See zonebus.server.tls."""

    cert_file: str = ""
    key_file: str = ""
    ca_file: str = ""
    verify: bool = False  # require and verify a client certificate (accepted connections)
    verify_and_map: bool = False  # verify, and log clients in as the user named by their certificate
    insecure: bool = False  # dialled links (routes, gateways): do not verify the peer's certificate
    timeout: float = 2.0  # seconds for the TLS handshake (nats-server's TLS_TIMEOUT)
    handshake_first: bool = False  # clients: TLS before INFO (nats-py `tls_handshake_first=True`)


@dataclass
class WebsocketOptions:
    """`websocket { ... }`: the WebSocket client listener (zonebus.server.websocket), nats-server's defaults."""

    host: str = "0.0.0.0"
    port: int = 0  # 0 = no WebSocket listener; -1 = a random port
    no_tls: bool = False  # nats-server refuses a listener without `tls {}` unless this is set
    tls: TLSOptions | None = None
    compression: bool = False  # permessage-deflate, when the client asks for it
    same_origin: bool = False  # an Origin header must name this very host and port
    allowed_origins: list[str] = field(default_factory=list)  # an Origin header must be one of these
    handshake_timeout: float = 0.0  # seconds for the HTTP upgrade; 0: none, or the tls block's timeout with TLS
    advertise: str = ""  # the `host:port` WebSocket clients are told to use (INFO `connect_urls`)
    # the block's own login (nats-server's "auth override" for WebSocket clients, zonebus.server.websocket)
    no_auth_user: str = ""
    auth_user: str = ""
    auth_password: str = ""
    auth_token: str = ""
    auth_timeout: float = 0.0  # seconds; 0: the top level's
    jwt_cookie: str = ""  # cookies of the HTTP upgrade that stand for the CONNECT's credentials
    user_cookie: str = ""
    pass_cookie: str = ""
    token_cookie: str = ""
    headers: dict[str, str] = field(default_factory=dict)  # extra headers of the 101 response
    ping_interval: float = 0.0  # seconds; 0: the top level's

    @property
    def auth_override(self) -> bool:
        """The block's own login replaces the top level's for WebSocket clients (nats-server's rule)."""
        return bool(self.auth_user or self.auth_token or self.no_auth_user)


@dataclass
class CompressionOptions:
    """`cluster { compression }` / `gateway { compression }`: nats-server's mode names, normalised by
    `zonebus.protocol.compression_modes.normalize_mode` (`accept`: compress only when the peer asks, nats-server's
    default for routes). `rtt_thresholds` (seconds) choose the level of `s2_auto` from the link's RTT."""

    mode: str = "accept"
    rtt_thresholds: tuple[float, ...] = (0.010, 0.050, 0.100)


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
    tls: TLSOptions | None = None  # cluster { tls {} }: routes over TLS
    compression: CompressionOptions = field(default_factory=CompressionOptions)  # zonebus.link.compression
    zone_relay: bool | None = None  # zonebus.cluster.relay; None: on when server_tags name a zone
    pool_size: int = 3  # nats-server's route pool size, in /varz; zonebus dials one route per peer whatever it is
    accounts: list[str] = field(default_factory=list)  # nats-server's pinned accounts: one shared route here too


@dataclass
class RemoteGatewayOptions:
    name: str
    urls: list[str] = field(default_factory=list)


LEAF_PORT = 7422  # nats-server's leafnode port, for `listen: host` and for remote URLs without a port


@dataclass
class RemoteLeafOptions:
    """One entry of `leafnodes { remotes: [...] }`: the hubs this server dials as a leaf."""

    urls: list[str] = field(default_factory=list)
    account: str = ""  # the local account the connection binds ("" = the global account)
    deny_imports: list[str] = field(default_factory=list)  # subjects not taken from the hub (no interest sent)
    deny_exports: list[str] = field(default_factory=list)  # subjects not sent to the hub
    tls: TLSOptions | None = None  # tls {}: the link is TLS after the hub's INFO (also `tls://` URLs)
    no_randomize: bool = False  # dial the URLs in the order given (nats-server shuffles them by default)
    first_info_timeout: float = 1.0  # seconds to wait for the hub's INFO after the TCP connect
    disabled: bool = False  # configured but never dialled
    nkey: str = ""  # a user nkey seed (`SU...`): the CONNECT carries its public key and its signature of the nonce
    credentials: str = ""  # a .creds file: the CONNECT carries its user JWT and its seed's signature of the nonce
    isolate: bool = False  # isolate_leafnode_interest (isolate): the hub is not told the other leafs' interest
    request_isolation: bool = False  # the CONNECT asks the hub not to tell this link its other leafs' interest
    # compression {}: nats-server's default for leaf nodes is s2_auto (zstd between zonebus servers)
    compression: CompressionOptions = field(default_factory=lambda: CompressionOptions(mode="s2_auto"))
    hub: bool = False  # this server dials but takes the hub role on the link (the CONNECT says `is_hub: true`)
    ws_compression: bool = False  # ws:// URLs: ask the hub for permessage-deflate
    ws_no_masking: bool = False  # ws:// URLs: ask the hub to take this side's frames unmasked
    # jetstream_cluster_migrate: while this remote cannot be dialled, this server leads none of its account's
    # replicated streams (from a reconnect interval after a failed dial; `leader_migrate_delay`: that long after)
    js_cluster_migrate: bool = False
    js_cluster_migrate_delay: float = 0.0


@dataclass
class LeafNodeOptions:
    """`leafnodes { ... }` block (zonebus.leaf): a listener for leaf nodes (as a hub) and remotes to dial."""

    host: str = "0.0.0.0"
    port: int = 0  # 0 = no listener
    user: str = ""
    password: str = ""
    auth_timeout: float = AUTH_TIMEOUT  # leafnodes { authorization { timeout } }
    nkey: str = ""  # leafnodes { authorization { nkey } }: a leaf must sign the nonce with this user nkey
    remotes: list[RemoteLeafOptions] = field(default_factory=list)
    tls: TLSOptions | None = None  # tls {}: accepted leaf nodes do TLS after this side's INFO
    compression: CompressionOptions = field(default_factory=lambda: CompressionOptions(mode="s2_auto"))
    reconnect_interval: float = 1.0  # seconds between two dials of a remote (nats-server's default)
    advertise: str = ""  # host[:port] told to leaf nodes (INFO `leafnode_urls`) and routes instead of the listener's
    no_advertise: bool = False  # routes are not told this server's leafnode URL (their leaf nodes do not learn it)
    min_version: str = ""  # accepted leaf nodes must report this version or later in their CONNECT
    write_deadline: float = 0.0  # seconds a blocked write to a leaf connection may take; 0: the top-level one
    isolate_leafnode_interest: bool = False  # (isolate) no leaf connection is told the interest of another


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
    tls: TLSOptions | None = None  # gateway { tls {} }: gateways over TLS
    compression: CompressionOptions = field(default_factory=CompressionOptions)  # zonebus.link.compression
    advertise: str = ""  # host[:port] told to other clusters and this cluster's peers instead of the listener's


@dataclass
class JetStreamOptions:
    """`jetstream { ... }` block (or `-js -sd DIR`)."""

    enabled: bool = False
    store_dir: str = ""
    domain: str = ""  # `domain`: the API also answers under `$JS.<domain>.API.` (zonebus.stream.domain)
    max_memory_store: int = -1
    max_file_store: int = -1
    # `sync_interval: always` (the default, unlike nats-server): a PubAck of a file stream or a durable queue group
    # goes out once its bytes are fsynced (group commit); `sync_interval: <duration>` is nats-server's lazy mode
    # (fsync every interval), an explicit opt-in that can lose acknowledged messages on power loss
    sync_interval: float = 120.0  # seconds between fsyncs in the lazy mode (shown as nats-server shows it)
    sync_always: bool = True
    # shared storage for file-storage streams (store_dir is then only a cache); see docs/shared-store-layout.md
    shared_store: str = ""  # file:///path or s3://bucket/prefix; "" = off
    shared_store_linger: float = 0.001  # group commit: while uploads run, seconds a batch waits for one to end
    shared_store_batch: int = 1024 * 1024  # bytes at which a batch is written at once
    shared_store_inflight: int = 4  # batch uploads in flight per stream
    # s3:// (billed per request): a batch fills so that its PubAcks come within this at p99 (0: as file://)
    shared_store_latency_budget: float = 0.25
    s3_endpoint: str = ""  # `s3 { endpoint }`; else AWS_ENDPOINT_URL
    s3_region: str = ""  # `s3 { region }`; else AWS_REGION / AWS_DEFAULT_REGION
    failover_timeout: float = 3.0  # clustered: a server unreachable this long loses its streams to another
    # zone router (zonebus.zonerouter): clients stay in their zone, payloads cross zones through the shared store
    zone_router: bool = False
    zone_router_linger: float = 0.001  # seconds a router batch waits for more publishes (at most 1 ms)
    zone_router_path: str = "auto"  # auto (the cheaper at the price lists), storage, link: how batches cross
    zone_router_batch: int = 256 * 1024  # bytes at which a router batch is written at once
    zone_router_epoch: float = 10.0  # seconds between route epochs (channel objects are trimmed by epoch)
    # s3:// with the router: `replicas` acks once a proxy in another zone holds the message and writes the log
    # object every `zone_router_tier` seconds (zonebus.store.sharedtier); `storage` acks once the object is stored
    zone_router_ack: str = "replicas"
    zone_router_tier: float = 5.0
    # with `replicas`: `quorum` sends the tail only to the proxies the ack waits for, the others read the stored
    # log objects (cheaper transfer, their consumers see messages up to `zone_router_tier` later); `auto` also to
    # the proxies whose consumers read at the head; `all` to every proxy (zonebus.zonerouter.spread)
    zone_router_spread: str = "auto"
    # with `replicas`: the log stores link records into the proxies' RouterChannel objects, and their full form is
    # packed this long after (zonebus.store.sharedpacks); the channels' trim waits for the packs
    zone_router_pack: float = 10.0
    # encryption at rest (nats-server's keys; zonebus.store.atrest): `key` (or `ek`, `encryption_key`) turns it on;
    # `cipher`: chachapoly (nats-server's default) or aes; `prev_key` (or `prev_ek`, `prev_encryption_key`): the
    # key stores were written with before a rotation (they are re-wrapped under `key` when opened)
    encryption_key: str = ""
    encryption_cipher: str = "chachapoly"
    prev_encryption_key: str = ""
    # `limits { batch { max_inflight_per_stream, max_inflight_total, max_msgs, timeout } }`: atomic batch publish
    # (zonebus.stream.atomic), nats-server's defaults
    batch_max_inflight_per_stream: int = 50
    batch_max_inflight_total: int = 1000
    batch_max_msgs: int = 1000
    batch_timeout: float = 10.0


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
class QueueGroupOptions:
    """One entry of `queue_groups { name: {...} }`: a durable queue group (zonebus.queue). Members are ordinary
    queue subscribers named `name` on `subjects`; publishes are stored first and pushed by the group's primary."""

    name: str = ""
    subjects: list[str] = field(default_factory=list)
    durable: bool = True  # false: the group behaves as a core NATS queue group
    ack: str = "none"  # "none": delivered once written to a member; "explicit": the member acks
    max_deliver: int = -1  # explicit acks: deliveries per message (-1 = unlimited)
    ack_wait: float = 30.0  # explicit acks: seconds before an unacked message goes to another member
    max_age: float = 0.0  # seconds a stored message waits for a member (0 = unlimited)


@dataclass
class SubjectPermission:
    """`publish`/`subscribe` of a permissions block: None = no list (everything allowed by that side).
    Subscribe entries may carry a queue after a space: `"foo.> workers"`."""

    allow: list[str] | None = None
    deny: list[str] | None = None


@dataclass
class ResponsePermission:
    """`allow_responses`: publish to the reply subjects of requests received, `max_msgs` times within
    `expires` seconds (0 = no time limit). nats-server's defaults: 1 message, 2 minutes."""

    max_msgs: int = 1
    expires: float = 120.0


@dataclass
class Permissions:
    publish: SubjectPermission | None = None
    subscribe: SubjectPermission | None = None
    response: ResponsePermission | None = None


@dataclass
class UserOptions:
    """One entry of `authorization { users: [...] }`: by name and password (clear or bcrypt), or by
    public nkey (`U...`)."""

    user: str = ""
    password: str = ""
    nkey: str = ""
    permissions: Permissions | None = None  # None: the block's default_permissions
    account: str = ""  # the account the user logs in to ("" = the global account, $G)


@dataclass
class ExportOptions:
    """One entry of an account's `exports`: a stream (messages flow out) or a service (requests flow in,
    replies back), to every account or only to those in `accounts`."""

    kind: str = "stream"  # "stream" | "service"
    subject: str = ""
    accounts: list[str] | None = None  # None: any account may import it
    response_type: str = "singleton"  # services: "singleton" | "stream" | "chunked"


@dataclass
class ImportOptions:
    """One entry of an account's `imports`: `{stream: {account, subject}, prefix}` delivers the exporter's
    messages here under `prefix.`; `{service: {account, subject}, to}` sends requests published here on `to`
    (default: the subject) to the exporter's `subject`."""

    kind: str = "stream"
    account: str = ""
    subject: str = ""
    prefix: str = ""  # streams
    to: str = ""  # services: the local subject (default: `subject`)


@dataclass
class AccountJetStream:
    """An account's `jetstream`: `enabled`, or its limits (-1 = none)."""

    max_memory: int = -1
    max_storage: int = -1
    max_streams: int = -1
    max_consumers: int = -1


@dataclass
class AccountLimits:
    """An account's `limits {}` (zonebus.server.account_limits); -1 = no limit, as nats-server."""

    max_connections: int = -1
    max_subscriptions: int = -1
    max_payload: int = -1
    max_leafnodes: int = -1  # accepted; not enforced (leaf connections are not counted per account)

    @property
    def any(self) -> bool:
        return (self.max_connections, self.max_subscriptions, self.max_payload) != (-1, -1, -1)


@dataclass
class AccountOptions:
    """One entry of `accounts { NAME: {...} }` (zonebus.server.accounts)."""

    name: str = ""
    nkey: str = ""  # `nkey`: the account's public nkey (`A...`); checked, kept, not shown (as nats-server)
    users: list[UserOptions] = field(default_factory=list)
    exports: list[ExportOptions] = field(default_factory=list)
    imports: list[ImportOptions] = field(default_factory=list)
    default_permissions: Permissions | None = None
    jetstream: AccountJetStream | None = None  # None: no JetStream in this account
    limits: AccountLimits = field(default_factory=AccountLimits)  # `limits {}`
    mappings: list[Mapping] = field(default_factory=list)  # `mappings {}` (zonebus.subjects.mapping)


@dataclass
class ServerOptions:
    server_name: str = ""
    host: str = "0.0.0.0"
    port: int = DEFAULT_PORT
    http_host: str = ""  # defaults to host
    http_port: int = 0  # 0 = no monitoring
    https_port: int = 0  # monitoring over https (needs the top-level tls block); 0 = none
    tls: TLSOptions | None = None  # top-level tls {}: clients must use TLS
    tls_from_flags: bool = False  # `tls` was set (or cleared, --tls=false) by --tls* flags: a reload keeps it
    server_tags: list[str] = field(default_factory=list)
    max_payload: int = MAX_PAYLOAD
    max_control_line: int = MAX_CONTROL_LINE
    max_connections: int = MAX_CONNECTIONS
    max_subscriptions: int = 0  # 0 = unlimited
    max_pending: int = MAX_PENDING
    ping_interval: float = PING_INTERVAL
    ping_max: int = PING_MAX
    write_deadline: float = WRITE_DEADLINE
    lame_duck_duration: float = 120.0  # `--signal ldm`: clients are closed over this long, then the server stops
    lame_duck_grace_period: float = 10.0  # ... starting this long after lame duck mode begins
    # top-level authorization { user, password, token, timeout }
    auth_user: str = ""
    auth_password: str = ""
    auth_token: str = ""
    auth_timeout: float = AUTH_TIMEOUT
    users: list[UserOptions] = field(default_factory=list)  # authorization { users: [...] }
    default_permissions: Permissions | None = None  # authorization { default_permissions }
    no_auth_user: str = ""  # top-level: the user a client without credentials logs in as
    accounts: list[AccountOptions] = field(default_factory=list)  # accounts { A: {...} }
    system_account: str = "$SYS"  # the account of the server's own events
    debug: bool = False
    trace: bool = False
    logtime: bool = True
    pid_file: str = ""
    log_file: str = ""  # `log_file`/`logfile` key, `-l/--log` flag
    log_size_limit: int = 0  # `logfile_size_limit`: rotate the log file past this size (zonebus.server.logrotation)
    log_max_files: int = 0  # `logfile_max_num`: keep at most this many log files (0: all)
    # nats-server's small keys (docs/configuration.md): syslog (zonebus.server.syslogging), the match cache
    # (zonebus.subjects.sublist), headers, and how often route/gateway dial errors are logged
    # (zonebus.link.reports)
    syslog: bool = False
    remote_syslog: str = ""  # udp://host:port, tcp://host:port, unix:///path
    disable_sublist_cache: bool = False
    no_header_support: bool = False
    connect_error_reports: int = 3600
    reconnect_error_reports: int = 1
    mappings: list[Mapping] = field(default_factory=list)  # top-level `mappings {}`: the global account's
    signal: str = ""  # `--signal reload[=pid]`: send this signal to a running server instead of serving
    config_file: str = ""
    cluster: RouteOptions = field(default_factory=RouteOptions)
    gateway: GatewayOptions = field(default_factory=GatewayOptions)
    leafnodes: LeafNodeOptions = field(default_factory=LeafNodeOptions)
    websocket: WebsocketOptions = field(default_factory=WebsocketOptions)
    jetstream: JetStreamOptions = field(default_factory=JetStreamOptions)
    ledger: LedgerOptions = field(default_factory=LedgerOptions)
    queue_groups: dict[str, QueueGroupOptions] = field(default_factory=dict)  # zonebus.queue
    # processes serving clients on one port (zonebus.workers); 1 = this process alone; 0 = not set, which
    # `zonebus server` makes one per core (zonebus.cli.flags.default_workers)
    workers: int = 0

    @property
    def auth_required(self) -> bool:
        return bool(self.auth_user or self.auth_token or self.users)
