package readpath

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/internal/etcdtest"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/config"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/metrics"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/servertest/backuptest"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage/filesystem"
)

// These tests are inside the package: they shrink the verify budget
// (limits.verifyScratchBytes) and the free space seen to a test's sizes.

// heldLocation is a location whose readers block on their first read
// until release is closed, telling opened first: a verify held there has
// its reservation and has written nothing yet.
type heldLocation struct {
	storage.Location
	opened  chan string
	release chan struct{}
}

func (l *heldLocation) Open(ctx context.Context, name string, offset, length int64) (io.ReadCloser, *storage.Manifest, error) {
	r, m, err := l.Location.Open(ctx, name, offset, length)
	if err != nil {
		return nil, nil, err
	}
	return &heldReader{ReadCloser: r, l: l, name: name}, m, nil
}

type heldReader struct {
	io.ReadCloser
	l    *heldLocation
	name string
	once sync.Once
}

func (r *heldReader) Read(p []byte) (int, error) {
	r.once.Do(func() {
		select {
		case r.l.opened <- r.name:
		default: // nobody waits for it: a test past its concurrent part
		}
		<-r.l.release
	})
	return r.ReadCloser.Read(p)
}

// verifyWorld is a Service over a filesystem location holding one real
// etcd snapshot under each name, every read of it held until released,
// and its scratch directory.
type verifyWorld struct {
	s       *Service
	loc     *heldLocation
	scratch string
	size    int64
}

func newVerifyWorld(t *testing.T, names ...string) *verifyWorld {
	t.Helper()
	fs, err := filesystem.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	snap := etcdtest.SnapshotFile(t, filepath.Join(t.TempDir(), "snap.db"), 64<<10)
	for _, n := range names {
		backuptest.Put(t, fs, &storage.Manifest{Name: n}, snap)
	}
	m, err := metrics.New(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	loc := &heldLocation{Location: fs, opened: make(chan string, len(names)), release: make(chan struct{})}
	scratch := t.TempDir()
	s := New(Config{
		Locations: oneLocation(t, loc, m),
		Metrics:   m, Limits: config.Limits{}.WithDefaults(),
		ScratchDir: scratch,
	})
	// Plenty of room, whatever this machine's disk holds; the budget is
	// what a test sets.
	s.verifies.free = func(string) (int64, int64, error) { return 1 << 40, 1 << 40, nil }
	return &verifyWorld{s: s, loc: loc, scratch: scratch, size: int64(len(snap))}
}

// scratchSpace reads the file system's figures where the server runs.
func TestScratchSpace(t *testing.T) {
	available, total, err := scratchSpace(t.TempDir())
	if runtime.GOOS == "windows" {
		if err == nil {
			t.Fatalf("scratchSpace on Windows said %d of %d bytes; it has no statfs", available, total)
		}
		return
	}
	if err != nil || total <= 0 || available < 0 || available > total {
		t.Fatalf("scratchSpace: %d available of %d (%v)", available, total, err)
	}
}

func (w *verifyWorld) verify(name string) (*ebv1.VerifyBackupResponse, error) {
	return w.s.VerifyBackup(context.Background(), &ebv1.VerifyBackupRequest{Name: name})
}

// scratchBytes is what the scratch directory holds, and its entries.
func (w *verifyWorld) scratchBytes(t *testing.T) (int64, []string) {
	t.Helper()
	var n int64
	var entries []string
	err := filepath.WalkDir(w.scratch, func(path string, d os.DirEntry, err error) error {
		if err != nil || path == w.scratch {
			return err
		}
		rel, _ := filepath.Rel(w.scratch, path)
		entries = append(entries, rel)
		if d.Type().IsRegular() {
			info, err := d.Info()
			if err != nil {
				return err
			}
			n += info.Size()
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return n, entries
}

func wantExhausted(t *testing.T, err error, subs ...string) {
	t.Helper()
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("got %v (%v), want ResourceExhausted", status.Code(err), err)
	}
	t.Logf("refused: %v", err)
	for _, s := range append(subs, "kubectl etcdbackup download") {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("refusal %q does not say %q", err, s)
		}
	}
}

// Two verifies whose snapshots together need more scratch space than the
// budget: the second is refused at once with ResourceExhausted, writing
// nothing, while the first runs on to its verdict; once it ended, the
// second fits.
func TestConcurrentVerifiesOverTheScratchBudget(t *testing.T) {
	w := newVerifyWorld(t, "first", "second")
	w.s.verifies.budget = w.size * 3 / 2

	type result struct {
		res *ebv1.VerifyBackupResponse
		err error
	}
	done := make(chan result, 1)
	go func() {
		res, err := w.verify("first")
		done <- result{res, err}
	}()
	if got := <-w.loc.opened; got != "first" {
		t.Fatalf("opened %q first", got)
	}

	_, err := w.verify("second")
	wantExhausted(t, err, `verify of "second"`, "try again when one has finished", "inspect second")
	// The refused verify made nothing; the first one holds its (empty)
	// scratch file and nothing more.
	if n, entries := w.scratchBytes(t); n != 0 || len(entries) != 2 {
		t.Fatalf("scratch holds %d bytes in %v while the first verify waits; want its directory and empty file", n, entries)
	}
	select {
	case name := <-w.loc.opened:
		t.Fatalf("the refused verify read %q", name)
	default:
	}

	close(w.loc.release)
	r := <-done
	if r.err != nil {
		t.Fatalf("the first verify: %v", r.err)
	}
	if r.res.GetRevision() <= 0 || r.res.GetTotalKeys() <= 0 {
		t.Fatalf("the first verify answered %v", r.res)
	}
	if n, entries := w.scratchBytes(t); n != 0 || len(entries) != 0 {
		t.Fatalf("scratch holds %d bytes in %v after the verify; want nothing", n, entries)
	}
	if w.s.verifies.n != 0 || w.s.verifies.reserved != 0 {
		t.Fatalf("the gate still counts %d verifies holding %d bytes", w.s.verifies.n, w.s.verifies.reserved)
	}
	if _, err := w.verify("second"); err != nil {
		t.Fatalf("the second verify, alone: %v", err)
	}
}

// With room in the budget, the verifies past maxVerifies are refused.
func TestVerifiesPastTheCountAreRefused(t *testing.T) {
	w := newVerifyWorld(t, "a", "b", "c")
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	for _, n := range []string{"a", "b"} {
		wg.Go(func() {
			_, err := w.verify(n)
			errs <- err
		})
		<-w.loc.opened
	}
	_, err := w.verify("c")
	wantExhausted(t, err, `verify of "c"`, "at most 2 verifies at once", "and 2 are running", "try again when one has finished")
	close(w.loc.release)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Errorf("a verify within the count: %v", err)
		}
	}
}

// A backup larger than the whole budget is refused up front, with where
// to check it instead; one larger than what the scratch file system can
// spare (its last 10% kept free) too.
func TestVerifyThatCannotFitIsRefused(t *testing.T) {
	w := newVerifyWorld(t, "big")
	close(w.loc.release)
	w.s.verifies.budget = w.size - 1
	_, err := w.verify("big")
	wantExhausted(t, err, `verify of "big"`, "more than the", "(limits.verifyScratchBytes)", "inspect big")
	// The budget is the configured limit.
	if b := New(Config{Locations: oneLocation(t, w.loc, nil), Limits: config.Limits{VerifyScratchBytes: 12345}.WithDefaults()}).verifies.budget; b != 12345 {
		t.Fatalf("verify budget %d with limits.verifyScratchBytes 12345", b)
	}
	if b := New(Config{Locations: oneLocation(t, w.loc, nil), Limits: config.Limits{}.WithDefaults()}).verifies.budget; b != config.DefaultVerifyScratchBytes {
		t.Fatalf("default verify budget %d", b)
	}

	w.s.verifies.budget = 0
	w.s.verifies.free = func(string) (int64, int64, error) { return 100<<20 + w.size - 1, 1000 << 20, nil }
	_, err = w.verify("big")
	wantExhausted(t, err, `verify of "big"`, "scratch space has 100.", "10% of its size (100 MiB) must stay free")

	w.s.verifies.free = func(string) (int64, int64, error) { return 100<<20 + w.size, 1000 << 20, nil }
	if _, err := w.verify("big"); err != nil {
		t.Fatalf("a verify that just fits: %v", err)
	}
	w.s.verifies.free = func(string) (int64, int64, error) { return 0, 0, errors.New("no statfs here") }
	if _, err := w.verify("big"); err != nil {
		t.Fatalf("a verify where free space is unknown, within the budget: %v", err)
	}
	if n, entries := w.scratchBytes(t); n != 0 || len(entries) != 0 {
		t.Fatalf("scratch holds %d bytes in %v; want nothing", n, entries)
	}
}

// A plain backup whose stored data runs past the size its manifest
// records writes no more than that size into scratch: it is corrupt.
func TestVerifyWritesNoMoreThanItReserved(t *testing.T) {
	dir := t.TempDir()
	fs, err := filesystem.New(dir)
	if err != nil {
		t.Fatal(err)
	}
	data := []byte("stored bytes of a plain backup")
	backuptest.Put(t, fs, &storage.Manifest{Name: "grown"}, data)
	f, err := os.OpenFile(filepath.Join(dir, "backups", "grown.db"), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(make([]byte, 1<<20)); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	var most int64
	w := &reservedWriter{w: writerFunc(func(p []byte) (int, error) { most += int64(len(p)); return len(p), nil }), left: int64(len(data))}
	if _, err := io.Copy(w, strings.NewReader(string(data)+"more")); !errors.Is(err, errPastReservation) || most != int64(len(data)) {
		t.Fatalf("reservedWriter wrote %d of %d bytes and said %v", most, len(data), err)
	}

	m, err := metrics.New(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	s := New(Config{
		Locations: oneLocation(t, fs, m),
		Metrics:   m, Limits: config.Limits{}.WithDefaults(),
		ScratchDir: t.TempDir(),
	})
	_, err = s.VerifyBackup(context.Background(), &ebv1.VerifyBackupRequest{Name: "grown"})
	if status.Code(err) != codes.DataLoss || !strings.Contains(err.Error(), "more than the 30 bytes its manifest records") {
		t.Fatalf("got %v, want DataLoss: more than the 30 bytes its manifest records", err)
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }
