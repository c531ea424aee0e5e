package client_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/client"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/internal/etcdtest"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/servertest"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage/filesystem"
)

// restartable is a real data server on a fixed loopback address that the
// test stops abruptly (no drain: in-flight streams are cut, as when a pod
// is killed) and starts again on the same address and storage, as a
// replacement pod would serve.
type restartable struct {
	t    *testing.T
	addr string
	dir  string

	mu   sync.Mutex
	stop func() // nil while stopped
	// down holds the address while the server is stopped, closing every
	// connection at once as a pod that is not serving does: were the
	// port let go, a server of another test process (go test runs
	// packages in parallel) could take it and answer the client.
	down net.Listener
	// dialsLeft, when above 0, is how many more dials of down start the
	// server again (StartAgainAfterDials).
	dialsLeft int
	closed    bool // the test ended: no more restarts
	wg        sync.WaitGroup
}

func startRestartable(t *testing.T) *restartable {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &restartable{t: t, addr: lis.Addr().String(), dir: t.TempDir()}
	s.mu.Lock()
	s.serve(lis)
	s.mu.Unlock()
	t.Cleanup(func() {
		s.mu.Lock()
		s.closed = true
		if s.down != nil {
			s.down.Close()
		}
		s.mu.Unlock()
		s.Stop()
		s.wg.Wait()
	})
	return s
}

// serve serves lis in the background; the caller holds s.mu.
func (s *restartable) serve(lis net.Listener) {
	loc, err := filesystem.New(s.dir)
	if err != nil {
		s.t.Fatal(err)
	}
	srv, err := server.New(server.Config{Locations: []server.NamedLocation{{Name: "default", Location: loc}}})
	if err != nil {
		s.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer close(done)
		if err := srv.Serve(ctx, server.Listeners{Users: lis}, 0); err != nil {
			s.t.Errorf("Serve: %v", err)
		}
	}()
	s.stop = func() { cancel(); <-done }
}

// Stop cuts every connection and stops serving; it returns once the
// server is down, its address held by down.
func (s *restartable) Stop() {
	s.mu.Lock()
	stop := s.stop
	s.stop = nil
	s.mu.Unlock()
	if stop != nil {
		stop()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || s.down != nil || s.stop != nil {
		return
	}
	if lis, err := net.Listen("tcp", s.addr); err == nil {
		s.holdDown(lis)
	}
}

// holdDown closes every connection lis accepts until dialsLeft of them
// after StartAgainAfterDials, then serves lis again; the caller holds
// s.mu.
func (s *restartable) holdDown(lis net.Listener) {
	s.down = lis
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			c, err := lis.Accept()
			if err != nil {
				return // the test ended
			}
			c.Close()
			s.mu.Lock()
			if s.dialsLeft > 0 {
				if s.dialsLeft--; s.dialsLeft == 0 {
					s.down = nil
					if s.closed {
						lis.Close()
					} else {
						s.serve(lis)
					}
					s.mu.Unlock()
					return
				}
			}
			s.mu.Unlock()
		}
	}()
}

// StartAgainAfterDials serves again on the same address, in the
// background, once the client has dialled it n times while it was down:
// each of those connections is closed at once, as by a pod that is not
// serving yet, so the client meets an outage of several failed attempts
// however fast or slow the machine is.
func (s *restartable) StartAgainAfterDials(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.down == nil {
		lis, err := net.Listen("tcp", s.addr)
		if err != nil {
			s.t.Errorf("listen again on %s: %v", s.addr, err)
			return
		}
		s.holdDown(lis)
	}
	s.dialsLeft = max(n, 1)
}

// dialRetrying connects the way the plugin does (gRPC reconnecting within
// seconds) with a retry budget of timeout, counting the retry notices.
func dialRetrying(t *testing.T, addr string, timeout time.Duration, notices *atomic.Int32) *client.Client {
	conn, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(insecure.NewCredentials()), client.Reconnect)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	c := client.New(conn)
	c.Retry = client.Retry{Timeout: timeout, Flag: "--retry-timeout", OnRetry: func(err error, left time.Duration) {
		t.Logf("retrying for up to %s after: %v", left, err)
		notices.Add(1)
	}}
	return c
}

// triggerWriter passes writes on and calls at once, from the writing
// goroutine, when at bytes went through.
type triggerWriter struct {
	w     io.Writer
	n, at int64
	fired bool
	at1   func()
}

func (w *triggerWriter) Write(p []byte) (int, error) {
	n, err := w.w.Write(p)
	w.n += int64(n)
	if !w.fired && w.n >= w.at {
		w.fired = true
		w.at1()
	}
	return n, err
}

// uploadRandom uploads random bytes of about size that end in etcd's
// trailer (the server stores nothing else) and returns them.
func uploadRandom(t *testing.T, c *client.Client, name string, size int) []byte {
	data := etcdtest.TrailedBytes(t, etcdtest.TrailedSize(size))
	if _, err := c.Upload(context.Background(), bytes.NewReader(data), &ebv1.UploadHeader{Name: name}, nil); err != nil {
		t.Fatal(err)
	}
	return data
}

// The server goes away mid-download and comes back on the same address
// after refusing two attempts: the same Download call completes with every byte once,
// after telling once that it retries.
func TestDownloadSurvivesServerRestart(t *testing.T) {
	s := startRestartable(t)
	var notices atomic.Int32
	c := dialRetrying(t, s.addr, 30*time.Second, &notices)
	data := uploadRandom(t, c, "big", 48<<20)

	var out bytes.Buffer
	w := &triggerWriter{w: &out, at: 4 << 20, at1: func() {
		s.Stop()
		s.StartAgainAfterDials(2)
	}}
	b, err := c.Download(context.Background(), w, client.DownloadRequest{Name: "big"})
	if err != nil {
		t.Fatalf("download across a server restart: %v", err)
	}
	if !w.fired {
		t.Fatal("the server was never stopped: the test did not exercise retrying")
	}
	if notices.Load() != 1 {
		t.Fatalf("told about retrying %d times, want once for the one outage", notices.Load())
	}
	if !bytes.Equal(out.Bytes(), data) {
		t.Fatalf("downloaded %d bytes that differ from the %d uploaded", out.Len(), len(data))
	}
	if sum := sha256.Sum256(data); b.GetSha256() != hex.EncodeToString(sum[:]) {
		t.Fatal("backup sha256 differs from the data's")
	}
}

// Two replicas serve one store; the one a download runs on shuts down
// mid-transfer (a pod deleted, a node drained). It hands the download
// off rather than draining it, and the same Download call resumes on the
// other replica at once: every byte once, bytes equal, a pause well
// inside one retry backoff step of a server that is gone.
func TestDownloadMovesToAnotherReplica(t *testing.T) {
	dir := t.TempDir()
	first := servertest.StartWith(t, servertest.Options{Dir: dir, HandOffDownloads: true})
	resumed := &firstDownload{}
	second := servertest.StartWith(t, servertest.Options{Dir: dir, HandOffDownloads: true, Logger: slog.New(resumed)})
	// As the tunnel does: the first dial reaches the first replica; once
	// it is going, dials reach the other.
	var going atomic.Bool
	dialer := func(ctx context.Context, _ string) (net.Conn, error) {
		addr := first.Addr
		if going.Load() {
			addr = second.Addr
		}
		return (&net.Dialer{}).DialContext(ctx, "tcp", addr)
	}
	conn, err := grpc.NewClient("passthrough:///replicas", grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(dialer), client.Reconnect)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	c := client.New(conn)
	var notices atomic.Int32
	c.Retry = client.Retry{Timeout: 30 * time.Second, Flag: "--retry-timeout", OnRetry: func(err error, left time.Duration) {
		t.Logf("retrying for up to %s after: %v", left, err)
		notices.Add(1)
	}}
	data := uploadRandom(t, c, "big", 48<<20)

	var out bytes.Buffer
	var stopped time.Time
	w := &triggerWriter{w: &out, at: 4 << 20, at1: func() {
		going.Store(true)
		stopped = time.Now()
		go first.Stop()
	}}
	b, err := c.Download(context.Background(), w, client.DownloadRequest{Name: "big"})
	if err != nil {
		t.Fatalf("download across the replica's shutdown: %v", err)
	}
	if !w.fired {
		t.Fatal("the replica was never stopped: the test did not exercise the hand-off")
	}
	if notices.Load() != 1 {
		t.Fatalf("told about retrying %d times, want once", notices.Load())
	}
	if !bytes.Equal(out.Bytes(), data) {
		t.Fatalf("downloaded %d bytes that differ from the %d uploaded", out.Len(), len(data))
	}
	if sum := sha256.Sum256(data); b.GetSha256() != hex.EncodeToString(sum[:]) {
		t.Fatal("backup sha256 differs from the data's")
	}
	// The first replica drains for up to 10 s (servertest); handed off,
	// the download does not wait for that.
	at := resumed.at.Load()
	if at == 0 {
		t.Fatal("the other replica never served the download")
	}
	pause := time.Unix(0, at).Sub(stopped)
	if pause >= 5*time.Second {
		t.Fatalf("the download resumed on the other replica %v after the first began shutting down, want at once", pause)
	}
	t.Logf("the download resumed on the other replica %v after the first began shutting down", pause)
}

// firstDownload is a slog.Handler that records when the first
// "backup download" record (a download admitted) came.
type firstDownload struct{ at atomic.Int64 }

func (h *firstDownload) Enabled(context.Context, slog.Level) bool { return true }
func (h *firstDownload) Handle(_ context.Context, r slog.Record) error {
	if r.Message == "backup download" {
		h.at.CompareAndSwap(0, r.Time.UnixNano())
	}
	return nil
}
func (h *firstDownload) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *firstDownload) WithGroup(string) slog.Handler      { return h }

// A server that never comes back: the download fails once the budget is
// spent, saying what happened and which flag sets the budget.
func TestDownloadGivesUpAfterRetryTimeout(t *testing.T) {
	s := startRestartable(t)
	var notices atomic.Int32
	c := dialRetrying(t, s.addr, 2*time.Second, &notices)
	uploadRandom(t, c, "big", 48<<20)

	// The time is taken before the stop: the client may see the broken
	// stream (and start its budget) while Stop is still returning, the
	// more so as chunks are written on a goroutine of their own.
	var stopped time.Time
	w := &triggerWriter{w: io.Discard, at: 4 << 20, at1: func() { stopped = time.Now(); s.Stop() }}
	_, err := c.Download(context.Background(), w, client.DownloadRequest{Name: "big"})
	checkGaveUp(t, err, stopped, "download \"big\" at byte")
	if notices.Load() != 1 {
		t.Fatalf("told about retrying %d times, want once", notices.Load())
	}
}

func checkGaveUp(t *testing.T, err error, stopped time.Time, op string) {
	t.Helper()
	var gave *client.GiveUpError
	if !errors.As(err, &gave) {
		t.Fatalf("got %v, want a GiveUpError", err)
	}
	for _, want := range []string{op, "connection to the server lost", "2s", "--retry-timeout"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	if d := time.Since(stopped); d < 2*time.Second {
		t.Errorf("gave up %s after the server stopped, before the 2s budget", d)
	}
}

// stoppingReader stops the server once at bytes were read: the upload
// breaks before commit.
type stoppingReader struct {
	*bytes.Reader
	n, at int64
	fired bool
	stop  func()
}

func (r *stoppingReader) Read(p []byte) (int, error) {
	n, err := r.Reader.Read(p)
	r.n += int64(n)
	if !r.fired && r.n >= r.at {
		r.fired = true
		r.stop()
	}
	return n, err
}

// The server goes away mid-upload: the upload starts again from the
// beginning on the server that comes back after refusing two attempts, and the stored backup is the
// file.
func TestUploadRetriesFromTheStart(t *testing.T) {
	s := startRestartable(t)
	var notices atomic.Int32
	c := dialRetrying(t, s.addr, 30*time.Second, &notices)
	data := etcdtest.TrailedBytes(t, etcdtest.TrailedSize(24<<20))
	r := &stoppingReader{Reader: bytes.NewReader(data), at: 4 << 20, stop: func() {
		s.Stop()
		s.StartAgainAfterDials(2)
	}}
	b, err := c.Upload(context.Background(), r, &ebv1.UploadHeader{Name: "up"}, nil)
	if err != nil {
		t.Fatalf("upload across a server restart: %v", err)
	}
	if !r.fired {
		t.Fatal("the server was never stopped: the test did not exercise retrying")
	}
	if notices.Load() != 1 {
		t.Fatalf("told about retrying %d times, want once", notices.Load())
	}
	sum := sha256.Sum256(data)
	if b.GetSize() != int64(len(data)) || b.GetSha256() != hex.EncodeToString(sum[:]) {
		t.Fatalf("stored %d bytes sha256 %s, want %d bytes %x", b.GetSize(), b.GetSha256(), len(data), sum)
	}
	var out bytes.Buffer
	if _, err := c.Download(context.Background(), &out, client.DownloadRequest{Name: "up"}); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(out.Bytes(), data) {
		t.Fatal("the stored backup differs from the uploaded file")
	}
}

func TestUploadGivesUpAfterRetryTimeout(t *testing.T) {
	s := startRestartable(t)
	var notices atomic.Int32
	c := dialRetrying(t, s.addr, 2*time.Second, &notices)
	data := make([]byte, 24<<20)
	var stopped time.Time
	r := &stoppingReader{Reader: bytes.NewReader(data), at: 4 << 20, stop: func() { stopped = time.Now(); s.Stop() }}
	_, err := c.Upload(context.Background(), r, &ebv1.UploadHeader{Name: "up"}, nil)
	checkGaveUp(t, err, stopped, `upload "up"`)
	if notices.Load() != 1 {
		t.Fatalf("told about retrying %d times, want once", notices.Load())
	}
}

// An input that cannot be read again is not retried: the first break is
// the error.
func TestUploadOfAStreamIsNotRetried(t *testing.T) {
	s := startRestartable(t)
	var notices atomic.Int32
	c := dialRetrying(t, s.addr, 30*time.Second, &notices)
	data := make([]byte, 24<<20)
	r := &stoppingReader{Reader: bytes.NewReader(data), at: 4 << 20, stop: func() {
		s.Stop()
		s.StartAgainAfterDials(2)
	}}
	_, err := c.Upload(context.Background(), struct{ io.Reader }{r}, &ebv1.UploadHeader{Name: "up"}, nil)
	if err == nil || notices.Load() != 0 {
		t.Fatalf("upload of a stream: err %v after %d retry notices, want the break itself and none", err, notices.Load())
	}
}

// loseFirstAnswer is a client stream interceptor that lets the first
// UploadBackup run to its end on the server and then reports the
// connection lost instead of the server's answer: the upload was
// committed, its caller does not know.
func loseFirstAnswer(lost *atomic.Bool) grpc.StreamClientInterceptor {
	return func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		s, err := streamer(ctx, desc, cc, method, opts...)
		if err != nil || !strings.HasSuffix(method, "/UploadBackup") || lost.Swap(true) {
			return s, err
		}
		return &answerLost{ClientStream: s}, nil
	}
}

type answerLost struct{ grpc.ClientStream }

func (s *answerLost) RecvMsg(m any) error {
	if err := s.ClientStream.RecvMsg(m); err != nil {
		return err
	}
	return status.Error(codes.Unavailable, "connection lost (injected after the server answered)")
}

// The answer to a committed upload is lost: the retry is refused as
// AlreadyExists, and the backup under the name is this upload's (same size
// and SHA-256), so the upload succeeds.
func TestUploadWhoseAnswerWasLostSucceeds(t *testing.T) {
	srv := servertest.Start(t, "")
	var lost atomic.Bool
	conn, err := grpc.NewClient("passthrough:///"+srv.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithStreamInterceptor(loseFirstAnswer(&lost)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	c := client.New(conn)
	var notices atomic.Int32
	c.Retry.OnRetry = func(error, time.Duration) { notices.Add(1) }
	data := etcdtest.TrailedBytes(t, etcdtest.TrailedSize(3<<20))
	b, err := c.Upload(context.Background(), bytes.NewReader(data), &ebv1.UploadHeader{Name: "once"}, nil)
	if err != nil {
		t.Fatalf("upload whose first answer was lost: %v", err)
	}
	if !lost.Load() || notices.Load() != 1 {
		t.Fatalf("answer lost %v, %d retry notices: the test did not exercise the retry", lost.Load(), notices.Load())
	}
	if sum := sha256.Sum256(data); b.GetSha256() != hex.EncodeToString(sum[:]) || b.GetSize() != int64(len(data)) {
		t.Fatalf("got backup of %d bytes sha256 %s, want the uploaded data's", b.GetSize(), b.GetSha256())
	}
}

// A retry refused as AlreadyExists by a backup that is not this upload's
// reports the conflict.
func TestUploadRetryIntoAnotherBackupIsAConflict(t *testing.T) {
	srv := servertest.Start(t, "")
	// Both are whole to etcd's trailer check, of the same size: only
	// their SHA-256 tells them apart.
	theirs, mine := etcdtest.TrailedBytes(t, 544), etcdtest.TrailedBytes(t, 544)
	if _, err := srv.Client.Upload(context.Background(), bytes.NewReader(theirs), &ebv1.UploadHeader{Name: "taken"}, nil); err != nil {
		t.Fatal(err)
	}
	var failed atomic.Bool
	// The first attempt breaks before it reaches the server.
	breakFirst := func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		if strings.HasSuffix(method, "/UploadBackup") && !failed.Swap(true) {
			return nil, status.Error(codes.Unavailable, "connection lost (injected)")
		}
		return streamer(ctx, desc, cc, method, opts...)
	}
	conn, err := grpc.NewClient("passthrough:///"+srv.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithStreamInterceptor(breakFirst))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	_, err = client.New(conn).Upload(context.Background(), bytes.NewReader(mine), &ebv1.UploadHeader{Name: "taken"}, nil)
	if status.Code(err) != codes.AlreadyExists {
		t.Fatalf("got %v, want AlreadyExists", err)
	}
}
