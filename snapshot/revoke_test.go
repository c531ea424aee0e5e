package snapshot_test

import (
	"context"
	"errors"
	"maps"
	"path/filepath"
	"slices"
	"testing"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	clientv3snapshot "go.etcd.io/etcd/client/v3/snapshot"
	"go.uber.org/zap"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/internal/etcdtest"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/snapshot"
)

// A restore of the cluster the server runs in removes the server's key
// Secrets, in whatever namespace, one revision past the restored keyspace,
// which is otherwise exactly the snapshot's: the server then makes new
// keys, which no backup holds (issue 37). Keys under leases are kept with
// their leases; a keyspace without the Secrets is not touched.
func TestRevokeServerKeys(t *testing.T) {
	ctx := context.Background()
	te := etcdtest.Start(t, false)
	c := te.Client(t)
	put := func(k, v string, opts ...clientv3.OpOption) {
		t.Helper()
		if _, err := c.Put(ctx, k, v, opts...); err != nil {
			t.Fatal(err)
		}
	}
	lease, err := c.Grant(ctx, 3600)
	if err != nil {
		t.Fatal(err)
	}
	put("/registry/events/default/e1", "event", clientv3.WithLease(lease.ID))
	put("/registry/secrets/etcdbackup-system/etcdbackup-job-signing-key", "k8s:enc:aescbc:v1:key1:...")
	put("/registry/secrets/etcdbackup-system/etcdbackup-agent-ca", "ca")
	put("/registry/secrets/other-install/etcdbackup-job-signing-key", "key of another install")
	put("/registry/secrets/etcdbackup-system/etcd-client", "kept")
	put("/registry/secrets/etcdbackup-system/etcdbackup-job-signing-key-old", "kept: another name")
	put("/registry/configmaps/etcdbackup-system/etcdbackup-agent-ca", "kept: the public CA")
	put("/app/secrets/etcdbackup-system/etcdbackup-agent-ca", "kept: not kube-apiserver's prefix")
	all, _ := keyValues(t, c, "/")
	path := filepath.Join(t.TempDir(), "snap.db")
	if _, err := clientv3snapshot.SaveWithVersion(ctx, zap.NewNop(), te.Config(t), path); err != nil {
		t.Fatal(err)
	}
	st, err := snapshot.Check(path)
	if err != nil {
		t.Fatal(err)
	}
	revoked := []string{
		"/registry/secrets/etcdbackup-system/etcdbackup-agent-ca",
		"/registry/secrets/etcdbackup-system/etcdbackup-job-signing-key",
		"/registry/secrets/other-install/etcdbackup-job-signing-key",
	}

	for _, bump := range []int64{snapshot.DefaultRevisionBump, 0} {
		peer := etcdtest.FreeURL(t)
		m := snapshot.Member{Name: "restored", InitialCluster: "restored=" + peer.String(), InitialAdvertisePeerURLs: []string{peer.String()},
			DataDir: filepath.Join(t.TempDir(), "data"), BumpRevision: &bump}
		if _, err := snapshot.Restore(path, m); err != nil {
			t.Fatal(err)
		}
		got, err := snapshot.RevokeServerKeys(m.DataDir)
		if err != nil {
			t.Fatal(err)
		}
		slices.Sort(got)
		if !slices.Equal(got, revoked) {
			t.Fatalf("bump %d: revoked %q, want %q", bump, got, revoked)
		}
		r := etcdtest.StartOn(t, m.DataDir, m.Name, m.InitialCluster, peer).Client(t)
		kvs, rev := keyValues(t, r, "/")
		want := maps.Clone(all)
		for _, k := range revoked {
			delete(want, k)
		}
		if !maps.Equal(kvs, want) {
			t.Fatalf("bump %d: after the revocation %v, want %v", bump, kvs, want)
		}
		if rev != st.Revision+bump+1 {
			t.Fatalf("bump %d: revision %d, want the restored %d + 1", bump, rev, st.Revision+bump)
		}
		// The restored revision itself reads as the snapshot was (a
		// bump's compaction mark is that revision: older ones are gone).
		old, err := r.Get(ctx, "/registry/secrets/", clientv3.WithPrefix(), clientv3.WithRev(st.Revision+bump))
		if err != nil || len(old.Kvs) != 5 {
			t.Fatalf("bump %d: read at the restored revision %d: %v, want all 5 secrets", bump, st.Revision+bump, err)
		}
		if _, err := r.Get(ctx, "/registry/", clientv3.WithPrefix(), clientv3.WithRev(st.Revision+bump-1)); bump > 0 && !errors.Is(err, rpctypes.ErrCompacted) {
			t.Fatalf("bump %d: read before the restored revision: %v, want compacted", bump, err)
		}
		// The event kept its lease.
		ev, err := r.Get(ctx, "/registry/events/default/e1")
		if err != nil || len(ev.Kvs) != 1 || ev.Kvs[0].Lease != int64(lease.ID) {
			t.Fatalf("bump %d: the leased key: %v, %v", bump, ev, err)
		}
	}

	// A keyspace without them is left as it is, revision included.
	peer := etcdtest.FreeURL(t)
	plain := filepath.Join(t.TempDir(), "plain.db")
	te2 := etcdtest.Start(t, false)
	if _, err := te2.Client(t).Put(ctx, "/app/x", "y"); err != nil {
		t.Fatal(err)
	}
	if _, err := clientv3snapshot.SaveWithVersion(ctx, zap.NewNop(), te2.Config(t), plain); err != nil {
		t.Fatal(err)
	}
	st2, err := snapshot.Check(plain)
	if err != nil {
		t.Fatal(err)
	}
	zero := int64(0)
	m := snapshot.Member{Name: "plain", InitialCluster: "plain=" + peer.String(), InitialAdvertisePeerURLs: []string{peer.String()},
		DataDir: filepath.Join(t.TempDir(), "data"), BumpRevision: &zero}
	if _, err := snapshot.Restore(plain, m); err != nil {
		t.Fatal(err)
	}
	if got, err := snapshot.RevokeServerKeys(m.DataDir); err != nil || len(got) != 0 {
		t.Fatalf("revoked %q, %v from a keyspace without them", got, err)
	}
	if _, rev := keyValues(t, etcdtest.StartOn(t, m.DataDir, m.Name, m.InitialCluster, peer).Client(t), "/"); rev != st2.Revision {
		t.Fatalf("revision %d after nothing was revoked, want the snapshot's %d", rev, st2.Revision)
	}
}
