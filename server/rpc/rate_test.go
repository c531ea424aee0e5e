package rpc_test

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/config"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/metrics"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/retention"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/rpc"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/servertest"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage/filesystem"
)

// The rate tests call the handlers with streams of their own inside a
// synctest bubble: the clock is the bubble's, so a client that sends a
// byte every 100 s costs the test no time, and nothing sleeps.

// newBubbleService is the request layer over a filesystem location in
// dir, with the default limits.
func newBubbleService(t *testing.T, dir string) *rpc.Service {
	t.Helper()
	loc, err := filesystem.New(dir)
	if err != nil {
		t.Fatal(err)
	}
	m, err := metrics.New(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	return rpc.New(rpc.Config{
		Locations: oneLocation(t, loc, m),
		Metrics:   m, Limits: config.Limits{}.WithDefaults(), InUse: retention.NewInUse(nil, nil, nil),
	})
}

// fakeUpload is an upload's stream: the header at once, then each chunk
// every `every`; the stream's context ends when the handler returns, as
// gRPC's does.
type fakeUpload struct {
	grpc.ServerStream
	ctx    context.Context
	header *ebv1.UploadHeader
	chunks [][]byte
	every  time.Duration
	i      int
}

func (f *fakeUpload) Context() context.Context { return f.ctx }

func (f *fakeUpload) Recv() (*ebv1.UploadBackupRequest, error) {
	if f.i == 0 {
		f.i++
		return &ebv1.UploadBackupRequest{Msg: &ebv1.UploadBackupRequest_Header{Header: f.header}}, nil
	}
	if f.i > len(f.chunks) {
		return nil, io.EOF
	}
	select {
	case <-f.ctx.Done():
		return nil, f.ctx.Err()
	case <-time.After(f.every):
	}
	c := bytes.Clone(f.chunks[f.i-1])
	f.i++
	return &ebv1.UploadBackupRequest{Msg: &ebv1.UploadBackupRequest_Chunk{Chunk: c}}, nil
}

func (f *fakeUpload) SendAndClose(*ebv1.UploadBackupResponse) error { return nil }

// runUpload runs the handler on f as gRPC would: the stream's context ends
// when the handler returns.
func runUpload(s *rpc.Service, f *fakeUpload) error {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	f.ctx = ctx
	return s.UploadBackup(f)
}

// An upload sending one byte every 100 s — never idle for
// limits.uploadIdleTimeout (2m) — holds a slot for days; it is ended
// after the first minute of waiting on it, with a status that says it
// was too slow and what the limit is, and nothing is stored.
func TestSlowUploadIsEnded(t *testing.T) {
	dir := t.TempDir()
	synctest.Test(t, func(t *testing.T) {
		s := newBubbleService(t, dir)
		chunks := make([][]byte, 1000)
		for i := range chunks {
			chunks[i] = []byte{0}
		}
		before := servertest.Tree(t, dir)
		start := time.Now()
		err := runUpload(s, &fakeUpload{header: &ebv1.UploadHeader{Name: "slow"}, chunks: chunks, every: 100 * time.Second})
		servertest.WantRefusal(t, err, codes.ResourceExhausted, `upload of "slow"`, "too slow", "64 KiB/s over 1m0s",
			"limits.minTransferRate", "limits.minTransferRateWindow")
		if took := time.Since(start); took != time.Minute {
			t.Errorf("ended after %s; the window is 1m", took)
		}
		synctest.Wait()
		if after := servertest.Tree(t, dir); after != before {
			t.Errorf("the ended upload left:\n%s\nwhere there was:\n%s", after, before)
		}
	})
}

// An upload at twice the rate, 128 KiB every second, for five minutes
// is not ended: the limit is an average over each window.
func TestUploadAtTheRateCompletes(t *testing.T) {
	dir := t.TempDir()
	synctest.Test(t, func(t *testing.T) {
		s := newBubbleService(t, dir)
		data := trailed(t, 300*128<<10)
		var chunks [][]byte
		for len(data) > 0 {
			n := min(len(data), 128<<10)
			chunks, data = append(chunks, data[:n]), data[n:]
		}
		if err := runUpload(s, &fakeUpload{header: &ebv1.UploadHeader{Name: "steady"}, chunks: chunks, every: time.Second}); err != nil {
			t.Fatalf("an upload at 128 KiB/s: %v", err)
		}
	})
}

// fakeDownload is a download's stream whose client takes the header and
// the first `fast` chunks at once, then each chunk after `every` (or, 0,
// never: a client that stops reading blocks the send, as gRPC's flow
// control does, until the stream ends).
type fakeDownload struct {
	grpc.ServerStream
	ctx   context.Context
	fast  int
	every time.Duration
	n     int
}

func (f *fakeDownload) Context() context.Context                { return f.ctx }
func (f *fakeDownload) Send(*ebv1.DownloadBackupResponse) error { return nil }

func (f *fakeDownload) SendMsg(any) error {
	if f.n++; f.n <= f.fast {
		return nil
	}
	var after <-chan time.Time
	if f.every > 0 {
		after = time.After(f.every)
	}
	select {
	case <-f.ctx.Done():
		return f.ctx.Err()
	case <-after:
		return nil
	}
}

func runDownload(s *rpc.Service, f *fakeDownload, name string) error {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	f.ctx = ctx
	return s.DownloadBackup(&ebv1.DownloadBackupRequest{Name: name}, f)
}

// A download whose client stops reading after two chunks (2 × (1 MiB −
// 64 B)) is ended after a window of the server waiting on it, though its
// send never returns; one whose client
// reads a 1 MiB chunk every 10 s (100 KiB/s) completes.
func TestSlowDownloadIsEnded(t *testing.T) {
	dir := t.TempDir()
	servertest.Start(t, dir).Upload(t, "big", trailed(t, 8<<20))
	synctest.Test(t, func(t *testing.T) {
		s := newBubbleService(t, dir)
		start := time.Now()
		err := runDownload(s, &fakeDownload{fast: 2}, "big")
		servertest.WantRefusal(t, err, codes.ResourceExhausted, `download of "big" from byte 0`, "ended after 2097024 bytes",
			"too slow", "64 KiB/s over 1m0s", "limits.minTransferRate")
		if took := time.Since(start); took != time.Minute {
			t.Errorf("ended after %s; the window is 1m", took)
		}
		if err := runDownload(s, &fakeDownload{every: 10 * time.Second}, "big"); err != nil {
			t.Fatalf("a download read at 100 KiB/s: %v", err)
		}
	})
}

// logSignal is a slog handler that closes a channel at the first record
// whose message is msg.
type logSignal struct {
	msg  string
	once sync.Once
	seen chan struct{}
}

func (h *logSignal) Enabled(context.Context, slog.Level) bool { return true }
func (h *logSignal) Handle(_ context.Context, r slog.Record) error {
	if r.Message == h.msg {
		h.once.Do(func() { close(h.seen) })
	}
	return nil
}
func (h *logSignal) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *logSignal) WithGroup(string) slog.Handler      { return h }

// Through gRPC's real transport: a client that stops reading blocks the
// server's send in flow control; the handler ends the download all the
// same, and the client, once it reads again, gets the buffered bytes and
// then the status saying why.
func TestSlowDownloadIsEndedThroughTheTransport(t *testing.T) {
	stalled := &logSignal{msg: "download aborted: too slow", seen: make(chan struct{})}
	srv := servertest.StartWith(t, servertest.Options{Logger: slog.New(stalled), Limits: config.Limits{
		MinTransferRateWindow: metav1.Duration{Duration: 200 * time.Millisecond},
	}})
	srv.Upload(t, "big", trailed(t, 64<<20))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stream, err := srv.Client.Backups.DownloadBackup(ctx, &ebv1.DownloadBackupRequest{Name: "big"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-stalled.seen:
	case <-ctx.Done():
		t.Fatal("the server did not end a download whose client stopped reading")
	}
	var got int64
	for {
		m, err := stream.Recv()
		if err != nil {
			servertest.WantRefusal(t, err, codes.ResourceExhausted, `download of "big"`, "too slow", "64 KiB/s over 200ms", "limits.minTransferRate")
			break
		}
		got += int64(len(m.GetChunk()))
	}
	if got >= 64<<20 {
		t.Errorf("the client received all %d bytes of the ended download", got)
	}
}
