package server_test

import (
	"bytes"
	"context"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/auth"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/config"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/servertest"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage/filesystem"
)

// wantRefusal checks err's code and that its message says every part of
// want (the limit's config key, the field, ...).
func wantRefusal(t *testing.T, err error, code codes.Code, want ...string) {
	t.Helper()
	if status.Code(err) != code {
		t.Fatalf("got %v, want code %v", err, code)
	}
	for _, w := range want {
		if !strings.Contains(status.Convert(err).Message(), w) {
			t.Errorf("%q does not say %q", status.Convert(err).Message(), w)
		}
	}
}

// openUpload starts an upload of name that sends its header and one
// chunk, a whole etcd snapshot to the server's trailer check, then holds
// the stream open; cancel ends it.
func openUpload(t *testing.T, srv *servertest.Server, location, name string) (ebv1.BackupService_UploadBackupClient, context.CancelFunc) {
	t.Helper()
	return openUploadOf(t, srv, location, name, trailed(t, 1))
}

// openUploadOf is openUpload with first as its one chunk.
func openUploadOf(t *testing.T, srv *servertest.Server, location, name string, first []byte) (ebv1.BackupService_UploadBackupClient, context.CancelFunc) {
	t.Helper()
	// Bounded, so a server that never ends it fails the test instead of
	// hanging it.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	stream, err := srv.Client.Backups.UploadBackup(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&ebv1.UploadBackupRequest{Msg: &ebv1.UploadBackupRequest_Header{Header: &ebv1.UploadHeader{Name: name, Location: location}}}); err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&ebv1.UploadBackupRequest{Msg: &ebv1.UploadBackupRequest_Chunk{Chunk: first}}); err != nil {
		t.Fatal(err)
	}
	return stream, cancel
}

// waitInProgress waits until the location has n uploads in progress:
// the server claims an upload's name, then opens its temporary file.
func waitInProgress(t *testing.T, srv *servertest.Server, location string, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		entries, err := os.ReadDir(filepath.Join(srv.Dirs[location], ".tmp"))
		if err != nil {
			t.Fatal(err)
		}
		if len(entries) == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d uploads in progress in location %q; want %d", len(entries), location, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestMaxConcurrentStreams(t *testing.T) {
	srv := servertest.StartWith(t, servertest.Options{Limits: config.Limits{MaxConcurrentStreams: 2}})
	openUpload(t, srv, "default", "s1")
	openUpload(t, srv, "default", "s2")
	waitInProgress(t, srv, "default", 2)
	// A third stream on the same connection waits for a free one.
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, err := srv.Client.Info.GetServerInfo(ctx, &ebv1.GetServerInfoRequest{})
	wantCode(t, err, codes.DeadlineExceeded)
	// The limit is per connection.
	conn, err := grpc.NewClient("passthrough:///"+srv.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := ebv1.NewInfoServiceClient(conn).GetServerInfo(context.Background(), &ebv1.GetServerInfoRequest{}); err != nil {
		t.Fatalf("another connection: %v", err)
	}
}

// panicService is a service whose handlers panic, registered on the
// server's own gRPC server to reach its interceptors.
var panicService = grpc.ServiceDesc{
	ServiceName: "test.Panic",
	HandlerType: (*any)(nil),
	Methods: []grpc.MethodDesc{{MethodName: "Unary", Handler: func(srv any, ctx context.Context, dec func(any) error, ic grpc.UnaryServerInterceptor) (any, error) {
		in := new(emptypb.Empty)
		if err := dec(in); err != nil {
			return nil, err
		}
		h := func(context.Context, any) (any, error) { panic("unary handler exploded") }
		return ic(ctx, in, &grpc.UnaryServerInfo{Server: srv, FullMethod: "/test.Panic/Unary"}, h)
	}}},
	Streams: []grpc.StreamDesc{{StreamName: "Stream", ServerStreams: true, Handler: func(any, grpc.ServerStream) error {
		panic("stream handler exploded")
	}}},
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func TestPanicInHandlerIsInternal(t *testing.T) {
	loc, err := filesystem.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	var logs syncBuffer
	s, err := server.New(server.Config{Locations: []server.NamedLocation{{Name: "default", Location: loc}}, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	g := s.NewGRPCServer(auth.AllowAll{})
	g.RegisterService(&panicService, struct{}{})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = g.Serve(lis) }()
	t.Cleanup(g.Stop)
	conn, err := grpc.NewClient("passthrough:///"+lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx := context.Background()

	err = conn.Invoke(ctx, "/test.Panic/Unary", &emptypb.Empty{}, &emptypb.Empty{})
	wantRefusal(t, err, codes.Internal, "internal error; see the server log")
	stream, serr := conn.NewStream(ctx, &panicService.Streams[0], "/test.Panic/Stream")
	if serr != nil {
		t.Fatal(serr)
	}
	if err := stream.CloseSend(); err != nil {
		t.Fatal(err)
	}
	serr = stream.RecvMsg(&emptypb.Empty{})
	wantRefusal(t, serr, codes.Internal, "internal error; see the server log")
	for _, e := range []error{err, serr} {
		if strings.Contains(status.Convert(e).Message(), "exploded") {
			t.Errorf("the panic value reached the client: %v", e)
		}
	}

	// The server still serves.
	if _, err := ebv1.NewInfoServiceClient(conn).GetServerInfo(ctx, &ebv1.GetServerInfoRequest{}); err != nil {
		t.Fatalf("after the panics: %v", err)
	}
	for _, want := range []string{"unary handler exploded", "stream handler exploded", "method=/test.Panic/Unary", "limits_test.go"} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("the log does not say %q (panic value, method and stack):\n%s", want, logs.String())
		}
	}
}
