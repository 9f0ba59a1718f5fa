"""Compression modes of routes and gateways, by nats-server's names: the mode constants, the names a config
file may use for them and the checks of `rtt_thresholds`. No I/O and no codec: the config reader
(`zonebus.config.convert`) and the link layer's negotiation and zstd streams (`zonebus.link.compression`,
where the modes are described) both read them.
"""

from __future__ import annotations

NOT_SUPPORTED = "not supported"
OFF = "off"
ACCEPT = "accept"
S2_AUTO = "s2_auto"
S2_UNCOMPRESSED = "s2_uncompressed"
S2_FAST = "s2_fast"
S2_BETTER = "s2_better"
S2_BEST = "s2_best"
S2_MODES = (S2_AUTO, S2_UNCOMPRESSED, S2_FAST, S2_BETTER, S2_BEST)

_ALIASES = {
    "not supported": NOT_SUPPORTED, "not_supported": NOT_SUPPORTED,
    "disabled": OFF, "off": OFF, "false": OFF,
    "accept": ACCEPT,
    "auto": S2_AUTO, "s2_auto": S2_AUTO,
    "fast": S2_FAST, "s2_fast": S2_FAST,
    "better": S2_BETTER, "s2_better": S2_BETTER,
    "best": S2_BEST, "s2_best": S2_BEST,
}


def normalize_mode(text: str, on_mode: str = S2_FAST) -> str:
    """A configured mode in nats-server's canonical name (`on`/`enabled`/`true` -> `on_mode`); ValueError
    for an unknown one, in nats-server's words."""
    low = text.lower()
    if low in ("on", "enabled", "true"):
        low = on_mode
    mode = _ALIASES.get(low)
    if mode is None:
        raise ValueError(f"unsupported compression mode {text!r}")
    return mode


def normalize_thresholds(values: list[float]) -> tuple[float, ...]:
    """nats-server's checks of `rtt_thresholds` (seconds): negatives are 0, non-zero values ascending, 0s at
    the end trimmed, between 1 and 4 values left."""
    out: list[float] = []
    for v in values:
        v = max(v, 0.0)
        if v and any(v < prev for prev in out):
            raise ValueError(f"RTT threshold values {values} should be in ascending order")
        out.append(v)
    while out and out[-1] == 0:
        out.pop()
    if len(out) > 4:
        raise ValueError(f"compression mode {S2_AUTO!r} should have no more than 4 RTT thresholds")
    if not out:
        raise ValueError(f"compression mode {S2_AUTO!r} requires at least one RTT threshold")
    return tuple(out)
