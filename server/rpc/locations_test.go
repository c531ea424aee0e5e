package rpc_test

import (
	"context"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/util/wait"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage/locations"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage/s3/s3test"
)

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

// wantLocationUnavailable checks the status of a call to an unavailable
// location: Unavailable, naming it in the message and in the detail that
// tells it from a lost connection to the server.
func wantLocationUnavailable(t *testing.T, what string, err error, name, reason string) {
	t.Helper()
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), `storage location "`+name+`" is unavailable`) ||
		!strings.Contains(err.Error(), reason) {
		t.Fatalf("%s: %v; want Unavailable naming location %q and %q", what, err, name, reason)
	}
	if loc, ok := ebv1.UnavailableLocation(status.Convert(err)); !ok || loc != name {
		t.Fatalf("%s: the detail names %q (%v), want %q", what, loc, ok, name)
	}
}

// TestLocationUnavailableAtStart: an S3 location whose endpoint refuses
// connections does not stop the server, which serves the other location
// and answers calls to this one with Unavailable, naming it and why;
// GetServerInfo reports it.
func TestLocationUnavailableAtStart(t *testing.T) {
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
	locs, err := locations.Open(ctx, []storage.LocationConfig{
		{Name: "default", Filesystem: &storage.FilesystemConfig{Path: t.TempDir()}},
		{Name: "s3", S3: &storage.S3Config{Bucket: "b", Endpoint: endpoint, PathStyle: true, AccessKeyIDEnv: "TEST_KEY_ID", SecretAccessKeyEnv: "TEST_SECRET"}},
	}, locations.Options{})
	if err != nil {
		t.Fatalf("open with an unreachable S3 endpoint: %v", err)
	}
	srv, err := server.New(server.Config{Locations: locs})
	if err != nil {
		t.Fatal(err)
	}
	if e := locationInfo(t, srv, "s3"); !strings.Contains(e, "connection refused") || !strings.Contains(e, `"b"`) || !strings.Contains(e, "(since ") {
		t.Fatalf("GetServerInfo of the unreachable S3 location: %q", e)
	}
	if e := locationInfo(t, srv, "default"); e != "" {
		t.Fatalf("GetServerInfo of the filesystem location: %q", e)
	}
	if _, err := srv.ListBackups(ctx, &ebv1.ListBackupsRequest{Location: "default"}); err != nil {
		t.Fatalf("list of the available location: %v", err)
	}
	_, err = srv.ListBackups(ctx, &ebv1.ListBackupsRequest{Location: "s3"})
	wantLocationUnavailable(t, "list of the unavailable location", err, "s3", "connection refused")
	_, err = srv.GetBackup(ctx, &ebv1.GetBackupRequest{Location: "s3", Name: "x"})
	wantLocationUnavailable(t, "get from the unavailable location", err, "s3", "connection refused")
}

func waitFor(t *testing.T, what string, within time.Duration, ok func() bool) {
	t.Helper()
	if err := wait.PollUntilContextTimeout(t.Context(), 10*time.Millisecond, within, true, func(context.Context) (bool, error) {
		return ok(), nil
	}); err != nil {
		t.Fatalf("%s: not within %s", what, within)
	}
}

// TestS3StopsAnswering: a real S3 server stopped mid-run (SIGSTOP: it
// accepts connections and never answers). The call that finds out fails
// within the location's bound, naming the location, which is then
// unavailable: the next call fails at once. After SIGCONT it serves again
// without a restart.
func TestS3StopsAnswering(t *testing.T) {
	store := s3test.Start(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cfg := store.Config("mid-run").S3Config
	opts := locations.Options{CallTimeout: 500 * time.Millisecond, ListTimeout: time.Second}
	locs, err := locations.Open(ctx, []storage.LocationConfig{{Name: "s3", S3: &cfg}}, opts)
	if err != nil {
		t.Fatal(err)
	}
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
	took := time.Since(began)
	wantLocationUnavailable(t, "list with the store stopped", err, "s3", "no answer within 1s to list")
	t.Logf("list with the store stopped failed after %s: %v", took.Round(time.Millisecond), err)
	if took > opts.ListTimeout+2*time.Second {
		t.Errorf("list with the store stopped took %s, bound %s", took, opts.ListTimeout)
	}
	began = time.Now()
	_, err = srv.GetBackup(ctx, &ebv1.GetBackupRequest{Location: "s3", Name: "x"})
	took = time.Since(began)
	wantLocationUnavailable(t, "get once the location is unavailable", err, "s3", "no answer within 1s to list")
	if took > 200*time.Millisecond {
		t.Errorf("get once the location is unavailable took %s; want at once", took)
	}
	if e := locationInfo(t, srv, "s3"); !strings.Contains(e, "no answer within") {
		t.Fatalf("GetServerInfo of the stopped store: %q", e)
	}
	if err := store.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	stopped = false
	waitFor(t, "list after SIGCONT", time.Minute, func() bool { return list() == nil })
	if e := locationInfo(t, srv, "s3"); e != "" {
		t.Fatalf("GetServerInfo once the store answers: %q", e)
	}
}
