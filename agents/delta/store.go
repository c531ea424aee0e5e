package delta

import (
	"bytes"
	"context"
	"fmt"

	"google.golang.org/protobuf/types/known/timestamppb"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/client"
)

// Store is where a chain's segments go.
type Store interface {
	// State says where the chain stands as stored: where capture starts,
	// or why the chain ended, and what capture checks etcd against before
	// it continues.
	State(ctx context.Context) (ChainState, error)
	// Put stores seg. A gRPC FailedPrecondition error means the agent may
	// not write (lost the Lease, stale epoch, out of order) and stops it;
	// AlreadyExists makes it ask Position again.
	Put(ctx context.Context, seg Segment) error
}

// SourceKind is the source kind of a delta segment on the server.
const SourceKind = "delta"

// ServerStore is the Store of a chain on the data server, reached
// through its agent port.
type ServerStore struct {
	Client *client.Client
	// Chain is the full backup the chain starts from; Location is where it
	// is stored ("" the server's default) and where segments go.
	Chain, Location string
	// Target is the etcd target, recorded with each segment.
	Target string
}

var _ Store = (*ServerStore)(nil)

// ChainState is a chain as stored.
type ChainState struct {
	// Next is the first revision the chain does not hold yet; Ended says
	// why the chain ended, if it did.
	Next  int64
	Ended string
	// Epoch is the newest stored segment's writer epoch (0 when none):
	// a writer never records an older one.
	Epoch int64
	// ClusterID is the etcd cluster the chain's full backup was taken of
	// (0 unknown); LastEvent the first event of the chain's newest
	// revision, Next-1 (nil when the chain holds no revision yet).
	ClusterID uint64
	LastEvent *Event
}

// Event identifies one etcd event (ebv1.DeltaEvent).
type Event struct {
	Key         []byte
	Deleted     bool
	ValueSHA256 string
}

// Position is State's first revision and end, for callers that need
// nothing else.
func (s *ServerStore) Position(ctx context.Context) (next int64, ended string, err error) {
	st, err := s.State(ctx)
	return st.Next, st.Ended, err
}

// State reads the chain's full backup: the chain continues after its
// stored end, or after the full's snapshot revision when nothing is
// stored yet.
func (s *ServerStore) State(ctx context.Context) (ChainState, error) {
	resp, err := s.Client.Backups.GetBackup(ctx, &ebv1.GetBackupRequest{Name: s.Chain, Location: s.Location})
	if err != nil {
		return ChainState{}, fmt.Errorf("read chain %q (its full backup) from the server: %w", s.Chain, err)
	}
	b := resp.GetBackup()
	st := ChainState{ClusterID: b.GetEtcd().GetClusterId()}
	if ch := b.GetChain(); ch != nil && ch.GetLastRevision() > 0 {
		st.Epoch = ch.GetEpoch()
		if ch.GetEndReason() != "" {
			st.Ended = ch.GetEndReason()
			return st, nil
		}
		st.Next = ch.GetLastRevision() + 1
		if ev := ch.GetLastEvent(); ev != nil {
			st.LastEvent = &Event{Key: ev.GetKey(), Deleted: ev.GetDeleted(), ValueSHA256: ev.GetValueSha256()}
		}
		return st, nil
	}
	rev := b.GetEtcd().GetRevision()
	if rev <= 0 {
		return ChainState{}, fmt.Errorf("backup %q records no etcd revision, so no delta chain can start from it; take a new full backup", s.Chain)
	}
	st.Next = rev + 1
	return st, nil
}

// Put uploads seg with its manifest. The upload retries broken
// connections itself (bytes.Reader rewinds).
func (s *ServerStore) Put(ctx context.Context, seg Segment) error {
	sum := seg.Summary
	h := &ebv1.UploadHeader{
		Name:        seg.Name,
		Location:    s.Location,
		Compression: seg.Compression,
		Encryption:  ebv1.EncryptionNone,
		Source:      &ebv1.BackupSource{Kind: SourceKind, Target: s.Target},
		Delta: &ebv1.DeltaSegment{
			Chain:         sum.Chain,
			Epoch:         sum.Epoch,
			FirstRevision: sum.FirstRevision,
			LastRevision:  sum.LastRevision,
			Events:        sum.Events,
			EndReason:     sum.EndReason,
			HistoryBreak:  seg.HistoryBreak,
			AuthRevision:  seg.AuthRevision,
		},
	}
	if ev := seg.LastEvent; ev != nil {
		h.Delta.LastEvent = &ebv1.DeltaEvent{Key: ev.Key, Deleted: ev.Deleted, ValueSha256: ev.ValueSHA256}
	}
	if !sum.FirstTime.IsZero() {
		h.Delta.FirstTime = timestamppb.New(sum.FirstTime)
		h.Delta.LastTime = timestamppb.New(sum.LastTime)
	}
	if len(seg.AgeRecipients) > 0 {
		h.Encryption, h.AgeRecipients = ebv1.EncryptionAge, seg.AgeRecipients
	}
	// The server compares this with its own clock: the same clock
	// stamped every revision.
	h.Delta.SentTime = timestamppb.Now()
	_, err := s.Client.UploadWith(ctx, bytes.NewReader(seg.Body), client.UploadRequest{
		Header: h,
		Raw:    func() (int64, string) { return seg.RawSize, seg.RawSHA256 },
	})
	if err != nil {
		// The status code stays reachable: Run decides on it.
		return fmt.Errorf("upload delta segment %s: %w", seg.Name, err)
	}
	return nil
}
