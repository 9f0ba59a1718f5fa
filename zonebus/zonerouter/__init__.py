"""The zone router (seed 002): clients stay in their zone, payloads cross zones through shared storage.

Modules: `ring` (consistent-hash rings and bounded-load assignment), `view` (live servers per zone and the
main/proxy mapping), `records` (the `zr` channel's publish-path frames), `channel` (the RouterChannel on the
shared store; its objects' encoding is `zonebus.store.routerbatch`, part of the store's layout), `proxy` and
`leader` (the two ends of the publish path), `readframes` (the read path's frames), `snapshot` (a proxy's view
of a stream led in another zone), `reader` and `serving` (the two ends of the read path: pull consumers, acks,
direct gets), `tailrefs` (a replica's own records in the replicated tail, by reference), `linkrefs` (which of
the leader's log records become link records, and the streams' pins that keep their channel objects),
`epochs` (route epochs and channel trimming through the meta group), `clientzones` (client zones, `/connz`),
`forwarder` (the server-core hook) and `router` (`ZoneRouter`, wired by `zonebus.node`). The server core never
imports this package.
"""
