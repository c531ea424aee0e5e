package snapshot_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.etcd.io/etcd/client/pkg/v3/fileutil"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/internal/etcdtest"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/snapshot"
)

func memberAt(dataDir string) snapshot.Member {
	return snapshot.Member{Name: "m1", InitialCluster: "m1=http://127.0.0.1:2380", InitialAdvertisePeerURLs: []string{"http://127.0.0.1:2380"}, DataDir: dataDir, MoveAside: true}
}

// A data directory whose WAL file another handle holds locked, as etcd
// does while it runs, is refused before and at the moment of writing, even
// with MoveAside, and is left where it is; once the lock is gone it may be
// moved aside.
func TestDataDirWithLockedWALIsRefused(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	wal := filepath.Join(dir, "member", "wal", "0000000000000000-0000000000000000.wal")
	if err := os.MkdirAll(filepath.Dir(wal), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(wal, []byte("wal"), 0o600); err != nil {
		t.Fatal(err)
	}
	held, err := fileutil.TryLockFile(wal, os.O_WRONLY, fileutil.PrivateFileMode)
	if err != nil {
		t.Fatal(err)
	}
	m := memberAt(dir)
	err = snapshot.CheckDataDir(m)
	if !errors.Is(err, snapshot.ErrMemberRunning) || !strings.Contains(err.Error(), wal) || !strings.Contains(err.Error(), "stop the member") {
		t.Fatalf("check with the WAL locked: %v, want ErrMemberRunning naming %s", err, wal)
	}
	if moved, err := snapshot.Restore(filepath.Join(t.TempDir(), "never-read.db"), m); !errors.Is(err, snapshot.ErrMemberRunning) || moved != "" {
		t.Fatalf("restore with the WAL locked: moved to %q, %v", moved, err)
	}
	if _, err := os.Stat(wal); err != nil {
		t.Fatalf("the held data directory was touched: %v", err)
	}
	held.Close()
	if err := snapshot.CheckDataDir(m); err != nil {
		t.Fatalf("check once the lock is gone: %v", err)
	}
}

// A real etcd running on its data directory: refused.
func TestDataDirOfARunningEtcdIsRefused(t *testing.T) {
	te := etcdtest.Start(t, false)
	if err := snapshot.CheckDataDir(memberAt(te.DataDir)); !errors.Is(err, snapshot.ErrMemberRunning) {
		t.Fatalf("data dir of a running etcd: %v, want ErrMemberRunning", err)
	}
	te.Stop()
	if err := snapshot.CheckDataDir(memberAt(te.DataDir)); err != nil {
		t.Fatalf("data dir of a stopped etcd, with move-aside: %v", err)
	}
}
