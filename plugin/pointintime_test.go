package plugin

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	etcdsnapshot "go.etcd.io/etcd/client/v3/snapshot"
	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	agentdelta "github.com/kubectl-etcdbackup/kubectl-etcdbackup/agents/delta"
	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/delta"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/internal/etcdtest"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/auth"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/config"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/jobs"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/servertest"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/snapshot"
)

// leaseFence plays the target's delta Lease: held by pod in epoch.
type leaseFence struct {
	pod   string
	epoch int64
}

func (f leaseFence) CheckDeltaWriter(_ context.Context, _, pod string, epoch int64) error {
	if pod != f.pod || epoch != f.epoch {
		return fmt.Errorf("%w: held by %s in epoch %d", jobs.ErrNotDeltaWriter, f.pod, f.epoch)
	}
	return nil
}

// TestRestoreToAPoint captures a real etcd under writes with the real
// delta agent into a real server, then restores with the real command to
// a revision inside a segment, to a segment's boundary, to the newest
// event and to a time, and compares every key of each restored member
// with the source's keyspace at that revision.
func TestRestoreToAPoint(t *testing.T) {
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

	agent := &agentAs{}
	srv := servertest.StartWith(t, servertest.Options{
		Targets:    []config.Target{{Name: "cp", Endpoints: []string{src.Endpoint}, InsecurePlaintext: true, Deltas: &config.Deltas{}}},
		AgentGuard: agent, DeltaFence: leaseFence{pod: "delta-pod", epoch: 3},
	})
	addr := "--server-address=" + srv.Addr

	// The full backup: a real snapshot, stored as the target's agent
	// stores it, with the revision read from the snapshot itself.
	snap := filepath.Join(t.TempDir(), "full.db")
	if _, err := etcdsnapshot.SaveWithVersion(ctx, zap.NewNop(), clientv3.Config{Endpoints: []string{src.Endpoint}, Logger: zap.NewNop()}, snap); err != nil {
		t.Fatal(err)
	}
	st, err := snapshot.Check(snap)
	if err != nil {
		t.Fatal(err)
	}
	agent.set("cp", "cp-full", false)
	f, err := os.Open(snap)
	if err != nil {
		t.Fatal(err)
	}
	_, err = srv.AgentClient.Upload(ctx, f, &ebv1.UploadHeader{Name: "cp-full", Etcd: &ebv1.EtcdInfo{Revision: st.Revision, SnapshotStatus: true}}, nil)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}

	// The delta agent of cp on cp-full's chain.
	agent.mu.Lock()
	agent.a = auth.Agent{Kind: auth.AgentDelta, JobNamespace: serverNS, JobName: "delta-cp", Backup: "cp-full", Location: "default", Target: "cp", Pod: "delta-pod"}
	agent.mu.Unlock()
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
		deadline := time.Now().Add(30 * time.Second)
		for {
			next, _, err := store.Position(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if next > rev {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("the chain reached only revision %d within 30s, want %d", next-1, rev)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}

	// First segment: puts, a delete, a key on a lease.
	put("/registry/a", "1")
	put("/registry/b", "2")
	lease, err := etcd.Grant(ctx, 600)
	if err != nil {
		t.Fatal(err)
	}
	put("/registry/leased", "x", clientv3.WithLease(lease.ID))
	dr, err := etcd.Delete(ctx, "/registry/base/00")
	if err != nil {
		t.Fatal(err)
	}
	boundary := dr.Header.Revision
	storedUpTo(boundary)

	// Later segments: a transaction of several operations, overwrites,
	// a range delete.
	_, err = etcd.Txn(ctx).Then(clientv3.OpPut("/registry/c", "3"), clientv3.OpDelete("/registry/a"), clientv3.OpPut("/registry/b", "22")).Commit()
	if err != nil {
		t.Fatal(err)
	}
	// Inside a segment: neither its first revision nor its last.
	inside := put("/registry/c", "33")
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

	// A writer that does not hold the Lease, or holds it in an older
	// epoch, stores nothing; nor does one whose segment leaves a gap.
	refusedPut := func(pod string, epoch, first int64, want string) {
		t.Helper()
		agent.mu.Lock()
		agent.a.Pod = pod
		agent.mu.Unlock()
		err := store.Put(ctx, agentdelta.Segment{
			Name: agentdelta.SegmentName("cp-full", first), Body: []byte("x"), Compression: ebv1.CompressionZstd, RawSize: 1, RawSHA256: strings.Repeat("0", 64),
			Summary: delta.Summary{Header: delta.Header{Chain: "cp-full", Epoch: epoch, FirstRevision: first}, LastRevision: first},
		})
		if status.Code(errors.Unwrap(err)) != codes.FailedPrecondition && status.Code(err) != codes.FailedPrecondition {
			t.Fatalf("segment of pod %s epoch %d at %d: %v, want FailedPrecondition", pod, epoch, first, err)
		}
		if !strings.Contains(err.Error(), want) {
			t.Fatalf("segment of pod %s epoch %d: %v, want it to say %q", pod, epoch, err, want)
		}
	}
	refusedPut("hand-started", 3, newest+1, "not the target's delta writer")
	refusedPut("delta-pod", 2, newest+1, "not the target's delta writer")
	refusedPut("delta-pod", 3, newest+5, "out of order")
	if next, _, _ := store.Position(ctx); next != newest+1 {
		t.Fatalf("after refused segments the chain ends at %d, want %d", next-1, newest)
	}

	restoreTo := func(t *testing.T, point ...string) (*clientv3.Client, result) {
		t.Helper()
		dataDir := filepath.Join(t.TempDir(), "etcd")
		peer := freeURL(t)
		r := mustRun(t, append([]string{addr, "restore", "--local", "--target", "cp", "--data-dir", dataDir, "--member-name", "m1",
			"--initial-cluster", "m1=" + peer.String(), "--initial-advertise-peer-urls", peer.String()}, point...)...)
		return startEtcd(t, dataDir, "m1", peer), r
	}
	for _, rev := range []int64{inside, boundary, newest} {
		t.Run(fmt.Sprintf("revision-%d", rev), func(t *testing.T) {
			restored, r := restoreTo(t, "--to-revision", fmt.Sprint(rev))
			if !strings.Contains(r.out, fmt.Sprintf("as it was at revision %d", rev)) {
				t.Fatalf("restore output does not name revision %d:\n%s", rev, r.out)
			}
			sameKeyspace(t, etcd, restored, rev)
		})
	}

	t.Run("time", func(t *testing.T) {
		segs, err := listChainSegments(ctx, &Connection{Client: srv.Client}, "", "cp-full")
		if err != nil {
			t.Fatal(err)
		}
		first := segs[0]
		for _, s := range segs {
			if s.FirstRevision < first.FirstRevision {
				first = s
			}
		}
		restored, r := restoreTo(t, "--to-time", first.LastTime.Format(time.RFC3339Nano))
		if !strings.Contains(r.out, fmt.Sprintf("as it was at revision %d", first.LastRevision)) {
			t.Fatalf("restore to %s (the first segment's last event) does not end at its revision %d:\n%s", first.LastTime, first.LastRevision, r.out)
		}
		sameKeyspace(t, etcd, restored, first.LastRevision)
	})

	t.Run("window", func(t *testing.T) {
		r := mustRun(t, addr, "list", "--target", "cp")
		want := fmt.Sprintf("Recoverable window of target \"cp\": revision %d", st.Revision)
		if !strings.Contains(r.out, want) || !strings.Contains(r.out, fmt.Sprintf("to revision %d", newest)) {
			t.Fatalf("list --target does not show the window %d..%d:\n%s", st.Revision, newest, r.out)
		}
		if strings.Contains(r.out, ".delta-") {
			t.Fatalf("list shows delta segments as backups:\n%s", r.out)
		}
		d := mustRun(t, addr, "describe", "cp-full")
		if !strings.Contains(d.out, "Delta Chain:") || !strings.Contains(d.out, fmt.Sprintf("%d to %d", st.Revision+1, newest)) {
			t.Fatalf("describe does not show the chain up to %d:\n%s", newest, d.out)
		}
	})

	t.Run("outside-the-window", func(t *testing.T) {
		mustFail(t, "after the newest", addr, "restore", "--local", "--target", "cp", "--to-revision", fmt.Sprint(newest+100),
			"--data-dir", filepath.Join(t.TempDir(), "x"), "--member-name", "m1", "--initial-cluster", "m1=http://127.0.0.1:2380", "--initial-advertise-peer-urls", "http://127.0.0.1:2380")
	})
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
