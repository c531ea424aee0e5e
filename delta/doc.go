// Package delta owns the delta segment format and delta chains, and
// nothing else: it encodes and decodes a segment (the etcd events of a
// contiguous range of revisions, each with the wall-clock time it was
// seen, and the leases those events use), checks that a chain's segments
// follow each other with no gap and no overlap, and plans a restore to a
// point (which full backup, which segments). It has no network or storage
// code: the delta agent, the server and the restore flow feed it bytes
// and manifests they fetched themselves. Replaying segments into etcd is
// package delta/replay.
//
// # Segment format (plain, before compression and encryption)
//
//	magic   "etcdbackup-delta-segment/v1\n"
//	frames  each: 1 type byte, uvarint payload length, payload
//	  'H' header    JSON {"chain","epoch","firstRevision"}
//	  'L' lease     varint ID, varint granted TTL (s), varint remaining TTL (s, -1 unknown)
//	  'R' revision  uvarint revision, varint unix nanoseconds seen,
//	                uvarint event count, then per event: uvarint length,
//	                etcd mvccpb.Event (protobuf)
//	  'E' end       uvarint last revision, uvarint revisions, uvarint events,
//	                uvarint length + end reason (UTF-8, may be empty)
//
// Invariants a reader checks: the header comes first and the end frame
// last (a segment cut short has none and is refused); revisions are
// strictly increasing by exactly one from firstRevision (etcd gives every
// write transaction exactly one revision and every revision events);
// every event of an 'R' frame has that revision as its mod revision; a
// lease frame comes before the first revision whose events use it; the
// end frame's counts equal what was read.
package delta
