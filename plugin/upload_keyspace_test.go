package plugin

import (
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"
	etcdsnapshot "go.etcd.io/etcd/client/v3/snapshot"
	"go.uber.org/zap"
)

// An uploaded snapshot records the keyspace fingerprint read from the
// file, and it is the one its member answers: HashKV and the number of
// keys at the snapshot's revision.
func TestUploadRecordsTheKeyspace(t *testing.T) {
	addr := startServer(t)
	c := startEtcd(t, filepath.Join(t.TempDir(), "data"), "source", freeURL(t))
	ctx := context.Background()
	for _, k := range []string{"/a", "/b", "/c", "/b"} {
		if _, err := c.Put(ctx, k, "v"+k); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.Delete(ctx, "/c"); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "snapshot.db")
	if _, err := etcdsnapshot.SaveWithVersion(ctx, zap.NewNop(), clientv3.Config{Endpoints: c.Endpoints(), Logger: zap.NewNop()}, path); err != nil {
		t.Fatal(err)
	}
	mustRun(t, addr, "upload", path, "--name", "ks")
	var b Backup
	if err := json.Unmarshal([]byte(mustRun(t, addr, "get", "ks", "-o", "json").out), &b); err != nil {
		t.Fatal(err)
	}
	e := b.Status.Etcd
	if e == nil || e.Keyspace == nil {
		t.Fatalf("no keyspace recorded: %+v", e)
	}
	hk, err := c.HashKV(ctx, c.Endpoints()[0], e.Revision)
	if err != nil {
		t.Fatal(err)
	}
	if e.Keyspace.HashKV != hk.Hash || e.Keyspace.Keys != 2 {
		t.Errorf("recorded %+v at revision %d; the member's HashKV %d, 2 keys (/a, /b)", e.Keyspace, e.Revision, hk.Hash)
	}
	r := mustRun(t, addr, "describe", "ks")
	if want := "2 keys at revision"; !strings.Contains(r.out, want) {
		t.Errorf("describe lacks %q:\n%s", want, r.out)
	}
}
