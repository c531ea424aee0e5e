package restore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"filippo.io/age"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/client"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/crypt"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/delta"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/delta/replay"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/snapshot"
)

// Deltas restore to a point after the full backup: the chain's segments
// are replayed onto it before the data directory is rebuilt.
type Deltas struct {
	// Segments are the chain's segments to replay, in order (delta.Plan's),
	// each pinned to its stored SHA-256.
	Segments []SegmentRef
	// Point is where replay stops (neither set: the end of the segments).
	Point delta.Point
	// AllowLeaseLoss restores keys whose lease's TTL was lost (see
	// replay.Options.AllowLeaseLoss) instead of refusing.
	AllowLeaseLoss bool
}

// SegmentRef names a stored segment and the SHA-256 it must have. Its
// JSON is the list a restore Job hands its agent (the server's
// jobs.SegmentPin).
type SegmentRef struct {
	Name   string `json:"name"`
	SHA256 string `json:"sha256"`
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
		if err := validSHA256(s.SHA256); err != nil {
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
		p, err := fetchSegment(ctx, c, o, segDir, s)
		if err != nil {
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

// fetchSegment downloads one segment pinned to its SHA-256 and writes its
// plain form: decrypted and decompressed as a backup is, without the
// snapshot checks (a segment has no etcd trailer; its own format is
// checked by replay as it reads).
func fetchSegment(ctx context.Context, c *client.Client, o Options, dir string, s SegmentRef) (string, error) {
	stored := filepath.Join(dir, s.Name+".stored")
	b, err := c.DownloadFile(ctx, client.FileDownload{
		Path: stored, Replace: true,
		DownloadRequest: client.DownloadRequest{
			Name: s.Name, Location: o.Location,
			OnHeader: func(b *ebv1.Backup) error {
				if b.GetSha256() != s.SHA256 {
					return fmt.Errorf("delta segment %q: %w: its SHA-256 differs (it was replaced under the same name?); nothing was restored, plan the restore again", s.Name, ErrWrongBackup)
				}
				if b.GetEncryption() != ebv1.EncryptionNone && len(o.Identities) == 0 {
					return fmt.Errorf("delta segment %q: %w", s.Name, crypt.ErrIdentityRequired)
				}
				return nil
			},
		},
	})
	switch {
	case errors.Is(err, crypt.ErrIdentityRequired) || errors.Is(err, ErrWrongBackup):
		return "", err
	case errors.Is(err, client.ErrCorrupt):
		return "", fmt.Errorf("delta segment %q is corrupt, refusing to restore it: %w: %v", s.Name, snapshot.ErrCorrupt, err)
	case err != nil:
		return "", &DownloadError{Err: fmt.Errorf("delta segment %q: %w", s.Name, err)}
	}
	if b.GetSha256() != s.SHA256 {
		return "", fmt.Errorf("delta segment %q: %w: its SHA-256 is not the one the restore was started for", s.Name, ErrWrongBackup)
	}
	plain := filepath.Join(dir, s.Name)
	if err := unpackSegment(ctx, stored, plain, snapshot.FormOf(b), o); err != nil {
		return "", fmt.Errorf("delta segment %q: %w", s.Name, err)
	}
	_ = os.Remove(stored)
	return plain, nil
}

// unpackSegment undoes a stored segment's encryption and compression.
func unpackSegment(ctx context.Context, stored, plain string, f snapshot.Form, o Options) error {
	in, err := os.Open(stored)
	if err != nil {
		return err
	}
	defer in.Close()
	var r io.Reader = in
	if f.Encryption == ebv1.EncryptionAge {
		if r, err = crypt.Decrypt(in, o.Identities); err != nil {
			return err
		}
	}
	out, err := os.OpenFile(plain, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	// A raw size recorded bounds the expansion; without one, the
	// default bound on backups applies.
	if _, err := snapshot.DecompressLimit(ctx, out, r, f.Compression, f.RawSize); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// FetchSegment downloads the segment s names from location through c into
// dir, pinned to its SHA-256, and returns the path of its plain form
// (decrypted with ids, decompressed): what replay.Options.Segments takes.
// Errors are as Fetch's: ErrWrongBackup, crypt.ErrIdentityRequired, a
// DownloadError when the server failed, snapshot.ErrCorrupt.
func FetchSegment(ctx context.Context, c *client.Client, location string, ids []age.Identity, dir string, s SegmentRef) (string, error) {
	if err := validSHA256(s.SHA256); err != nil {
		return "", fmt.Errorf("delta segment %q: %w", s.Name, err)
	}
	return fetchSegment(ctx, c, Options{Location: location, Identities: ids}, dir, s)
}
