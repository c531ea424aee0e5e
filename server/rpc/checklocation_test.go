package rpc_test

import (
	"bytes"
	"context"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc/codes"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/servertest"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage/filesystem"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage/locations"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage/s3/s3test"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage/storagetest"
)

func stepResults(resp *ebv1.CheckLocationResponse) []string {
	var out []string
	for _, s := range resp.GetSteps() {
		out = append(out, s.GetName()+"="+s.GetResult())
	}
	return out
}

// logBuffer collects a server's log as text, safe for its goroutines.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestCheckLocation: a filesystem location passes its check through the
// Service, every step named; nothing is left, and a probe an interrupted
// check left is neither listed nor addressable as a backup.
func TestCheckLocation(t *testing.T) {
	ctx := t.Context()
	loc, err := filesystem.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	leftover := storage.ProbePrefix + "0123456789abcdef"
	storagetest.Put(t, loc, leftover, storagetest.Data(1, 100))
	srv, err := server.New(server.Config{Locations: []server.NamedLocation{{Name: "default", Location: loc}}})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := srv.CheckLocation(ctx, &ebv1.CheckLocationRequest{})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"write=ok", "multipart write=skipped", "ranged read=ok", "list=ok",
		"conditional create=ok", "checksums=skipped", "object lock=skipped", "delete=ok"}
	if !resp.GetOk() || resp.GetLocation() != "default" || resp.GetType() != "filesystem" || !slices.Equal(stepResults(resp), want) {
		t.Fatalf("check: ok=%v location=%q type=%q steps %q", resp.GetOk(), resp.GetLocation(), resp.GetType(), stepResults(resp))
	}
	list, err := srv.ListBackups(ctx, &ebv1.ListBackupsRequest{})
	if err != nil || len(list.GetBackups()) != 0 {
		t.Fatalf("list after the check: %v (%v), want nothing: the young leftover stays in the store, unlisted", list.GetBackups(), err)
	}
	if _, err := loc.Stat(ctx, leftover); err != nil {
		t.Fatalf("the leftover probe: %v", err)
	}
	_, err = srv.GetBackup(ctx, &ebv1.GetBackupRequest{Name: leftover})
	servertest.WantCode(t, err, codes.InvalidArgument)
	_, err = srv.DeleteBackup(ctx, &ebv1.DeleteBackupRequest{Name: leftover})
	servertest.WantCode(t, err, codes.InvalidArgument)

	_, err = srv.CheckLocation(ctx, &ebv1.CheckLocationRequest{Location: "nope"})
	servertest.WantCode(t, err, codes.NotFound)
}

// TestCheckLocationUnavailable: a location whose store does not answer
// is refused as every call to it is.
func TestCheckLocationUnavailable(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	endpoint := "http://" + ln.Addr().String()
	ln.Close()
	t.Setenv("TEST_KEY_ID", "id")
	t.Setenv("TEST_SECRET", "secret")
	locs, err := locations.Open(t.Context(), []storage.LocationConfig{
		{Name: "s3", S3: &storage.S3Config{Bucket: "b", Endpoint: endpoint, PathStyle: true, AccessKeyIDEnv: "TEST_KEY_ID", SecretAccessKeyEnv: "TEST_SECRET"}},
	}, locations.Options{})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := server.New(server.Config{Locations: locs})
	if err != nil {
		t.Fatal(err)
	}
	_, err = srv.CheckLocation(t.Context(), &ebv1.CheckLocationRequest{Location: "s3"})
	wantLocationUnavailable(t, "check of the unavailable location", err, "s3", "connection refused")
}

// TestCheckLocationCredentialThatMayNotDelete: a real versitygw whose
// bucket policy denies the location's credentials s3:DeleteObject. The
// check fails at delete alone, naming the permission; the probes it
// could not remove are in no listing; the server's own check at start
// logs the step as a warning with its advice.
func TestCheckLocationCredentialThatMayNotDelete(t *testing.T) {
	ctx := t.Context()
	store := s3test.Start(t)
	user := store.UserDenied(t, "s3:DeleteObject")
	cfg := store.ConfigAs("no-delete", user).S3Config
	locs, err := locations.Open(ctx, []storage.LocationConfig{{Name: "s3", S3: &cfg}}, locations.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var log logBuffer
	srv, err := server.New(server.Config{Locations: locs, Logger: slog.New(slog.NewTextHandler(&log, nil))})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := srv.CheckLocation(ctx, &ebv1.CheckLocationRequest{Location: "s3"})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"write=ok", "multipart write=ok", "ranged read=ok", "list=ok",
		"conditional create=ok", "checksums=ok", "object lock=skipped", "delete=failed"}
	if resp.GetOk() || resp.GetType() != "s3" || !slices.Equal(stepResults(resp), want) {
		t.Fatalf("check: ok=%v type=%q steps %q", resp.GetOk(), resp.GetType(), stepResults(resp))
	}
	del := resp.GetSteps()[len(resp.GetSteps())-1]
	if !strings.Contains(del.GetDetail(), "AccessDenied") || !strings.Contains(del.GetAdvice(), "grant s3:DeleteObject") {
		t.Errorf("delete: %q, advice %q", del.GetDetail(), del.GetAdvice())
	}
	keys, err := store.Keys(ctx)
	if err != nil || len(keys) == 0 {
		t.Fatalf("keys %q (%v), want the probes left behind", keys, err)
	}
	list, err := srv.ListBackups(ctx, &ebv1.ListBackupsRequest{Location: "s3"})
	if err != nil || len(list.GetBackups()) != 0 {
		t.Fatalf("list: %v (%v), want no probe listed", list.GetBackups(), err)
	}

	srv.CheckLocations(ctx)
	got := log.String()
	for _, w := range []string{
		`level=WARN msg="storage location check: a step failed; ` + "`kubectl etcdbackup location check s3`" + ` runs it again" location=s3 step=delete`,
		`advice="the credentials may not delete objects: grant s3:DeleteObject`,
		`level=INFO msg="storage location checked" location=s3 type=s3 ok=false failed=[delete]`,
	} {
		if !strings.Contains(got, w) {
			t.Errorf("the log does not say %s:\n%s", w, got)
		}
	}
	if strings.Count(got, "level=WARN") != 1 {
		t.Errorf("want one warning, for the one failed step:\n%s", got)
	}
	if strings.Contains(got, user.SecretAccessKey) {
		t.Error("the log holds the secret key")
	}
}

// TestChecksRunOneAtATime: checks asked at once all pass: the second
// waits for the first.
func TestChecksRunOneAtATime(t *testing.T) {
	loc, err := filesystem.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	srv, err := server.New(server.Config{Locations: []server.NamedLocation{{Name: "default", Location: loc}}})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for range 3 {
		wg.Go(func() {
			resp, err := srv.CheckLocation(context.Background(), &ebv1.CheckLocationRequest{})
			if err != nil || !resp.GetOk() {
				t.Errorf("check: %v %q", err, stepResults(resp))
			}
		})
	}
	wg.Wait()
	// A caller that gives up while it waits gets its context's error.
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	_, err = srv.CheckLocation(ctx, &ebv1.CheckLocationRequest{})
	servertest.WantCode(t, err, codes.Canceled)
}
