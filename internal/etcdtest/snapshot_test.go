package etcdtest_test

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/internal/etcdtest"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/snapshot"
)

// A made snapshot is etcd's: trailer and database check out, it holds the
// filled keys and is about the size asked. Trailed bytes pass the trailer
// check alone.
func TestSnapshotFile(t *testing.T) {
	p := filepath.Join(t.TempDir(), "s.db")
	data := etcdtest.SnapshotFile(t, p, 300<<10)
	st, err := snapshot.Check(p)
	if err != nil {
		t.Fatal(err)
	}
	if len(data) < 300<<10 || len(data) > 600<<10 || st.TotalKey < 30 {
		t.Errorf("snapshot of %d bytes with status %+v, asked about %d bytes", len(data), st, 300<<10)
	}
	again := etcdtest.SnapshotFile(t, filepath.Join(t.TempDir(), "again.db"), 300<<10)
	if string(again) != string(data) {
		t.Error("the same size made twice differs")
	}

	q := filepath.Join(t.TempDir(), "t.db")
	if err := os.WriteFile(q, etcdtest.TrailedBytes(t, etcdtest.TrailedSize(1000)), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := snapshot.CheckTrailer(q); err != nil {
		t.Errorf("trailer of TrailedBytes: %v", err)
	}
	if _, err := snapshot.Check(q); !errors.Is(err, snapshot.ErrCorrupt) {
		t.Errorf("Check of TrailedBytes: %v, want the database refused", err)
	}
}
