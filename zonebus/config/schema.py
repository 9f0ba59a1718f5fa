"""Maps a parsed configuration tree onto `ServerOptions`, checking every key and type: the top level.

Keys are matched case-insensitively, as nats-server does. Problems are collected (not stopped at the first)
and raised together as one `ConfigError`, each line `<file>:<line>:<col>: <message>`:

- an unknown key: `unknown field "<key>"` (nats-server's wording); entries that were referenced as
  `$variables` are variable definitions and are not reported;
- a bad value: `<key>: expected <type>, got <value>`, or nats-server's own message for that check.

The top-level keys are here; each block has a module of its own: `authorization`, `tls`, `links` (`cluster`
and `gateway`), `leafnodes`, `websocket`, `jetstream`, `ledger`, `queue_groups` and `accounts`, all built on `readers`.
"""

from __future__ import annotations

from zonebus.config.accounts import read_accounts, read_system_account
from zonebus.config.authorization import top_auth
from zonebus.config.convert import BadValue, get_duration, get_int, get_port, get_str_list, show
from zonebus.config.jetstream import read_jetstream
from zonebus.config.leafnodes import read_leafnodes
from zonebus.config.ledger import read_ledger
from zonebus.config.links import read_cluster, read_gateway
from zonebus.config.mappings import read_mappings
from zonebus.config.parser import ConfigError, Value
from zonebus.config.queue_groups import read_queue_groups
from zonebus.config.readers import (
    MAX_PAYLOAD_LIMIT,
    Errors,
    Handler,
    apply_handlers,
    bool_field,
    int_field,
    listen_field,
    name_field,
    positive_duration,
    setter,
    str_field,
)
from zonebus.config.tls import tls_block
from zonebus.config.websocket import read_websocket, websocket_problems
from zonebus.options import ServerOptions

MAX_WORKERS = 256  # `workers`: processes of one server (zonebus.workers)


# ---- top level ------------------------------------------------------------------------------------


def _max_payload(opts: ServerOptions, v: Value, errors: Errors) -> None:
    size = get_int(v, 1)
    if size > MAX_PAYLOAD_LIMIT:
        raise BadValue("max_payload value is too big", v)
    opts.max_payload = size


def _server_tags(opts: ServerOptions, v: Value, errors: Errors) -> None:
    # nats-server stores tags in lower case; a single string is one tag (commas are not split).
    opts.server_tags = [tag.lower() for tag in get_str_list(v)]


LAME_DUCK_MIN = 30.0  # seconds; nats-server refuses less


def _lame_duck_duration(v: Value) -> float:
    seconds = get_duration(v)
    if seconds < LAME_DUCK_MIN:
        shown = v.value if v.kind == "string" else show(v)
        raise BadValue(f"invalid lame_duck_duration of {shown}, minimum is 30 seconds", v)
    return seconds


_TOP_HANDLERS: dict[str, Handler] = {
    "listen": listen_field("host", "port"),
    "host": str_field("host"),
    "net": str_field("host"),
    "addr": str_field("host"),
    "port": setter("port", get_port),
    "server_name": name_field("server_name", "server"),
    "name": name_field("server_name", "server"),
    "http": listen_field("http_host", "http_port"),
    "monitor": listen_field("http_host", "http_port"),
    "http_port": setter("http_port", get_port),
    "https": listen_field("http_host", "https_port"),
    "https_port": setter("https_port", get_port),
    "tls": tls_block(""),
    "monitor_port": setter("http_port", get_port),
    "server_tags": _server_tags,
    "max_payload": _max_payload,
    "max_control_line": int_field("max_control_line", 1),
    "max_connections": int_field("max_connections"),
    "max_conn": int_field("max_connections"),
    "max_subscriptions": int_field("max_subscriptions", 0),
    "max_subs": int_field("max_subscriptions", 0),
    "max_pending": int_field("max_pending", 1),
    "ping_interval": positive_duration("ping_interval"),
    "ping_max": int_field("ping_max"),
    "write_deadline": positive_duration("write_deadline"),
    "lame_duck_duration": setter("lame_duck_duration", _lame_duck_duration),
    "lame_duck_grace_period": positive_duration("lame_duck_grace_period"),
    "authorization": top_auth,
    "no_auth_user": str_field("no_auth_user"),
    "debug": bool_field("debug"),
    "trace": bool_field("trace"),
    "logtime": bool_field("logtime"),
    "pid_file": str_field("pid_file"),
    "pidfile": str_field("pid_file"),
    "log_file": str_field("log_file"),
    "logfile": str_field("log_file"),
    "logfile_size_limit": int_field("log_size_limit"),
    "log_size_limit": int_field("log_size_limit"),
    "logfile_max_num": int_field("log_max_files"),
    "log_max_num": int_field("log_max_files"),
    "syslog": bool_field("syslog"),
    "remote_syslog": str_field("remote_syslog"),
    "disable_sublist_cache": bool_field("disable_sublist_cache"),
    "no_header_support": bool_field("no_header_support"),
    "connect_error_reports": int_field("connect_error_reports"),
    "reconnect_error_reports": int_field("reconnect_error_reports"),
    "mappings": lambda o, v, e: setattr(o, "mappings", read_mappings(v, e)),
    "cluster": read_cluster,
    "gateway": read_gateway,
    "leafnodes": read_leafnodes,
    "leaf": read_leafnodes,
    "websocket": read_websocket,
    "jetstream": read_jetstream,
    "ledger": read_ledger,
    "queue_groups": read_queue_groups,
    "workers": int_field("workers", 1, MAX_WORKERS),
    "accounts": read_accounts,
    "system_account": read_system_account,
}


def apply_config(tree: dict[str, Value], opts: ServerOptions | None = None) -> ServerOptions:
    """Apply a parsed tree to `opts` (fresh defaults when None) and return it; raises `ConfigError`
    listing every problem found."""
    opts = ServerOptions() if opts is None else opts
    errors = Errors()
    apply_handlers(tree, _TOP_HANDLERS, opts, errors, "")
    if opts.no_auth_user and not errors and not any(opts.no_auth_user in (u.user, u.nkey) for u in opts.users):
        where = next((v for k, v in tree.items() if k.lower() == "no_auth_user"), None)
        msg = (f'no_auth_user: "{opts.no_auth_user}" not present as user or nkey in authorization block '
               "or account configuration")
        errors.append(f"{where.where}: {msg}" if where is not None else msg)
    if not errors:
        where = next((v for k, v in tree.items() if k.lower() == "websocket"), None)
        for problem in websocket_problems(opts):
            errors.append(f"{where.where}: {problem}" if where is not None else problem)
    if opts.https_port and opts.tls is None and not errors:
        where = next((v for k, v in tree.items() if k.lower() in ("https", "https_port")), None)
        msg = "https: monitoring over https needs a top-level tls block (the certificate it serves)"
        errors.append(f"{where.where}: {msg}" if where is not None else msg)
    if errors:
        raise ConfigError(list(errors))
    return opts
