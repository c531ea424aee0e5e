package snapshot

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	etcdutl "go.etcd.io/etcd/etcdutl/v3/snapshot"
	"go.uber.org/zap"
)

// Member is the layout of the member a data directory is rebuilt for.
type Member struct {
	Name                     string
	InitialCluster           string
	InitialAdvertisePeerURLs []string
	// InitialClusterToken is the restored cluster's token; "" is etcd's
	// own default, "etcd-cluster".
	InitialClusterToken string
	// DataDir is the member's --data-dir.
	DataDir string
	// MoveAside lets Restore rename a non-empty DataDir to
	// DataDir.before-restore-TIMESTAMP instead of refusing.
	MoveAside bool
	// BumpRevision is added to the keyspace's revision by Restore, which
	// then marks the new revision compacted (etcdutl's --bump-revision
	// and --mark-compacted). nil is DefaultRevisionBump; 0 keeps the
	// snapshot's revision and marks nothing compacted; negative is
	// refused. Every member of a cluster must get the same value: their
	// revisions must agree.
	BumpRevision *int64
}

// DefaultRevisionBump is what a restore adds to etcd's revision unless
// told otherwise: etcd's recommendation for Kubernetes (its recovery
// guide, etcd PR #16029), larger than the number of writes a cluster
// makes between two backups. Without it the restored revision is lower
// than the resourceVersions that kube-apiserver's watch cache, every
// informer and every kubelet hold of the lost data: they keep stale
// objects and miss changes. Bumped past them and marked compacted, every
// watch from before the restore is cancelled as compacted and its client
// relists. Revisions are int64, so the bump costs nothing.
const DefaultRevisionBump int64 = 1_000_000_000

// RevisionBump is what Restore adds to the revision: BumpRevision, or
// DefaultRevisionBump when unset.
func (m Member) RevisionBump() int64 {
	if m.BumpRevision == nil {
		return DefaultRevisionBump
	}
	return *m.BumpRevision
}

// MarksCompacted says whether Restore marks the bumped revision
// compacted: whenever it bumps (etcd takes the two only together).
func (m Member) MarksCompacted() bool { return m.RevisionBump() > 0 }

// Validate checks the layout before anything is touched; it does no I/O.
func (m Member) Validate() error {
	var missing []string
	if m.Name == "" {
		missing = append(missing, "member name")
	}
	if m.InitialCluster == "" {
		missing = append(missing, "initial cluster")
	}
	if len(m.InitialAdvertisePeerURLs) == 0 {
		missing = append(missing, "initial advertise peer URLs")
	}
	if m.DataDir == "" {
		missing = append(missing, "data dir")
	}
	if len(missing) > 0 {
		return fmt.Errorf("restore needs the %s", strings.Join(missing, ", "))
	}
	if !strings.Contains(m.InitialCluster, m.Name+"=") {
		return fmt.Errorf("initial cluster %q does not name member %q", m.InitialCluster, m.Name)
	}
	if b := m.RevisionBump(); b < 0 {
		return fmt.Errorf("revision bump %d is negative: etcd's revision only grows; give 0 to keep the snapshot's revisions, or a positive amount (default %d)", b, DefaultRevisionBump)
	}
	return nil
}

// ErrDataDirNotEmpty is returned when the data directory holds data and
// MoveAside was not asked for.
var ErrDataDirNotEmpty = errors.New("the data directory is not empty")

// ErrMemberRunning is returned when a running etcd holds the data
// directory: the lock etcd keeps on its WAL files, or bbolt's on its
// database, is taken.
var ErrMemberRunning = errors.New("an etcd process holds the data directory")

// ErrRestoreInProgress is returned when another restore holds the lock on
// the data directory.
var ErrRestoreInProgress = errors.New("another restore is writing the data directory")

// CheckDataDir fails early, before any download, when Restore would
// refuse m.DataDir: a running etcd holds it, or it is not empty and
// MoveAside was not asked for. Restore checks again under its lock, just
// before writing.
func CheckDataDir(m Member) error {
	if err := m.Validate(); err != nil {
		return err
	}
	if err := checkNotHeld(m.DataDir); err != nil {
		return err
	}
	entries, err := os.ReadDir(m.DataDir)
	if err == nil && len(entries) > 0 && !m.MoveAside {
		return fmt.Errorf("%w: %s holds %d entries; stop the member and pass the move-aside option to keep them next to it, or choose an empty directory",
			ErrDataDirNotEmpty, m.DataDir, len(entries))
	}
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// checkNotHeld refuses a data directory a running etcd holds: etcd locks
// its WAL files (with etcd's own locking code, used here to test them:
// OFD locks on Linux) and bbolt flocks member/snap/db. Taking each lock
// for a moment is the test; it is let go at once. A WAL kept elsewhere
// (--wal-dir) is not seen, the database still is.
func checkNotHeld(dataDir string) error {
	member := filepath.Join(dataDir, "member")
	wals, _ := filepath.Glob(filepath.Join(member, "wal", "*.wal"))
	for _, w := range wals {
		held, err := walLockHeld(w)
		if held {
			return fmt.Errorf("%w: its WAL file %s is locked by a running etcd; stop the member and wait for its process to exit before restoring", ErrMemberRunning, w)
		}
		if err != nil {
			return fmt.Errorf("check whether a running etcd holds %s: %w", w, err)
		}
	}
	db := filepath.Join(member, "snap", "db")
	if fi, err := os.Stat(db); err != nil || !fi.Mode().IsRegular() {
		// Not etcd's layout (no database, or "member" is a file): nothing
		// to hold, unless it cannot be looked at.
		if errors.Is(err, fs.ErrPermission) {
			return fmt.Errorf("check whether a running etcd holds %s: %w", db, err)
		}
		return nil
	}
	held, err := flockHeld(db)
	switch {
	case held:
		return fmt.Errorf("%w: its database %s is locked by a running etcd; stop the member and wait for its process to exit before restoring", ErrMemberRunning, db)
	case err != nil:
		return fmt.Errorf("check whether a running etcd holds %s: %w", db, err)
	}
	return nil
}

// Restore rebuilds m's data directory from the snapshot at path with etcd's
// own restore code (which checks the SHA-256 trailer again), adding
// m.RevisionBump() to the revision and marking the result compacted when
// that is above 0 (Member.BumpRevision). A non-empty
// data directory is refused, or with MoveAside renamed — never deleted. It
// returns where the old data went, if anywhere.
//
// Just before writing it takes an exclusive lock on the data directory
// (created empty if absent) and checks again that no etcd holds it and
// that it is empty: between the server's check and this moment a member
// may have been started, or another restore begun. With MoveAside the
// fresh directory is created and locked before etcd's restore fills it,
// so a concurrent restore finds it taken.
func Restore(path string, m Member) (movedTo string, err error) {
	if err := m.Validate(); err != nil {
		return "", err
	}
	if err := os.MkdirAll(m.DataDir, 0o700); err != nil {
		return "", fmt.Errorf("create data directory: %w", err)
	}
	unlock, err := lockDir(m.DataDir)
	if err != nil {
		return "", err
	}
	defer unlock()
	if err := CheckDataDir(m); err != nil {
		return "", err
	}
	entries, err := os.ReadDir(m.DataDir)
	switch {
	case err != nil:
		return "", err
	case len(entries) > 0:
		movedTo = fmt.Sprintf("%s.before-restore-%s", strings.TrimRight(m.DataDir, "/"), time.Now().UTC().Format("20060102-150405"))
		if err := os.Rename(m.DataDir, movedTo); err != nil {
			return "", fmt.Errorf("move %s aside: %w", m.DataDir, err)
		}
		// Exclusive: someone who made the directory meanwhile wins.
		if err := os.Mkdir(m.DataDir, 0o700); err != nil {
			return movedTo, fmt.Errorf("create data directory after moving the old one aside: %w", err)
		}
		if !lockFollowsPath {
			unlockNew, err := lockDir(m.DataDir)
			if err != nil {
				return movedTo, err
			}
			defer unlockNew()
		}
	default:
		// An empty directory (a fresh volume's mount point, which cannot
		// be removed) is used as is: etcdutl refuses only non-empty ones.
	}
	token := m.InitialClusterToken
	if token == "" {
		token = "etcd-cluster" // etcd's own default
	}
	err = etcdutl.NewV3(zap.NewNop()).Restore(etcdutl.RestoreConfig{
		SnapshotPath:        path,
		Name:                m.Name,
		OutputDataDir:       m.DataDir,
		PeerURLs:            m.InitialAdvertisePeerURLs,
		InitialCluster:      m.InitialCluster,
		InitialClusterToken: token,
		// Validate refused a negative bump, so the conversion is exact.
		RevisionBump:  uint64(m.RevisionBump()),
		MarkCompacted: m.MarksCompacted(),
	})
	if err != nil {
		return movedTo, fmt.Errorf("etcd restore into %s: %w", m.DataDir, err)
	}
	return movedTo, nil
}
