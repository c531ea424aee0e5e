package plugin

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	etcdsnapshot "go.etcd.io/etcd/client/v3/snapshot"
	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/util/wait"

	agentdelta "github.com/kubectl-etcdbackup/kubectl-etcdbackup/agents/delta"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/agentjob"
	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/delta"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/internal/etcdtest"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/auth"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/config"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/jobs"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/servertest"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/snapshot"
)

// leaseFence plays the target's delta Lease: held by pod, with
// transitions (as jobs.Launcher.CheckDeltaWriter checks it).
type leaseFence struct {
	pod         string
	transitions atomic.Int32
}

func newLeaseFence(pod string, transitions int32) *leaseFence {
	f := &leaseFence{pod: pod}
	f.transitions.Store(transitions)
	return f
}

func (f *leaseFence) CheckDeltaWriter(_ context.Context, _, pod string, epoch, chainEpoch int64) error {
	if want := jobs.WriterEpoch(f.transitions.Load(), chainEpoch); pod != f.pod || epoch != want {
		return fmt.Errorf("%w: held by %s in epoch %d", jobs.ErrNotDeltaWriter, f.pod, want)
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
	w := newCaptureWorld(t)
	etcd, srv, store := w.etcd, w.srv, w.store
	addr := "--server-address=" + srv.Addr
	st := w.full
	put := func(k, v string, opts ...clientv3.OpOption) int64 {
		t.Helper()
		return w.put(t, k, v, opts...)
	}
	stop, done := w.capture(t, 200*time.Millisecond)
	storedUpTo := func(rev int64) {
		t.Helper()
		w.waitStored(t, rev, 30*time.Second)
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
		w.agent.mu.Lock()
		w.agent.a.Pod = pod
		w.agent.mu.Unlock()
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
		// Read at the start, the full's last byte, the checks' end, the
		// replay's end and the rebuild's end.
		r := runRestoreAt(t, []time.Duration{0, 41 * time.Second, 47 * time.Second, 59 * time.Second, 95 * time.Second},
			append([]string{addr, "restore", "--local", "--target", "cp", "--data-dir", dataDir, "--member-name", "m1",
				"--initial-cluster", "m1=" + peer.String(), "--initial-advertise-peer-urls", peer.String()}, point...)...)
		if r.err != nil {
			t.Fatalf("restore to %v: %v\n%s", point, r.err, r.errOut)
		}
		if !strings.HasSuffix(r.out, "\nrestored in 1m35s: download 41s, verify 6s, replay 12s, rebuild 36s\n") {
			t.Fatalf("restore to %v does not end with its elapsed time and steps:\n%s", point, r.out)
		}
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
		want := fmt.Sprintf("Recoverable window of target \"cp\": revision %d", st)
		if !strings.Contains(r.out, want) || !strings.Contains(r.out, fmt.Sprintf("to revision %d", newest)) {
			t.Fatalf("list --target does not show the window %d..%d:\n%s", st, newest, r.out)
		}
		if strings.Contains(r.out, ".delta-") {
			t.Fatalf("list shows delta segments as backups:\n%s", r.out)
		}
		d := mustRun(t, addr, "describe", "cp-full")
		if !strings.Contains(d.out, "Delta Chain:") || !strings.Contains(d.out, fmt.Sprintf("%d to %d", st+1, newest)) {
			t.Fatalf("describe does not show the chain up to %d:\n%s", newest, d.out)
		}
	})

	t.Run("outside-the-window", func(t *testing.T) {
		mustFail(t, "after the newest", addr, "restore", "--local", "--target", "cp", "--to-revision", fmt.Sprint(newest+100),
			"--data-dir", filepath.Join(t.TempDir(), "x"), "--member-name", "m1", "--initial-cluster", "m1=http://127.0.0.1:2380", "--initial-advertise-peer-urls", "http://127.0.0.1:2380")
	})

	t.Run("segments-go-with-their-full", func(t *testing.T) {
		segs, err := listChainSegments(ctx, &Connection{Client: srv.Client}, "", "cp-full")
		if err != nil || len(segs) == 0 {
			t.Fatalf("chain before the delete: %d segments, %v", len(segs), err)
		}
		if r := run(t, addr, "delete", segs[0].Name); r.err == nil || !strings.Contains(r.errOut, "segments go only with their full backup") {
			t.Fatalf("delete of segment %s: %v\n%s", segs[0].Name, r.err, r.errOut)
		}
		mustRun(t, addr, "delete", "cp-full")
		if segs, err := listChainSegments(ctx, &Connection{Client: srv.Client}, "", "cp-full"); err != nil || len(segs) != 0 {
			t.Fatalf("after deleting cp-full its chain still has %d segments (%v)", len(segs), err)
		}
		// The agent, still running somewhere, stores nothing more.
		refusedPut("delta-pod", 3, newest+1, "its full backup is not stored")
	})
}

// captureWorld is a real etcd, a real server whose target cp has deltas,
// a full backup of cp stored as its agent stores one, and the agent port
// playing cp's delta agent on that full's chain, holding the Lease.
type captureWorld struct {
	etcd *clientv3.Client
	// member is the etcd member etcd talks to.
	member *etcdtest.Etcd
	srv    *servertest.Server
	agent  *agentAs
	fence  *leaseFence
	store  *agentdelta.ServerStore
	// full is the full backup's revision, read from its snapshot.
	full int64
}

func newCaptureWorld(tb testing.TB) *captureWorld {
	tb.Helper()
	ctx := context.Background()
	src := etcdtest.Start(tb, false)
	etcd, err := clientv3.New(clientv3.Config{Endpoints: []string{src.Endpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop(), MaxCallSendMsgSize: 17 << 20})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { etcd.Close() })
	w := &captureWorld{etcd: etcd, member: src, agent: &agentAs{}, fence: newLeaseFence("delta-pod", 3)}
	for i := range 20 {
		w.put(tb, fmt.Sprintf("/registry/base/%02d", i), "v")
	}
	w.srv = servertest.StartWith(tb, servertest.Options{
		Targets:    []config.Target{{Name: "cp", Endpoints: []string{src.Endpoint}, InsecurePlaintext: true, Deltas: &config.Deltas{}}},
		AgentGuard: w.agent, DeltaFence: w.fence,
	})
	// The full backup: a real snapshot, stored as the target's agent
	// stores it, with the revision read from the snapshot itself.
	snap := filepath.Join(tb.TempDir(), "full.db")
	if _, err := etcdsnapshot.SaveWithVersion(ctx, zap.NewNop(), clientv3.Config{Endpoints: []string{src.Endpoint}, Logger: zap.NewNop()}, snap); err != nil {
		tb.Fatal(err)
	}
	st, err := snapshot.Check(snap)
	if err != nil {
		tb.Fatal(err)
	}
	w.full = st.Revision
	w.agent.set("cp", "cp-full", false)
	f, err := os.Open(snap)
	if err != nil {
		tb.Fatal(err)
	}
	_, err = w.srv.AgentClient.Upload(ctx, f, &ebv1.UploadHeader{Name: "cp-full", Etcd: &ebv1.EtcdInfo{Revision: st.Revision, SnapshotStatus: true}}, nil)
	f.Close()
	if err != nil {
		tb.Fatal(err)
	}
	w.agent.mu.Lock()
	w.agent.a = auth.Agent{Kind: agentjob.Delta, JobNamespace: serverNS, JobName: "delta-cp", Backup: "cp-full", Location: "default", Target: "cp", Pod: "delta-pod"}
	w.agent.mu.Unlock()
	w.store = &agentdelta.ServerStore{Client: w.srv.AgentClient, Chain: "cp-full", Target: "cp"}
	return w
}

func (w *captureWorld) put(tb testing.TB, k, v string, opts ...clientv3.OpOption) int64 {
	tb.Helper()
	r, err := w.etcd.Put(context.Background(), k, v, opts...)
	if err != nil {
		tb.Fatal(err)
	}
	return r.Header.Revision
}

// capture runs the real delta agent on cp-full's chain until stop; done
// then says how it ended.
func (w *captureWorld) capture(tb testing.TB, period time.Duration) (stop func(), done chan error) {
	return w.captureTo(tb, w.store, period)
}

// captureTo is capture storing through store.
func (w *captureWorld) captureTo(tb testing.TB, store agentdelta.Store, period time.Duration) (stop func(), done chan error) {
	ctx, cancel := context.WithCancel(context.Background())
	done = make(chan error, 1)
	go func() {
		_, err := agentdelta.Run(ctx, agentdelta.Options{Etcd: w.etcd, Store: store, Chain: "cp-full", Epoch: func() int64 { return int64(w.fence.transitions.Load()) },
			Period: period, Compression: ebv1.CompressionZstd})
		done <- err
	}()
	var once sync.Once
	tb.Cleanup(func() { once.Do(func() { cancel(); <-done }) })
	return cancel, done
}

// waitStored waits until the stored chain holds rev.
func (w *captureWorld) waitStored(tb testing.TB, rev int64, within time.Duration) {
	tb.Helper()
	waitChain(tb, w.store, rev, within)
}

// waitChain waits until store's chain holds rev.
func waitChain(tb testing.TB, store *agentdelta.ServerStore, rev int64, within time.Duration) {
	tb.Helper()
	var next int64
	err := wait.PollUntilContextTimeout(context.Background(), 10*time.Millisecond, within, true, func(ctx context.Context) (bool, error) {
		var err error
		next, _, err = store.Position(ctx)
		return next > rev, err
	})
	if err != nil {
		tb.Fatalf("chain %s reached only revision %d within %s, want %d: %v", store.Chain, next-1, within, rev, err)
	}
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
	compareKeyspace(t, fmt.Sprintf("revision %d", rev), got.Kvs, want.Kvs)
}

// compareKeyspace compares a restored keyspace with the source's, key by
// key: value, create and mod revisions, version and lease.
func compareKeyspace(t *testing.T, what string, got, want []*mvccpb.KeyValue) {
	t.Helper()
	key := func(kv *mvccpb.KeyValue) string {
		return fmt.Sprintf("%s create=%d mod=%d version=%d lease=%x value=%q", kv.Key, kv.CreateRevision, kv.ModRevision, kv.Version, kv.Lease, kv.Value)
	}
	short := func(s string) string {
		if len(s) > 200 {
			return s[:200] + "…"
		}
		return s
	}
	if len(got) != len(want) {
		t.Errorf("%s: restored %d keys, the source had %d", what, len(got), len(want))
	}
	for i := range min(len(got), len(want)) {
		if g, w := key(got[i]), key(want[i]); g != w {
			t.Errorf("%s, key %d:\n restored %s\n source   %s", what, i, short(g), short(w))
		}
	}
}

// BenchmarkDeltaRecoveryPoint measures the recovery point of delta
// capture — how long after etcd acknowledged a write it is stored in a
// delta segment, so that a restore can reach it — with the real agent,
// a real etcd and a real server, at steady write rates with a 1 s
// deltas.period, side by side in one run. It reports the median and the
// worst, their ratio to the period, and the stored bytes per 10,000
// writes.
func BenchmarkDeltaRecoveryPoint(b *testing.B) {
	const period = time.Second
	for _, rate := range []int{100, 1000} {
		b.Run(fmt.Sprintf("writes-%d-per-second", rate), func(b *testing.B) {
			for range b.N {
				w := newCaptureWorld(b)
				stop, _ := w.capture(b, period)
				const d = 10 * time.Second
				lags, writes := w.measureLag(b, rate, d)
				stop()
				slices.Sort(lags)
				median, worst := lags[len(lags)/2], lags[len(lags)-1]
				resp, err := w.srv.Client.Backups.GetBackup(context.Background(), &ebv1.GetBackupRequest{Name: "cp-full"})
				if err != nil {
					b.Fatal(err)
				}
				b.ReportMetric(float64(writes)/d.Seconds(), "writes/s")
				b.ReportMetric(median.Seconds(), "median-lag-s")
				b.ReportMetric(worst.Seconds(), "worst-lag-s")
				b.ReportMetric(worst.Seconds()/period.Seconds(), "worst/period")
				b.ReportMetric(float64(resp.GetBackup().GetChain().GetBytes())/float64(writes)*10000, "stored-B/10k-writes")
				if worst >= 2*period {
					b.Errorf("at %d writes/s a write waited %s to be stored, want less than twice the period (%s)", rate, worst, period)
				}
			}
		})
	}
}

// measureLag writes at rate for d and, for a sample of the writes, how
// long after etcd acknowledged each it was stored.
func (w *captureWorld) measureLag(tb testing.TB, rate int, d time.Duration) (lags []time.Duration, writes int) {
	type written struct {
		rev int64
		at  time.Time
	}
	tick := time.NewTicker(time.Second / time.Duration(rate))
	defer tick.Stop()
	var pending []written
	var asked time.Time
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		<-tick.C
		rev := w.put(tb, fmt.Sprintf("/registry/bench/%04d", writes%2000), strings.Repeat("v", 300))
		writes++
		if writes%max(rate/20, 1) == 0 {
			pending = append(pending, written{rev, time.Now()})
		}
		if time.Since(asked) < 20*time.Millisecond {
			continue
		}
		// Where the stored chain ends, every 20 ms (each ask lists the
		// location): the lags are that much coarse at most.
		asked = time.Now()
		next, _, err := w.store.Position(context.Background())
		if err != nil {
			tb.Fatal(err)
		}
		for len(pending) > 0 && pending[0].rev < next {
			lags = append(lags, time.Since(pending[0].at))
			pending = pending[1:]
		}
	}
	for _, p := range pending {
		w.waitStored(tb, p.rev, time.Minute)
		lags = append(lags, time.Since(p.at))
	}
	return lags, writes
}
