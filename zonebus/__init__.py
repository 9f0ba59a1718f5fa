"""zonebus: a zone-aware message broker that speaks the NATS client protocol, and its cost pipeline."""

__version__ = "0.1.0"
# nats-py reads the server version as major.minor to pick JetStream API subjects: report a 2.x version.
SERVER_VERSION = "2.11.0-zonebus"
