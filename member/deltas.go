package member

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/client"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/delta"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/delta/replay"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/fetch"
)

// Deltas restore to a point after the full backup: the chain's segments
// are replayed onto it before the data directory is rebuilt.
type Deltas struct {
	// Segments are the chain's segments to replay, in order (delta.Plan's),
	// each pinned to its stored SHA-256.
	Segments []fetch.Pin
	// Point is where replay stops (neither set: the end of the segments).
	Point delta.Point
	// AllowLeaseLoss restores keys whose lease's TTL was lost (see
	// replay.Options.AllowLeaseLoss) instead of refusing.
	AllowLeaseLoss bool
}

func (d *Deltas) validate() error {
	if d.Point.Revision < 0 {
		return fmt.Errorf("revision %d: etcd revisions are positive", d.Point.Revision)
	}
	if d.Point.Revision > 0 && !d.Point.Time.IsZero() {
		return errors.New("restore to a revision or to a time, not both")
	}
	for _, s := range d.Segments {
		if s.Name == "" {
			return errors.New("a delta segment without a name")
		}
		if err := fetch.CheckSHA256(s.SHA256); err != nil {
			return fmt.Errorf("delta segment %q: %w", s.Name, err)
		}
	}
	return nil
}

// replayDeltas fetches the segments into work, replays them onto the
// full's plain snapshot at base and returns the path of the replayed
// snapshot and what replay did.
func replayDeltas(ctx context.Context, c *client.Client, o Options, work, base string, v Verified) (string, replay.Result, error) {
	d := o.Deltas
	segDir := filepath.Join(work, "deltas")
	if err := os.MkdirAll(segDir, 0o700); err != nil {
		return "", replay.Result{}, fmt.Errorf("work directory: %w", err)
	}
	plain := make([]string, 0, len(d.Segments))
	for _, s := range d.Segments {
		p := filepath.Join(segDir, s.Name)
		if err := fetch.Segment(ctx, c, fetch.Request{Name: s.Name, Location: o.Location, SHA256: s.SHA256, Identities: o.Identities, Path: p}); err != nil {
			return "", replay.Result{}, err
		}
		plain = append(plain, p)
	}
	// The manifest's revision is the snapshot's true one, where the chain
	// starts; the snapshot's status is the fallback for an older record.
	baseRev := v.Backup.GetEtcd().GetRevision()
	if baseRev == 0 {
		baseRev = v.Status.Revision
	}
	out := filepath.Join(work, o.Name+".replayed.db")
	res, err := replay.Build(ctx, replay.Options{
		BasePath: base, BaseRevision: baseRev, Segments: plain, Point: d.Point,
		WorkDir: filepath.Join(work, "replay"), OutPath: out, AllowLeaseLoss: d.AllowLeaseLoss,
	})
	if err != nil {
		return "", res, fmt.Errorf("replay the deltas of backup %q to %s: %w", o.Name, d.Point, err)
	}
	// The inputs are no longer needed: the work directory holds one copy
	// of the data besides the replayed snapshot.
	_ = os.RemoveAll(segDir)
	_ = os.Remove(base)
	return out, res, nil
}
