package fold_test

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	etcdsnapshot "go.etcd.io/etcd/client/v3/snapshot"
	"go.uber.org/zap"
	"k8s.io/apimachinery/pkg/util/wait"

	agentdelta "github.com/kubectl-etcdbackup/kubectl-etcdbackup/agents/delta"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/agents/fold"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/agentjob"
	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/fetch"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/internal/etcdtest"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/internal/loopetcd"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/auth"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/config"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/jobs"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/servertest"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/snapshot"
)

// agentAs admits every agent-port call as the agent it is set to.
type agentAs struct {
	mu sync.Mutex
	a  auth.Agent
}

func (g *agentAs) set(a auth.Agent) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.a = a
}

func (g *agentAs) Admit(ctx context.Context, _ string) (context.Context, error) {
	g.mu.Lock()
	a := g.a
	g.mu.Unlock()
	return auth.WithAgent(ctx, &a), nil
}

// leaseFence plays the target's delta Lease, held by pod in epoch.
type leaseFence struct {
	pod   string
	epoch int64
}

func (f leaseFence) CheckDeltaWriter(_ context.Context, _, pod string, epoch, chainEpoch int64) error {
	if pod != f.pod || epoch != jobs.WriterEpoch(int32(f.epoch), chainEpoch) {
		return fmt.Errorf("%w: held by %s in epoch %d", jobs.ErrNotDeltaWriter, f.pod, f.epoch)
	}
	return nil
}

// TestFoldAChainCapturedFromARealEtcd captures a real etcd under writes
// with the real delta agent into a real server, folds the chain with the
// fold agent as its Job would run it, and restores the stored fold: it
// holds every key exactly as the source had it at the chain's last
// revision, and records that revision and the source's HashKV there
// once the source is compacted there too. The fold keeps no history: a
// key overwritten many times in the chain is there once, older
// revisions are compacted, and the snapshot is smaller than the
// source's.
func TestFoldAChainCapturedFromARealEtcd(t *testing.T) {
	ctx := context.Background()
	src := etcdtest.Start(t, false)
	etcd, err := clientv3.New(clientv3.Config{Endpoints: []string{src.Endpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { etcd.Close() })
	put := func(k, v string, opts ...clientv3.OpOption) int64 {
		t.Helper()
		r, err := etcd.Put(ctx, k, v, opts...)
		if err != nil {
			t.Fatal(err)
		}
		return r.Header.Revision
	}
	for i := range 20 {
		put(fmt.Sprintf("/registry/base/%02d", i), "v")
	}

	guard := &agentAs{}
	srv := servertest.StartWith(t, servertest.Options{
		Targets:    []config.Target{{Name: "cp", Endpoints: []string{src.Endpoint}, InsecurePlaintext: true, Deltas: &config.Deltas{CompactAfterRevisions: 1000}}},
		AgentGuard: guard, DeltaFence: leaseFence{pod: "delta-pod", epoch: 3},
	})

	// The chain's full backup, stored as the target's backup agent
	// stores it.
	snap := filepath.Join(t.TempDir(), "full.db")
	if _, err := etcdsnapshot.SaveWithVersion(ctx, zap.NewNop(), clientv3.Config{Endpoints: []string{src.Endpoint}, Logger: zap.NewNop()}, snap); err != nil {
		t.Fatal(err)
	}
	st, err := snapshot.Check(snap)
	if err != nil {
		t.Fatal(err)
	}
	guard.set(auth.Agent{Kind: agentjob.Backup, JobNamespace: "etcdbackup", JobName: "backup-cp-full", Backup: "cp-full", Location: "default", Target: "cp"})
	f, err := os.Open(snap)
	if err != nil {
		t.Fatal(err)
	}
	full, err := srv.AgentClient.Upload(ctx, f, &ebv1.UploadHeader{Name: "cp-full", Etcd: &ebv1.EtcdInfo{Revision: st.Revision, SnapshotStatus: true}}, nil)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}

	// The delta agent of cp on cp-full's chain, under writes of every
	// kind: puts, overwrites, deletes, a transaction, a leased key.
	guard.set(auth.Agent{Kind: agentjob.Delta, JobNamespace: "etcdbackup", JobName: "delta-cp", Backup: "cp-full", Location: "default", Target: "cp", Pod: "delta-pod"})
	store := &agentdelta.ServerStore{Client: srv.AgentClient, Chain: "cp-full", Target: "cp"}
	capCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := agentdelta.Run(capCtx, agentdelta.Options{Etcd: etcd, Store: store, Chain: "cp-full", Epoch: func() int64 { return 3 },
			Period: 200 * time.Millisecond, Compression: ebv1.CompressionZstd})
		done <- err
	}()
	t.Cleanup(func() { stop(); <-done })
	storedUpTo := func(rev int64) {
		t.Helper()
		var next int64
		err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			var err error
			if next, _, err = store.Position(ctx); err != nil {
				t.Fatal(err)
			}
			return next > rev, nil
		})
		if err != nil {
			t.Fatalf("the chain reached only revision %d within 30s, want %d", next-1, rev)
		}
	}
	put("/registry/a", "1")
	lease, err := etcd.Grant(ctx, 600)
	if err != nil {
		t.Fatal(err)
	}
	put("/registry/leased", "x", clientv3.WithLease(lease.ID))
	if _, err := etcd.Delete(ctx, "/registry/base/00"); err != nil {
		t.Fatal(err)
	}
	storedUpTo(put("/registry/b", "2"))
	// A key overwritten many times: history the fold drops.
	hot := strings.Repeat("h", 4<<10)
	firstHot := put("/registry/hot", hot)
	for range 300 {
		put("/registry/hot", hot)
	}
	if _, err := etcd.Txn(ctx).Then(clientv3.OpPut("/registry/c", "3"), clientv3.OpDelete("/registry/a"), clientv3.OpPut("/registry/b", "22")).Commit(); err != nil {
		t.Fatal(err)
	}
	if _, err := etcd.Delete(ctx, "/registry/base/1", clientv3.WithPrefix()); err != nil {
		t.Fatal(err)
	}
	newest := put("/registry/d", "4")
	storedUpTo(newest)
	stop()
	if err := <-done; err != nil {
		t.Fatalf("delta agent: %v", err)
	}
	done <- nil
	// Written after the chain's end: not in the fold.
	put("/registry/after", "x")

	// The chain as the controller pins it.
	resp, err := srv.Client.Backups.ListBackups(ctx, &ebv1.ListBackupsRequest{Chain: "cp-full"})
	if err != nil {
		t.Fatal(err)
	}
	in := fold.Inputs{Full: fetch.Pin{Name: "cp-full", SHA256: full.GetSha256()}, ToRevision: newest}
	pins := map[string]string{"cp-full": full.GetSha256()}
	segs := resp.GetBackups()
	slices.SortFunc(segs, func(a, b *ebv1.Backup) int {
		return cmp.Compare(a.GetDelta().GetFirstRevision(), b.GetDelta().GetFirstRevision())
	})
	for _, b := range segs {
		in.Segments = append(in.Segments, fetch.Pin{Name: b.GetName(), SHA256: b.GetSha256()})
		pins[b.GetName()] = b.GetSha256()
	}
	if len(in.Segments) < 2 {
		t.Fatalf("the chain holds %d segments; the test wants at least 2", len(in.Segments))
	}

	name := jobs.FoldName("cp", newest)
	guard.set(auth.Agent{Kind: agentjob.Fold, JobNamespace: "etcdbackup", JobName: "fold-cp", Backup: name, Location: "default", Target: "cp", Inputs: pins})
	// Uncompressed, as targets store by default (the oracle folds with
	// zstd): the plain snapshot goes to the server as it is read.
	res, err := fold.Run(ctx, srv.AgentClient, fold.Options{Inputs: in, Target: "cp", Name: name, Compression: ebv1.CompressionNone, ScratchDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	// The source's snapshot holds the history the fold dropped. Compacted
	// at the chain's last revision, it hashes the same keyspace there —
	// once restored: the source itself answers HashKV at its compact
	// revision with the hash it took just before compacting, of all the
	// history.
	uncompacted, err := os.Stat(save(t, src.Endpoint))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := etcd.Compact(ctx, newest, clientv3.WithCompactPhysical()); err != nil {
		t.Fatal(err)
	}
	compactedSource, err := loopetcd.Start(ctx, loopetcd.Options{Snapshot: save(t, src.Endpoint), DataDir: filepath.Join(t.TempDir(), "source")})
	if err != nil {
		t.Fatal(err)
	}
	hash, err := compactedSource.Client.HashKV(ctx, compactedSource.Endpoint, newest)
	compactedSource.Close()
	if err != nil {
		t.Fatal(err)
	}
	count, err := etcd.Get(ctx, "\x00", clientv3.WithFromKey(), clientv3.WithCountOnly(), clientv3.WithRev(newest))
	if err != nil {
		t.Fatal(err)
	}
	if !res.Succeeded || res.Backup != name || res.Revision != newest || res.Keys != count.Count || res.HashKV != hash.Hash {
		t.Fatalf("fold: %+v; want %s at revision %d with %d keys and the source's HashKV %d", res, name, newest, count.Count, hash.Hash)
	}

	// What the server recorded: an agent full backup of cp at the
	// chain's last revision, with the keyspace fingerprint a drill
	// compares with (the compacted source's HashKV there).
	got, err := srv.Client.Backups.GetBackup(ctx, &ebv1.GetBackupRequest{Name: name})
	if err != nil {
		t.Fatal(err)
	}
	b := got.GetBackup()
	e := b.GetEtcd()
	if b.GetSource().GetKind() != "agent" || b.GetSource().GetTarget() != "cp" || b.GetSource().GetScheduled() || b.GetCompression() != ebv1.CompressionNone ||
		!e.GetSnapshotStatus() || e.GetRevision() != newest || !e.GetKeyspace() || e.GetKeyspaceKeys() != count.Count || e.GetHashKv() != hash.Hash ||
		e.GetCompactRevision() != newest {
		t.Fatalf("stored fold %s: source %v, compression %q, etcd %v", name, b.GetSource(), b.GetCompression(), e)
	}

	// Restored, it is the source at the chain's last revision, key by key.
	path := filepath.Join(t.TempDir(), name+".db")
	if _, err := fetch.Snapshot(ctx, srv.Client, fetch.Request{Name: name, SHA256: b.GetSha256(), Path: path, CheckDatabase: true}); err != nil {
		t.Fatal(err)
	}
	folded, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if folded.Size() >= uncompacted.Size()/2 {
		t.Errorf("the folded snapshot is %d bytes, the source's uncompacted one %d: the fold kept its history", folded.Size(), uncompacted.Size())
	}
	m, err := loopetcd.Start(ctx, loopetcd.Options{Snapshot: path, DataDir: filepath.Join(t.TempDir(), "member")})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	sameKeyspace(t, etcd, m.Client, newest)
	if _, err := m.Client.Get(ctx, "/registry/hot", clientv3.WithRev(firstHot)); !errors.Is(err, rpctypes.ErrCompacted) {
		t.Errorf("get of an overwritten key's revision %d from the fold: %v, want %v", firstHot, err, rpctypes.ErrCompacted)
	}
}

// save writes a snapshot of the etcd at endpoint and returns its path.
func save(t *testing.T, endpoint string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "source.db")
	if _, err := etcdsnapshot.SaveWithVersion(context.Background(), zap.NewNop(), clientv3.Config{Endpoints: []string{endpoint}, Logger: zap.NewNop()}, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// sameKeyspace compares every key of restored with source's keyspace at
// rev: value, create and mod revisions, version and lease.
func sameKeyspace(t *testing.T, source, restored *clientv3.Client, rev int64) {
	t.Helper()
	ctx := context.Background()
	want, err := source.Get(ctx, "\x00", clientv3.WithFromKey(), clientv3.WithRev(rev))
	if err != nil {
		t.Fatal(err)
	}
	got, err := restored.Get(ctx, "\x00", clientv3.WithFromKey())
	if err != nil {
		t.Fatal(err)
	}
	if got.Header.Revision != rev {
		t.Errorf("restored at revision %d, want %d", got.Header.Revision, rev)
	}
	key := func(kv *mvccpb.KeyValue) string {
		return fmt.Sprintf("%s=%s create=%d mod=%d version=%d lease=%x", kv.Key, kv.Value, kv.CreateRevision, kv.ModRevision, kv.Version, kv.Lease)
	}
	if len(got.Kvs) != len(want.Kvs) {
		t.Errorf("restored %d keys, the source had %d at revision %d", len(got.Kvs), len(want.Kvs), rev)
	}
	for i := range min(len(got.Kvs), len(want.Kvs)) {
		if g, w := key(got.Kvs[i]), key(want.Kvs[i]); g != w {
			t.Errorf("key %d at revision %d:\n restored %s\n source   %s", i, rev, g, w)
		}
	}
}
