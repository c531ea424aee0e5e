package snapshot_test

import (
	"context"
	"errors"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
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
	negative := ok
	negative.BumpRevision = ptr[int64](-1)
	if err := negative.Validate(); err == nil || !strings.Contains(err.Error(), "revision bump -1 is negative") {
		t.Fatalf("negative bump: %v", err)
	}
}

func ptr[T any](v T) *T { return &v }

// The bump's default is etcd's recommendation, and it always comes with the
// compaction mark (etcd takes them only together).
func TestMemberRevisionBump(t *testing.T) {
	for _, tc := range []struct {
		bump   *int64
		want   int64
		marked bool
	}{
		{nil, 1_000_000_000, true},
		{ptr[int64](0), 0, false},
		{ptr[int64](5), 5, true},
	} {
		m := snapshot.Member{BumpRevision: tc.bump}
		if m.RevisionBump() != tc.want || m.MarksCompacted() != tc.marked {
			t.Errorf("BumpRevision %v: bump %d, marked %v; want %d, %v", tc.bump, m.RevisionBump(), m.MarksCompacted(), tc.want, tc.marked)
		}
	}
	if snapshot.DefaultRevisionBump != 1_000_000_000 {
		t.Errorf("DefaultRevisionBump = %d", snapshot.DefaultRevisionBump)
	}
}

// restoreAndStart restores the snapshot at path with bump into a fresh
// data directory and starts a real etcd on it; it returns a client.
func restoreAndStart(t *testing.T, path string, bump *int64) *clientv3.Client {
	t.Helper()
	peer := etcdtest.FreeURL(t)
	m := snapshot.Member{Name: "restored", InitialCluster: "restored=" + peer.String(), InitialAdvertisePeerURLs: []string{peer.String()},
		DataDir: filepath.Join(t.TempDir(), "data"), BumpRevision: bump}
	if _, err := snapshot.Restore(path, m); err != nil {
		t.Fatal(err)
	}
	return etcdtest.StartOn(t, m.DataDir, m.Name, m.InitialCluster, peer).Client(t)
}

// keyValues reads every key under prefix with its value.
func keyValues(t *testing.T, c *clientv3.Client, prefix string) (map[string]string, int64) {
	t.Helper()
	resp, err := c.Get(context.Background(), prefix, clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, kv := range resp.Kvs {
		out[string(kv.Key)] = string(kv.Value)
	}
	return out, resp.Header.Revision
}

// Every restore bumps etcd's revision past any resourceVersion a client of
// the lost data can hold and marks the new revision compacted (etcd's
// recovery guide for Kubernetes): a read or a watch from a revision of
// before the restore fails as compacted, which is what makes
// kube-apiserver's watch cache and every informer relist. With bump 0 the
// revisions are the snapshot's and its history stays readable.
func TestRestoreBumpsRevisionAndMarksCompacted(t *testing.T) {
	ctx := context.Background()
	te := etcdtest.Start(t, false)
	c := te.Client(t)
	// Two versions of a key: the snapshot keeps the history that an old
	// revision reads.
	first, err := c.Put(ctx, "/registry/pods/a", "v1")
	if err != nil {
		t.Fatal(err)
	}
	oldRev := first.Header.Revision
	for k, v := range map[string]string{"/registry/pods/a": "v2", "/registry/pods/b": "b"} {
		if _, err := c.Put(ctx, k, v); err != nil {
			t.Fatal(err)
		}
	}
	want, _ := keyValues(t, c, "/registry/")
	path := filepath.Join(t.TempDir(), "snap.db")
	if _, err := clientv3snapshot.SaveWithVersion(ctx, zap.NewNop(), te.Config(t), path); err != nil {
		t.Fatal(err)
	}
	st, err := snapshot.Check(path)
	if err != nil {
		t.Fatal(err)
	}

	t.Run("default bump", func(t *testing.T) {
		r := restoreAndStart(t, path, nil)
		got, rev := keyValues(t, r, "/registry/")
		if !maps.Equal(got, want) {
			t.Fatalf("restored keys %v, want %v", got, want)
		}
		if rev < st.Revision+snapshot.DefaultRevisionBump {
			t.Fatalf("revision after restore %d, want at least the snapshot's %d + %d", rev, st.Revision, snapshot.DefaultRevisionBump)
		}
		// A read at a revision of the snapshot: compacted.
		_, err := r.Get(ctx, "/registry/pods/a", clientv3.WithRev(oldRev))
		if !errors.Is(err, rpctypes.ErrCompacted) || !strings.Contains(err.Error(), "required revision has been compacted") {
			t.Fatalf("get at the old revision %d: %v, want etcd's ErrCompacted", oldRev, err)
		}
		// A watch from it (an informer resuming from its resourceVersion)
		// is cancelled as compacted: the client must relist.
		wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		select {
		case wr, ok := <-r.Watch(wctx, "/registry/", clientv3.WithPrefix(), clientv3.WithRev(oldRev)):
			if !ok || !wr.Canceled || wr.CompactRevision < st.Revision+snapshot.DefaultRevisionBump || !errors.Is(wr.Err(), rpctypes.ErrCompacted) {
				t.Fatalf("watch from the old revision %d: open %v, %+v, err %v; want it cancelled as compacted at the bumped revision", oldRev, ok, wr, wr.Err())
			}
		case <-wctx.Done():
			t.Fatal("a watch from an old revision was neither cancelled nor answered")
		}
		// New writes go on from the bumped revision.
		put, err := r.Put(ctx, "/registry/pods/c", "new")
		if err != nil || put.Header.Revision <= rev {
			t.Fatalf("put after restore: %v at revision %d, want above %d", err, put.Header.Revision, rev)
		}
	})

	t.Run("bump 0", func(t *testing.T) {
		r := restoreAndStart(t, path, ptr[int64](0))
		got, rev := keyValues(t, r, "/registry/")
		if !maps.Equal(got, want) || rev != st.Revision {
			t.Fatalf("restored keys %v at revision %d, want %v at the snapshot's %d", got, rev, want, st.Revision)
		}
		old, err := r.Get(ctx, "/registry/pods/a", clientv3.WithRev(oldRev))
		if err != nil || len(old.Kvs) != 1 || string(old.Kvs[0].Value) != "v1" {
			t.Fatalf("get at the old revision %d: %+v %v, want v1", oldRev, old, err)
		}
	})
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
