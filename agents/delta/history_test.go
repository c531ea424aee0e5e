package delta_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	agent "github.com/kubectl-etcdbackup/kubectl-etcdbackup/agents/delta"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/delta"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/internal/etcdtest"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/snapshot"
)

// A chain whose stored end is ahead of etcd (etcd restored without a
// revision bump, or re-created): the agent must not wait for etcd to
// reach the chain's next revision and append the new history to the old
// chain; it ends the chain as a history break, storing nothing of the new
// history (review finding 2).
func TestChainEndsWhenEtcdIsBehindTheChain(t *testing.T) {
	te := etcdtest.Start(t, false)
	c := te.Client(t)
	ctx := context.Background()
	cur := rev(t, c)
	store := &memStore{start: cur + 50}
	r := start(ctx, agent.Options{Etcd: c, Store: store, Chain: "full-1", Epoch: epoch1, Period: 100 * time.Millisecond})
	for i := range 100 {
		if _, err := c.Put(ctx, fmt.Sprintf("/new/%03d", i), "x"); err != nil {
			t.Fatal(err)
		}
	}
	res, err := r.wait(t)
	if err != nil {
		t.Fatal(err)
	}
	segs := store.segments()
	if len(segs) != 1 || segs[0].Summary.Revisions != 0 || !segs[0].HistoryBreak {
		t.Fatalf("stored %d segments (first: %+v); want only an end segment marking a history break", len(segs), segs)
	}
	if !strings.Contains(res.ChainEnded, "went back") || !strings.Contains(res.ChainEnded, fmt.Sprint(cur+49)) {
		t.Fatalf("chain ended: %q; want it to say etcd's revision went back below %d", res.ChainEnded, cur+49)
	}
}

// etcd's history grew past the chain's end while no agent ran, with other
// writes: the revision the chain ends at holds another write, so the
// chain ends there (review finding 2, a reinstalled etcd).
func TestChainEndsWhenEtcdHoldsAnotherWriteAtItsEnd(t *testing.T) {
	te := etcdtest.Start(t, false)
	c := te.Client(t)
	ctx := context.Background()
	resp, err := c.Put(ctx, "/app/config", "new history")
	if err != nil {
		t.Fatal(err)
	}
	held := resp.Header.Revision
	old := sha256.Sum256([]byte("old history"))
	store := &memStore{start: held + 1, stored: []agent.Segment{{
		Name:      agent.SegmentName("full-1", held),
		Summary:   delta.Summary{Header: delta.Header{Chain: "full-1", Epoch: 1, FirstRevision: held}, LastRevision: held, Revisions: 1, Events: 1},
		LastEvent: &agent.Event{Key: []byte("/app/config"), ValueSHA256: hex.EncodeToString(old[:])},
	}}}
	res, err := start(ctx, agent.Options{Etcd: c, Store: store, Chain: "full-1", Epoch: epoch1}).wait(t)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(res.ChainEnded, "another write at revision") || !strings.Contains(res.ChainEnded, "/app/config") {
		t.Fatalf("chain ended: %q; want it to name the write that differs", res.ChainEnded)
	}
	if segs := store.segments(); len(segs) != 2 || !segs[1].HistoryBreak {
		t.Fatalf("stored %+v; want the end segment marking a history break", segs)
	}

	// The same write: the chain goes on.
	same := sha256.Sum256([]byte("new history"))
	store = &memStore{start: held + 1, stored: []agent.Segment{{
		Name:      agent.SegmentName("full-1", held),
		Summary:   delta.Summary{Header: delta.Header{Chain: "full-1", Epoch: 1, FirstRevision: held}, LastRevision: held, Revisions: 1, Events: 1},
		LastEvent: &agent.Event{Key: []byte("/app/config"), ValueSHA256: hex.EncodeToString(same[:])},
	}}}
	runCtx, stop := context.WithCancel(ctx)
	r := start(runCtx, agent.Options{Etcd: c, Store: store, Chain: "full-1", Epoch: epoch1, Period: 50 * time.Millisecond})
	next, err := c.Put(ctx, "/app/more", "x")
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the next revision stored", func() bool { return store.last() >= next.Header.Revision })
	stop()
	if res, err := r.wait(t); err != nil || res.ChainEnded != "" {
		t.Fatalf("capture on the same history: %+v, %v", res, err)
	}
}

// etcd restored in place without a revision bump under a running agent,
// from a snapshot taken while the agent held writes it had not stored
// yet: etcd's client resumes the watch after the restart and nothing in
// it says that etcd changed; the new history reaches past what the agent
// received and its writes follow on. The agent must see at its next cut
// that etcd no longer holds what it received, store nothing of the mixed
// segment, and end the chain as a history break where it was last
// stored (review finding 2, the sandbox's case, found by its e2e test).
func TestRunningAgentSeesEtcdRestoredUnderIt(t *testing.T) {
	te := etcdtest.Start(t, false)
	c := te.Client(t)
	ctx := context.Background()
	store := &memStore{start: rev(t, c) + 1}
	// Now is read once per revision the agent takes: the test knows
	// what it holds. The period never ends; a big write cuts.
	var taken atomic.Int64
	now := func() time.Time { taken.Add(1); return time.Now() }
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	r := start(runCtx, agent.Options{Etcd: c, Store: store, Chain: "full-1", Epoch: epoch1, Period: time.Hour, MaxBytes: 64 << 10, Now: now})
	write := func(key, value string) int64 {
		t.Helper()
		resp, err := c.Put(ctx, key, value)
		if err != nil {
			t.Fatal(err)
		}
		return resp.Header.Revision
	}
	for i := range 10 {
		write(fmt.Sprintf("/old/a%02d", i), "old")
	}
	waitFor(t, "the agent holding 10 revisions", func() bool { return taken.Load() == 10 })
	snap := saveSnapshot(t, c)
	var oldEnd int64
	for i := range 10 {
		oldEnd = write(fmt.Sprintf("/old/b%02d", i), "old")
	}
	waitFor(t, "the agent holding 20 revisions", func() bool { return taken.Load() == 20 })
	if n := len(store.segments()); n != 0 {
		t.Fatalf("%d segments stored before the restore; want the writes held", n)
	}

	restoreInPlace(t, te, snap)
	// The new history passes the old one's end, then a write over
	// MaxBytes makes the agent cut.
	for rev(t, c) <= oldEnd {
		write("/new/filler", "new")
	}
	write("/new/big", strings.Repeat("n", 70<<10))
	waitFor(t, "the agent storing a segment", func() bool { return len(store.segments()) > 0 })
	stop()
	res, err := r.wait(t)
	if err != nil {
		t.Fatal(err)
	}
	segs := store.segments()
	if len(segs) != 1 || segs[0].Summary.Revisions != 0 || !segs[0].HistoryBreak || segs[0].Summary.FirstRevision != store.start {
		t.Fatalf("stored %+v; want only an empty end segment at revision %d marking a history break", segs, store.start)
	}
	if !strings.Contains(res.ChainEnded, "changed under the running agent") || !strings.Contains(res.ChainEnded, fmt.Sprintf("ends at revision %d", store.start-1)) {
		t.Fatalf("chain ended: %q; want it to say etcd changed under the agent and where the chain ends", res.ChainEnded)
	}
}

// The same restore under a running agent, where the last revision the
// chain stored is a delete and the new history never had that key: the
// key is absent at that revision in both histories, so absence proves
// nothing. The agent must also see that the key was there just before,
// and end the chain holding none of the new history (found by
// TestPointRestoreOracle, seed 1796505340066441378).
func TestRunningAgentSeesARestoreUnderAStoredDelete(t *testing.T) {
	te := etcdtest.Start(t, false)
	c := te.Client(t)
	ctx := context.Background()
	snap := saveSnapshot(t, c)
	store := &memStore{start: rev(t, c) + 1}
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	r := start(runCtx, agent.Options{Etcd: c, Store: store, Chain: "full-1", Epoch: epoch1, Period: 20 * time.Millisecond})
	for i := range 5 {
		if _, err := c.Put(ctx, fmt.Sprintf("/old/a%02d", i), "old"); err != nil {
			t.Fatal(err)
		}
	}
	del, err := c.Delete(ctx, "/old/a04")
	if err != nil {
		t.Fatal(err)
	}
	oldEnd := del.Header.Revision
	waitFor(t, "the delete stored", func() bool { return store.last() == oldEnd })

	restoreInPlace(t, te, snap)
	for rev(t, c) <= oldEnd+5 {
		if _, err := c.Put(ctx, "/new/filler", "new"); err != nil {
			t.Fatal(err)
		}
	}
	res, err := r.wait(t)
	if err != nil {
		t.Fatal(err)
	}
	segs := store.segments()
	if end := segs[len(segs)-1]; !end.HistoryBreak || end.Summary.Revisions != 0 || end.Summary.FirstRevision != oldEnd+1 {
		t.Fatalf("the chain ended with %+v; want an empty end segment at revision %d marking a history break", end.Summary, oldEnd+1)
	}
	if !strings.Contains(res.ChainEnded, "history changed") || !strings.Contains(res.ChainEnded, "/old/a04") {
		t.Fatalf("chain ended: %q; want it to say etcd's history changed at the deleted key", res.ChainEnded)
	}
}

// saveSnapshot writes etcd's snapshot, as its client streams it, into a
// new file and returns its path.
func saveSnapshot(t *testing.T, c *clientv3.Client) string {
	t.Helper()
	snap := filepath.Join(t.TempDir(), "snap.db")
	f, err := os.Create(snap)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rc, err := c.Snapshot(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	if _, err := f.ReadFrom(rc); err != nil {
		t.Fatal(err)
	}
	return snap
}

// restoreInPlace restores te from snap without a revision bump, as an
// operator restoring in place does, and starts it again on that data:
// same URL, same cluster and member IDs.
func restoreInPlace(t *testing.T, te *etcdtest.Etcd, snap string) {
	t.Helper()
	zero := int64(0)
	dir := filepath.Join(t.TempDir(), "restored")
	if _, err := snapshot.Restore(snap, snapshot.Member{Name: te.Name, InitialCluster: te.InitialCluster,
		InitialAdvertisePeerURLs: []string{te.PeerURL}, DataDir: dir, BumpRevision: &zero}); err != nil {
		t.Fatal(err)
	}
	te.RestartOn(t, dir)
}

// An etcd of another cluster under the target's name ends the chain.
func TestChainEndsOnAnotherCluster(t *testing.T) {
	te := etcdtest.Start(t, false)
	c := te.Client(t)
	store := &memStore{start: rev(t, c) + 1, clusterID: 0x1234}
	res, err := start(context.Background(), agent.Options{Etcd: c, Store: store, Chain: "full-1", Epoch: epoch1}).wait(t)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(res.ChainEnded, "cluster 1234") || len(store.segments()) != 1 || !store.segments()[0].HistoryBreak {
		t.Fatalf("chain ended %q, stored %+v; want a history break naming the full's cluster", res.ChainEnded, store.segments())
	}
}

// A writer whose Lease was re-created (its transitions back at 0) never
// records an epoch older than the chain's (review finding 7).
func TestEpochsOnlyGrow(t *testing.T) {
	te := etcdtest.Start(t, false)
	c := te.Client(t)
	ctx, stop := context.WithCancel(context.Background())
	store := &memStore{start: rev(t, c) + 1, epoch: 6}
	r := start(ctx, agent.Options{Etcd: c, Store: store, Chain: "full-1", Epoch: func() int64 { return 0 }, Period: 50 * time.Millisecond})
	resp, err := c.Put(context.Background(), "k", "v")
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the write stored", func() bool { return store.last() >= resp.Header.Revision })
	stop()
	if _, err := r.wait(t); err != nil {
		t.Fatal(err)
	}
	for _, s := range store.segments() {
		if s.Summary.Epoch != 6 {
			t.Fatalf("segment %s records epoch %d after the chain's 6", s.Name, s.Summary.Epoch)
		}
	}
}

// Users and roles are not in the watch stream; each segment records
// etcd's auth revision as it is stored, so that a restore to a point can
// warn that they changed after the full.
func TestSegmentsRecordTheAuthRevision(t *testing.T) {
	te := etcdtest.Start(t, false)
	c := te.Client(t)
	ctx := context.Background()
	store := &memStore{start: rev(t, c) + 1}
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	r := start(runCtx, agent.Options{Etcd: c, Store: store, Chain: "full-1", Epoch: epoch1, Period: 50 * time.Millisecond})
	put := func(k string) {
		t.Helper()
		resp, err := c.Put(ctx, k, "v")
		if err != nil {
			t.Fatal(err)
		}
		waitFor(t, "the write stored", func() bool { return store.last() == resp.Header.Revision })
	}
	put("/before")
	before := store.segments()
	if _, err := c.UserAdd(ctx, "alice", "secret"); err != nil {
		t.Fatal(err)
	}
	put("/after")
	stop()
	if _, err := r.wait(t); err != nil {
		t.Fatal(err)
	}
	segs := store.segments()
	first, last := before[len(before)-1].AuthRevision, segs[len(segs)-1].AuthRevision
	if first == 0 || last <= first {
		t.Fatalf("auth revision %d in the segment before a user was added, %d after; want it recorded and grown", first, last)
	}
}
