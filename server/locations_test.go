package server_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/config"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage/filesystem"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage/s3"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage/s3/s3test"
)

func TestOpenLocations(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	locs, err := server.OpenLocations(ctx, []config.Location{{Name: "default", Filesystem: &config.Filesystem{Path: dir}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(locs) != 1 || locs[0].Name != "default" || locs[0].Location.Type() != "filesystem" || !strings.Contains(locs[0].Location.Describe(), dir) {
		t.Fatalf("locations: %+v", locs)
	}
	// The S3 section goes to package s3 as is; its error names the location.
	_, err = server.OpenLocations(ctx, []config.Location{
		{Name: "default", Filesystem: &config.Filesystem{Path: dir}},
		{Name: "s3", S3: &config.S3{Bucket: "b"}},
	}, nil)
	if err == nil || !strings.Contains(err.Error(), `locations[1] ("s3")`) || !strings.Contains(err.Error(), "no credentials configured") {
		t.Fatalf("S3 location without credentials: %v", err)
	}
}

// flaky is a store whose availability a test switches: while down, opening
// and every call fail with a network error, as an unreachable S3 does.
type flaky struct {
	storage.Location
	down  atomic.Bool
	opens atomic.Int32
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
	if f.down.Load() {
		return fmt.Errorf("check: %w", errRefused)
	}
	return nil
}

// locationInfo is what `version` shows of a location: "" when available.
func locationInfo(t *testing.T, srv *server.Server, name string) string {
	t.Helper()
	info, err := srv.GetServerInfo(context.Background(), &ebv1.GetServerInfoRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range info.GetLocations() {
		if l.GetName() == name {
			if l.GetUnavailable() != (l.GetError() != "") {
				t.Fatalf("location %q: unavailable=%v with error %q", name, l.GetUnavailable(), l.GetError())
			}
			return l.GetError()
		}
	}
	t.Fatalf("location %q not in GetServerInfo: %v", name, info.GetLocations())
	return ""
}

// TestLocationUnavailable: a location whose store does not answer at start
// is served as unavailable, with its error, while the other location
// works; it becomes available in the background once the store answers,
// and unavailable again when the store stops answering mid-run.
func TestLocationUnavailable(t *testing.T) {
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
	locs := server.OpenWith(ctx, []server.Opener{
		{Name: "fs", Type: "filesystem", Where: "dir", Open: func(context.Context) (storage.Location, error) { return fsLoc, nil }},
		{Name: "s3", Type: "s3", Where: "s3://b", Open: f.open},
	}, 20*time.Millisecond, time.Second)
	srv, err := server.New(server.Config{Locations: locs})
	if err != nil {
		t.Fatal(err)
	}
	list := func(loc string) error {
		_, err := srv.ListBackups(ctx, &ebv1.ListBackupsRequest{Location: loc})
		return err
	}

	if err := list("fs"); err != nil {
		t.Fatalf("the available location: %v", err)
	}
	err = list("s3")
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), `storage location "s3" is unavailable`) ||
		!strings.Contains(err.Error(), "connection refused") {
		t.Fatalf("list of the unavailable location: %v", err)
	}
	// Clients tell it from a lost connection to the server by its detail.
	if loc, ok := ebv1.UnavailableLocation(status.Convert(err)); !ok || loc != "s3" {
		t.Fatalf("list of the unavailable location: detail names %q (%v)", loc, ok)
	}
	if e := locationInfo(t, srv, "s3"); !strings.Contains(e, "connection refused") || !strings.Contains(e, "(since ") {
		t.Fatalf("GetServerInfo of the unavailable location: %q", e)
	}
	if e := locationInfo(t, srv, "fs"); e != "" {
		t.Fatalf("GetServerInfo of the available location: %q", e)
	}
	// The first attempt and more, in the background.
	waitFor(t, func() bool { return f.opens.Load() >= 3 })

	f.down.Store(false)
	waitFor(t, func() bool { return list("s3") == nil })
	if e := locationInfo(t, srv, "s3"); e != "" {
		t.Fatalf("GetServerInfo once the store answers: %q", e)
	}

	// Mid-run: the call that finds the store gone names the location;
	// the location is unavailable until the store answers again, which
	// a background check (not a reopen) finds out.
	opens := f.opens.Load()
	f.down.Store(true)
	err = list("s3")
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), `storage location "s3" is unavailable`) {
		t.Fatalf("list after the store stopped answering: %v", err)
	}
	if e := locationInfo(t, srv, "s3"); !strings.Contains(e, "connection refused") {
		t.Fatalf("GetServerInfo after the store stopped answering: %q", e)
	}
	if err := list("fs"); err != nil {
		t.Fatalf("the other location meanwhile: %v", err)
	}
	f.down.Store(false)
	waitFor(t, func() bool { return list("s3") == nil })
	if f.opens.Load() != opens {
		t.Errorf("the location was reopened (%d opens, want %d): a check is enough", f.opens.Load(), opens)
	}
}

// TestOpenLocationsStartsUnavailable: an S3 location whose endpoint
// refuses connections does not stop OpenLocations, which returns it
// unavailable with the reason; a configuration error still does.
func TestOpenLocationsStartsUnavailable(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	endpoint := "http://" + ln.Addr().String()
	ln.Close() // nothing listens there now
	t.Setenv("TEST_KEY_ID", "id")
	t.Setenv("TEST_SECRET", "secret")
	locs, err := server.OpenLocations(ctx, []config.Location{
		{Name: "default", Filesystem: &config.Filesystem{Path: t.TempDir()}},
		{Name: "s3", S3: &config.S3{Bucket: "b", Endpoint: endpoint, PathStyle: true, AccessKeyIDEnv: "TEST_KEY_ID", SecretAccessKeyEnv: "TEST_SECRET"}},
	}, nil)
	if err != nil {
		t.Fatalf("OpenLocations with an unreachable S3 endpoint: %v", err)
	}
	if locs[1].Location.Type() != "s3" || !strings.Contains(locs[1].Location.Describe(), "s3://b at "+endpoint) {
		t.Fatalf("unavailable location: type %q, description %q", locs[1].Location.Type(), locs[1].Location.Describe())
	}
	srv, err := server.New(server.Config{Locations: locs})
	if err != nil {
		t.Fatal(err)
	}
	if e := locationInfo(t, srv, "s3"); !strings.Contains(e, "connection refused") || !strings.Contains(e, `"b"`) {
		t.Fatalf("GetServerInfo of the unreachable S3 location: %q", e)
	}
	if e := locationInfo(t, srv, "default"); e != "" {
		t.Fatalf("GetServerInfo of the filesystem location: %q", e)
	}
}

func waitFor(t *testing.T, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatal("timed out")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestS3StopsAnswering: a real S3 server stopped mid-run (SIGSTOP: it
// accepts connections and never answers). The call that finds out fails
// within the response timeout, naming the location, which is then
// unavailable; after SIGCONT it serves again without being reopened.
func TestS3StopsAnswering(t *testing.T) {
	store := s3test.Start(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cfg := store.Config("mid-run")
	cfg.ResponseTimeout = 300 * time.Millisecond
	locs := server.OpenWith(ctx, []server.Opener{{Name: "s3", Type: "s3", Where: "s3://" + store.Bucket,
		Open: func(ctx context.Context) (storage.Location, error) { return s3.New(ctx, cfg) }}}, 50*time.Millisecond, 5*time.Second)
	srv, err := server.New(server.Config{Locations: locs})
	if err != nil {
		t.Fatal(err)
	}
	list := func() error {
		_, err := srv.ListBackups(ctx, &ebv1.ListBackupsRequest{Location: "s3"})
		return err
	}
	if err := list(); err != nil {
		t.Fatal(err)
	}
	if err := store.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := true
	defer func() {
		if stopped {
			_ = store.Signal(syscall.SIGCONT)
		}
	}()
	began := time.Now()
	err = list()
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), `storage location "s3" is unavailable`) {
		t.Fatalf("list with the store stopped: %v", err)
	}
	t.Logf("list with the store stopped failed after %s: %v", time.Since(began).Round(time.Millisecond), err)
	if e := locationInfo(t, srv, "s3"); e == "" {
		t.Fatal("GetServerInfo shows the stopped store available")
	}
	if err := store.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	stopped = false
	waitFor(t, func() bool { return list() == nil })
}
