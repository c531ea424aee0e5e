package snapshot_test

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	bolt "go.etcd.io/bbolt"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/snapshot"
)

// The locks a restore relies on are real on every platform the plugin is
// built for (flock(2) on Unix, LockFileEx on Windows): bbolt's own lock on
// member/snap/db, as a running etcd holds it, and a concurrent restore's
// lock of the data directory, which covers the fresh directory made after
// moving the old one aside too.
func TestDataDirLocksOnEveryPlatform(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	db := filepath.Join(dir, "member", "snap", "db")
	if err := os.MkdirAll(filepath.Dir(db), 0o700); err != nil {
		t.Fatal(err)
	}
	open, err := bolt.Open(db, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := snapshot.CheckDataDir(memberAt(dir)); !errors.Is(err, snapshot.ErrMemberRunning) {
		t.Fatalf("database held by bbolt: %v, want ErrMemberRunning", err)
	}
	if err := open.Close(); err != nil {
		t.Fatal(err)
	}
	if err := snapshot.CheckDataDir(memberAt(dir)); err != nil {
		t.Fatalf("database bbolt closed: %v", err)
	}

	for _, held := range []struct {
		name string
		fill bool // a non-empty directory, moved aside first
	}{{"empty directory", false}, {"directory moved aside", true}} {
		t.Run(held.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "data")
			if err := os.Mkdir(dir, 0o700); err != nil {
				t.Fatal(err)
			}
			if held.fill {
				if err := os.WriteFile(filepath.Join(dir, "old"), []byte("old"), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			unlock, err := snapshot.LockDir(dir)
			if err != nil {
				t.Fatal(err)
			}
			moved, err := snapshot.Restore(filepath.Join(t.TempDir(), "never-read.db"), memberAt(dir))
			if !errors.Is(err, snapshot.ErrRestoreInProgress) || moved != "" {
				t.Fatalf("restore into a directory another restore holds: moved to %q, %v; want ErrRestoreInProgress", moved, err)
			}
			unlock()
			// Released, the directory is a restore's again: it gets as far
			// as reading the (absent) snapshot, the old data moved aside.
			moved, err = snapshot.Restore(filepath.Join(t.TempDir(), "never-read.db"), memberAt(dir))
			if errors.Is(err, snapshot.ErrRestoreInProgress) || err == nil {
				t.Fatalf("restore once the lock is released: %v, want etcd's refusal of a missing snapshot", err)
			}
			if held.fill != (moved != "") {
				t.Fatalf("moved aside to %q; want a move only of a non-empty directory", moved)
			}
		})
	}
}
