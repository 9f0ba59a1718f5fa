"""Configuration files in nats-server's syntax, loaded into `ServerOptions`.

`load_config(path)` and `parse_config_text(text, filename)` return a `ServerOptions`; any problem raises
`ConfigError` (a ValueError) whose message names file, line and column, one line per problem.
The grammar lives in `parser`, value readers in `convert`, the key-by-key mapping in `schema` (the top
level) and a module per block (`authorization`, `tls`, `links`, `jetstream`, `ledger`, `queue_groups`,
`accounts`), built on `readers`.
"""

from __future__ import annotations

from collections.abc import Mapping

from zonebus.config.parser import ConfigError, Value, parse_file, parse_text
from zonebus.config.schema import apply_config
from zonebus.options import ServerOptions


def parse_config_text(
    text: str, filename: str = "", env: Mapping[str, str] | None = None, opts: ServerOptions | None = None
) -> ServerOptions:
    """Options from configuration text. `filename` names it in errors and anchors relative includes
    (the working directory when empty); `env` replaces os.environ for `$VAR` lookups; `opts`, when
    given, is updated instead of starting from defaults."""
    return apply_config(parse_text(text, filename, env), opts)


def load_config(path: str, env: Mapping[str, str] | None = None) -> ServerOptions:
    """Options from a configuration file; `config_file` is set to `path`."""
    opts = apply_config(parse_file(path, env))
    opts.config_file = path
    return opts


__all__ = [
    "ConfigError",
    "Value",
    "apply_config",
    "load_config",
    "parse_config_text",
    "parse_file",
    "parse_text",
]
