"""Server version strings as nats-server compares them: the `version` a leaf node sends in its CONNECT, and a
`leafnodes { min_version }` it must reach.

A version is semantic versioning (`2.10.4`, `2.11.0-zonebus.0.1.0`, `2.12.0-RC.1+build`), nats-server's
`semVerRe`; only major, minor and patch count in a comparison (a pre-release of 2.12.0 is at least 2.12.0, as
there). Anything else does not parse (`ValueError("invalid semver")`), and is at least no version. No I/O.
"""

from __future__ import annotations

import re

_IDENT = r"(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)"
_SEMVER = re.compile(
    r"(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    rf"(?:-({_IDENT}(?:\.{_IDENT})*))?"
    r"(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?",
    re.ASCII)


def version_components(version: str) -> tuple[int, int, int]:
    """(major, minor, patch) of a version string; ValueError("invalid semver") when it is not one."""
    m = _SEMVER.fullmatch(version)
    if m is None:
        raise ValueError("invalid semver")
    return int(m[1]), int(m[2]), int(m[3])


def version_at_least(version: str, minimum: tuple[int, int, int]) -> bool:
    """Whether `version` is `minimum` or later (False for a version that does not parse, an empty one too)."""
    try:
        return version_components(version) >= minimum
    except ValueError:
        return False
