package snapshot_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	bolt "go.etcd.io/bbolt"
	clientv3 "go.etcd.io/etcd/client/v3"
	etcdsnapshot "go.etcd.io/etcd/client/v3/snapshot"
	etcdutl "go.etcd.io/etcd/etcdutl/v3/snapshot"
	"go.etcd.io/etcd/server/v3/storage/mvcc"
	"go.etcd.io/etcd/server/v3/storage/schema"
	"go.uber.org/zap"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/internal/etcdtest"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/snapshot"
)

// The revision a snapshot's status says is the store's, the one etcd's
// response headers carried when it was taken: after a delete (its
// revision is above every remaining key's) and after a compaction at the
// current revision.
func TestCheckReadsTheStoreRevision(t *testing.T) {
	te := etcdtest.Start(t, false)
	c := te.Client(t)
	ctx := context.Background()
	for i := range 20 {
		if _, err := c.Put(ctx, fmt.Sprintf("/k/%02d", i%7), fmt.Sprint(i)); err != nil {
			t.Fatal(err)
		}
	}
	del, err := c.Delete(ctx, "/k/06")
	if err != nil {
		t.Fatal(err)
	}
	save := func() string {
		path := filepath.Join(t.TempDir(), "snap.db")
		if _, err := etcdsnapshot.SaveWithVersion(ctx, zap.NewNop(), te.Config(t), path); err != nil {
			t.Fatal(err)
		}
		return path
	}
	header := func() int64 {
		r, err := c.Get(ctx, "/k/00")
		if err != nil {
			t.Fatal(err)
		}
		if r.Kvs[0].ModRevision >= r.Header.Revision {
			t.Fatalf("the newest remaining key is at revision %d, the store at %d: the test needs a delete last", r.Kvs[0].ModRevision, r.Header.Revision)
		}
		return r.Header.Revision
	}

	afterDelete := save()
	want := header()
	if want != del.Header.Revision {
		t.Fatalf("header revision %d after the delete at %d", want, del.Header.Revision)
	}
	if st, err := snapshot.Check(afterDelete); err != nil || st.Revision != want {
		t.Fatalf("status after a delete: revision %d (%v), etcd's header said %d", st.Revision, err, want)
	}

	if _, err := c.Compact(ctx, want, clientv3.WithCompactPhysical()); err != nil {
		t.Fatal(err)
	}
	compacted := save()
	if st, err := snapshot.Check(compacted); err != nil || st.Revision != header() {
		t.Fatalf("status after a compaction at the current revision: revision %d (%v), etcd's header said %d", st.Revision, err, want)
	}

	// etcd up to 3.5.15 removed a tombstone at the compact revision: the
	// newest entry of the key bucket is then below the store's revision,
	// which the status still says (etcdutl's alone does not).
	old := withoutEntriesAbove(t, compacted, want-1)
	if st, err := etcdutl.NewV3(zap.NewNop()).Status(old); err != nil || st.Revision >= want {
		t.Fatalf("etcdutl's status of the snapshot without its tombstone: revision %d (%v); the test expects it below %d", st.Revision, err, want)
	}
	if st, err := snapshot.Check(old); err != nil || st.Revision != want {
		t.Fatalf("status of a snapshot whose compaction removed the tombstone at its revision: revision %d (%v), want %d", st.Revision, err, want)
	}
}

// withoutEntriesAbove copies the snapshot at path without the key
// bucket's entries above revision rev, with a new trailer: as etcd up to
// 3.5.15 left a snapshot whose newest write, a delete, was compacted.
func withoutEntriesAbove(t *testing.T, path string, rev int64) string {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "old.db")
	if err := os.WriteFile(out, raw[:len(raw)-sha256.Size], 0o600); err != nil {
		t.Fatal(err)
	}
	db, err := bolt.Open(out, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(schema.Key.Name())
		var drop [][]byte
		if err := b.ForEach(func(k, _ []byte) error {
			if mvcc.BytesToRev(k).Main > rev {
				drop = append(drop, bytes.Clone(k))
			}
			return nil
		}); err != nil {
			return err
		}
		if len(drop) == 0 {
			return fmt.Errorf("no entry above revision %d", rev)
		}
		for _, k := range drop {
			if err := b.Delete(k); err != nil {
				return err
			}
		}
		return nil
	})
	if cerr := db.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}
	body, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(body)
	if err := os.WriteFile(out, append(body, sum[:]...), 0o600); err != nil {
		t.Fatal(err)
	}
	return out
}
