package client_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"log/slog"
	"net"
	"sync"
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

// HTTP/2 frame types and the error code the tearing proxy uses (RFC 9113).
const (
	frameData       = 0x0
	frameRSTStream  = 0x3
	errCodeInternal = 0x2
)

// tearingProxy relays TCP connections to a real server and tears the
// first one whose server-to-client DATA frames pass at bytes: it sends
// the client a RST_STREAM (INTERNAL_ERROR) for that stream instead of the
// frame, as an HTTP/2 intermediary that lost its upstream does, and
// closes both sides. Later connections are relayed whole.
type tearingProxy struct {
	addr     string
	upstream string
	at       int64
	torn     atomic.Bool
	wg       sync.WaitGroup
}

func startTearingProxy(t *testing.T, upstream string, at int64) *tearingProxy {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &tearingProxy{addr: lis.Addr().String(), upstream: upstream, at: at}
	t.Cleanup(func() { lis.Close(); p.wg.Wait() })
	p.wg.Go(func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			p.wg.Go(func() { p.relay(c) })
		}
	})
	return p
}

func (p *tearingProxy) relay(c net.Conn) {
	defer c.Close()
	u, err := net.Dial("tcp", p.upstream)
	if err != nil {
		return
	}
	defer u.Close()
	p.wg.Go(func() {
		_, _ = io.Copy(u, c)
		u.Close()
	})
	// Server to client frame by frame (the server sends no preface of
	// its own): a 9-byte header — length, type, flags, stream — and the
	// payload.
	var hdr [9]byte
	var data int64
	for {
		if _, err := io.ReadFull(u, hdr[:]); err != nil {
			return
		}
		payload := make([]byte, int(hdr[0])<<16|int(hdr[1])<<8|int(hdr[2]))
		if _, err := io.ReadFull(u, payload); err != nil {
			return
		}
		stream := binary.BigEndian.Uint32(hdr[5:]) & 0x7fffffff
		if hdr[3] == frameData && stream != 0 {
			if data += int64(len(payload)); data >= p.at && !p.torn.Swap(true) {
				rst := []byte{0, 0, 4, frameRSTStream, 0, 0, 0, 0, 0, 0, 0, 0, errCodeInternal}
				binary.BigEndian.PutUint32(rst[5:9], stream)
				_, _ = c.Write(rst)
				return
			}
		}
		if _, err := c.Write(append(hdr[:], payload...)); err != nil {
			return
		}
	}
}

// A stream torn mid-download surfaces as Internal from gRPC's transport,
// without the server's mark: the download is resumed on a new connection
// and completes, after telling once that it retries.
func TestTornStreamInternalIsRetried(t *testing.T) {
	srv := servertest.Start(t, "")
	data := uploadRandom(t, srv.Client, "big", 8<<20)
	proxy := startTearingProxy(t, srv.Addr, 2<<20)
	var notices atomic.Int32
	c := dialRetrying(t, proxy.addr, 30*time.Second, &notices)
	var broke error
	c.Retry.OnRetry = func(err error, _ time.Duration) { broke = err; notices.Add(1) }

	var out bytes.Buffer
	if _, err := c.Download(context.Background(), &out, client.DownloadRequest{Name: "big"}); err != nil {
		t.Fatalf("download across a torn stream: %v", err)
	}
	if !proxy.torn.Load() || notices.Load() != 1 {
		t.Fatalf("torn %v, %d retry notices: want the one torn stream told once", proxy.torn.Load(), notices.Load())
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
