package drill

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"
	etcdsnapshot "go.etcd.io/etcd/client/v3/snapshot"
	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/internal/etcdtest"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/internal/loopetcd"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/snapshot"
)

// history writes n revisions that overwrite a few keys and delete one, so
// that a compaction removes entries and HashKV depends on where it did.
func history(t *testing.T, c *clientv3.Client, tag string, n int) {
	t.Helper()
	ctx := context.Background()
	for i := range n {
		if _, err := c.Put(ctx, fmt.Sprintf("/registry/%s/%d", tag, i%5), fmt.Sprint(i)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.Delete(ctx, fmt.Sprintf("/registry/%s/0", tag)); err != nil {
		t.Fatal(err)
	}
}

func revisionOf(t *testing.T, c *clientv3.Client) int64 {
	t.Helper()
	r, err := c.Get(context.Background(), "x")
	if err != nil {
		t.Fatal(err)
	}
	return r.Header.Revision
}

func compact(t *testing.T, c *clientv3.Client, rev int64) {
	t.Helper()
	if _, err := c.Compact(context.Background(), rev, clientv3.WithCompactPhysical()); err != nil {
		t.Fatal(err)
	}
}

// save snapshots the member as the backup agent does and returns the file
// and its revision.
func save(t *testing.T, te *etcdtest.Etcd) (string, int64) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "snap.db")
	if _, err := etcdsnapshot.SaveWithVersion(context.Background(), zap.NewNop(), te.Config(t), path); err != nil {
		t.Fatal(err)
	}
	st, err := snapshot.Check(path)
	if err != nil {
		t.Fatal(err)
	}
	return path, st.Revision
}

// fingerprint asks the live member for what the backup agent records at
// rev: HashKV (with the compact revision it answered) and the key count.
func fingerprint(t *testing.T, c *clientv3.Client, endpoint string, rev int64) *ebv1.EtcdInfo {
	t.Helper()
	ctx := context.Background()
	hk, err := c.HashKV(ctx, endpoint, rev)
	if err != nil {
		t.Fatal(err)
	}
	count, err := c.Get(ctx, "\x00", clientv3.WithFromKey(), clientv3.WithCountOnly(), clientv3.WithRev(rev), clientv3.WithSerializable())
	if err != nil {
		t.Fatal(err)
	}
	return &ebv1.EtcdInfo{Revision: rev, KeyspaceKeys: count.Count, HashKv: hk.Hash, CompactRevision: max(0, hk.CompactRevision), Keyspace: true}
}

// serve restores the snapshot as a drill does and serves it.
func serve(t *testing.T, path string) *loopetcd.Member {
	t.Helper()
	m, err := loopetcd.Start(context.Background(), loopetcd.Options{Snapshot: path, DataDir: filepath.Join(t.TempDir(), "member")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	return m
}

// hashKV is the restored member's own HashKV at rev, as the drill compared
// it before it aligned compactions.
func hashKV(t *testing.T, m *loopetcd.Member, rev int64) uint32 {
	t.Helper()
	hk, err := m.Client.HashKV(context.Background(), m.Endpoint, rev)
	if err != nil {
		t.Fatal(err)
	}
	return hk.Hash
}

func mustVerify(t *testing.T, m *loopetcd.Member, want *ebv1.EtcdInfo, says ...string) Result {
	t.Helper()
	got, err := check(context.Background(), m.Client, m.Endpoint, want)
	if err != nil {
		t.Fatal(err)
	}
	if !got.Succeeded || got.Revision != want.GetRevision() || got.Keys != want.GetKeyspaceKeys() {
		t.Fatalf("drill of a good backup (recorded %+v): %+v", want, got)
	}
	for _, s := range says {
		if !strings.Contains(got.Message, s) {
			t.Errorf("message %q does not say %q", got.Message, s)
		}
	}
	return got
}

// A drill compares the restored member's HashKV with the cluster's over
// the same history: etcd's HashKV covers the revisions after the compact
// revision it reports, so a compaction of the cluster between the
// snapshot and its fingerprint must not fail a good backup.
func TestDrillComparesHashKVOverTheSameHistory(t *testing.T) {
	// Compacted before the snapshot; the fingerprint taken at the
	// snapshot's revision once more writes happened.
	t.Run("compacted-before-the-snapshot", func(t *testing.T) {
		te := etcdtest.Start(t, false)
		c := te.Client(t)
		history(t, c, "a", 40)
		compact(t, c, revisionOf(t, c)-10)
		history(t, c, "b", 30)
		path, rev := save(t, te)
		history(t, c, "c", 20)
		want := fingerprint(t, c, te.Endpoint, rev)
		if want.GetCompactRevision() == 0 {
			t.Fatal("the fingerprint records no compaction")
		}
		got := mustVerify(t, serve(t, path), want, "as recorded")
		if got.HashKV != want.GetHashKv() {
			t.Errorf("HashKV %d, recorded %d", got.HashKV, want.GetHashKv())
		}
	})

	// The cluster compacted between the snapshot and the fingerprint:
	// the recorded HashKV leaves out history the snapshot holds. The
	// restored member's own HashKV differs (what failed the drill
	// before); compacted as the cluster was, it matches.
	t.Run("compacted-between-the-snapshot-and-the-fingerprint", func(t *testing.T) {
		te := etcdtest.Start(t, false)
		c := te.Client(t)
		history(t, c, "a", 40)
		path, rev := save(t, te)
		history(t, c, "b", 20)
		compact(t, c, rev-10)
		want := fingerprint(t, c, te.Endpoint, rev)
		if want.GetCompactRevision() != rev-10 {
			t.Fatalf("the fingerprint records compact revision %d, want %d", want.GetCompactRevision(), rev-10)
		}
		member := serve(t, path)
		if own := hashKV(t, member, rev); own == want.GetHashKv() {
			t.Fatalf("the restored member's own HashKV %d equals the cluster's after its compaction: the test proves nothing", own)
		}
		got := mustVerify(t, member, want, "as recorded", fmt.Sprintf("compacted at %d", rev-10))
		if got.HashKV != want.GetHashKv() {
			t.Errorf("HashKV %d, recorded %d", got.HashKV, want.GetHashKv())
		}
		// Compared like with like, a different keyspace still fails.
		other := proto.Clone(want).(*ebv1.EtcdInfo)
		other.HashKv++
		bad, err := check(context.Background(), member.Client, member.Endpoint, other)
		if err != nil {
			t.Fatal(err)
		}
		if bad.Succeeded || !strings.Contains(bad.Message, "differs from the cluster's") {
			t.Fatalf("drill of a backup whose keyspace differs: %+v", bad)
		}
	})

	// The cluster compacted at the snapshot's revision right after it:
	// etcd answers HashKV there with the hash it stored while compacting.
	t.Run("compacted-at-the-snapshot-revision-after-it", func(t *testing.T) {
		te := etcdtest.Start(t, false)
		c := te.Client(t)
		history(t, c, "a", 40)
		compact(t, c, 20)
		history(t, c, "b", 40)
		path, rev := save(t, te)
		compact(t, c, rev)
		history(t, c, "c", 10)
		want := fingerprint(t, c, te.Endpoint, rev)
		mustVerify(t, serve(t, path), want, "as recorded")
	})

	// The snapshot was taken after a compaction the cluster's HashKV
	// answer predates (etcd answers from the hash it stored while
	// compacting): the history it covers is not in the snapshot. Revision
	// and keys are compared and the message says why HashKV was not.
	t.Run("snapshot-compacted-past-the-recorded-hash", func(t *testing.T) {
		te := etcdtest.Start(t, false)
		c := te.Client(t)
		history(t, c, "a", 40)
		rev := revisionOf(t, c)
		compact(t, c, rev)
		path, snapRev := save(t, te)
		if snapRev != rev {
			t.Fatalf("snapshot at %d, want %d", snapRev, rev)
		}
		want := fingerprint(t, c, te.Endpoint, rev)
		if want.GetCompactRevision() >= rev {
			t.Skipf("etcd answered HashKV at %d from history since %d, not from the hash stored when compacting", rev, want.GetCompactRevision())
		}
		mustVerify(t, serve(t, path), want, "HashKV could not be compared", fmt.Sprintf("compacted at revision %d", rev))
	})
}
