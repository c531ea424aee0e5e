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
//	frames  each: 1 type byte, uvarint payload length, payload (at most MaxFrameSize, 64 MiB)
//	  'H' header        JSON {"chain","epoch","firstRevision"}
//	  'L' lease         varint ID, varint granted TTL (s), varint remaining TTL (s, -1 unknown)
//	  'R' revision      uvarint revision, varint unix nanoseconds seen,
//	                    uvarint event count (the whole revision's), then per
//	                    event: uvarint length, etcd mvccpb.Event (protobuf)
//	  'C' continuation  more events of the revision an 'R' frame opened, as
//	                    there: per event uvarint length, mvccpb.Event
//	  'E' end           uvarint last revision, uvarint revisions, uvarint events,
//	                    uvarint length + end reason (UTF-8, may be empty)
//
// A writer writes a revision as one 'R' frame when that frame's payload
// is at most 4 MiB (writers before 'C' frames existed: at most
// MaxFrameSize; a reader takes both). A larger revision is split: its 'R'
// frame holds the first of its events, and 'C' frames follow it directly
// with the next ones until the count is reached; the writer fills each
// frame up to 4 MiB, past that only to hold a single larger event. A revision's events, lengths included, are
// at most MaxRevisionBytes (256 MiB, the largest request the replay etcd
// takes) over all its frames: a writer refuses a larger revision
// (ErrRevisionTooLarge), and the chain must end before it.
//
// Invariants a reader checks: the header comes first and the end frame
// last (a segment cut short has none and is refused); revisions are
// strictly increasing by exactly one from firstRevision (etcd gives every
// write transaction exactly one revision and every revision events);
// every event of a revision's frames has that revision as its mod
// revision; a revision's frames hold exactly its event count, at least
// one event each, and at most MaxRevisionBytes together: 'C' frames come
// only while a revision's count is not reached, and nothing else comes
// until it is; a lease frame comes before the first revision whose events
// use it; the end frame's counts equal what was read.
package delta
