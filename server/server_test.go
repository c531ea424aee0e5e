package server_test

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/util/wait"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/client"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/internal/etcdtest"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/rpc"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/servertest"
)

// trailed returns random bytes of about n (rounded up to whole 512-byte
// pages) that end in their SHA-256, as etcd ends a snapshot: the server
// stores a plain upload only if it passes that check.
func trailed(t testing.TB, n int) []byte {
	return etcdtest.TrailedBytes(t, etcdtest.TrailedSize(n))
}

func TestHealthAndServerInfo(t *testing.T) {
	ts := servertest.Start(t, "")
	h, err := healthpb.NewHealthClient(ts.Conn).Check(context.Background(), &healthpb.HealthCheckRequest{})
	if err != nil || h.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health: %v %v", h, err)
	}
	info, err := ts.Client.Info.GetServerInfo(context.Background(), &ebv1.GetServerInfoRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(info.GetLocations()) != 1 || info.GetLocations()[0].GetName() != "default" || !info.GetLocations()[0].GetDefault() ||
		info.GetLimits().GetMaxChunkBytes() != rpc.MaxChunkBytes {
		t.Fatalf("info: %v", info)
	}
}

// SIGTERM (Serve's context ending) lets a download in flight finish.
func TestShutdownDrainsInFlightDownload(t *testing.T) {
	ts := servertest.Start(t, "")
	data := trailed(t, 16<<20)
	ts.Upload(t, "big", data)
	pr, pw := io.Pipe()
	errc := make(chan error, 1)
	var got bytes.Buffer
	go func() {
		_, err := ts.Client.Download(context.Background(), io.MultiWriter(&got, pw), client.DownloadRequest{Name: "big"})
		pw.CloseWithError(err)
		errc <- err
	}()
	// Read the first bytes so the stream is surely in flight, then stop
	// the server while the rest is still coming.
	if _, err := io.ReadFull(pr, make([]byte, 1<<20)); err != nil {
		t.Fatal(err)
	}
	stopped := make(chan struct{})
	go func() { ts.Stop(); close(stopped) }()
	if _, err := io.Copy(io.Discard, pr); err != nil {
		t.Fatalf("download interrupted by shutdown: %v", err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	<-stopped
	if !bytes.Equal(got.Bytes(), data) {
		t.Fatal("drained download has wrong bytes")
	}
}

// refuseEveryone is a Guard that admits no call.
type refuseEveryone struct{}

func (refuseEveryone) Admit(context.Context, string) (context.Context, error) {
	return nil, status.Error(codes.Unauthenticated, "refused by the test's guard")
}

// The guard decides on every call but grpc.health.v1's, unary and
// streaming alike: the kubelet's probes carry no credentials.
func TestGuardSkipsOnlyHealth(t *testing.T) {
	srv := servertest.StartWith(t, servertest.Options{UserGuard: refuseEveryone{}, AgentGuard: refuseEveryone{}})
	ctx := context.Background()
	for _, conn := range []*grpc.ClientConn{srv.Conn, srv.AgentConn} {
		h, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
		if err != nil || h.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			t.Fatalf("health check past a guard that refuses all: %v %v", h, err)
		}
		watchCtx, stopWatch := context.WithCancel(ctx)
		watch, err := healthpb.NewHealthClient(conn).Watch(watchCtx, &healthpb.HealthCheckRequest{})
		if err != nil {
			t.Fatal(err)
		}
		// Watch, a stream, passes the guard too and is refused by health
		// itself: it never ends, so no listener serves it.
		h, err = watch.Recv()
		stopWatch()
		if status.Code(err) != codes.Unimplemented {
			t.Fatalf("health watch past a guard that refuses all: %v %v; want health's Unimplemented", h, err)
		}
		_, err = ebv1.NewInfoServiceClient(conn).GetServerInfo(ctx, &ebv1.GetServerInfoRequest{})
		servertest.WantCode(t, err, codes.Unauthenticated)
		logs, err := ebv1.NewBackupServiceClient(conn).GetBackupLogs(ctx, &ebv1.GetBackupLogsRequest{Name: "b"})
		if err == nil {
			_, err = logs.Recv()
		}
		servertest.WantCode(t, err, codes.Unauthenticated)
	}
}

// lockedLog collects a server's log, safe for its goroutines.
type lockedLog struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// With CheckLocations, Serve checks each location once in the background
// while it already answers; a location that passes is one line of the
// log, and leaves nothing in the store.
func TestServeChecksLocationsAtStart(t *testing.T) {
	var log lockedLog
	ts := servertest.StartWith(t, servertest.Options{CheckLocations: true, Logger: slog.New(slog.NewTextHandler(&log, nil))})
	if _, err := ts.Client.Info.GetServerInfo(context.Background(), &ebv1.GetServerInfoRequest{}); err != nil {
		t.Fatal(err)
	}
	want := `level=INFO msg="storage location checked" location=default type=filesystem ok=true failed=[]`
	if err := wait.PollUntilContextTimeout(t.Context(), 10*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		return strings.Contains(log.String(), want), nil
	}); err != nil {
		t.Fatalf("the log does not say %s:\n%s", want, log.String())
	}
	if strings.Contains(log.String(), "level=WARN") {
		t.Errorf("a warning:\n%s", log.String())
	}
	entries, err := os.ReadDir(filepath.Join(ts.Dir, "backups"))
	if err != nil || len(entries) != 0 {
		t.Errorf("backups/ holds %v (%v) after the check", entries, err)
	}
}
