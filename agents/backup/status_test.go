package backup_test

import (
	"context"
	"fmt"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/agents/backup"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/internal/etcdtest"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/servertest"
)

// The revision a backup records is the store's, what etcd's response
// headers said when it was taken, not the newest remaining key's: after
// a delete and after a compaction at the current revision. The keyspace
// fingerprint is taken there.
func TestBackupRecordsTheStoreRevision(t *testing.T) {
	te := etcdtest.Start(t, false)
	c := te.Client(t)
	ctx := context.Background()
	srv := servertest.Start(t, "")
	for i := range 30 {
		if _, err := c.Put(ctx, fmt.Sprintf("/k/%02d", i%9), fmt.Sprint(i)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.Delete(ctx, "/k/08"); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		compact bool
	}{{"after-a-delete", false}, {"after-a-compaction-at-the-current-revision", true}} {
		t.Run(tc.name, func(t *testing.T) {
			head, err := c.Get(ctx, "/k/00")
			if err != nil {
				t.Fatal(err)
			}
			want := head.Header.Revision
			if head.Kvs[0].ModRevision >= want {
				t.Fatalf("the newest key is at %d, the store at %d: the test needs a delete last", head.Kvs[0].ModRevision, want)
			}
			if tc.compact {
				if _, err := c.Compact(ctx, want, clientv3.WithCompactPhysical()); err != nil {
					t.Fatal(err)
				}
			}
			b, err := backup.Run(ctx, c, srv.Client, backup.Options{Endpoint: te.Endpoint, Name: tc.name, ScratchDir: t.TempDir()})
			if err != nil {
				t.Fatal(err)
			}
			e := b.GetEtcd()
			if e.GetRevision() != want || !e.GetKeyspace() || e.GetKeyspaceKeys() != 8 {
				t.Fatalf("recorded revision %d, keyspace %v with %d keys; etcd's header said %d, 8 keys", e.GetRevision(), e.GetKeyspace(), e.GetKeyspaceKeys(), want)
			}
		})
	}
}
