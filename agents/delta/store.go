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
	// Position returns the first revision the chain does not hold yet
	// (where capture starts), or why the chain ended if it did.
	Position(ctx context.Context) (next int64, ended string, err error)
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

// Position reads the chain's full backup: the chain continues after its
// stored end, or after the full's snapshot revision when nothing is
// stored yet.
func (s *ServerStore) Position(ctx context.Context) (int64, string, error) {
	resp, err := s.Client.Backups.GetBackup(ctx, &ebv1.GetBackupRequest{Name: s.Chain, Location: s.Location})
	if err != nil {
		return 0, "", fmt.Errorf("read chain %q (its full backup) from the server: %w", s.Chain, err)
	}
	b := resp.GetBackup()
	if ch := b.GetChain(); ch != nil && ch.GetLastRevision() > 0 {
		if ch.GetEndReason() != "" {
			return 0, ch.GetEndReason(), nil
		}
		return ch.GetLastRevision() + 1, "", nil
	}
	rev := b.GetEtcd().GetRevision()
	if rev <= 0 {
		return 0, "", fmt.Errorf("backup %q records no etcd revision, so no delta chain can start from it; take a new full backup", s.Chain)
	}
	return rev + 1, "", nil
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
		},
	}
	if !sum.FirstTime.IsZero() {
		h.Delta.FirstTime = timestamppb.New(sum.FirstTime)
		h.Delta.LastTime = timestamppb.New(sum.LastTime)
	}
	if len(seg.AgeRecipients) > 0 {
		h.Encryption, h.AgeRecipients = ebv1.EncryptionAge, seg.AgeRecipients
	}
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
