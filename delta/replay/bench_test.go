package replay

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	clientsnapshot "go.etcd.io/etcd/client/v3/snapshot"
	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/delta"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/internal/etcdtest"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/snapshot"
)

// BenchmarkReplayToPoint measures a restore to a point side by side with
// a plain restore of the same full backup, in one run: a real etcd is
// filled to ETCDBACKUP_BENCH_DB_MIB MiB (default 64) of 64 KiB values
// and snapshotted (the full), then takes ETCDBACKUP_BENCH_REVISIONS
// revisions (default 10000) of 256-byte puts over 10,000 keys from 8
// writers, captured by a watch into segments of 10,000 revisions as the
// delta agent writes them. Each round replays the segments onto the full
// (the scratch member without fsync, as every replay runs) and restores
// the result into a data directory, and restores the full alone. It
// reports replayed revisions per second, both wall times and their
// ratio. ETCDBACKUP_BENCH_DB_MIB=2200 shows a point whose result is above
// etcd's default 2 GiB quota.
func BenchmarkReplayToPoint(b *testing.B) {
	mib, revisions := benchEnv(b, "ETCDBACKUP_BENCH_DB_MIB", 64), benchEnv(b, "ETCDBACKUP_BENCH_REVISIONS", 10000)
	ctx := context.Background()
	te := etcdtest.Start(b, false)
	c := te.Client(b)
	dir := b.TempDir()
	fill(b, c, mib)
	base := filepath.Join(dir, "base.db")
	if _, err := clientsnapshot.SaveWithVersion(ctx, zap.NewNop(), te.Config(b), base); err != nil {
		b.Fatal(err)
	}
	st, err := snapshot.Check(base)
	if err != nil {
		b.Fatal(err)
	}
	segments := captureRevisions(b, c, dir, st.Revision, revisions)

	var replayWall, pointRestoreWall, plainWall time.Duration
	var resultBytes int64
	for i := range b.N {
		run := filepath.Join(dir, fmt.Sprintf("run-%d", i))
		out := filepath.Join(run, "point.db")
		start := time.Now()
		res, err := Build(ctx, Options{BasePath: base, BaseRevision: st.Revision, Segments: segments, WorkDir: filepath.Join(run, "work"), OutPath: out})
		if err != nil {
			b.Fatal(err)
		}
		replayWall += time.Since(start)
		if want := st.Revision + int64(revisions); res.Revision != want {
			b.Fatalf("replayed to revision %d, want %d", res.Revision, want)
		}
		fi, err := os.Stat(out)
		if err != nil {
			b.Fatal(err)
		}
		resultBytes = fi.Size()
		start = time.Now()
		restoreInto(b, out, filepath.Join(run, "point.etcd"))
		pointRestoreWall += time.Since(start)
		start = time.Now()
		restoreInto(b, base, filepath.Join(run, "plain.etcd"))
		plainWall += time.Since(start)
		if err := os.RemoveAll(run); err != nil {
			b.Fatal(err)
		}
	}
	n := float64(b.N)
	point := (replayWall + pointRestoreWall).Seconds() / n
	b.ReportMetric(float64(revisions)*n/replayWall.Seconds(), "revisions/s")
	b.ReportMetric(point, "point-restore-s")
	b.ReportMetric(plainWall.Seconds()/n, "plain-restore-s")
	b.ReportMetric(point/(plainWall.Seconds()/n), "point/plain")
	b.ReportMetric(float64(resultBytes)/(1<<20), "result-MiB")
}

func benchEnv(b *testing.B, name string, def int) int {
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	v, err := strconv.Atoi(s)
	if err != nil || v <= 0 {
		b.Fatalf("%s=%q: a positive number", name, s)
	}
	return v
}

// fill puts mib MiB of 64 KiB values from 4 writers.
func fill(b *testing.B, c *clientv3.Client, mib int) {
	value := string(make([]byte, 64<<10))
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for w := range 4 {
		wg.Go(func() {
			for i := w; i < mib*16; i += 4 {
				if _, err := c.Put(context.Background(), fmt.Sprintf("/fill/%07d", i), value); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
}

// captureRevisions makes n revisions of puts after base and writes them,
// as a watch from base+1 delivers them, into segment files of at most
// 10,000 revisions.
func captureRevisions(b *testing.B, c *clientv3.Client, dir string, base int64, n int) []string {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	wch := c.Watch(ctx, "\x00", clientv3.WithFromKey(), clientv3.WithRev(base+1))
	var wg sync.WaitGroup
	value := string(make([]byte, 256))
	for w := range 8 {
		wg.Go(func() {
			for i := w; i < n; i += 8 {
				if _, err := c.Put(ctx, fmt.Sprintf("/churn/%05d", i%10000), value); err != nil {
					return
				}
			}
		})
	}
	var paths []string
	var w *delta.Writer
	var f *os.File
	last := base + int64(n)
	next := base + 1
	var cur delta.Revision
	flush := func() {
		if err := w.AddRevision(cur); err != nil {
			b.Fatal(err)
		}
		if cur.Revision-base == int64(len(paths))*10000 || cur.Revision == last {
			if _, err := w.Close(""); err != nil {
				b.Fatal(err)
			}
			if err := f.Close(); err != nil {
				b.Fatal(err)
			}
			w = nil
		}
	}
	for next <= last {
		wr, ok := <-wch
		if !ok || wr.Err() != nil {
			b.Fatalf("watch: %v", wr.Err())
		}
		for _, ev := range wr.Events {
			rev := ev.Kv.ModRevision
			if cur.Revision != rev {
				if cur.Revision != 0 {
					flush()
				}
				if w == nil {
					var err error
					if f, err = os.Create(filepath.Join(dir, fmt.Sprintf("seg.delta-%d", rev))); err != nil {
						b.Fatal(err)
					}
					if w, err = delta.NewWriter(f, delta.Header{Chain: "bench", Epoch: 1, FirstRevision: rev}); err != nil {
						b.Fatal(err)
					}
					paths = append(paths, f.Name())
				}
				cur = delta.Revision{Revision: rev, Time: time.Now()}
				next = rev + 1
			}
			cur.Events = append(cur.Events, proto.Clone(ev).(*mvccpb.Event))
		}
	}
	flush()
	wg.Wait()
	return paths
}

// restoreInto restores a snapshot into dataDir as a local restore does.
func restoreInto(b *testing.B, path, dataDir string) {
	peer := "http://127.0.0.1:2380"
	if _, err := snapshot.Restore(path, snapshot.Member{Name: "m1", InitialCluster: "m1=" + peer, InitialAdvertisePeerURLs: []string{peer}, DataDir: dataDir}); err != nil {
		b.Fatal(err)
	}
}
