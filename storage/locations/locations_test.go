package locations_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage/filesystem"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage/locations"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage/s3/s3test"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage/storagetest"
)

func TestOpen(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	locs, err := locations.Open(ctx, []storage.LocationConfig{{Name: "default", Filesystem: &storage.FilesystemConfig{Path: dir}}}, locations.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if len(locs) != 1 || locs[0].Name != "default" || locs[0].Location.Type() != "filesystem" || !strings.Contains(locs[0].Location.Describe(), dir) {
		t.Fatalf("locations: %+v", locs)
	}
	if since, err := locations.Status(locs[0].Location); err != nil || !since.IsZero() {
		t.Fatalf("status of an opened location: %v, %v", since, err)
	}
	storagetest.Put(t, locs[0].Location, "first", storagetest.Data(1, 1000))

	notPEM := filepath.Join(t.TempDir(), "ca.crt")
	if err := os.WriteFile(notPEM, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	// Only what retrying cannot fix is an error, each naming its place.
	for _, tc := range []struct {
		name string
		cfgs []storage.LocationConfig
		want []string
	}{
		{"no credentials", []storage.LocationConfig{
			{Name: "default", Filesystem: &storage.FilesystemConfig{Path: dir}},
			{Name: "s3", S3: &storage.S3Config{Bucket: "b"}},
		}, []string{"locations[1].s3", "no credentials configured"}},
		{"same name twice", []storage.LocationConfig{
			{Name: "default", Filesystem: &storage.FilesystemConfig{Path: dir}},
			{Name: "default", Filesystem: &storage.FilesystemConfig{Path: dir}},
		}, []string{"locations[1].name", "Duplicate value"}},
		{"none", nil, []string{"locations", "at least one"}},
		{"CA bundle without a certificate", []storage.LocationConfig{
			{Name: "s3", S3: &storage.S3Config{Bucket: "b", CABundleFile: notPEM, AccessKeyIDEnv: "K", SecretAccessKeyEnv: "S"}},
		}, []string{`locations[0] ("s3")`, "holds no PEM certificate"}},
	} {
		_, err := locations.Open(ctx, tc.cfgs, locations.Options{})
		for _, w := range tc.want {
			if err == nil || !strings.Contains(err.Error(), w) {
				t.Errorf("%s: %v, want %q", tc.name, err, w)
			}
		}
	}
}

// flaky is a store whose availability a test switches: while down, opening
// and every call fail with a network error, as an unreachable S3 does.
type flaky struct {
	storage.Location
	down   atomic.Bool
	opens  atomic.Int32
	checks atomic.Int32
}

var errRefused = &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")}

func (f *flaky) open(context.Context) (storage.Location, error) {
	f.opens.Add(1)
	if f.down.Load() {
		return nil, fmt.Errorf("bucket not reachable: %w", errRefused)
	}
	return f, nil
}

func (f *flaky) List(ctx context.Context) ([]*storage.Manifest, error) {
	if f.down.Load() {
		return nil, fmt.Errorf("list: %w", errRefused)
	}
	return f.Location.List(ctx)
}

func (f *flaky) Check(context.Context) error {
	f.checks.Add(1)
	if f.down.Load() {
		return fmt.Errorf("check: %w", errRefused)
	}
	return nil
}

// waitFor polls ok (apimachinery's wait) until it holds, failing the test
// after within.
func waitFor(t *testing.T, what string, within time.Duration, ok func() bool) {
	t.Helper()
	if err := wait.PollUntilContextTimeout(context.Background(), 10*time.Millisecond, within, true, func(context.Context) (bool, error) {
		return ok(), nil
	}); err != nil {
		t.Fatalf("%s: not within %s", what, within)
	}
}

// wantUnavailable checks that err is the UnavailableError of location
// name, saying reason.
func wantUnavailable(t *testing.T, what string, err error, name, reason string) *locations.UnavailableError {
	t.Helper()
	var ue *locations.UnavailableError
	if !errors.As(err, &ue) || ue.Location != name || !strings.Contains(err.Error(), reason) ||
		!strings.Contains(err.Error(), `storage location "`+name+`" is unavailable: `) || ue.Since.IsZero() {
		t.Fatalf("%s: %v; want location %q unavailable: %s", what, err, name, reason)
	}
	return ue
}

// TestUnavailableAndBack: a location whose store does not answer at open
// is returned unavailable, with its error, while the other works; it
// becomes available in the background once the store answers, and
// unavailable again when the store stops answering, until a background
// check (not a reopen) finds it back.
func TestUnavailableAndBack(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	fsLoc, err := filesystem.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	backing, err := filesystem.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	f := &flaky{Location: backing}
	f.down.Store(true)
	locs := locations.OpenWith(ctx, []locations.Opener{
		{Name: "fs", Type: "filesystem", Where: "dir", Open: func(context.Context) (storage.Location, error) { return fsLoc, nil }},
		{Name: "s3", Type: "s3", Where: "s3://b", Open: f.open},
	}, 20*time.Millisecond, locations.Options{})
	fs, s3 := locs[0].Location, locs[1].Location
	if s3.Type() != "s3" || s3.Describe() != "s3://b" {
		t.Fatalf("an unopened location is still described: %q, %q", s3.Type(), s3.Describe())
	}

	if _, err := fs.List(ctx); err != nil {
		t.Fatalf("the available location: %v", err)
	}
	_, err = s3.List(ctx)
	wantUnavailable(t, "list of the unavailable location", err, "s3", "connection refused")
	_, err = s3.Stat(ctx, "x")
	ue := wantUnavailable(t, "stat of the unavailable location", err, "s3", "connection refused")
	if since, err := locations.Status(s3); err == nil || !since.Equal(ue.Since) || !strings.Contains(err.Error(), "connection refused") {
		t.Fatalf("status of the unavailable location: %v, %v; want since %v", since, err, ue.Since)
	}
	if _, err := locations.Status(fs); err != nil {
		t.Fatalf("status of the available location: %v", err)
	}
	// The first attempt and more, in the background.
	waitFor(t, "retries", 10*time.Second, func() bool { return f.opens.Load() >= 3 })

	f.down.Store(false)
	waitFor(t, "available once the store answers", 10*time.Second, func() bool { _, err := locations.Status(s3); return err == nil })
	if _, err := s3.List(ctx); err != nil {
		t.Fatalf("list once the store answers: %v", err)
	}

	// Mid-run: the call that finds the store gone names the location;
	// the location is unavailable until the store answers again.
	opens := f.opens.Load()
	f.down.Store(true)
	_, err = s3.List(ctx)
	wantUnavailable(t, "list after the store stopped answering", err, "s3", "connection refused")
	if _, err := locations.Status(s3); err == nil {
		t.Fatal("status after the store stopped answering: available")
	}
	if _, err := fs.List(ctx); err != nil {
		t.Fatalf("the other location meanwhile: %v", err)
	}
	checks := f.checks.Load()
	waitFor(t, "background checks", 10*time.Second, func() bool { return f.checks.Load() >= checks+2 })
	f.down.Store(false)
	waitFor(t, "available again", 10*time.Second, func() bool { _, err := locations.Status(s3); return err == nil })
	if f.opens.Load() != opens {
		t.Errorf("the location was reopened (%d opens, want %d): a check is enough", f.opens.Load(), opens)
	}
}

// TestOpenReadOnly: read-only locations read, refuse writes with
// storage.ErrReadOnly (even while unavailable), and a path that is no
// location is unavailable saying so, and not created.
func TestOpenReadOnly(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dir := t.TempDir()
	owner, err := filesystem.New(dir)
	if err != nil {
		t.Fatal(err)
	}
	m := storagetest.Put(t, owner, "kept", storagetest.Data(1, 1000))
	wrong := filepath.Join(t.TempDir(), "not-there")
	locs, err := locations.Open(ctx, []storage.LocationConfig{
		{Name: "default", Filesystem: &storage.FilesystemConfig{Path: dir}},
		{Name: "wrong", Filesystem: &storage.FilesystemConfig{Path: wrong}},
	}, locations.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	loc := locs[0].Location
	if sum, _ := storagetest.ReadAt(t, loc, "kept", 0); sum != m.SHA256 {
		t.Fatalf("read: SHA-256 %s, want %s", sum, m.SHA256)
	}
	if ms, err := loc.List(ctx); err != nil || len(ms) != 1 {
		t.Fatalf("list: %v, %v", ms, err)
	}
	for _, l := range locs {
		if _, err := l.Location.Create(ctx, "new"); !errors.Is(err, storage.ErrReadOnly) || !strings.Contains(err.Error(), "break-glass") {
			t.Errorf("create in %s: %v, want storage.ErrReadOnly", l.Name, err)
		}
		if err := l.Location.Delete(ctx, "kept"); !errors.Is(err, storage.ErrReadOnly) {
			t.Errorf("delete from %s: %v, want storage.ErrReadOnly", l.Name, err)
		}
	}
	if _, err := locations.Status(locs[1].Location); err == nil || !strings.Contains(err.Error(), "no backups directory under "+wrong+": is this the location's path?") {
		t.Errorf("status of a read-only location at a wrong path: %v", err)
	}
	if _, err := os.Stat(wrong); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a read-only open created %s (%v)", wrong, err)
	}
}

// TestHungStore: a real S3 store that accepts connections and never
// answers (versitygw under SIGSTOP). The first call fails with an
// UnavailableError when its bound passes — Stat and Open after
// CallTimeout, List after ListTimeout — the next ones at once; after
// SIGCONT the background check finds the store back.
func TestHungStore(t *testing.T) {
	store := s3test.Start(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cfg := store.Config("hung").S3Config
	opts := locations.Options{CallTimeout: time.Second, ListTimeout: 2 * time.Second}
	locs, err := locations.Open(ctx, []storage.LocationConfig{{Name: "s3", S3: &cfg}}, opts)
	if err != nil {
		t.Fatal(err)
	}
	loc := locs[0].Location
	storagetest.Put(t, loc, "kept", storagetest.Data(1, 1000))
	// The margin covers a busy machine; the S3 client alone would wait
	// its ResponseTimeout (30 s) per attempt.
	const margin = 1500 * time.Millisecond

	stop := func() {
		t.Helper()
		if err := store.Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = store.Signal(syscall.SIGCONT) })
	}
	resume := func() {
		t.Helper()
		if err := store.Signal(syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
		began := time.Now()
		waitFor(t, "available after SIGCONT", time.Minute, func() bool { _, err := locations.Status(loc); return err == nil })
		t.Logf("available again %s after SIGCONT", time.Since(began).Round(time.Millisecond))
	}
	timed := func(what string, bound time.Duration, reason string, call func() error) {
		t.Helper()
		began := time.Now()
		err := call()
		took := time.Since(began)
		wantUnavailable(t, what, err, "s3", reason)
		t.Logf("%s: failed after %s: %v", what, took.Round(time.Millisecond), err)
		switch {
		case bound == 0 && took > 200*time.Millisecond:
			t.Errorf("%s took %s; want at once", what, took.Round(time.Millisecond))
		case bound > 0 && (took < bound-50*time.Millisecond || took > bound+margin):
			t.Errorf("%s took %s; want about %s", what, took.Round(time.Millisecond), bound)
		}
	}

	stop()
	timed("stat of a hung store", opts.CallTimeout, `no answer within 1s to stat "kept"`, func() error {
		_, err := loc.Stat(ctx, "kept")
		return err
	})
	timed("list once unavailable", 0, `no answer within 1s to stat "kept"`, func() error {
		_, err := loc.List(ctx)
		return err
	})
	timed("open once unavailable", 0, `no answer within 1s to stat "kept"`, func() error {
		_, _, err := loc.Open(ctx, "kept", 0, 0)
		return err
	})
	resume()
	if _, err := loc.Stat(ctx, "kept"); err != nil {
		t.Fatalf("stat after SIGCONT: %v", err)
	}

	stop()
	timed("list of a hung store", opts.ListTimeout, "no answer within 2s to list", func() error {
		_, err := loc.List(ctx)
		return err
	})
	resume()

	stop()
	timed("open of a hung store", opts.CallTimeout, `no answer within 1s to open "kept"`, func() error {
		_, _, err := loc.Open(ctx, "kept", 0, 0)
		return err
	})
	resume()

	// The caller giving up is not the store failing.
	stop()
	cctx, ccancel := context.WithTimeout(ctx, 200*time.Millisecond)
	_, err = loc.Stat(cctx, "kept")
	ccancel()
	if err == nil || errors.As(err, new(*locations.UnavailableError)) {
		t.Errorf("stat whose caller gave up: %v; want the caller's error", err)
	}
	if _, err := locations.Status(loc); err != nil {
		t.Errorf("status after a caller gave up: %v", err)
	}
	resume()
}

// TestTransferNotCut: the bound is on the store's answer, not on the
// transfer: a reader Open returned keeps reading long after CallTimeout.
func TestTransferNotCut(t *testing.T) {
	store := s3test.Start(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cfg := store.Config("transfer").S3Config
	opts := locations.Options{CallTimeout: 200 * time.Millisecond}
	locs, err := locations.Open(ctx, []storage.LocationConfig{{Name: "s3", S3: &cfg}}, opts)
	if err != nil {
		t.Fatal(err)
	}
	loc := locs[0].Location
	m := storagetest.Put(t, loc, "big", storagetest.Data(1, 8<<20))
	r, _, err := loc.Open(ctx, "big", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	head := make([]byte, 64<<10)
	if _, err := io.ReadFull(r, head); err != nil {
		t.Fatal(err)
	}
	// A reader that takes its time: what is under test is time passing
	// on the bound's real timer, with the store (versitygw) another
	// process and the bytes on real sockets — no condition to wait for,
	// and a fake clock cannot move either (the sleep is 600 ms).
	time.Sleep(3 * opts.CallTimeout)
	sum, n := storagetest.Sum(t, io.MultiReader(bytes.NewReader(head), r), 0)
	if sum != m.SHA256 || n != m.Size {
		t.Fatalf("read past the bound: %d bytes, SHA-256 %s; want %d, %s", n, sum, m.Size, m.SHA256)
	}
	if _, err := locations.Status(loc); err != nil {
		t.Fatalf("status after a slow read: %v", err)
	}
}
