// Package member rebuilds one etcd member's data directory from a
// backup: it checks that the data directory may be rebuilt, fetches the
// backup through the data server with every check (package fetch) or
// takes a file downloaded earlier, decrypts it with the age identities it
// is given (never the server's: it has none), replays delta segments onto
// it for a restore to a point (delta/replay), rebuilds the data directory
// with etcd's own restore code, bumping its revision and marking it
// compacted unless told not to (snapshot.Member.BumpRevision), and
// removes the data server's key Secrets from what it restored. The
// in-cluster restore agent (agents/restore) and the plugin's `restore
// --local` run this same flow; they differ only in how they report it
// (Events).
package member

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"time"

	"filippo.io/age"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/client"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/delta/replay"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/fetch"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/snapshot"
)

// Options say what to restore and where.
type Options struct {
	// Name and Location of the backup on the server.
	Name, Location string
	// FromFile, if set, is a backup downloaded earlier (as stored, possibly
	// zstd-compressed) to restore instead of downloading: the path for a
	// dead control plane, when no API server answers.
	FromFile string
	// Member is the layout the data directory is rebuilt for.
	Member snapshot.Member
	// Identities decrypt an age-encrypted backup. Without them, an
	// encrypted backup is refused before any byte is downloaded.
	Identities []age.Identity
	// WorkDir keeps the download until it is restored; "" is a directory
	// beside the data directory (DefaultWorkDir). It is removed after a
	// successful restore and kept after a failed one, so a rerun resumes
	// the download.
	WorkDir string
	// SHA256, when set, is the only stored SHA-256 (hex) accepted: a
	// backup replaced under the same name is refused at the download's
	// header, before any byte of it is written (fetch.ErrWrongBackup).
	SHA256 string
	// Deltas, when set, restore to a point after the backup: its chain's
	// segments are fetched through the same server and replayed onto it
	// before the data directory is rebuilt. Not with FromFile.
	Deltas *Deltas
}

// Events report the flow's progress; any may be nil.
type Events struct {
	// Downloading is called as bytes arrive.
	Downloading func(done, total int64)
	// Verified is called once the snapshot passed every check.
	Verified func(Verified)
	// Rebuilding is called once the snapshot to restore is final (checked,
	// and replayed with Deltas), just before the data directory is
	// rebuilt: what comes before it is getting the data, what comes after
	// writing it, which a caller timing the restore tells apart.
	Rebuilding func()
	// MovedAside is called when a non-empty data directory was renamed.
	MovedAside func(to string)
}

// Verified is what was checked before the data directory is touched.
type Verified struct {
	// Backup is the server's record of the backup (nil with FromFile).
	Backup *ebv1.Backup
	// File is FromFile, when restoring from a file.
	File   string
	Status snapshot.Status
}

// Result is what a restore did.
type Result struct {
	// DataDir is the absolute data directory that was rebuilt.
	DataDir string
	// MovedTo is where the old data went, if anywhere.
	MovedTo string
	// SnapshotRevision is the snapshot's revision; Revision the restored
	// member's: SnapshotRevision + BumpRevision.
	SnapshotRevision, Revision int64
	// BumpRevision is what was added to the revision (0: nothing), and
	// MarkedCompacted whether the restored revision was marked compacted,
	// so that every watch from before it is cancelled and relists.
	BumpRevision    int64
	MarkedCompacted bool
	// ToRevision is the revision deltas were replayed to (with Deltas;
	// SnapshotRevision then equals it), ReplayedRevisions how many
	// revisions that took and PointTime when the last one was seen (zero
	// when none was replayed).
	ToRevision        int64
	ReplayedRevisions int64
	PointTime         time.Time
	// RevokedServerKeys are the data server's key Secrets the restored
	// keyspace held, removed one revision past it
	// (snapshot.RevokeServerKeys): the server makes new keys, which no
	// backup holds. Revision is then one more. Empty for any etcd but
	// the one of a Kubernetes cluster the server runs in.
	RevokedServerKeys []string
}

// DefaultWorkDir is where a restore into dataDir keeps backup name's
// download: beside the data directory, on the same volume.
func DefaultWorkDir(dataDir, name string) string {
	return filepath.Join(filepath.Dir(filepath.Clean(dataDir)), ".etcdbackup-restore-"+name)
}

// Validate checks the options without I/O.
func (o Options) Validate() error {
	if o.Name == "" && o.FromFile == "" {
		return errors.New("restore needs the name of a backup")
	}
	if o.SHA256 != "" {
		if fetch.CheckSHA256(o.SHA256) != nil {
			return fmt.Errorf("--sha256 %q is not a SHA-256 in lowercase hex (64 characters)", o.SHA256)
		}
	}
	if o.Deltas != nil {
		if o.FromFile != "" {
			return errors.New("a restore to a point in time replays delta segments fetched through the server: it cannot start from a downloaded file; restore through the server, or restore the file without a point")
		}
		if err := o.Deltas.validate(); err != nil {
			return err
		}
	}
	return o.Member.Validate()
}

// Restore rebuilds o.Member's data directory from backup o.Name fetched
// through c (or from o.FromFile, when c may be nil), replayed to a point
// with o.Deltas. A corrupt backup wraps snapshot.ErrCorrupt and changes
// nothing (a *fetch.Error says which check failed, or that the server
// did); so does a data directory that
// is not empty without Member.MoveAside (snapshot.ErrDataDirNotEmpty), one
// a running etcd holds (snapshot.ErrMemberRunning) and one another restore
// holds (snapshot.ErrRestoreInProgress). The data directory is checked
// before the download and again, under its lock, just before writing.
func Restore(ctx context.Context, c *client.Client, o Options, ev Events) (*Result, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	dataDir, err := filepath.Abs(o.Member.DataDir)
	if err != nil {
		return nil, err
	}
	o.Member.DataDir = dataDir
	// Refuse before a byte is downloaded.
	if err := snapshot.CheckDataDir(o.Member); err != nil {
		return nil, err
	}
	work := o.WorkDir
	if work == "" {
		work = DefaultWorkDir(dataDir, o.Name)
	}
	if err := os.MkdirAll(work, 0o700); err != nil {
		return nil, fmt.Errorf("work directory: %w", err)
	}

	var path string
	var v Verified
	if o.FromFile != "" {
		path, v, err = checkFile(ctx, o.FromFile, work, o.Identities)
	} else {
		if c == nil {
			return nil, errors.New("restore: no server connection and no file to restore from")
		}
		path = filepath.Join(work, o.Name+".db")
		var f *fetch.Fetched
		f, err = fetch.Snapshot(ctx, c, fetch.Request{
			Name: o.Name, Location: o.Location, SHA256: o.SHA256, Identities: o.Identities, Progress: ev.Downloading,
			Path: path, Replace: true, Resume: true, CheckDatabase: true,
		})
		if f != nil {
			v = Verified{Backup: f.Backup, Status: f.Status}
		}
	}
	if err != nil {
		return nil, err
	}
	if ev.Verified != nil {
		ev.Verified(v)
	}
	var replayed replay.Result
	if o.Deltas != nil {
		if path, replayed, err = replayDeltas(ctx, c, o, work, path, v); err != nil {
			return nil, err
		}
		// What is restored is the replayed snapshot: its status replaces
		// the full's (the bump starts from its revision).
		if v.Status, err = snapshot.Check(path); err != nil {
			return nil, fmt.Errorf("the snapshot replayed from backup %q and its deltas does not check: %w", o.Name, err)
		}
	}
	bump := o.Member.RevisionBump()
	// etcd adds the bump without checking: past int64 the revision would
	// wrap negative and the member would not start.
	if bump > math.MaxInt64-v.Status.Revision {
		return nil, fmt.Errorf("a revision bump of %d would take the snapshot's revision %d past the largest etcd can hold (%d); choose a smaller one (default %d)",
			bump, v.Status.Revision, int64(math.MaxInt64), snapshot.DefaultRevisionBump)
	}
	if ev.Rebuilding != nil {
		ev.Rebuilding()
	}
	movedTo, err := snapshot.Restore(path, o.Member)
	if movedTo != "" && ev.MovedAside != nil {
		ev.MovedAside(movedTo)
	}
	if err != nil {
		return &Result{DataDir: dataDir, MovedTo: movedTo}, err
	}
	// Every backup of the cluster the server runs in holds the keys its
	// trust rests on; the restored cluster must not trust them again.
	revoked, err := snapshot.RevokeServerKeys(dataDir)
	if err != nil {
		return &Result{DataDir: dataDir, MovedTo: movedTo}, fmt.Errorf("restored %s, but could not remove the data server's key Secrets from it: %w; restore again, or delete Secrets %v of the server's namespace once the cluster runs",
			dataDir, err, snapshot.ServerKeySecrets)
	}
	after := int64(0)
	if len(revoked) > 0 {
		after = 1
	}
	_ = os.RemoveAll(work)
	return &Result{RevokedServerKeys: revoked,
		DataDir: dataDir, MovedTo: movedTo,
		// etcdutl bumps the snapshot's newest revision, the one its status
		// reports.
		SnapshotRevision: v.Status.Revision, Revision: v.Status.Revision + bump + after,
		BumpRevision: bump, MarkedCompacted: o.Member.MarksCompacted(),
		ToRevision: replayed.Revision, ReplayedRevisions: replayed.Revisions, PointTime: replayed.Time,
	}, nil
}

// checkFile unpacks and checks a backup downloaded earlier.
func checkFile(ctx context.Context, file, work string, ids []age.Identity) (string, Verified, error) {
	path, err := snapshot.UnpackWith(ctx, file, work, ids)
	if err != nil {
		return "", Verified{}, fmt.Errorf("%s: %w", file, err)
	}
	st, err := snapshot.Check(path)
	if err != nil {
		return "", Verified{}, fmt.Errorf("%s is not a usable etcd snapshot, refusing to restore it: %w", file, err)
	}
	return path, Verified{File: file, Status: st}, nil
}
