"""The zone router (seed 002): clients stay in their zone, publish payloads cross zones through shared storage.

Modules: `ring` (consistent-hash rings and bounded-load assignment), `view` (live servers per zone and the
main/proxy mapping), `records` (the `zr` channel's binary frames), `batch` (RouterChannel objects), `channel`
(the RouterChannel on the shared store), `proxy` and `leader` (the two ends of the publish path),
`clientzones` (client zones, `/connz`), `forwarder` (the server-core hook) and `router` (`ZoneRouter`, wired
by `zonebus.node`). The server core never imports this package.
"""
