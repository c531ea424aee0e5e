package snapshot_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	clientv3snapshot "go.etcd.io/etcd/client/v3/snapshot"
	"go.uber.org/zap"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/internal/etcdtest"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/snapshot"
)

func TestMemberValidate(t *testing.T) {
	ok := snapshot.Member{Name: "m1", InitialCluster: "m1=http://127.0.0.1:2380", InitialAdvertisePeerURLs: []string{"http://127.0.0.1:2380"}, DataDir: "/d"}
	if err := ok.Validate(); err != nil {
		t.Fatal(err)
	}
	if err := (snapshot.Member{}).Validate(); err == nil || !strings.Contains(err.Error(), "member name, initial cluster, initial advertise peer URLs, data dir") {
		t.Fatalf("got %v", err)
	}
	bad := ok
	bad.InitialCluster = "m2=http://127.0.0.1:2380"
	if err := bad.Validate(); err == nil || !strings.Contains(err.Error(), `does not name member "m1"`) {
		t.Fatalf("got %v", err)
	}
}

// A real snapshot of a real etcd is checked, restored into a data dir, and
// read back by a real etcd started on it.
func TestCheckAndRestoreARealSnapshot(t *testing.T) {
	ctx := context.Background()
	te := etcdtest.Start(t, false)
	c := te.Client(t)
	if _, err := c.Put(ctx, "marker", "before-backup"); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "snap.db")
	if _, err := clientv3snapshot.SaveWithVersion(ctx, zap.NewNop(), te.Config(t), path); err != nil {
		t.Fatal(err)
	}
	st, err := snapshot.Check(path)
	if err != nil || st.TotalKey == 0 || st.Revision == 0 {
		t.Fatalf("check: %+v %v", st, err)
	}

	peer := etcdtest.FreeURL(t)
	m := snapshot.Member{Name: "restored", InitialCluster: "restored=" + peer.String(), InitialAdvertisePeerURLs: []string{peer.String()}, DataDir: filepath.Join(dir, "data")}
	if _, err := snapshot.Restore(path, m); err != nil {
		t.Fatal(err)
	}
	// A second restore into the now non-empty dir is refused; with
	// MoveAside the old data is kept beside it.
	if _, err := snapshot.Restore(path, m); !errors.Is(err, snapshot.ErrDataDirNotEmpty) {
		t.Fatalf("got %v, want ErrDataDirNotEmpty", err)
	}
	m.MoveAside = true
	movedTo, err := snapshot.Restore(path, m)
	if err != nil || movedTo == "" {
		t.Fatalf("move aside: %q %v", movedTo, err)
	}
	if _, err := os.Stat(filepath.Join(movedTo, "member")); err != nil {
		t.Fatalf("moved-aside data: %v", err)
	}

	// etcd starts on the restored dir and has the key.
	if got := etcdtest.ReadKey(t, m.DataDir, m.Name, m.InitialCluster, peer, "marker"); got != "before-backup" {
		t.Fatalf("marker after restore: %q", got)
	}
}

func TestCorruptSnapshotFileIsRefused(t *testing.T) {
	path := filepath.Join(t.TempDir(), "bad.db")
	os.WriteFile(path, []byte("not a snapshot at all"), 0o600)
	if _, err := snapshot.Check(path); !errors.Is(err, snapshot.ErrCorrupt) {
		t.Fatalf("got %v", err)
	}
}
