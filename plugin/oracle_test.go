package plugin

import (
	"cmp"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	etcdsnapshot "go.etcd.io/etcd/client/v3/snapshot"
	"go.uber.org/zap"
	"k8s.io/apimachinery/pkg/util/wait"

	agentdelta "github.com/kubectl-etcdbackup/kubectl-etcdbackup/agents/delta"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/agents/fold"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/agentjob"
	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/fetch"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/auth"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/config"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/jobs"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/servertest"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/snapshot"
)

// Environment variables of TestPointRestoreOracle: the seed (printed on
// every run) and how long it restores and compares points.
const (
	oracleSeedEnv   = "ETCDBACKUP_ORACLE_SEED"
	oracleBudgetEnv = "ETCDBACKUP_ORACLE_BUDGET"
)

// TestPointRestoreOracle restores points of a real etcd under a random,
// seeded workload — puts of small and large values, deletes, range
// deletes, multi-operation transactions, one revision larger than a
// segment frame, leases granted, revoked and expiring, a compaction —
// captured by real delta agents into a real server while the agent is
// killed and its Lease taken over, a new full backup is taken mid-stream
// whose chain's agent starts later, as the controller starts it, and that
// chain is folded while its agent goes on, and etcd is restored in place
// without a revision bump under the fold's running chain (from a
// snapshot inside it), after which a new full starts the next chain.
// Every point restored with the real command
// is compared key by key (value, create and mod revision, version,
// lease) with what etcd itself answered at that revision, read as the
// workload ran, before any compaction. Time points are taken right after
// writes stored on the old chain after the new full was taken (the
// window where the new chain has not caught up): each must hold that
// write, and right after writes of the history after the restore, which
// must be planned on the new chain. Rounds of workload (seeds seed, seed+1, …) and their points run
// until ETCDBACKUP_ORACLE_BUDGET (default 1m) is spent, at least one;
// ETCDBACKUP_ORACLE_SEED replays a round.
func TestPointRestoreOracle(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv(oracleSeedEnv); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("%s=%q: %v", oracleSeedEnv, s, err)
		}
		seed = v
	}
	budget := time.Minute
	if s := os.Getenv(oracleBudgetEnv); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil {
			t.Fatalf("%s=%q: %v", oracleBudgetEnv, s, err)
		}
		budget = d
	}
	// Rounds of one workload each, seed, seed+1, …, until the budget is
	// spent (at least one, whose points take what the budget leaves).
	deadline := time.Now().Add(budget)
	points, rounds := 0, 0
	for s := seed; rounds == 0 || time.Now().Before(deadline); s++ {
		rounds++
		t.Run(fmt.Sprintf("seed-%d", s), func(t *testing.T) {
			t.Logf("%s=%d reproduces this round", oracleSeedEnv, s)
			defer func() {
				if t.Failed() {
					t.Logf("failed with seed %d: rerun with %s=%d", s, oracleSeedEnv, s)
				}
			}()
			points += oracleRound(t, s, deadline)
		})
		if t.Failed() {
			break
		}
	}
	t.Logf("checked %d points in %d rounds of workload (seeds %d..%d) against etcd's answers", points, rounds, seed, seed+uint64(rounds)-1)
}

// oracleRound runs one seeded workload and checks its points until
// deadline; it returns how many it checked.
func oracleRound(t *testing.T, seed uint64, deadline time.Time) int {
	o := newOracle(t, seed)
	ctx := context.Background()

	// Phase A: the first chain, its agent killed once and the Lease
	// taken over (transitions +1), a compaction behind the agent.
	stop := o.runAgent(t, o.w.store, "cp-full")
	o.workload(t, 30)
	o.bigRevision(t)
	o.workload(t, 30)
	o.w.waitStored(t, o.last, time.Minute)
	stop()
	o.w.fence.transitions.Add(1)
	stop = o.runAgent(t, o.w.store, "cp-full")
	o.workload(t, 60)
	o.w.waitStored(t, o.last, time.Minute)
	if _, err := o.w.etcd.Compact(ctx, o.last-10); err != nil {
		t.Fatal(err)
	}

	// Phase B: a new full is taken while the first chain's agent runs;
	// writes after it are stored on the first chain only, each one
	// waited for, so that its stamp is its segment's last.
	full2 := o.takeFull(t, o.fullUp, "cp-full2")
	var afterFull []timed
	for range 4 {
		o.workload(t, 1)
		o.w.waitStored(t, o.last, time.Minute)
		afterFull = append(afterFull, o.stampOf(t, "cp-full", o.last))
	}
	o.w.waitStored(t, o.last, time.Minute)
	stop()

	// Phase C: the new chain's agent, started later (a new Lease
	// holder), catches up from the new full and goes on.
	o.w.fence.transitions.Add(1)
	store2 := &agentdelta.ServerStore{Client: o.chain2.AgentClient, Chain: "cp-full2", Target: "cp"}
	stop = o.runAgent(t, store2, "cp-full2")
	o.workload(t, 40)
	waitChain(t, store2, o.last, time.Minute)

	// Phase D: the second chain is folded while its agent goes on; writes
	// after the fold are stored on the second chain only; then the fold's
	// chain starts, later, as the controller starts it.
	folded := o.fold(t, "cp-full2", o.last)
	for range 3 {
		o.workload(t, 1)
		waitChain(t, store2, o.last, time.Minute)
		afterFull = append(afterFull, o.stampOf(t, "cp-full2", o.last))
	}
	stop()
	o.w.fence.transitions.Add(1)
	chain3 := o.replica(t, auth.Agent{Kind: agentjob.Delta, JobNamespace: serverNS, JobName: "delta-cp-3", Backup: folded, Location: "default", Target: "cp", Pod: "delta-pod"})
	store3 := &agentdelta.ServerStore{Client: chain3.AgentClient, Chain: folded, Target: "cp"}
	stop = o.runAgent(t, store3, folded)
	o.workload(t, 20)
	waitChain(t, store3, o.last, time.Minute)

	// Phase E: etcd restored in place without a revision bump while the
	// fold's chain runs, from a snapshot taken inside that chain (the two
	// histories agree up to it), with writes the agent may hold unstored.
	// etcd's client resumes the agent's watch; the new history passes the
	// old one's end. The chain must end as a history break holding none
	// of the new history; a new full, taken later, starts the next chain.
	snap := o.snapshot(t)
	o.workload(t, 20)
	waitChain(t, store3, o.last, time.Minute)
	o.workload(t, 5)
	oldLast := o.last
	o.restoreInPlace(t, snap)
	for o.last <= oldLast+5 {
		o.workload(t, 1)
	}
	chain3End := waitChainEnd(t, store3, time.Minute)
	stop()
	if chain3End > oldLast {
		t.Fatalf("the chain of %s holds revisions up to %d, past the old history's end %d: it took writes of the new history", folded, chain3End, oldLast)
	}
	full4 := o.takeFull(t, o.replica(t, auth.Agent{Kind: agentjob.Backup, JobNamespace: serverNS, JobName: "backup-cp-full4", Backup: "cp-full4", Location: "default", Target: "cp"}), "cp-full4")
	o.w.fence.transitions.Add(1)
	chain4 := o.replica(t, auth.Agent{Kind: agentjob.Delta, JobNamespace: serverNS, JobName: "delta-cp-4", Backup: "cp-full4", Location: "default", Target: "cp", Pod: "delta-pod"})
	store4 := &agentdelta.ServerStore{Client: chain4.AgentClient, Chain: "cp-full4", Target: "cp"}
	stop = o.runAgent(t, store4, "cp-full4")
	var afterRestore []timed
	for range 3 {
		// One operation that makes a revision (a delete may not).
		for before := o.last; o.last == before; {
			o.workload(t, 1)
		}
		waitChain(t, store4, o.last, time.Minute)
		afterRestore = append(afterRestore, o.stampOf(t, "cp-full4", o.last))
	}
	o.workload(t, 20)
	waitChain(t, store4, o.last, time.Minute)
	stop()
	t.Logf("workload: revisions %d..%d, second full at %d, fold %s, restored in place at revision %d under it (its chain ends at %d), new full at %d, last %d; %d revisions read from etcd",
		o.w.full, oldLast, full2, folded, snap.rev, chain3End, full4, o.last, len(o.old)+len(o.want))

	// The points: first the time points right after writes stored after
	// the new full, then revisions at random, until the budget is spent.
	checked := 0
	for _, p := range afterFull {
		rev, _ := o.point(t, o.old, "--to-time", p.at.Format(time.RFC3339Nano))
		if rev < p.rev {
			t.Errorf("restore to %s, when revision %d was stored with that time on the old chain: came back at revision %d, without it",
				p.at.Format(time.RFC3339Nano), p.rev, rev)
		}
		checked++
	}
	for _, p := range afterRestore {
		rev, out := o.point(t, o.want, "--to-time", p.at.Format(time.RFC3339Nano))
		if rev != p.rev || !strings.Contains(out, `after backup "cp-full4"`) {
			t.Errorf("restore to %s, the time revision %d of the history after the restore was stored with: came back at revision %d, planned as\n%s", p.at.Format(time.RFC3339Nano), p.rev, rev, out)
		}
		checked++
	}
	// Revisions of the old history its chains hold, and of the new one
	// from its full on.
	type candidate struct {
		rev  int64
		want map[int64][]*mvccpb.KeyValue
	}
	var revs []candidate
	for r := range o.old {
		if r <= chain3End {
			revs = append(revs, candidate{r, o.old})
		}
	}
	for r := range o.want {
		if r >= full4 {
			revs = append(revs, candidate{r, o.want})
		}
	}
	slices.SortFunc(revs, func(a, b candidate) int { return cmp.Compare(a.rev, b.rev) })
	o.rng.Shuffle(len(revs), func(i, j int) { revs[i], revs[j] = revs[j], revs[i] })
	for _, c := range revs {
		if time.Now().After(deadline) || t.Failed() {
			break
		}
		if got, _ := o.point(t, c.want, "--to-revision", fmt.Sprint(c.rev)); got != c.rev {
			t.Errorf("restore to revision %d came back at revision %d", c.rev, got)
		}
		checked++
	}
	t.Logf("checked %d points of %d revisions (seed %d)", checked, len(revs), seed)
	return checked
}

// timed is a revision and the time its chain's agent stamped it with.
type timed struct {
	rev int64
	at  time.Time
}

// stored is a snapshot file of etcd and its revision.
type stored struct {
	path string
	rev  int64
}

// snapshot saves etcd's snapshot now.
func (o *oracle) snapshot(t *testing.T) stored {
	t.Helper()
	path := filepath.Join(t.TempDir(), "inplace.db")
	cfg := clientv3.Config{Endpoints: o.w.etcd.Endpoints(), Logger: zap.NewNop()}
	if _, err := etcdsnapshot.SaveWithVersion(context.Background(), zap.NewNop(), cfg, path); err != nil {
		t.Fatal(err)
	}
	st, err := snapshot.Check(path)
	if err != nil {
		t.Fatal(err)
	}
	return stored{path: path, rev: st.Revision}
}

// restoreInPlace restores snap into etcd's member without a revision
// bump, as an operator restores in place: the same member, the same
// URLs and cluster ID. What the workload reads from now on is another
// history.
func (o *oracle) restoreInPlace(t *testing.T, snap stored) {
	t.Helper()
	m := o.w.member
	zero := int64(0)
	dir := filepath.Join(t.TempDir(), "restored-in-place")
	if _, err := snapshot.Restore(snap.path, snapshot.Member{Name: m.Name, InitialCluster: m.InitialCluster,
		InitialAdvertisePeerURLs: []string{m.PeerURL}, DataDir: dir, BumpRevision: &zero}); err != nil {
		t.Fatal(err)
	}
	m.RestartOn(t, dir)
	o.old, o.want, o.leases, o.last = o.want, map[int64][]*mvccpb.KeyValue{}, nil, 0
	o.read(t)
}

// waitChainEnd waits for store's chain to end as a history break and
// returns the last revision it holds.
func waitChainEnd(t *testing.T, store *agentdelta.ServerStore, within time.Duration) int64 {
	t.Helper()
	var ch *ebv1.DeltaChain
	err := wait.PollUntilContextTimeout(context.Background(), 10*time.Millisecond, within, true, func(ctx context.Context) (bool, error) {
		resp, err := store.Client.Backups.GetBackup(ctx, &ebv1.GetBackupRequest{Name: store.Chain})
		ch = resp.GetBackup().GetChain()
		return ch.GetEndReason() != "", err
	})
	if err != nil {
		t.Fatalf("chain %s did not end within %s (it holds revisions up to %d): %v", store.Chain, within, ch.GetLastRevision(), err)
	}
	if r := ch.GetEndReason(); !strings.Contains(r, "history changed") && !strings.Contains(r, "revision went back") {
		t.Fatalf("chain %s ended with %q; want a history break", store.Chain, r)
	}
	return ch.GetLastRevision()
}

// oracle is a captureWorld under a seeded workload, with what etcd
// answered at each revision the workload made.
type oracle struct {
	w   *captureWorld
	rng *rand.Rand
	// want is etcd's keyspace at revision, read right after the write;
	// old is want of the history before etcd was restored in place.
	want, old map[int64][]*mvccpb.KeyValue
	last      int64
	// leases the workload granted and has not revoked.
	leases []clientv3.LeaseID
	// fullUp stores full backups; chain2 is the second chain's agent's
	// server: replicas of the test's server on its storage, each
	// admitting its one agent.
	fullUp, chain2 *servertest.Server
	// replica starts another, admitting agent a.
	replica func(t *testing.T, a auth.Agent) *servertest.Server
}

// fold folds chain up to rev with the real fold agent, as its Job runs it,
// and returns the new full's name.
func (o *oracle) fold(t *testing.T, chain string, rev int64) string {
	t.Helper()
	ctx := context.Background()
	resp, err := o.w.srv.Client.Backups.ListBackups(ctx, &ebv1.ListBackupsRequest{Chain: chain})
	if err != nil {
		t.Fatal(err)
	}
	full, err := o.w.srv.Client.Backups.GetBackup(ctx, &ebv1.GetBackupRequest{Name: chain})
	if err != nil {
		t.Fatal(err)
	}
	in := fold.Inputs{Full: fetch.Pin{Name: chain, SHA256: full.GetBackup().GetSha256()}, ToRevision: rev}
	segs := resp.GetBackups()
	slices.SortFunc(segs, func(a, b *ebv1.Backup) int {
		return cmp.Compare(a.GetDelta().GetFirstRevision(), b.GetDelta().GetFirstRevision())
	})
	for _, b := range segs {
		if b.GetDelta().GetFirstRevision() <= rev {
			in.Segments = append(in.Segments, fetch.Pin{Name: b.GetName(), SHA256: b.GetSha256()})
		}
	}
	pins := map[string]string{in.Full.Name: in.Full.SHA256}
	for _, r := range in.Segments {
		pins[r.Name] = r.SHA256
	}
	name := jobs.FoldName("cp", rev)
	folder := o.replica(t, auth.Agent{Kind: agentjob.Fold, JobNamespace: serverNS, JobName: "fold-cp", Backup: name, Location: "default", Target: "cp", Inputs: pins})
	res, err := fold.Run(ctx, folder.AgentClient, fold.Options{Inputs: in, Target: "cp", Name: name, Compression: ebv1.CompressionZstd, ScratchDir: t.TempDir()})
	if err != nil || !res.Succeeded {
		t.Fatalf("fold of %s to %d: %+v, %v", chain, rev, res, err)
	}
	return name
}

func newOracle(t *testing.T, seed uint64) *oracle {
	w := newCaptureWorld(t)
	o := &oracle{w: w, rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), want: map[int64][]*mvccpb.KeyValue{}, last: w.full}
	replica := func(a auth.Agent) *servertest.Server {
		return servertest.StartWith(t, servertest.Options{
			Dir:        w.srv.Dir,
			Targets:    []config.Target{{Name: "cp", Endpoints: []string{"http://127.0.0.1:1"}, InsecurePlaintext: true, Deltas: &config.Deltas{}}},
			AgentGuard: servertest.AsAgent(a), DeltaFence: w.fence,
		})
	}
	o.replica = func(t *testing.T, a auth.Agent) *servertest.Server { return replica(a) }
	o.fullUp = replica(auth.Agent{Kind: agentjob.Backup, JobNamespace: serverNS, JobName: "backup-cp-full2", Backup: "cp-full2", Location: "default", Target: "cp"})
	o.chain2 = replica(auth.Agent{Kind: agentjob.Delta, JobNamespace: serverNS, JobName: "delta-cp-2", Backup: "cp-full2", Location: "default", Target: "cp", Pod: "delta-pod"})
	return o
}

// runAgent runs the real delta agent on chain until the returned stop.
func (o *oracle) runAgent(t *testing.T, store agentdelta.Store, chain string) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := agentdelta.Run(ctx, agentdelta.Options{Etcd: o.w.etcd, Store: store, Chain: chain,
			Epoch:  func() int64 { return int64(o.w.fence.transitions.Load()) },
			Period: 50 * time.Millisecond, Compression: ebv1.CompressionZstd})
		done <- err
	}()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("delta agent of chain %s: %v", chain, err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// workload makes n random operations, reading etcd's keyspace after each.
func (o *oracle) workload(t *testing.T, n int) {
	t.Helper()
	ctx := context.Background()
	c := o.w.etcd
	key := func() string { return fmt.Sprintf("/registry/w/%02d", o.rng.IntN(24)) }
	value := func() string {
		size := o.rng.IntN(200)
		if o.rng.IntN(20) == 0 {
			size = 64 << 10
		}
		b := make([]byte, size)
		for i := range b {
			b[i] = byte('a' + o.rng.IntN(26))
		}
		return string(b)
	}
	for range n {
		var err error
		switch op := o.rng.IntN(100); {
		case op < 45:
			_, err = c.Put(ctx, key(), value())
		case op < 55:
			_, err = c.Delete(ctx, key())
		case op < 60:
			_, err = c.Delete(ctx, fmt.Sprintf("/registry/w/%d", o.rng.IntN(3)), clientv3.WithPrefix())
		case op < 72:
			k := o.rng.Perm(24) // etcd refuses a key twice in one transaction
			at := func(i int) string { return fmt.Sprintf("/registry/w/%02d", k[i]) }
			_, err = c.Txn(ctx).Then(clientv3.OpPut(at(0), value()), clientv3.OpDelete(at(1)), clientv3.OpPut(at(2), value())).Commit()
		case op < 82:
			var l *clientv3.LeaseGrantResponse
			ttl := int64(600)
			if o.rng.IntN(4) == 0 {
				ttl = 3 // expires during the run: etcd writes the deletes
			}
			if l, err = c.Grant(ctx, ttl); err == nil {
				if ttl > 3 {
					o.leases = append(o.leases, l.ID)
				}
				_, err = c.Put(ctx, key(), value(), clientv3.WithLease(l.ID))
			}
		case op < 90 && len(o.leases) > 0:
			i := o.rng.IntN(len(o.leases))
			_, err = c.Revoke(ctx, o.leases[i])
			o.leases = slices.Delete(o.leases, i, i+1)
		case op < 95 && len(o.leases) > 0:
			_, err = c.Put(ctx, key(), value(), clientv3.WithLease(o.leases[o.rng.IntN(len(o.leases))]))
		default:
			_, err = c.Put(ctx, "/registry/w/counter", fmt.Sprint(o.rng.Int()))
		}
		if err != nil {
			t.Fatal(err)
		}
		o.read(t)
	}
}

// bigRevision makes one revision larger than a delta segment's frame
// (a transaction of five 1 MiB puts), which the agent splits across
// frames.
func (o *oracle) bigRevision(t *testing.T) {
	t.Helper()
	var ops []clientv3.Op
	for i := range 5 {
		b := make([]byte, 1<<20)
		for j := range b {
			b[j] = byte('a' + o.rng.IntN(26))
		}
		ops = append(ops, clientv3.OpPut(fmt.Sprintf("/registry/big/%d", i), string(b)))
	}
	if _, err := o.w.etcd.Txn(context.Background()).Then(ops...).Commit(); err != nil {
		t.Fatal(err)
	}
	o.read(t)
}

// read records etcd's keyspace at its current revision.
func (o *oracle) read(t *testing.T) {
	t.Helper()
	r, err := o.w.etcd.Get(context.Background(), "\x00", clientv3.WithFromKey())
	if err != nil {
		t.Fatal(err)
	}
	o.want[r.Header.Revision] = r.Kvs
	o.last = max(o.last, r.Header.Revision)
}

// takeFull stores a full backup of the etcd now, as its agent does, and
// returns its revision.
func (o *oracle) takeFull(t *testing.T, up *servertest.Server, name string) int64 {
	t.Helper()
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), name+".db")
	cfg := clientv3.Config{Endpoints: o.w.etcd.Endpoints(), Logger: zap.NewNop()}
	if _, err := etcdsnapshot.SaveWithVersion(ctx, zap.NewNop(), cfg, path); err != nil {
		t.Fatal(err)
	}
	st, err := snapshot.Check(path)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := up.AgentClient.Upload(ctx, f, &ebv1.UploadHeader{Name: name, Etcd: &ebv1.EtcdInfo{Revision: st.Revision, SnapshotStatus: true}}, nil); err != nil {
		t.Fatal(err)
	}
	o.read(t)
	return st.Revision
}

// stampOf is the time chain's agent stamped the segment holding rev with
// (its last revision's), and that revision: rev itself unless etcd wrote
// more (a lease's expiry) before the segment was cut.
func (o *oracle) stampOf(t *testing.T, chain string, rev int64) timed {
	t.Helper()
	segs, err := listChainSegments(context.Background(), &Connection{Client: o.w.srv.Client}, "", chain)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range segs {
		if s.FirstRevision <= rev && rev <= s.LastRevision {
			return timed{rev: s.LastRevision, at: s.LastTime}
		}
	}
	t.Fatalf("no segment of chain %s holds revision %d: %+v", chain, rev, segs)
	return timed{}
}

// point runs restoreAndCompare as a subtest, whose cleanup stops the
// restored member before the next point.
func (o *oracle) point(t *testing.T, want map[int64][]*mvccpb.KeyValue, point ...string) (rev int64, out string) {
	t.Run(fmt.Sprint(point), func(t *testing.T) { rev, out = o.restoreAndCompare(t, want, point...) })
	return rev, out
}

var restoredAt = regexp.MustCompile(`as it was at revision (\d+)`)

// restoreAndCompare restores target cp to point with restore --local,
// compares the restored keyspace with etcd's at the revision it came
// back at (in wants, the history the point is in), and returns that
// revision and what restore printed.
func (o *oracle) restoreAndCompare(t *testing.T, wants map[int64][]*mvccpb.KeyValue, point ...string) (int64, string) {
	t.Helper()
	dataDir := filepath.Join(t.TempDir(), "etcd")
	peer := freeURL(t)
	r := mustRun(t, append([]string{"--server-address=" + o.w.srv.Addr, "restore", "--local", "--target", "cp", "--data-dir", dataDir, "--member-name", "m1",
		"--initial-cluster", "m1=" + peer.String(), "--initial-advertise-peer-urls", peer.String()}, point...)...)
	m := restoredAt.FindStringSubmatch(r.out)
	if m == nil {
		t.Fatalf("restore to %v does not say the revision it restored:\n%s", point, r.out)
	}
	rev, _ := strconv.ParseInt(m[1], 10, 64)
	want, ok := wants[rev]
	if !ok {
		// A revision the workload did not read (a lease's expiry).
		t.Logf("restore to %v came back at revision %d, which the workload did not read (a lease expired); its keyspace is not compared", point, rev)
		return rev, r.out
	}
	restored := startEtcd(t, dataDir, "m1", peer)
	got, err := restored.Get(context.Background(), "\x00", clientv3.WithFromKey())
	if err != nil {
		t.Fatal(err)
	}
	compareKeyspace(t, fmt.Sprintf("restore to %v (revision %d)", point, rev), got.Kvs, want)
	return rev, r.out
}
