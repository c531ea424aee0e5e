// Package storage is the data access layer of the etcdbackup server: one
// interface over the places backups are kept (a filesystem directory, an S3
// bucket, ...), knowing nothing of gRPC, authentication or etcd.
//
// Every backend keeps the same promise: a backup becomes visible to Stat and
// List only once its data is completely and durably written and its
// manifest, written last, is in place. An upload that is aborted, or a
// process that dies mid-upload, leaves nothing listed.
package storage

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"time"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
)

// Errors every backend returns (wrapped) so the request layer can map them
// to status codes.
var (
	ErrNotFound      = errors.New("backup not found")
	ErrAlreadyExists = errors.New("backup already exists")
	// ErrNoSpace is a write refused because the location is full (or over
	// its quota). The upload is aborted like any other failed one.
	ErrNoSpace = errors.New("no space left in the storage location")
	// ErrReadOnly is a write (Create, Delete) to a location opened
	// read-only: one read for break-glass access, which must leave the
	// store as it found it for the server that owns it.
	ErrReadOnly = errors.New("the storage location was opened read-only (break-glass access): nothing can be written to or deleted from it")
	// ErrLocked is a delete the store's object lock refuses: the backup's
	// retention has not ended (*LockedError says until when).
	ErrLocked = errors.New("locked by the store's object lock")
	// ErrMisconfigured is a store that answers but cannot do what the
	// location's configuration asks (an S3 bucket without object lock for
	// a location with objectLock): retrying cannot fix it, so the server
	// refuses to start.
	ErrMisconfigured = errors.New("the store does not support what the location's configuration asks")
)

// LockedError is a delete of a backup whose object lock retention ends
// at Until; nothing of it was deleted.
type LockedError struct {
	Name  string
	Until time.Time
	// Mode is the retention mode (GOVERNANCE, COMPLIANCE), when known.
	Mode string
}

func (e *LockedError) Error() string {
	mode := ""
	if e.Mode != "" {
		mode = ", " + e.Mode
	}
	return fmt.Sprintf("%q is locked until %s (object lock%s): the store refuses to delete it before then; nothing of it was deleted",
		e.Name, e.Until.UTC().Format(time.RFC3339), mode)
}

func (e *LockedError) Is(target error) bool { return target == ErrLocked }

// Checker is a Location that can tell cheaply whether it answers, without
// listing its backups. The server calls it to find out when a location it
// reported unavailable works again.
type Checker interface {
	Check(ctx context.Context) error
}

// CheckManifest rejects a manifest read back under name that cannot be
// that backup's: another name, or sizes no upload produces. A
// backend decodes whatever is in the store; this keeps a damaged or
// planted manifest from reaching the request layer as a backup.
func CheckManifest(m *Manifest, name string) error {
	switch {
	case m.Name != name:
		return fmt.Errorf("manifest of %q names backup %q", name, m.Name)
	case m.Size < 0 || m.RawSize < 0:
		return fmt.Errorf("manifest of %q records a negative size", name)
	}
	return nil
}

// Manifest is what a location stores about a backup beside its data. It is
// written after the data and its presence is what makes the backup exist.
type Manifest struct {
	Name        string            `json:"name"`
	Size        int64             `json:"size"`
	SHA256      string            `json:"sha256"`
	CreateTime  time.Time         `json:"createTime"`
	Labels      map[string]string `json:"labels,omitempty"`
	Compression string            `json:"compression,omitempty"`
	// RawSize and RawSHA256 are the plain etcd snapshot's, before
	// compression and encryption.
	RawSize   int64  `json:"rawSize,omitempty"`
	RawSHA256 string `json:"rawSHA256,omitempty"`
	// Encryption is "" or "age"; AgeRecipients are the public keys it is
	// encrypted to (never a secret).
	Encryption    string    `json:"encryption,omitempty"`
	AgeRecipients []string  `json:"ageRecipients,omitempty"`
	Source        Source    `json:"source"`
	Etcd          *EtcdInfo `json:"etcd,omitempty"`
	// Verification is the newest restore drill's verdict: the one part
	// of a manifest written after the backup was stored
	// (VerificationWriter), never a fact about the data.
	Verification *Verification `json:"verification,omitempty"`
	// Delta is set on a delta segment (Source.Kind ebv1.SourceDelta): the
	// revisions it holds and the chain it belongs to.
	Delta *Delta `json:"delta,omitempty"`
	// Kit is set on a backup's recovery kit (Source.Kind ebv1.SourceKit).
	Kit *Kit `json:"kit,omitempty"`
	// LockedUntil is when the object lock retention its objects were
	// written with ends (S3 locations with objectLock); until then the
	// store refuses to delete them.
	LockedUntil time.Time `json:"lockedUntil,omitzero"`
	// Copy is set on a backup (or part) the server copied into this
	// location from another: the stored bytes are the original's.
	Copy *CopyOf `json:"copy,omitempty"`
}

// CopyOf records where a copy came from.
type CopyOf struct {
	// From is the location it was copied from.
	From string `json:"from"`
	// Time is when the copy was stored.
	Time time.Time `json:"time"`
}

// PlainSize is the plain etcd snapshot's size: RawSize when it was
// compressed or encrypted, else the stored size.
func (m *Manifest) PlainSize() int64 {
	if m.RawSize > 0 {
		return m.RawSize
	}
	return m.Size
}

// Locked says whether m's object lock retention has not ended at now.
func (m *Manifest) Locked(now time.Time) bool { return m.LockedUntil.After(now) }

// Clone is a copy of m that shares nothing with it.
func (m *Manifest) Clone() *Manifest {
	c := *m
	c.Labels = maps.Clone(m.Labels)
	c.AgeRecipients = slices.Clone(m.AgeRecipients)
	if m.Etcd != nil {
		e := *m.Etcd
		c.Etcd = &e
	}
	if m.Verification != nil {
		v := *m.Verification
		c.Verification = &v
	}
	if m.Delta != nil {
		d := *m.Delta
		c.Delta = &d
	}
	c.Kit = m.Kit.clone()
	if m.Copy != nil {
		cp := *m.Copy
		c.Copy = &cp
	}
	return &c
}

// Delta is what a delta segment holds: every event of revisions
// FirstRevision..LastRevision of one chain, the chain being the full
// backup named Chain and the segments after it, contiguous.
type Delta struct {
	Chain string `json:"chain"`
	// Epoch is the fencing epoch of the agent that wrote it.
	Epoch         int64     `json:"epoch"`
	FirstRevision int64     `json:"firstRevision"`
	LastRevision  int64     `json:"lastRevision"`
	FirstTime     time.Time `json:"firstTime,omitzero"`
	LastTime      time.Time `json:"lastTime,omitzero"`
	Events        int64     `json:"events"`
	// EndReason is set on a chain's last segment: why it ended.
	EndReason string `json:"endReason,omitempty"`
	// HistoryBreak is set with EndReason when the chain ended because
	// etcd's history changed under it (restored or re-created).
	HistoryBreak bool `json:"historyBreak,omitempty"`
	// ClockOffset is the server's clock minus the writing agent's when the
	// segment arrived (the agent's clock stamps every revision).
	ClockOffset time.Duration `json:"clockOffset,omitempty"`
	// LastEvent is the first event of the segment's newest revision: an
	// agent continuing the chain checks etcd still holds it there.
	LastEvent *DeltaEvent `json:"lastEvent,omitempty"`
	// AuthRevision is etcd's auth revision when the segment was stored
	// (0: unknown).
	AuthRevision uint64 `json:"authRevision,omitempty"`
}

// DeltaEvent identifies one event: its key, whether it deleted the key,
// and the SHA-256 of the value it put (lower-case hex).
type DeltaEvent struct {
	Key         []byte `json:"key"`
	Deleted     bool   `json:"deleted,omitempty"`
	ValueSHA256 string `json:"valueSHA256,omitempty"`
}

// Verification is what a restore drill found: the backup restored with
// etcd's restore code, served by etcd and compared with its keyspace
// fingerprint.
type Verification struct {
	Time time.Time `json:"time"`
	// Result is VerificationSucceeded, VerificationFailed or
	// VerificationError.
	Result string `json:"result"`
	// Revision, Keys and HashKV are what the restored member answered.
	Revision int64  `json:"revision,omitempty"`
	Keys     int64  `json:"keys,omitempty"`
	HashKV   uint32 `json:"hashKV,omitempty"`
	// Duration is the drill's wall time, download included.
	Duration time.Duration `json:"duration,omitempty"`
	Message  string        `json:"message,omitempty"`
	// Job is the drill agent's Job.
	Job string `json:"job,omitempty"`
}

// Results of a Verification.
const (
	// VerificationSucceeded: the restore equals what the backup recorded.
	VerificationSucceeded = "Succeeded"
	// VerificationFailed: it did not restore, or not to what it recorded.
	VerificationFailed = "Failed"
	// VerificationError: the drill reached no verdict.
	VerificationError = "Error"
)

// VerificationWriter is a Location that can record a drill's verdict in a
// stored backup's manifest. It changes nothing else in the manifest and
// never makes a deleted backup reappear: ErrNotFound when the backup is
// gone.
type VerificationWriter interface {
	SetVerification(ctx context.Context, name string, v *Verification) error
}

// Source records where a backup's data came from.
type Source struct {
	// Kind is ebv1.SourceUpload, ebv1.SourceAgent, ebv1.SourceDelta or
	// ebv1.SourceKit.
	Kind        string    `json:"kind"`
	Description string    `json:"description,omitempty"`
	Target      string    `json:"target,omitempty"`
	StartTime   time.Time `json:"startTime,omitzero"`
	EndTime     time.Time `json:"endTime,omitzero"`
	// Scheduled marks one of Target's scheduled backups, ScheduledTime
	// when its schedule was due. Only the server sets them, when the
	// agent Job its schedule started stores the backup; retention and
	// the schedule go by them, never by labels.
	Scheduled     bool      `json:"scheduled,omitempty"`
	ScheduledTime time.Time `json:"scheduledTime,omitzero"`
	// ClaimedTarget is the target an upload's header named: the
	// uploader's word, never acted on. Target is only ever the server's.
	ClaimedTarget string `json:"claimedTarget,omitempty"`
}

// OfTarget says whether m is one of target's own backups: taken by the
// target's agent (a snapshot or a fold) and recorded so by the server.
// Restores to a point, drills, retention, delta chains and metrics of a
// target count only these: an upload is whatever its uploader made it.
func (m *Manifest) OfTarget(target string) bool {
	return ebv1.OfTarget(m.Source.Kind, m.Source.Target, target)
}

// EtcdInfo records facts about a snapshot and the etcd member it was taken
// from.
type EtcdInfo struct {
	ClusterID  uint64 `json:"clusterID,omitempty"`
	MemberID   uint64 `json:"memberID,omitempty"`
	MemberName string `json:"memberName,omitempty"`
	// Revision is the snapshot's (with SnapshotStatus), else the member's
	// just before the snapshot (backups from before it was read).
	Revision int64  `json:"revision,omitempty"`
	Version  string `json:"version,omitempty"`
	DBSize   int64  `json:"dbSize,omitempty"`
	// TotalKeys and Hash are what etcdutl snapshot status reports of the
	// plain snapshot; SnapshotStatus says Revision, TotalKeys and Hash
	// were read from it.
	TotalKeys      int64  `json:"totalKeys,omitempty"`
	Hash           uint32 `json:"hash,omitempty"`
	SnapshotStatus bool   `json:"snapshotStatus,omitempty"`
	// KeyspaceKeys, HashKV and CompactRevision are the keyspace
	// fingerprint at Revision (Keyspace says they were recorded): what
	// a restore of the backup must equal.
	KeyspaceKeys    int64  `json:"keyspaceKeys,omitempty"`
	HashKV          uint32 `json:"hashKV,omitempty"`
	CompactRevision int64  `json:"compactRevision,omitempty"`
	// AuthRevision is etcd's auth revision right after the snapshot
	// (0: unknown).
	AuthRevision uint64 `json:"authRevision,omitempty"`
	Keyspace     bool   `json:"keyspace,omitempty"`
}

// Location is one named place where backups are stored. Implementations are
// safe for concurrent use.
type Location interface {
	// Create starts writing a new backup called name. It fails with
	// ErrAlreadyExists when a complete backup of that name exists. The
	// caller must call exactly one of Commit or Abort on the result.
	Create(ctx context.Context, name string) (Upload, error)
	// Open returns the backup's manifest and a reader of its data starting
	// at offset, which must be within [0, Size]: length bytes of it, cut at
	// the end, or everything to the end when length is 0. A store that
	// can read a range reads only that range.
	Open(ctx context.Context, name string, offset, length int64) (io.ReadCloser, *Manifest, error)
	// Stat returns the manifest of a complete backup.
	Stat(ctx context.Context, name string) (*Manifest, error)
	// List returns the manifests of all complete backups, in no order.
	List(ctx context.Context) ([]*Manifest, error)
	// Delete removes a backup: the manifest first, so that a crash halfway
	// leaves data that the next start cleans, never a listed backup without
	// data.
	Delete(ctx context.Context, name string) error
	// Describe says where the location stores, for humans; never a secret.
	Describe() string
	// Type is the kind of backend, such as "filesystem".
	Type() string
}

// Upload is a backup being written. Data written is invisible until Commit.
type Upload interface {
	io.Writer
	// Commit makes the data durable, then writes the manifest, which makes
	// the backup visible. Name in the manifest must equal the created name.
	// If the name was taken meanwhile it fails with ErrAlreadyExists and
	// stores nothing.
	Commit(ctx context.Context, m *Manifest) error
	// Abort discards everything written. Safe to call after Commit failed.
	Abort() error
}
