"""zonebus: a zone-aware message broker that speaks the NATS client protocol, and its cost pipeline.

Versions, in one place. `SERVER_VERSION` is zonebus's one version string: `zonebus --version`,
`zonebus server -v`, the log line at start, `/varz` and the INFO clients read all show it. It starts with the
nats-server release whose client protocol and JetStream API zonebus emulates (`NATS_VERSION`), because
clients read major.minor from INFO to pick JetStream API subjects, and ends with zonebus's own release
(`__version__`, the package version): `2.12.0-zonebus.0.1.0`.
"""

__version__ = "0.1.0"
NATS_VERSION = "2.12.0"  # the nats-server release whose protocol zonebus emulates
NATS_PROTOCOL = 1  # INFO "proto": the client protocol revision (1: dynamic cluster discovery, headers)
SERVER_VERSION = f"{NATS_VERSION}-zonebus.{__version__}"


def version_text(prog: str = "zonebus") -> str:
    """What `--version` prints: the version string, then the NATS protocol it emulates on a line of its own."""
    return f"{prog}: v{SERVER_VERSION}\nNATS client protocol {NATS_PROTOCOL}, as spoken by nats-server {NATS_VERSION}"
