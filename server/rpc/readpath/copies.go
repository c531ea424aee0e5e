package readpath

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/protobuf/types/known/timestamppb"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/domain"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage"
)

// copyListings are the listings of one location's copy locations, read
// once for a ListBackups or GetBackup of it.
type copyListings struct {
	from   string
	copies []copyListing
}

type copyListing struct {
	name   string
	byName map[string]*storage.Manifest
	err    error
}

// listCopies lists each copy location of l (none: nil); with name set,
// only looks that backup up in each.
func (s *Service) listCopies(ctx context.Context, l *domain.Location, name string) *copyListings {
	if len(l.Copies) == 0 {
		return nil
	}
	out := &copyListings{from: l.Name}
	for _, to := range l.Copies {
		c := copyListing{name: to}
		cl, err := s.locations.Get(to)
		var ms []*storage.Manifest
		switch {
		case err != nil:
		case name != "":
			var m *storage.Manifest
			if m, err = cl.Stat(ctx, name); err == nil {
				ms = append(ms, m)
			} else if errors.Is(err, storage.ErrNotFound) {
				err = nil
			}
		default:
			ms, err = cl.List(ctx)
		}
		if c.err = err; err == nil {
			c.byName = make(map[string]*storage.Manifest, len(ms))
			for _, m := range ms {
				c.byName[m.Name] = m
			}
		}
		out.copies = append(out.copies, c)
	}
	return out
}

// set fills b.Copies: where each copy of m stands.
func (cl *copyListings) set(b *ebv1.Backup, m *storage.Manifest, tracker domain.CopyTracker) {
	if cl == nil {
		return
	}
	for _, c := range cl.copies {
		bc := &ebv1.BackupCopy{Location: c.name}
		var st domain.CopyStatus
		if tracker != nil {
			st = tracker.CopyStatus(cl.from, c.name, m.Name, m.SHA256)
		}
		switch dm := c.byName[m.Name]; {
		case c.err != nil && st.Failing != nil:
			retrying(bc, st.Failing)
		case c.err != nil:
			bc.State, bc.Message = ebv1.BackupCopyState_BACKUP_COPY_STATE_UNKNOWN, fmt.Sprintf("copy location %q cannot be read: %v", c.name, c.err)
		case dm != nil && dm.SHA256 == m.SHA256:
			bc.State, bc.Sha256 = ebv1.BackupCopyState_BACKUP_COPY_STATE_COPIED, dm.SHA256
			t := dm.CreateTime
			if dm.Copy != nil {
				t = dm.Copy.Time
			}
			bc.CopyTime = timestamppb.New(t)
		case dm != nil:
			bc.State, bc.Sha256 = ebv1.BackupCopyState_BACKUP_COPY_STATE_CONFLICT, dm.SHA256
			bc.Message = fmt.Sprintf("location %q holds another backup named %q (SHA-256 %s): nothing is copied over it; delete that one (--location %s) to let the copy be made", c.name, m.Name, dm.SHA256, c.name)
		case st.Skipped:
			bc.State = ebv1.BackupCopyState_BACKUP_COPY_STATE_SKIPPED
			bc.Message = fmt.Sprintf("deleted from location %q (its ledger records it): not copied again", c.name)
		case st.Failing != nil:
			retrying(bc, st.Failing)
		default:
			bc.State = ebv1.BackupCopyState_BACKUP_COPY_STATE_PENDING
		}
		b.Copies = append(b.Copies, bc)
	}
}

func retrying(bc *ebv1.BackupCopy, f *domain.CopyFailure) {
	bc.State, bc.Message = ebv1.BackupCopyState_BACKUP_COPY_STATE_RETRYING, f.Message
	bc.FailingSince, bc.NextAttempt = timestamppb.New(f.Since), timestamppb.New(f.Next)
}

// fromCopy finds backup name in a copy location of the location called
// from, for a read the original cannot serve (its location unavailable,
// the backup or its bytes gone): the first copy location, in the order
// configured, that is available and holds a copy of it made from there
// (with sha, when sha is set). nil when none does.
func (s *Service) fromCopy(ctx context.Context, from, name, sha string) (*domain.Location, *storage.Manifest) {
	l, ok := s.locations.Lookup(from)
	if !ok {
		return nil, nil
	}
	for _, c := range l.Copies {
		cl, err := s.locations.Get(c)
		if err != nil {
			continue
		}
		m, err := cl.Stat(ctx, name)
		if err != nil || m.Copy == nil || m.Copy.From != from || (sha != "" && m.SHA256 != sha) {
			continue
		}
		return cl, m
	}
	return nil, nil
}
