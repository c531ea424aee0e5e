package server_test

import (
	"bytes"
	"context"
	"log/slog"
	"net"
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

func TestMaxConcurrentStreams(t *testing.T) {
	srv := servertest.StartWith(t, servertest.Options{Limits: config.Limits{MaxConcurrentStreams: 2}})
	srv.OpenUpload(t, "default", "s1")
	srv.OpenUpload(t, "default", "s2")
	srv.WaitInProgress(t, "default", 2)
	// A third stream on the same connection waits for a free one.
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, err := srv.Client.Info.GetServerInfo(ctx, &ebv1.GetServerInfoRequest{})
	servertest.WantCode(t, err, codes.DeadlineExceeded)
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
	servertest.WantRefusal(t, err, codes.Internal, "internal error; see the server log")
	stream, serr := conn.NewStream(ctx, &panicService.Streams[0], "/test.Panic/Stream")
	if serr != nil {
		t.Fatal(serr)
	}
	if err := stream.CloseSend(); err != nil {
		t.Fatal(err)
	}
	serr = stream.RecvMsg(&emptypb.Empty{})
	servertest.WantRefusal(t, serr, codes.Internal, "internal error; see the server log")
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
