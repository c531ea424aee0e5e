package copies_test

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/ledger"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/config"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/copies"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/domain"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/metrics"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/retention"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/servertest/backuptest"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage/locations"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage/s3/s3test"
)

// world is a primary filesystem location copied to a versitygw bucket,
// opened as the server opens them.
type world struct {
	t       *testing.T
	dir     string
	store   *s3test.Server
	locs    *domain.Locations
	from    *domain.Location
	to      *domain.Location
	metrics *metrics.Metrics
	now     time.Time
	c       *copies.Copier
	target  config.Target
}

func newWorld(t *testing.T, target config.Target) *world {
	w := &world{t: t, dir: t.TempDir(), store: s3test.Start(t), now: time.Now().UTC(), target: target}
	offsite := w.store.Config("copies").S3Config
	named, err := locations.Open(t.Context(), []storage.LocationConfig{
		{Name: "default", Filesystem: &storage.FilesystemConfig{Path: w.dir}, Copies: []storage.CopyConfig{{To: "offsite"}}},
		{Name: "offsite", S3: &offsite},
	}, locations.Options{CallTimeout: 5 * time.Second, ListTimeout: 5 * time.Second, OpenTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if w.metrics, err = metrics.New(prometheus.NewRegistry()); err != nil {
		t.Fatal(err)
	}
	if w.locs, err = domain.NewLocations(named, w.metrics); err != nil {
		t.Fatal(err)
	}
	w.from, _ = w.locs.Lookup("default")
	w.to, _ = w.locs.Lookup("offsite")
	w.restart()
	return w
}

// restart replaces the copier by a new one, as a restarted server (or a
// new leader) has: it knows only what storage holds.
func (w *world) restart() {
	now := func() time.Time { return w.now }
	targets := []config.Target{w.target}
	pruner := &retention.Pruner{InUse: retention.NewInUse(nil, targets, nil), Metrics: w.metrics, Log: slog.New(slog.DiscardHandler), Now: now}
	w.c = copies.New(copies.Config{Locations: w.locs, Targets: targets, Pruner: pruner, Metrics: w.metrics, Now: now})
}

// put stores an object in the primary location, created now unless
// m says when.
func (w *world) put(m *storage.Manifest, data []byte) *storage.Manifest {
	w.t.Helper()
	if m.CreateTime.IsZero() {
		m.CreateTime = w.now
	}
	backuptest.Put(w.t, w.from, m, data)
	return m
}

// dataFile is where the filesystem location keeps name's bytes.
func (w *world) dataFile(name string) string { return filepath.Join(w.dir, "backups", name+".db") }

func (w *world) round() copies.RoundResult {
	w.t.Helper()
	return w.c.Round(w.t.Context(), w.from, w.to)
}

// copied checks that the copy location holds name as stored in the
// primary: bytes equal, SHA-256 equal, marked a copy of it.
func (w *world) copied(name string) {
	w.t.Helper()
	r, m, err := w.to.Open(w.t.Context(), name, 0, 0)
	if err != nil {
		w.t.Fatalf("%s is not in the copy location: %v", name, err)
	}
	got, err := io.ReadAll(r)
	r.Close()
	if err != nil {
		w.t.Fatal(err)
	}
	want, err := os.ReadFile(w.dataFile(name))
	if err != nil {
		w.t.Fatal(err)
	}
	sum := sha256.Sum256(got)
	orig, err := w.from.Stat(w.t.Context(), name)
	if err != nil {
		w.t.Fatal(err)
	}
	switch {
	case !bytes.Equal(got, want):
		w.t.Errorf("%s: the copy's bytes differ from the original's", name)
	case hex.EncodeToString(sum[:]) != orig.SHA256 || m.SHA256 != orig.SHA256:
		w.t.Errorf("%s: copy hashes to %x, its manifest says %s, the original's %s", name, sum, m.SHA256, orig.SHA256)
	case m.Copy == nil || m.Copy.From != "default" || !m.Copy.Time.Equal(w.now.Truncate(0)):
		w.t.Errorf("%s: copy's manifest records %+v, want a copy from default at %s", name, m.Copy, w.now)
	case m.Encryption != orig.Encryption || m.Source != orig.Source || (m.Delta == nil) != (orig.Delta == nil) || (m.Kit == nil) != (orig.Kit == nil):
		w.t.Errorf("%s: the copy's manifest is not the original's: %+v vs %+v", name, m, orig)
	}
}

func (w *world) gauge(g *prometheus.GaugeVec) float64 {
	return testutil.ToFloat64(g.WithLabelValues("default", "offsite"))
}

func random(t *testing.T, n int) []byte {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}

// A backup, its recovery kit and its delta segment reach the copy
// location as stored, hashes equal, and are copied once; the ledgers of
// both locations say so; bytes that do not hash to their manifest are
// not copied, and a new copier resumes from what storage holds.
func TestCopiesAsStored(t *testing.T) {
	w := newWorld(t, config.Target{Name: "cp"})
	src := storage.Source{Kind: ebv1.SourceAgent, Target: "cp"}
	w.put(&storage.Manifest{Name: "b1", Source: src, Encryption: "age", AgeRecipients: []string{"age1xyz"}}, random(t, 3<<20))
	w.put(&storage.Manifest{Name: "b1.kit", Source: storage.Source{Kind: ebv1.SourceKit, Target: "cp"}, Kit: &storage.Kit{Backup: "b1"}}, random(t, 4096))
	w.put(&storage.Manifest{Name: storage.SegmentName("b1", 10), Source: storage.Source{Kind: ebv1.SourceDelta, Target: "cp"},
		Delta: &storage.Delta{Chain: "b1", FirstRevision: 10, LastRevision: 20}}, random(t, 1000))
	if w.gauge(w.metrics.CopiesPending) != 0 {
		t.Fatal("pending before any round")
	}

	res := w.round()
	if len(res.Copied) != 3 || len(res.Failed) != 0 || res.Pending != 0 {
		t.Fatalf("first round: %+v", res)
	}
	if res.Copied[0] != "b1" {
		t.Errorf("copied %v: the backup goes before its parts", res.Copied)
	}
	for _, n := range res.Copied {
		w.copied(n)
	}
	if got := testutil.ToFloat64(w.metrics.Copied.WithLabelValues("default", "offsite")); got != 3 {
		t.Errorf("copies_total %v, want 3", got)
	}
	if w.gauge(w.metrics.CopiesPending) != 0 || w.gauge(w.metrics.CopyLag) != 0 {
		t.Errorf("after copying: pending %v, lag %v", w.gauge(w.metrics.CopiesPending), w.gauge(w.metrics.CopyLag))
	}
	// The backup and the kit are entered in both ledgers; the segment
	// is not (its chain's full is).
	for _, l := range []*domain.Location{w.from, w.to} {
		var got []string
		for _, e := range entries(t, l) {
			if e.Action == ledger.ActionCopy {
				got = append(got, e.Backup+" "+e.Detail)
			}
		}
		if len(got) != 2 || !strings.HasPrefix(got[0], "b1 copied") || !strings.HasPrefix(got[1], "b1.kit copied") {
			t.Errorf("ledger of %s: copy entries %q", l.Name, got)
		}
	}

	// Copied once: a second round, and a new copier, find nothing to do.
	if res := w.round(); len(res.Copied)+len(res.Failed)+res.Pending != 0 {
		t.Errorf("second round: %+v", res)
	}
	w.restart()
	if res := w.round(); len(res.Copied)+len(res.Failed)+res.Pending != 0 {
		t.Errorf("a new copier's round: %+v", res)
	}

	// Bytes damaged in the primary: refused, retried with backoff,
	// nothing stored in the copy location.
	damaged := w.put(&storage.Manifest{Name: "b2", Source: src}, random(t, 1<<20))
	f, err := os.OpenFile(w.dataFile("b2"), os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("damage"), 1000); err != nil {
		t.Fatal(err)
	}
	f.Close()
	res = w.round()
	if len(res.Failed) != 1 || res.Failed[0] != "b2" || res.Pending != 1 {
		t.Fatalf("round with damaged bytes: %+v", res)
	}
	if _, err := w.to.Stat(t.Context(), "b2"); !errors.Is(err, storage.ErrNotFound) {
		t.Errorf("damaged b2 reached the copy location: %v", err)
	}
	st := w.c.CopyStatus("default", "offsite", "b2", damaged.SHA256)
	if st.Failing == nil || !strings.Contains(st.Failing.Message, "do not match their manifest") || !st.Failing.Next.After(w.now) {
		t.Errorf("status of the damaged copy: %+v", st.Failing)
	}
	if res := w.round(); len(res.Failed) != 0 || res.Pending != 1 {
		t.Errorf("the damaged copy was tried again before its backoff ended: %+v", res)
	}
	if got := testutil.ToFloat64(w.metrics.CopyFailures.WithLabelValues("default", "offsite")); got != 1 {
		t.Errorf("copy_failures_total %v, want 1", got)
	}
	w.now = w.now.Add(time.Hour)
	if w.gauge(w.metrics.CopyLag) < 0 {
		t.Fatal("negative lag")
	}
	if err := w.from.Delete(t.Context(), "b2"); err != nil {
		t.Fatal(err)
	}
	if res := w.round(); len(res.Copied)+len(res.Failed)+res.Pending != 0 {
		t.Errorf("after the damaged backup was deleted: %+v", res)
	}
}

// entries are l's ledger entries.
func entries(t *testing.T, l *domain.Location) []ledger.Entry {
	t.Helper()
	recs, err := l.ReadLedger(t.Context(), 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	var out []ledger.Entry
	for _, r := range recs {
		var e ledger.Entry
		if err := json.Unmarshal(r.Data, &e); err != nil {
			t.Fatal(err)
		}
		out = append(out, e)
	}
	return out
}

// The copy location stopped: copies wait (pending, the lag growing,
// each copy "retrying"), and once it answers again they catch up with
// nothing lost.
func TestCopyLocationDown(t *testing.T) {
	w := newWorld(t, config.Target{Name: "cp"})
	src := storage.Source{Kind: ebv1.SourceAgent, Target: "cp"}
	w.put(&storage.Manifest{Name: "b1", Source: src}, random(t, 1<<20))
	if res := w.round(); len(res.Copied) != 1 {
		t.Fatalf("%+v", res)
	}
	w.store.Kill()
	stored := w.now
	b2 := w.put(&storage.Manifest{Name: "b2", Source: src}, random(t, 1<<20))
	b3 := w.put(&storage.Manifest{Name: "b3", Source: src}, random(t, 1<<20))
	for i := range 3 {
		w.now = stored.Add(time.Duration(i+1) * time.Minute)
		if res := w.round(); len(res.Copied) != 0 {
			t.Fatalf("copied to a stopped store: %+v", res)
		}
		if got, want := w.gauge(w.metrics.CopiesPending), 2.0; got != want {
			t.Errorf("pending %v, want %v", got, want)
		}
		if got, want := w.gauge(w.metrics.CopyLag), w.now.Sub(stored).Seconds(); got != want {
			t.Errorf("lag %v, want %v", got, want)
		}
		if st := w.c.CopyStatus("default", "offsite", "b2", b2.SHA256); st.Failing == nil || st.Failing.Since.After(stored.Add(time.Minute)) {
			t.Errorf("status of a copy while its location is down: %+v", st.Failing)
		}
	}
	if err := w.store.Restart(); err != nil {
		t.Fatal(err)
	}
	// The location's background check finds the store back.
	deadline := time.Now().Add(time.Minute)
	for w.to.Unavailable() != nil {
		if time.Now().After(deadline) {
			t.Fatalf("the copy location stays unavailable: %v", w.to.Unavailable())
		}
		time.Sleep(100 * time.Millisecond)
	}
	w.now = w.now.Add(time.Minute)
	if res := w.round(); len(res.Copied) != 2 || res.Pending != 0 {
		t.Fatalf("catching up: %+v", res)
	}
	w.copied("b2")
	w.copied("b3")
	if w.gauge(w.metrics.CopiesPending) != 0 || w.gauge(w.metrics.CopyLag) != 0 {
		t.Errorf("after catching up: pending %v, lag %v", w.gauge(w.metrics.CopiesPending), w.gauge(w.metrics.CopyLag))
	}
	if st := w.c.CopyStatus("default", "offsite", "b3", b3.SHA256); st.Failing != nil {
		t.Errorf("still failing after the copy: %+v", st.Failing)
	}
}

// Retention acts per location: the copy location keeps what the
// target's copyRetention says, the primary what its retention says, and
// a copy removed by either retention or a delete is not copied again.
func TestRetentionPerCopyLocation(t *testing.T) {
	w := newWorld(t, config.Target{Name: "cp", Retention: &config.Retention{KeepLast: 3},
		CopyRetention: map[string]config.Retention{"offsite": {KeepLast: 2}}})
	base := w.now.Add(-time.Hour)
	for i, n := range []string{"cp-1", "cp-2", "cp-3"} {
		w.put(&storage.Manifest{Name: n, CreateTime: base.Add(time.Duration(i) * time.Minute),
			Source: storage.Source{Kind: ebv1.SourceAgent, Target: "cp", Scheduled: true}}, random(t, 1000))
	}
	res := w.round()
	if len(res.Copied) != 3 {
		t.Fatalf("%+v", res)
	}
	names := func(l *domain.Location) string { return strings.Join(backuptest.Names(t, l), ",") }
	if got := names(w.to); got != "cp-2,cp-3" {
		t.Errorf("copy location after its retention: %s, want cp-2,cp-3", got)
	}
	if got := names(w.from); got != "cp-1,cp-2,cp-3" {
		t.Errorf("primary: %s", got)
	}
	// cp-1, removed by the copy location's retention, is not copied back;
	// nor is cp-2 once deleted there.
	if err := w.to.Delete(t.Context(), "cp-2"); err != nil {
		t.Fatal(err)
	}
	m2, _ := w.from.Stat(t.Context(), "cp-2")
	w.to.Note(t.Context(), slog.New(slog.DiscardHandler), ledger.Entry{Action: ledger.ActionDelete, Backup: "cp-2", SHA256: m2.SHA256, Who: "user alice"})
	if res := w.round(); len(res.Copied)+res.Pending != 0 {
		t.Errorf("copies removed on purpose came back: %+v", res)
	}
	m1, _ := w.from.Stat(t.Context(), "cp-1")
	if !w.c.CopyStatus("default", "offsite", "cp-1", m1.SHA256).Skipped || !w.c.CopyStatus("default", "offsite", "cp-2", m2.SHA256).Skipped {
		t.Error("a copy removed on purpose is not reported skipped")
	}
	if got := names(w.to); got != "cp-3" {
		t.Errorf("copy location: %s, want cp-3", got)
	}
}
