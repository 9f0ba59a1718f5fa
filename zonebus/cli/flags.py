"""Command-line flags for `zonebus server`, spelled as nats-server spells them.

Parsing follows Go's `flag` package, which nats-server uses: every flag may be written with one or two
dashes (`-js`, `--jetstream`, `-port`), values as `-p 4222` or `-p=4222`, booleans as `-D` or `-D=false`;
parsing stops at `--` or the first non-flag argument, which is an error. The config file (`-c`) is loaded
first and the flags are then applied over it, whatever their order on the command line.

The TLS flags (`--tls`, `--tlscert`, `--tlskey`, `--tlscacert`, `--tlsverify`) work together, as in
nats-server: any of them defines the client `tls {}` block anew (certificate and key required; `--tlsverify`
requires client certificates, signed by `--tlscacert` or else the system's CAs), replacing the config file's
block but for its `timeout` and `handshake_first`; `--tls=false` anywhere switches client TLS off, whatever
the file or the other TLS flags say. A reload (SIGHUP) keeps what the flags set.

A bad flag prints `zonebus server: <message>` to stderr and raises SystemExit(2); a bad config file prints
`zonebus server: <errors>` and raises SystemExit(1), and so do TLS flags that do not make a usable block
(the message names the flag); `-h` prints the usage and raises SystemExit(0).
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from zonebus.config import ConfigError, load_config
from zonebus.config.convert import is_url, split_host_port
from zonebus.config.schema import MAX_WORKERS
from zonebus.options import ServerOptions, TLSOptions

PROG = "zonebus server"
SIGNALS = ("ldm", "stop", "quit", "term", "reload")

USAGE = f"""
Usage: {PROG} [options]

Server Options:
    -a, --addr, --net <host>         Bind to host address (default: 0.0.0.0)
    -p, --port <port>                Use port for clients (default: 4222)
    -n, --name, --server_name <name> Server name (default: auto)
    -P, --pid <file>                 File to store PID
    -m, --http_port <port>           Use port for http monitoring
    -c, --config <file>              Configuration file
    -t                               Test configuration and exit
    -sl,--signal <signal>[=<pid>]    Send signal to a running server ({", ".join(SIGNALS)})
        --tags <tag1,tag2>           Server tags (zonebus; e.g. az:us-east-1a)
        --workers <n>                Processes serving clients on one port (zonebus; default: one per core)

Logging Options:
    -l, --log <file>                 File to redirect log output
    -T, --logtime                    Timestamp log entries (default: true)
    -D, --debug                      Enable debugging output
    -V, --trace                      Trace the raw protocol
    -DV                              Debug and trace

JetStream Options:
    -js, --jetstream                 Enable JetStream functionality
    -sd, --store_dir <dir>           Set the storage directory

Authorization Options:
        --user <user>                User required for connections
        --pass <password>            Password required for connections
        --auth <token>               Authorization token required for connections

TLS Options:
        --tls                        Enable TLS, do not verify clients (default: false)
        --tlscert <file>             Server certificate file
        --tlskey <file>              Private key for server certificate
        --tlsverify                  Enable TLS, verify client certificates
        --tlscacert <file>           Client certificate CA for verification

Cluster Options:
        --routes <rurl-1, rurl-2>    Routes to solicit and connect
        --cluster <cluster-url>      Cluster URL for solicited routes (nats://host:port)
        --cluster_name <string>      Cluster name
        --no_advertise <bool>        Do not advertise known cluster information to clients
        --connect_retries <number>   For implicit routes, number of connect retries

Common Options:
    -h, --help                       Show this message
    -v, --version                    Show version
"""


class _FlagError(Exception):
    pass


@dataclass(frozen=True)
class _Flag:
    names: tuple[str, ...]
    kind: str  # "bool" or "value"
    apply: Callable[[ServerOptions, Any], None]
    convert: Callable[[str], Any] = str


def _port(text: str) -> int:
    try:
        port = int(text, 10)
    except ValueError:
        raise _FlagError("parse error")
    if not -1 <= port <= 65535:
        raise _FlagError("port out of range")
    return port


def _count(text: str) -> int:
    try:
        number = int(text, 10)
    except ValueError:
        raise _FlagError("parse error")
    if number < 0:
        raise _FlagError("must not be negative")
    return number


def _workers(text: str) -> int:
    number = _count(text)
    if not 1 <= number <= MAX_WORKERS:
        raise _FlagError(f"must be from 1 to {MAX_WORKERS}")
    return number


def _name(text: str) -> str:
    if " " in text:
        raise _FlagError("name cannot contain spaces")
    return text


def _csv(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def _route_urls(text: str) -> list[str]:
    urls = _csv(text)
    for url in urls:
        if not is_url(url):
            raise _FlagError(f"error parsing url {url!r}: expected nats-route://host:port")
    return urls


def _listen_url(text: str) -> tuple[str, int]:
    try:
        if "://" in text:
            parts = urlsplit(text)
            host, port = parts.hostname or "", parts.port
        else:
            host, port_text = split_host_port(text)
            port = int(port_text)
    except ValueError:
        host, port = "", None
    if port is None:
        raise _FlagError("expected nats://host:port")
    return host, port


def _signal(text: str) -> str:
    name, sep, pid = text.partition("=")
    if name not in SIGNALS:
        raise _FlagError(f"unknown signal {name!r}; expected one of {', '.join(SIGNALS)}")
    if sep and not pid:
        raise _FlagError("missing pid or pid file after '='")
    return text


def _set_cluster_listen(opts: ServerOptions, hp: tuple[str, int]) -> None:
    if hp[0]:
        opts.cluster.host = hp[0]
    opts.cluster.port = hp[1]


def _set_debug_trace(opts: ServerOptions, on: bool) -> None:
    opts.debug = opts.trace = on


def _set(attr: str) -> Callable[[ServerOptions, Any], None]:
    return lambda opts, value: setattr(opts, attr, value)


def _later(opts: ServerOptions, value: Any) -> None:
    """The TLS flags: collected into `_TLSFlags` and applied together once all flags are read."""


@dataclass
class _TLSFlags:
    """What the TLS flags said; `spelled` is the first of them as written, for messages."""

    enabled: bool | None = None  # --tls / --tls=false (the last one given)
    cert_file: str = ""
    key_file: str = ""
    ca_file: str = ""
    verify: bool = False
    spelled: str = ""

    def take(self, name: str, value: Any, spelled: str) -> None:
        self.spelled = self.spelled or spelled
        if name == "tls":
            self.enabled = value
        else:
            setattr(self, _TLS_FIELDS[name], value)

    def apply(self, opts: ServerOptions) -> None:
        """Define (or, with --tls=false, remove) the client tls block; SystemExit(1) naming the flag when
        the flags do not make a usable block (nats-server's wording, then what to add)."""
        if not self.spelled:
            return
        opts.tls_from_flags = True
        if self.enabled is False:
            opts.tls = None
            return
        if not self.cert_file:
            raise _fail(f"{self.spelled}: TLS Server certificate must be present and valid: "
                        f"give --tlscert <file>", code=1)
        if not self.key_file:
            raise _fail(f"{self.spelled}: TLS Server private key must be present and valid: "
                        f"give --tlskey <file>", code=1)
        old = opts.tls or TLSOptions()
        tls = TLSOptions(cert_file=self.cert_file, key_file=self.key_file, ca_file=self.ca_file,
                         verify=self.verify, timeout=old.timeout, handshake_first=old.handshake_first)
        from zonebus.credentials import TLSConfigError, check

        try:
            check(TLSOptions(cert_file=tls.cert_file, key_file=tls.key_file), "--tlscert/--tlskey: ")
            check(tls, "--tlscacert: ")
        except TLSConfigError as exc:
            raise _fail(str(exc), code=1)
        opts.tls = tls


_FLAGS = (
    _Flag(("a", "addr", "net"), "value", _set("host")),
    _Flag(("p", "port"), "value", _set("port"), _port),
    _Flag(("n", "name", "server_name"), "value", _set("server_name"), _name),
    _Flag(("m", "http_port"), "value", _set("http_port"), _port),
    _Flag(("P", "pid"), "value", _set("pid_file")),
    _Flag(("sl", "signal"), "value", _set("signal"), _signal),
    _Flag(("tags",), "value", lambda o, v: setattr(o, "server_tags", [t.lower() for t in v]), _csv),
    _Flag(("workers",), "value", _set("workers"), _workers),
    _Flag(("l", "log"), "value", _set("log_file")),
    _Flag(("T", "logtime"), "bool", _set("logtime")),
    _Flag(("D", "debug"), "bool", _set("debug")),
    _Flag(("V", "trace", "VV"), "bool", _set("trace")),
    _Flag(("DV", "DVV"), "bool", _set_debug_trace),
    _Flag(("js", "jetstream"), "bool", lambda o, v: setattr(o.jetstream, "enabled", v)),
    _Flag(("sd", "store_dir"), "value", lambda o, v: setattr(o.jetstream, "store_dir", v)),
    _Flag(("user",), "value", _set("auth_user")),
    _Flag(("pass",), "value", _set("auth_password")),
    _Flag(("auth",), "value", _set("auth_token")),
    _Flag(("tls",), "bool", _later),
    _Flag(("tlscert",), "value", _later),
    _Flag(("tlskey",), "value", _later),
    _Flag(("tlscacert",), "value", _later),
    _Flag(("tlsverify",), "bool", _later),
    _Flag(("routes",), "value", lambda o, v: setattr(o.cluster, "routes", v), _route_urls),
    _Flag(("cluster", "cluster_listen"), "value", _set_cluster_listen, _listen_url),
    _Flag(("cluster_name",), "value", lambda o, v: setattr(o.cluster, "name", v), _name),
    _Flag(("no_advertise",), "bool", lambda o, v: setattr(o.cluster, "no_advertise", v)),
    _Flag(("connect_retries",), "value", lambda o, v: setattr(o.cluster, "connect_retries", v), _count),
)
_BY_NAME = {name: flag for flag in _FLAGS for name in flag.names}
_TLS_FIELDS = {"tlscert": "cert_file", "tlskey": "key_file", "tlscacert": "ca_file", "tlsverify": "verify"}
_SPECIAL = {"c": "config", "config": "config", "t": "test", "h": "help", "help": "help"}
_SPECIAL |= {"v": "version", "version": "version"}
_TRUE = ("1", "t", "T", "TRUE", "true", "True")
_FALSE = ("0", "f", "F", "FALSE", "false", "False")


def _fail(message: str, code: int = 2) -> SystemExit:
    print(f"{PROG}: {message}", file=sys.stderr)
    return SystemExit(code)


def _parse_bool(text: str, spelled: str) -> bool:
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise _fail(f'invalid boolean value "{text}" for {spelled}: parse error')


def _scan(argv: list[str]) -> tuple[list[tuple[_Flag, Any, str]], str, bool]:
    """Read argv into (flag, value, flag as written) actions, the config path and the -t switch."""
    actions: list[tuple[_Flag, Any, str]] = []
    config, test = "", False
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            i += 1
            break
        if not arg.startswith("-") or arg == "-":
            break
        body = arg[2:] if arg.startswith("--") else arg[1:]
        if not body or body[0] in "-=":
            raise _fail(f"bad flag syntax: {arg}")
        name, has_value, value = body.partition("=")
        spelled = arg[: len(arg) - len(body)] + name
        special = _SPECIAL.get(name)
        flag = _BY_NAME.get(name)
        if flag is None and special is None:
            raise _fail(f"flag provided but not defined: {spelled}")
        on = True
        is_bool = special in ("test", "help", "version") or (flag is not None and flag.kind == "bool")
        if is_bool:
            on = _parse_bool(value, spelled) if has_value else True
        elif not has_value:
            i += 1
            if i >= len(argv):
                raise _fail(f"flag needs an argument: {spelled}")
            value = argv[i]
        i += 1
        if special == "help" and on:
            print(USAGE)
            raise SystemExit(0)
        if special == "version" and on:
            from zonebus import version_text

            print(version_text(PROG))
            raise SystemExit(0)
        if special == "test":
            test = on
        elif special == "config":
            config = value
        else:
            try:
                actions.append((flag, on if is_bool else flag.convert(value), spelled))
            except _FlagError as exc:
                raise _fail(f'invalid value "{value}" for flag {spelled}: {exc}')
    if i < len(argv):
        raise _fail(f'unrecognized command: "{argv[i]}"')
    return actions, config, test


def parse_server_args(argv: list[str]) -> tuple[ServerOptions, bool]:
    """Options from `zonebus server` arguments (config file first, flags over it) and whether `-t`
    (test the configuration and exit) was given."""
    actions, config, test = _scan(list(argv))
    if test and not config:
        raise _fail("must specify [-c, --config] option to check configuration file syntax")
    if config:
        try:
            opts = load_config(config)
        except ConfigError as exc:
            raise _fail(str(exc), code=1)
    else:
        opts = ServerOptions()
    tls = _TLSFlags()
    for flag, value, spelled in actions:
        if flag.apply is _later:
            tls.take(flag.names[0], value, spelled)
        else:
            flag.apply(opts, value)
    tls.apply(opts)
    if not opts.workers:
        opts.workers = default_workers()
    return opts, test


def default_workers() -> int:
    """`workers` when neither the config nor a flag says: one per core this process may run on, whatever
    the config (every block works with several processes), or 1 on a platform without SO_REUSEPORT (the
    workers share the client port with it)."""
    if not hasattr(socket, "SO_REUSEPORT"):
        return 1
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(cores, MAX_WORKERS))
