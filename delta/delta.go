package delta

import (
	"io"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
)

// Header opens a segment.
type Header struct {
	// Chain is the full backup the chain starts from.
	Chain string `json:"chain"`
	// Epoch is the writer's fencing epoch.
	Epoch int64 `json:"epoch"`
	// FirstRevision is the first revision the segment holds (the chain's
	// previous segment's last + 1, or the full's revision + 1).
	FirstRevision int64 `json:"firstRevision"`
}

// Revision is every event etcd produced at one revision, and when the
// watcher saw them.
type Revision struct {
	Revision int64
	Time     time.Time
	Events   []*mvccpb.Event
}

// Lease is a lease some event of a segment uses, as the watcher read it
// from etcd (LeaseTimeToLive) when it first saw it.
type Lease struct {
	ID int64
	// TTL is the TTL the lease was granted with, in seconds.
	TTL int64
	// Remaining is what was left of it when read, in seconds; -1 when the
	// lease was already gone (expired or revoked) when the watcher asked.
	Remaining int64
}

// Summary is what a finished segment holds: what its manifest records.
type Summary struct {
	Header
	// LastRevision is FirstRevision - 1 for a segment without revisions.
	LastRevision        int64
	FirstTime, LastTime time.Time
	Revisions, Events   int64
	EndReason           string
}

// Writer encodes one segment. It is not safe for concurrent use.
type Writer struct {
	w   io.Writer
	sum Summary
	err error
}
