package snapshot_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"
	etcdsnapshot "go.etcd.io/etcd/client/v3/snapshot"
	"go.uber.org/zap"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/internal/etcdtest"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/snapshot"
)

// The fingerprint read from a snapshot file is what the member it came
// from answers: HashKV and the key count at the snapshot's revision, with
// deletes, overwrites and a compaction in the history.
func TestReadKeyspaceMatchesTheMember(t *testing.T) {
	te := etcdtest.Start(t, false)
	c := te.Client(t)
	ctx := context.Background()
	for i := range 300 {
		if _, err := c.Put(ctx, fmt.Sprintf("/k/%03d", i%120), fmt.Sprint(i)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.Delete(ctx, "/k/01", clientv3.WithPrefix()); err != nil {
		t.Fatal(err)
	}
	mid, err := c.Get(ctx, "x")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Compact(ctx, mid.Header.Revision-50, clientv3.WithCompactPhysical()); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Put(ctx, "/after", "compaction"); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "snap.db")
	if _, err := etcdsnapshot.SaveWithVersion(ctx, zap.NewNop(), te.Config(t), path); err != nil {
		t.Fatal(err)
	}
	before, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	ks, err := snapshot.ReadKeyspace(path, t.TempDir(), true)
	if err != nil {
		t.Fatal(err)
	}
	hk, err := c.HashKV(ctx, te.Endpoint, ks.Revision)
	if err != nil {
		t.Fatal(err)
	}
	all, err := c.Get(ctx, "\x00", clientv3.WithFromKey(), clientv3.WithCountOnly(), clientv3.WithRev(ks.Revision))
	if err != nil {
		t.Fatal(err)
	}
	if ks.HashKV != hk.Hash || ks.CompactRevision != max(0, hk.CompactRevision) || ks.Keys != all.Count || ks.Revision != all.Header.Revision {
		t.Fatalf("read from the snapshot %+v; the member at revision %d: hash %d, compacted at %d, %d keys (revision %d)",
			ks, ks.Revision, hk.Hash, hk.CompactRevision, all.Count, all.Header.Revision)
	}
	if after, _ := os.ReadFile(path); string(after) != string(before) {
		t.Error("reading the keyspace changed the snapshot file")
	}
	if ks.Keys != 111 {
		t.Errorf("%d keys, want 111 (120 written, 10 deleted, one more)", ks.Keys)
	}
}

// A file that is not a database is refused as corrupt.
func TestReadKeyspaceRefusesJunk(t *testing.T) {
	path := filepath.Join(t.TempDir(), "junk.db")
	if err := os.WriteFile(path, etcdtest.TrailedBytes(t, 32+512*8), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := snapshot.ReadKeyspace(path, t.TempDir(), true); err == nil {
		t.Fatal("junk read as a keyspace")
	}
}
