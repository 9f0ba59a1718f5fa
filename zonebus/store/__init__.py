"""The storage engine: message stores and the shared-store layout, below JetStream and everything else.

`msgstore` (the `MsgStore` interface, `StoredMsg`), `memstore` (memory streams), `filestore` (segment files with
checksums; `segindex` and `subject_index` are its indexes), and the shared store (`shared`: the entry point;
`sharedlayout`: names, encoding and chain rules of the versioned layout; `sharedstore`: the writer, with
`sharedcommit` (group commit and the upload pipeline), `sharedfence` (takeover and fencing), `sharedtier` (the
replicated tail), `sharedbase` (base moves) and `shareddocs` (config and consumer documents); `sharedview`: the
reader). It depends only on `zonebus.storage` (object store access) and `zonebus.subjects`; JetStream, the zone
router, durable queues and the Spark reader import it.
"""
