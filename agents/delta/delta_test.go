package delta_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"filippo.io/age"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/util/wait"

	agent "github.com/kubectl-etcdbackup/kubectl-etcdbackup/agents/delta"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/crypt"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/delta"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/internal/etcdtest"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/snapshot"
)

// memStore keeps a chain in memory and refuses what the server refuses:
// a segment that does not follow the chain, a name stored already.
type memStore struct {
	// start is where the chain starts (the full's revision + 1).
	start int64
	// put, if set, runs before a segment is stored; an error refuses it.
	put func(ctx context.Context, seg agent.Segment) error
	// clusterID and epoch are the full's cluster and the chain's epoch
	// before any segment.
	clusterID uint64
	epoch     int64
	// stored are segments the chain held before the test.
	stored []agent.Segment

	mu   sync.Mutex
	segs []agent.Segment
	puts int
}

func (s *memStore) State(ctx context.Context) (agent.ChainState, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := agent.ChainState{Next: s.start, ClusterID: s.clusterID, Epoch: s.epoch}
	if s.segs == nil && s.stored != nil {
		s.segs = append(s.segs, s.stored...)
	}
	if n := len(s.segs); n > 0 {
		last := s.segs[n-1]
		st.Next, st.Ended, st.Epoch = last.Summary.LastRevision+1, last.Summary.EndReason, last.Summary.Epoch
		for i := n - 1; i >= 0 && st.LastEvent == nil; i-- {
			st.LastEvent = s.segs[i].LastEvent
		}
	}
	return st, nil
}

func (s *memStore) Put(ctx context.Context, seg agent.Segment) error {
	s.mu.Lock()
	s.puts++
	s.mu.Unlock()
	if s.put != nil {
		if err := s.put(ctx, seg); err != nil {
			return err
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	want := s.start
	if n := len(s.segs); n > 0 {
		want = s.segs[n-1].Summary.LastRevision + 1
		if s.segs[n-1].Summary.EndReason != "" {
			return status.Error(codes.FailedPrecondition, "the chain ended")
		}
	}
	for _, have := range s.segs {
		if have.Name == seg.Name {
			return status.Errorf(codes.AlreadyExists, "%s exists", seg.Name)
		}
	}
	if seg.Summary.FirstRevision != want {
		return status.Errorf(codes.FailedPrecondition, "out of order: segment starts at %d, chain ends at %d", seg.Summary.FirstRevision, want-1)
	}
	s.segs = append(s.segs, seg)
	return nil
}

func (s *memStore) segments() []agent.Segment {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]agent.Segment(nil), s.segs...)
}

// last is the last revision stored, 0 if none.
func (s *memStore) last() int64 {
	segs := s.segments()
	if len(segs) == 0 {
		return 0
	}
	return segs[len(segs)-1].Summary.LastRevision
}

// waitFor polls cond until it holds, failing after 60 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	if err := wait.PollUntilContextTimeout(t.Context(), 10*time.Millisecond, 60*time.Second, true, func(context.Context) (bool, error) {
		return cond(), nil
	}); err != nil {
		t.Fatalf("timed out waiting for %s", what)
	}
}

// logWatch is a slog handler that counts messages containing a text.
type logWatch struct {
	slog.Handler
	text string
	n    *atomic.Int64
}

func (h logWatch) Handle(ctx context.Context, r slog.Record) error {
	if strings.Contains(r.Message, h.text) {
		h.n.Add(1)
	}
	return h.Handler.Handle(ctx, r)
}

func testLog(t *testing.T, text string) (*slog.Logger, *atomic.Int64) {
	n := &atomic.Int64{}
	var h slog.Handler = slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug})
	return slog.New(logWatch{Handler: h, text: text, n: n}), n
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

type running struct {
	done chan struct{}
	res  agent.Result
	err  error
}

func start(ctx context.Context, o agent.Options) *running {
	r := &running{done: make(chan struct{})}
	go func() {
		defer close(r.done)
		r.res, r.err = agent.Run(ctx, o)
	}()
	return r
}

func (r *running) wait(t *testing.T) (agent.Result, error) {
	t.Helper()
	select {
	case <-r.done:
		return r.res, r.err
	case <-time.After(60 * time.Second):
		t.Fatal("Run did not return")
		return agent.Result{}, nil
	}
}

func rev(t *testing.T, c *clientv3.Client) int64 {
	t.Helper()
	r, err := c.Get(context.Background(), "probe")
	if err != nil {
		t.Fatal(err)
	}
	return r.Header.Revision
}

func epoch1() int64 { return 1 }

// decoded is a stored chain, read back.
type decoded struct {
	revs    []delta.Revision
	leases  map[int64]delta.Lease
	summary []delta.Summary
}

// decode reads every segment of segs back, checking that they follow
// each other from start without gap or overlap.
func decode(t *testing.T, segs []agent.Segment, start int64, ids []age.Identity) decoded {
	t.Helper()
	d := decoded{leases: map[int64]delta.Lease{}}
	next := start
	for _, seg := range segs {
		var body io.Reader = bytes.NewReader(seg.Body)
		if len(seg.AgeRecipients) > 0 {
			var err error
			if body, err = crypt.Decrypt(body, ids); err != nil {
				t.Fatalf("%s: %v", seg.Name, err)
			}
		}
		var plain bytes.Buffer
		if _, err := snapshot.DecompressLimit(context.Background(), &plain, body, seg.Compression, seg.RawSize); err != nil {
			t.Fatalf("%s: %v", seg.Name, err)
		}
		if int64(plain.Len()) != seg.RawSize {
			t.Fatalf("%s: raw size %d, recorded %d", seg.Name, plain.Len(), seg.RawSize)
		}
		r, err := delta.NewReader(&plain)
		if err != nil {
			t.Fatalf("%s: %v", seg.Name, err)
		}
		if h := r.Header(); h.FirstRevision != next || seg.Name != agent.SegmentName(h.Chain, h.FirstRevision) {
			t.Fatalf("segment %s starts at %d, want %d", seg.Name, h.FirstRevision, next)
		}
		for {
			rv, l, err := r.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("%s: %v", seg.Name, err)
			}
			if l != nil {
				d.leases[l.ID] = *l
				continue
			}
			if rv.Revision != next {
				t.Fatalf("%s: revision %d, want %d", seg.Name, rv.Revision, next)
			}
			next++
			d.revs = append(d.revs, *rv)
		}
		sum := r.Summary()
		if sum.LastRevision != seg.Summary.LastRevision || sum.Events != seg.Summary.Events || sum.EndReason != seg.Summary.EndReason {
			t.Fatalf("%s: read %+v, recorded %+v", seg.Name, sum, seg.Summary)
		}
		d.summary = append(d.summary, sum)
	}
	return d
}

// replay applies the chain's events to state (key → value).
func (d decoded) replay(state map[string]string) {
	for _, r := range d.revs {
		for _, ev := range r.Events {
			if ev.Type == mvccpb.DELETE {
				delete(state, string(ev.Kv.Key))
			} else {
				state[string(ev.Kv.Key)] = string(ev.Kv.Value)
			}
		}
	}
}

func keyspace(t *testing.T, c *clientv3.Client, rev int64) map[string]string {
	t.Helper()
	opts := []clientv3.OpOption{clientv3.WithPrefix()}
	if rev > 0 {
		opts = append(opts, clientv3.WithRev(rev))
	}
	r, err := c.Get(context.Background(), "", opts...)
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]string{}
	for _, kv := range r.Kvs {
		m[string(kv.Key)] = string(kv.Value)
	}
	return m
}

// Every write during capture (puts, deletes, a transaction, keys with
// leases, a revoked lease) is stored, compressed and encrypted, in
// segments that follow each other; replayed over the keyspace at the
// chain's start they give etcd's keyspace; shutdown stores what is
// pending.
func TestCaptureWrites(t *testing.T) {
	te := etcdtest.Start(t, false)
	c := te.Client(t)
	ctx := context.Background()
	for i := range 5 {
		if _, err := c.Put(ctx, fmt.Sprintf("/before/%d", i), "x"); err != nil {
			t.Fatal(err)
		}
	}
	base := rev(t, c)
	id, err := age.GenerateX25519Identity()
	if err != nil {
		t.Fatal(err)
	}
	store := &memStore{start: base + 1}
	var clock atomic.Int64
	clock.Store(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	now := func() time.Time { return time.Unix(0, clock.Add(int64(time.Second))).UTC() }
	log, _ := testLog(t, "")
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	r := start(runCtx, agent.Options{Etcd: c, Store: store, Chain: "full-1", Epoch: epoch1, Period: 100 * time.Millisecond,
		MaxBytes: 2048, Compression: "zstd", AgeRecipients: []string{id.Recipient().String()}, Now: now, Log: log})

	for i := range 30 {
		if _, err := c.Put(ctx, fmt.Sprintf("/k/%02d", i), strings.Repeat("v", i*10)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.Delete(ctx, "/before/1"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Delete(ctx, "/k/", clientv3.WithPrefix(), clientv3.WithRange("/k/10")); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Txn(ctx).Then(clientv3.OpPut("/txn/a", "1"), clientv3.OpPut("/txn/b", "2"), clientv3.OpDelete("/before/2")).Commit(); err != nil {
		t.Fatal(err)
	}
	kept, err := c.Grant(ctx, 3600)
	if err != nil {
		t.Fatal(err)
	}
	revoked, err := c.Grant(ctx, 3600)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if _, err := c.Put(ctx, fmt.Sprintf("/leased/%d", i), "l", clientv3.WithLease(kept.ID)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.Put(ctx, "/gone", "g", clientv3.WithLease(revoked.ID)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Revoke(ctx, revoked.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Put(ctx, "/last", "z"); err != nil {
		t.Fatal(err)
	}
	end := rev(t, c)
	waitFor(t, "every write stored", func() bool { return store.last() == end })
	stop()
	res, err := r.wait(t)
	if err != nil || res.ChainEnded != "" {
		t.Fatalf("Run: %+v, %v", res, err)
	}
	segs := store.segments()
	if store.last() != end || res.LastRevision != end || res.Segments != len(segs) {
		t.Fatalf("stored up to %d (result %+v, %d segments), etcd is at %d", store.last(), res, len(segs), end)
	}
	if len(segs) < 2 {
		t.Fatalf("%d segments: MaxBytes 2048 should have cut", len(segs))
	}
	d := decode(t, segs, base+1, []age.Identity{id})
	state := keyspace(t, c, base)
	d.replay(state)
	want := keyspace(t, c, 0)
	if fmt.Sprint(state) != fmt.Sprint(want) {
		t.Fatalf("replayed keyspace:\n%v\netcd:\n%v", state, want)
	}
	if l, ok := d.leases[int64(kept.ID)]; !ok || l.TTL != 3600 || l.Remaining <= 0 {
		t.Fatalf("lease %x recorded as %+v (%v)", kept.ID, l, ok)
	}
	if _, ok := d.leases[int64(revoked.ID)]; !ok {
		t.Fatalf("lease %x of /gone not recorded", revoked.ID)
	}
	// Times come from the injected clock, one second apart.
	for i := 1; i < len(d.revs); i++ {
		if got := d.revs[i].Time.Sub(d.revs[i-1].Time); got != time.Second {
			t.Fatalf("revision %d seen %v after the one before", d.revs[i].Revision, got)
		}
	}
	for _, seg := range segs {
		if seg.Compression != "zstd" || len(seg.AgeRecipients) != 1 || seg.Summary.Epoch != 1 {
			t.Fatalf("%s: compression %q, recipients %v, epoch %d", seg.Name, seg.Compression, seg.AgeRecipients, seg.Summary.Epoch)
		}
	}
}

// A segment is cut when its period is over, while capture goes on.
func TestPeriodCut(t *testing.T) {
	te := etcdtest.Start(t, false)
	c := te.Client(t)
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	base := rev(t, c)
	store := &memStore{start: base + 1}
	r := start(ctx, agent.Options{Etcd: c, Store: store, Chain: "full", Epoch: epoch1, Period: 50 * time.Millisecond, MaxBytes: 1 << 20})
	for i := range 3 {
		if _, err := c.Put(ctx, "/p", fmt.Sprint(i)); err != nil {
			t.Fatal(err)
		}
		want := base + 1 + int64(i)
		waitFor(t, fmt.Sprintf("revision %d stored", want), func() bool { return store.last() == want })
	}
	if n := len(store.segments()); n != 3 {
		t.Fatalf("%d segments, want one per period", n)
	}
	stop()
	if res, err := r.wait(t); err != nil || res.Segments != 3 {
		t.Fatalf("Run: %+v, %v", res, err)
	}
	decode(t, store.segments(), base+1, nil)
}

// A segment is cut when it reaches MaxBytes, long before its period.
func TestMaxBytesCut(t *testing.T) {
	te := etcdtest.Start(t, false)
	c := te.Client(t)
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	base := rev(t, c)
	store := &memStore{start: base + 1}
	const maxBytes = 4096
	// The clock is read once per revision the agent takes in.
	var seen atomic.Int64
	now := func() time.Time { seen.Add(1); return time.Now() }
	r := start(ctx, agent.Options{Etcd: c, Store: store, Chain: "full", Epoch: epoch1, Period: time.Hour, MaxBytes: maxBytes, Now: now})
	etcdtest.Fill(t, c, 100, 200)
	waitFor(t, "three segments", func() bool { return len(store.segments()) >= 3 })
	waitFor(t, "every revision taken in", func() bool { return seen.Load() == 100 })
	for _, seg := range store.segments() {
		if seg.RawSize < maxBytes || seg.RawSize > maxBytes+400 {
			t.Fatalf("%s: %d bytes, cut at %d", seg.Name, seg.RawSize, maxBytes)
		}
	}
	// The last revisions fill no segment: shutdown stores them.
	stop()
	if _, err := r.wait(t); err != nil {
		t.Fatal(err)
	}
	d := decode(t, store.segments(), base+1, nil)
	if got := len(d.revs); got != 100 {
		t.Fatalf("%d revisions stored, want 100", got)
	}
}

// When etcd compacts past the agent's position while it cannot read the
// watch (its store is slow), the chain ends: what it holds is stored as
// the last segment, which says why.
func TestCompactionEndsChain(t *testing.T) {
	te := etcdtest.Start(t, false)
	c := te.Client(t)
	ctx := context.Background()
	base := rev(t, c)
	unblock := make(chan struct{})
	store := &memStore{start: base + 1, put: func(ctx context.Context, seg agent.Segment) error {
		select {
		case <-unblock:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}}
	log, paused := testLog(t, "pausing the watch")
	r := start(ctx, agent.Options{Etcd: c, Store: store, Chain: "full", Epoch: epoch1, Period: time.Hour, MaxBytes: 1024, Log: log})
	for i := 0; paused.Load() == 0; i++ {
		if i > 10000 {
			t.Fatal("the agent never paused its watch")
		}
		if _, err := c.Put(ctx, fmt.Sprintf("/c/%d", i), strings.Repeat("x", 100)); err != nil {
			t.Fatal(err)
		}
	}
	// Written while the watch is paused, then compacted away.
	for i := range 20 {
		if _, err := c.Put(ctx, fmt.Sprintf("/lost/%d", i), "y"); err != nil {
			t.Fatal(err)
		}
	}
	compactAt := rev(t, c)
	if _, err := c.Compact(ctx, compactAt); err != nil {
		t.Fatal(err)
	}
	close(unblock)
	res, err := r.wait(t)
	if err != nil || !strings.Contains(res.ChainEnded, fmt.Sprintf("etcd compacted revision %d past the agent's position", compactAt)) {
		t.Fatalf("Run: %+v, %v", res, err)
	}
	segs := store.segments()
	d := decode(t, segs, base+1, nil)
	if last := d.summary[len(d.summary)-1]; last.EndReason != res.ChainEnded {
		t.Fatalf("last segment ends with %q, want %q", last.EndReason, res.ChainEnded)
	}
	// The chain ended: a new Run does nothing.
	again, err := agent.Run(ctx, agent.Options{Etcd: c, Store: store, Chain: "full", Epoch: epoch1})
	if err != nil || again.ChainEnded != res.ChainEnded || again.Segments != 0 {
		t.Fatalf("Run on an ended chain: %+v, %v", again, err)
	}
}

// A chain whose position etcd compacted already ends with a segment
// without revisions.
func TestCompactedBeforeStart(t *testing.T) {
	te := etcdtest.Start(t, false)
	c := te.Client(t)
	ctx := context.Background()
	base := rev(t, c)
	etcdtest.Fill(t, c, 5, 10)
	compactAt := rev(t, c)
	if _, err := c.Compact(ctx, compactAt); err != nil {
		t.Fatal(err)
	}
	store := &memStore{start: base + 1}
	res, err := agent.Run(ctx, agent.Options{Etcd: c, Store: store, Chain: "full", Epoch: epoch1})
	if err != nil || res.ChainEnded == "" {
		t.Fatalf("Run: %+v, %v", res, err)
	}
	segs := store.segments()
	if len(segs) != 1 || segs[0].Summary.FirstRevision != base+1 || segs[0].Summary.LastRevision != base || segs[0].Summary.EndReason != res.ChainEnded {
		t.Fatalf("end segment: %+v", segs)
	}
	decode(t, segs, base+1, nil)
}

// With a slow store and etcd written fast, the agent holds at most two
// segments (one filling, one uploading) and pauses its watch rather than
// let etcd's client buffer; nothing is lost.
func TestBackPressure(t *testing.T) {
	te := etcdtest.Start(t, false)
	c := te.Client(t)
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	base := rev(t, c)
	// The server takes nothing until every write is done, then is fast.
	slow := make(chan struct{})
	store := &memStore{start: base + 1, put: func(ctx context.Context, seg agent.Segment) error {
		select {
		case <-slow:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}}
	const maxBytes = 16 << 10
	const value = 512
	log, paused := testLog(t, "pausing the watch")
	var seen atomic.Int64 // revisions taken in (the clock is read once for each)
	now := func() time.Time { seen.Add(1); return time.Now() }
	r := start(ctx, agent.Options{Etcd: c, Store: store, Chain: "full", Epoch: epoch1, Period: time.Hour, MaxBytes: maxBytes, Log: log, Now: now})
	const writers, writes = 4, 500
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := range writers {
		wg.Go(func() {
			for i := range writes {
				if _, err := c.Put(ctx, fmt.Sprintf("/bp/%d/%d", w, i%50), strings.Repeat("b", value)); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if paused.Load() == 0 {
		t.Fatal("the watch was not paused while the store took nothing")
	}
	close(slow)
	end := rev(t, c)
	waitFor(t, "every revision taken in", func() bool { return seen.Load() == end-base })
	stop()
	res, err := r.wait(t)
	if err != nil {
		t.Fatal(err)
	}
	// A revision here is about value+100 bytes; a segment may pass
	// MaxBytes by one.
	if bound := int64(2 * (maxBytes + value + 200)); res.PeakHeldBytes > bound {
		t.Fatalf("held up to %d bytes, bound %d", res.PeakHeldBytes, bound)
	}
	d := decode(t, store.segments(), base+1, nil)
	if got := int64(len(d.revs)); got != end-base {
		t.Fatalf("%d revisions stored, want %d", got, end-base)
	}
	t.Logf("%d segments, watch paused %d times, peak %d bytes held", res.Segments, paused.Load(), res.PeakHeldBytes)
}

// A store that refuses a segment as FailedPrecondition (the agent lost
// its Lease) stops capture at once with an error saying so.
func TestDeposed(t *testing.T) {
	te := etcdtest.Start(t, false)
	c := te.Client(t)
	ctx := context.Background()
	base := rev(t, c)
	store := &memStore{start: base + 1, put: func(ctx context.Context, seg agent.Segment) error {
		return status.Error(codes.FailedPrecondition, "the caller does not hold the delta Lease of target t at epoch 1")
	}}
	r := start(ctx, agent.Options{Etcd: c, Store: store, Chain: "full", Epoch: epoch1, Period: time.Hour, MaxBytes: 256})
	etcdtest.Fill(t, c, 10, 100)
	_, err := r.wait(t)
	if !errors.Is(err, agent.ErrDeposed) || !strings.Contains(err.Error(), "delta Lease") {
		t.Fatalf("Run: %v", err)
	}
	if store.puts != 1 {
		t.Fatalf("%d puts after the refusal, want none", store.puts-1)
	}
}

// A segment stored already (by an earlier attempt) makes the agent ask
// where the chain ends and go on from there.
func TestAlreadyExists(t *testing.T) {
	te := etcdtest.Start(t, false)
	c := te.Client(t)
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	base := rev(t, c)
	var store *memStore
	var once sync.Once
	store = &memStore{start: base + 1}
	store.put = func(ctx context.Context, seg agent.Segment) error {
		refused := false
		once.Do(func() {
			// Stored by someone else just before this agent's attempt.
			store.mu.Lock()
			store.segs = append(store.segs, seg)
			store.mu.Unlock()
			refused = true
		})
		if refused {
			return status.Error(codes.AlreadyExists, seg.Name+" exists")
		}
		return nil
	}
	r := start(ctx, agent.Options{Etcd: c, Store: store, Chain: "full", Epoch: epoch1, Period: 20 * time.Millisecond, MaxBytes: 512})
	etcdtest.Fill(t, c, 20, 100)
	end := rev(t, c)
	waitFor(t, "every write stored", func() bool { return store.last() == end })
	stop()
	if _, err := r.wait(t); err != nil {
		t.Fatal(err)
	}
	decode(t, store.segments(), base+1, nil)
}

// An agent that lost leadership stops without storing what it holds.
func TestNotLeaderStoresNothing(t *testing.T) {
	te := etcdtest.Start(t, false)
	c := te.Client(t)
	ctx, cancel := context.WithCancelCause(context.Background())
	base := rev(t, c)
	store := &memStore{start: base + 1}
	log, added := testLog(t, "delta capture starting")
	r := start(ctx, agent.Options{Etcd: c, Store: store, Chain: "full", Epoch: epoch1, Period: time.Hour, Log: log})
	waitFor(t, "capture started", func() bool { return added.Load() > 0 })
	etcdtest.Fill(t, c, 3, 10)
	cancel(agent.ErrNotLeader)
	if _, err := r.wait(t); !errors.Is(err, agent.ErrNotLeader) {
		t.Fatalf("Run: %v", err)
	}
	if n := len(store.segments()); n != 0 {
		t.Fatalf("%d segments stored after leadership was lost", n)
	}
}
