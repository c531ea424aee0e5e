//go:build unix

package snapshot_test

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/snapshot"
)

func flock(t *testing.T, path string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		t.Fatal(err)
	}
}

// bbolt's lock on member/snap/db (etcd with its WAL elsewhere) is seen
// too, and a data directory another restore holds is not written.
func TestDataDirLocks(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	db := filepath.Join(dir, "member", "snap", "db")
	if err := os.MkdirAll(filepath.Dir(db), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(db, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	flock(t, db)
	if err := snapshot.CheckDataDir(memberAt(dir)); !errors.Is(err, snapshot.ErrMemberRunning) {
		t.Fatalf("database locked: %v, want ErrMemberRunning", err)
	}

	empty := filepath.Join(t.TempDir(), "empty")
	if err := os.Mkdir(empty, 0o700); err != nil {
		t.Fatal(err)
	}
	flock(t, empty)
	if _, err := snapshot.Restore(filepath.Join(t.TempDir(), "never-read.db"), memberAt(empty)); !errors.Is(err, snapshot.ErrRestoreInProgress) {
		t.Fatalf("restore into a directory another restore holds: %v, want ErrRestoreInProgress", err)
	}
	if entries, _ := os.ReadDir(empty); len(entries) != 0 {
		t.Fatalf("written into a held directory: %v", entries)
	}
}
