package replay

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	clientsnapshot "go.etcd.io/etcd/client/v3/snapshot"
	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/delta"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/internal/etcdtest"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/internal/loopetcd"
)

var t0 = time.Date(2026, 3, 4, 5, 0, 0, 0, time.UTC)

// seen is the synthetic time the "agent" saw rev at.
func seen(rev int64) time.Time { return t0.Add(time.Duration(rev) * time.Second) }

// source is a real etcd with a snapshot at base and history after it,
// captured by a real watch into segments.
type source struct {
	c        *clientv3.Client
	dir      string
	base     string
	baseRev  int64
	segments []string
	last     int64
}

func must[T any](t *testing.T) func(T, error) T {
	return func(v T, err error) T {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
}

func newSource(t *testing.T, write func(ctx context.Context, c *clientv3.Client) error, cuts ...int64) *source {
	ctx := context.Background()
	te := etcdtest.Start(t, false)
	s := &source{c: te.Client(t), dir: t.TempDir()}
	c := s.c
	// History before the snapshot, so the snapshot holds versions,
	// deletions and a lease.
	lease := must[*clientv3.LeaseGrantResponse](t)(c.Grant(ctx, 3600))
	for i := 0; i < 5; i++ {
		must[*clientv3.PutResponse](t)(c.Put(ctx, fmt.Sprintf("/pre/%d", i), "v0"))
	}
	must[*clientv3.PutResponse](t)(c.Put(ctx, "/pre/0", "v1"))
	must[*clientv3.PutResponse](t)(c.Put(ctx, "/pre/leased", "x", clientv3.WithLease(lease.ID)))
	must[*clientv3.DeleteResponse](t)(c.Delete(ctx, "/pre/4"))
	s.base = filepath.Join(s.dir, "base.db")
	if _, err := clientsnapshot.SaveWithVersion(ctx, zap.NewNop(), te.Config(t), s.base); err != nil {
		t.Fatal(err)
	}
	s.baseRev = must[*clientv3.GetResponse](t)(c.Get(ctx, "\x00", clientv3.WithCountOnly())).Header.Revision
	if err := write(ctx, c); err != nil {
		t.Fatal(err)
	}
	s.last = must[*clientv3.GetResponse](t)(c.Get(ctx, "\x00", clientv3.WithCountOnly())).Header.Revision
	for i := range cuts {
		cuts[i] += s.baseRev
	}
	s.capture(t, cuts)
	return s
}

// writes is a history touching what replay must reproduce: puts,
// overwrites, deletes, a range delete, a multi-op transaction, leases
// (one kept, one revoked), a lease from before the snapshot.
func writes(ctx context.Context, c *clientv3.Client) error {
	l, err := c.Grant(ctx, 600)
	if err != nil {
		return err
	}
	gone, err := c.Grant(ctx, 600)
	if err != nil {
		return err
	}
	pre, err := c.Get(ctx, "/pre/leased")
	if err != nil {
		return err
	}
	steps := []func() error{
		func() error { _, err := c.Put(ctx, "/a", "1"); return err },
		func() error { _, err := c.Put(ctx, "/a", "2"); return err },
		func() error { _, err := c.Put(ctx, "/b", "1", clientv3.WithLease(l.ID)); return err },
		func() error { _, err := c.Delete(ctx, "/pre/1"); return err },
		func() error {
			_, err := c.Txn(ctx).Then(clientv3.OpPut("/t/1", "x"), clientv3.OpPut("/t/2", "y"), clientv3.OpDelete("/a"), clientv3.OpPut("/pre/2", "v2")).Commit()
			return err
		},
		func() error { _, err := c.Put(ctx, "/g/1", "z", clientv3.WithLease(gone.ID)); return err },
		func() error {
			_, err := c.Put(ctx, "/pre/3", "reuses the snapshot's lease", clientv3.WithLease(clientv3.LeaseID(pre.Kvs[0].Lease)))
			return err
		},
		func() error { _, err := c.Delete(ctx, "/t/", clientv3.WithPrefix()); return err },
		func() error { _, err := c.Put(ctx, "/a", "back"); return err },
		func() error { _, err := c.Put(ctx, "/b", "no lease any more"); return err },
		func() error { _, err := c.Put(ctx, "/c", "last"); return err },
	}
	for _, s := range steps {
		if err := s(); err != nil {
			return err
		}
	}
	return nil
}

// capture watches from baseRev+1 to last and writes segments cut after
// each revision in cuts, as a delta agent would.
func (s *source) capture(t *testing.T, cuts []int64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	wch := s.c.Watch(ctx, "\x00", clientv3.WithFromKey(), clientv3.WithRev(s.baseRev+1))
	var revs []delta.Revision
	for len(revs) == 0 || revs[len(revs)-1].Revision < s.last {
		wr, ok := <-wch
		if !ok || wr.Err() != nil {
			t.Fatalf("watch: %v", wr.Err())
		}
		for _, ev := range wr.Events {
			rev := ev.Kv.ModRevision
			if n := len(revs); n == 0 || revs[n-1].Revision != rev {
				revs = append(revs, delta.Revision{Revision: rev, Time: seen(rev)})
			}
			revs[len(revs)-1].Events = append(revs[len(revs)-1].Events, proto.Clone(ev).(*mvccpb.Event))
		}
	}
	cuts = append(cuts, s.last)
	var w *delta.Writer
	var f *os.File
	var described map[int64]bool
	for _, r := range revs {
		if w == nil {
			f = must[*os.File](t)(os.Create(filepath.Join(s.dir, fmt.Sprintf("seg.delta-%d", r.Revision))))
			w = must[*delta.Writer](t)(delta.NewWriter(f, delta.Header{Chain: "base", Epoch: 1, FirstRevision: r.Revision}))
			described = map[int64]bool{}
			s.segments = append(s.segments, f.Name())
		}
		for _, ev := range r.Events {
			if id := ev.Kv.Lease; id != 0 && !described[id] {
				l := delta.Lease{ID: id, TTL: -1, Remaining: -1}
				if ttl, err := s.c.TimeToLive(ctx, clientv3.LeaseID(id)); err == nil && ttl.TTL > 0 {
					l.TTL, l.Remaining = ttl.GrantedTTL, ttl.TTL
				}
				if err := w.AddLease(l); err != nil {
					t.Fatal(err)
				}
				described[id] = true
			}
		}
		if err := w.AddRevision(r); err != nil {
			t.Fatal(err)
		}
		if len(cuts) > 0 && r.Revision >= cuts[0] {
			cuts = cuts[1:]
			if _, err := w.Close("rotated"); err != nil {
				t.Fatal(err)
			}
			f.Close()
			w = nil
		}
	}
}

// keyspace is every key of the etcd at endpoint (or c) at rev.
func keyspace(t *testing.T, c *clientv3.Client, rev int64) []string {
	t.Helper()
	resp := must[*clientv3.GetResponse](t)(c.Get(context.Background(), "\x00", clientv3.WithFromKey(), clientv3.WithRev(rev)))
	var ks []string
	for _, kv := range resp.Kvs {
		ks = append(ks, fmt.Sprintf("%s=%q create=%d mod=%d version=%d lease=%d", kv.Key, kv.Value, kv.CreateRevision, kv.ModRevision, kv.Version, kv.Lease))
	}
	return ks
}

// served serves a snapshot and returns a client of it.
func served(t *testing.T, path string) *clientv3.Client {
	t.Helper()
	dir := t.TempDir()
	m, err := loopetcd.Start(context.Background(), loopetcd.Options{Snapshot: path, DataDir: filepath.Join(dir, "member")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	return m.Client
}

func (s *source) build(t *testing.T, p delta.Point, allowLoss bool) (Result, string, error) {
	t.Helper()
	out := filepath.Join(t.TempDir(), "out.db")
	work := t.TempDir()
	res, err := Build(context.Background(), Options{
		BasePath: s.base, BaseRevision: s.baseRev, Segments: s.segments, Point: p,
		WorkDir: work, OutPath: out, AllowLeaseLoss: allowLoss,
	})
	if left, _ := os.ReadDir(work); len(left) != 0 {
		t.Errorf("the work directory was not emptied: %v", left)
	}
	return res, out, err
}

func (s *source) check(t *testing.T, out string, rev int64) {
	t.Helper()
	got, want := keyspace(t, served(t, out), rev), keyspace(t, s.c, rev)
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("keyspace at revision %d:\n got %s\nwant %s", rev, strings.Join(got, "\n     "), strings.Join(want, "\n     "))
	}
	head := must[*clientv3.GetResponse](t)(served(t, out).Get(context.Background(), "\x00", clientv3.WithCountOnly()))
	if head.Header.Revision != rev {
		t.Fatalf("the snapshot is at revision %d, want %d", head.Header.Revision, rev)
	}
}

func TestBuildToRevisions(t *testing.T) {
	s := newSource(t, writes, 4, 8)
	if len(s.segments) != 3 {
		t.Fatalf("%d segments", len(s.segments))
	}
	for _, tc := range []struct {
		name string
		rev  int64
	}{
		{"the full's own revision", s.baseRev},
		{"inside the first segment", s.baseRev + 2},
		{"a segment boundary", s.baseRev + 4},
		{"after the multi-op txn", s.baseRev + 6},
		{"the last event", s.last},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, out, err := s.build(t, delta.Point{Revision: tc.rev}, false)
			if err != nil {
				t.Fatal(err)
			}
			if res.Revision != tc.rev || res.Revisions != tc.rev-s.baseRev {
				t.Fatalf("result %+v, want revision %d", res, tc.rev)
			}
			if tc.rev > s.baseRev && !res.Time.Equal(seen(tc.rev)) {
				t.Fatalf("time %v, want %v", res.Time, seen(tc.rev))
			}
			s.check(t, out, tc.rev)
		})
	}
	t.Run("newest", func(t *testing.T) {
		res, out, err := s.build(t, delta.Point{}, false)
		if err != nil {
			t.Fatal(err)
		}
		if res.Revision != s.last || res.LeasesGranted != 2 {
			t.Fatalf("result %+v", res)
		}
		s.check(t, out, s.last)
	})
	t.Run("past the chain", func(t *testing.T) {
		_, _, err := s.build(t, delta.Point{Revision: s.last + 1}, false)
		if err == nil || !strings.Contains(err.Error(), "does not reach") {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("segments out of order", func(t *testing.T) {
		s2 := *s
		s2.segments = []string{s.segments[1], s.segments[0]}
		_, _, err := s2.build(t, delta.Point{}, false)
		if err == nil || !strings.Contains(err.Error(), "not one contiguous chain") {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("wrong base revision", func(t *testing.T) {
		s2 := *s
		s2.baseRev--
		_, _, err := s2.build(t, delta.Point{}, false)
		if err == nil || !strings.Contains(err.Error(), "its manifest says") {
			t.Fatalf("got %v", err)
		}
	})
}

func TestBuildToTime(t *testing.T) {
	s := newSource(t, writes, 5)
	for _, rev := range []int64{s.baseRev, s.baseRev + 3, s.baseRev + 5, s.last} {
		t.Run(fmt.Sprint(rev-s.baseRev), func(t *testing.T) {
			// Between rev's time and the next's.
			res, out, err := s.build(t, delta.Point{Time: seen(rev).Add(500 * time.Millisecond)}, false)
			if err != nil {
				t.Fatal(err)
			}
			if res.Revision != rev {
				t.Fatalf("result %+v, want revision %d", res, rev)
			}
			s.check(t, out, rev)
		})
	}
}

// A time point with a revision known committed by then (another chain,
// a full, saw it earlier than this chain's agent did): replay reaches it
// whatever this chain's stamps say, and stops at the point's time after
// it.
func TestBuildToTimeAtLeastToMinRevision(t *testing.T) {
	s := newSource(t, writes, 5)
	early := seen(s.baseRev).Add(500 * time.Millisecond) // before every stamp of the chain
	for _, min := range []int64{s.baseRev + 2, s.baseRev + 5, s.last} {
		t.Run(fmt.Sprint(min-s.baseRev), func(t *testing.T) {
			res, out, err := s.build(t, delta.Point{Time: early, MinRevision: min}, false)
			if err != nil {
				t.Fatal(err)
			}
			if res.Revision != min {
				t.Fatalf("result %+v, want revision %d (the minimum; every later stamp is after the time)", res, min)
			}
			s.check(t, out, min)
		})
	}
	// Past the segments: the chain does not reach the point.
	if _, _, err := s.build(t, delta.Point{Time: early, MinRevision: s.last + 1}, false); err == nil || !strings.Contains(err.Error(), "does not reach the point") {
		t.Fatalf("minimum past the chain: %v", err)
	}
}

// A lease gone before the agent read it: keys holding it at the point
// are refused unless allowed; after its keys are deleted, nothing is
// lost.
func TestLostLease(t *testing.T) {
	var held, deleted int64
	var lost clientv3.LeaseID
	s := newSource(t, func(ctx context.Context, c *clientv3.Client) error {
		l, err := c.Grant(ctx, 600)
		if err != nil {
			return err
		}
		lost = l.ID
		if _, err := c.Put(ctx, "/lost/1", "x", clientv3.WithLease(l.ID)); err != nil {
			return err
		}
		r, err := c.Put(ctx, "/other", "y")
		if err != nil {
			return err
		}
		held = r.Header.Revision
		// Revoked before the "agent" asks its TTL (capture runs after).
		rv, err := c.Revoke(ctx, l.ID)
		if err != nil {
			return err
		}
		deleted = rv.Header.Revision
		_, err = c.Put(ctx, "/after", "z")
		return err
	})
	// No flag needed: the keys come back on a stand-in lease (a
	// Kubernetes control plane's short leases are lost at every chain
	// start), and the result says which.
	res, out, err := s.build(t, delta.Point{Revision: held}, false)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.LostLeases) != 1 || res.LostLeases[0] != int64(lost) {
		t.Fatalf("lost leases %v", res.LostLeases)
	}
	s.check(t, out, held)
	ttl := must[*clientv3.LeaseTimeToLiveResponse](t)(served(t, out).TimeToLive(context.Background(), lost))
	if ttl.GrantedTTL <= 0 || ttl.GrantedTTL > DefaultLostLeaseTTL {
		t.Fatalf("the lost lease was restored with TTL %d, want a stand-in of at most %d", ttl.GrantedTTL, DefaultLostLeaseTTL)
	}
	res, out, err = s.build(t, delta.Point{Revision: deleted}, false)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.LostLeases) != 0 {
		t.Fatalf("lost leases %v", res.LostLeases)
	}
	s.check(t, out, deleted)
	leases := must[*clientv3.LeaseLeasesResponse](t)(served(t, out).Leases(context.Background()))
	for _, l := range leases.Leases {
		if l.ID == lost {
			t.Fatal("the revoked lease survived")
		}
	}
}

// A lease the full holds and the source revokes after it (no event says
// so, only its keys' deletes do), and one granted and revoked after it,
// are not in what replay saves.
func TestRevokedLeasesAreNotKept(t *testing.T) {
	s := newSource(t, func(ctx context.Context, c *clientv3.Client) error {
		pre, err := c.Get(ctx, "/pre/leased")
		if err != nil {
			return err
		}
		if _, err := c.Revoke(ctx, clientv3.LeaseID(pre.Kvs[0].Lease)); err != nil {
			return err
		}
		l, err := c.Grant(ctx, 600)
		if err != nil {
			return err
		}
		if _, err := c.Put(ctx, "/leased/1", "x", clientv3.WithLease(l.ID)); err != nil {
			return err
		}
		if _, err := c.Revoke(ctx, l.ID); err != nil {
			return err
		}
		_, err = c.Put(ctx, "/after", "y")
		return err
	})
	res, out, err := s.build(t, delta.Point{}, false)
	if err != nil {
		t.Fatal(err)
	}
	s.check(t, out, res.Revision)
	leases := must[*clientv3.LeaseLeasesResponse](t)(served(t, out).Leases(context.Background()))
	if len(leases.Leases) != 0 {
		t.Fatalf("replay kept leases %v; the source revoked both", leases.Leases)
	}
}
