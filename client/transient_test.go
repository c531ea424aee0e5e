package client_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/client"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/servertest"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage/filesystem"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage/locations"
)

// A stream torn mid-download surfaces as Internal from gRPC's transport,
// without the server's mark: the download is resumed on a new connection
// and completes, after telling once that it retries.
func TestTornStreamInternalIsRetried(t *testing.T) {
	srv := servertest.Start(t, "")
	data := uploadRandom(t, srv.Client, "big", 8<<20)
	proxy := newResettingProxy(t, srv.Addr, 2<<20, 1)
	var notices atomic.Int32
	c := dialRetrying(t, proxy.lis.Addr().String(), 30*time.Second, &notices)
	var broke error
	c.Retry.OnRetry = func(err error, _ time.Duration) { broke = err; notices.Add(1) }

	var out bytes.Buffer
	if _, err := c.Download(context.Background(), &out, client.DownloadRequest{Name: "big"}); err != nil {
		t.Fatalf("download across a torn stream: %v", err)
	}
	if proxy.cutDone.Load() != 1 || notices.Load() != 1 {
		t.Fatalf("%d streams reset, %d retry notices: want the one reset stream told once", proxy.cutDone.Load(), notices.Load())
	}
	t.Logf("the torn stream failed with: %v", broke)
	if st, _ := status.FromError(broke); st.Code() != codes.Internal || ebv1.IsServerError(st) {
		t.Errorf("the torn stream failed with %v, want the transport's unmarked Internal", broke)
	}
	if !bytes.Equal(out.Bytes(), data) {
		t.Fatalf("downloaded %d bytes that differ from the %d uploaded", out.Len(), len(data))
	}
}

// brokenLocation is a filesystem location whose Stat fails as fail does
// (returns an error, or panics), counting the calls: what reaches the
// server's handler each time the client asks.
type brokenLocation struct {
	storage.Location
	fail  func() error
	calls atomic.Int32
}

func (l *brokenLocation) Stat(context.Context, string) (*storage.Manifest, error) {
	l.calls.Add(1)
	return nil, l.fail()
}

// serveLocation serves loc as location "default" of a real server and
// returns a retrying client of it.
func serveLocation(t *testing.T, loc storage.Location, notices *atomic.Int32) *client.Client {
	srv, err := server.New(server.Config{Locations: []server.NamedLocation{{Name: "default", Location: loc}}, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(ctx, server.Listeners{Users: lis}, 0); err != nil {
			t.Errorf("Serve: %v", err)
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	return dialRetrying(t, lis.Addr().String(), 30*time.Second, notices)
}

// The server's own answers are not retried: the Internal of a handler
// that panicked (it carries the server's mark), and the Unavailable of a
// storage location the server cannot reach (it retries that itself).
func TestServerAnswersAreNotRetried(t *testing.T) {
	for _, tc := range []struct {
		name string
		fail func() error
		code codes.Code
	}{
		{"panic", func() error { panic("stat exploded") }, codes.Internal},
		{"location unavailable", func() error {
			return &locations.UnavailableError{Location: "default", Since: time.Now(), Err: errors.New("connection refused")}
		}, codes.Unavailable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs, err := filesystem.New(t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			loc := &brokenLocation{Location: fs, fail: tc.fail}
			var notices atomic.Int32
			c := serveLocation(t, loc, &notices)
			_, err = c.Download(context.Background(), io.Discard, client.DownloadRequest{Name: "any"})
			st, _ := status.FromError(err)
			if st.Code() != tc.code || !ebv1.IsServerError(st) {
				t.Fatalf("got %v, want the server's marked %v", err, tc.code)
			}
			if n := loc.calls.Load(); n != 1 || notices.Load() != 0 {
				t.Fatalf("the server was asked %d times after %d retry notices, want once and none", n, notices.Load())
			}
		})
	}
}
